//! `STRATA.REPLICATE key source-desc version expire_at_ms` (internal): the
//! node that accepted a write asks this one to hold a copy. This node pulls
//! the bytes from the source with a one-sided read and keeps them only if
//! they are newer than its own copy; an up-to-date copy answers at once
//! without any transfer. `expire_at_ms` 0 means no expiry.
//!
//! An optional sixth argument is a `cma` descriptor of the same value in
//! the source node's process, sent when that node is on this host: the
//! copy is then one `process_vm_readv`. It is used only if it names a
//! process the ring lists as a member (so a client cannot make this node
//! read an arbitrary process); any failure falls back to the network
//! descriptor.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};

use super::put::pull;
use super::{desc_arg, int_arg, own_key, store_error, Ctx, Out};
use crate::clock::now_ms;
use crate::metrics::Direction;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if args.len() > 6 {
        return CommandError::wrong_arity("strata.replicate").into();
    }
    let (version, expire) = match (int_arg(&args[3]), int_arg(&args[4])) {
        (Ok(v), Ok(e)) if v >= 0 && e >= 0 => (v as u64, (e > 0).then_some(e as u64)),
        _ => return CommandError::not_integer().into(),
    };
    let node = ctx.node;
    if node
        .store
        .version_of(&args[1], ctx.now_ms)
        .is_some_and(|v| v >= version)
    {
        return Reply::Ok.into();
    }
    let desc = match desc_arg(&args[2]) {
        Ok(d) if super::network_desc(node, d.transport, true).is_ok() && d.epoch.is_some() => d,
        Ok(_) => {
            return CommandError::new(
                ErrorCode::BadDesc,
                "a replication source needs this transport and an epoch",
            )
            .into()
        }
        Err(e) => return e.into(),
    };
    let res = match node.store.reserve(desc.len) {
        Ok(r) => r,
        Err(e) => return store_error(e).into(),
    };
    let same_host = args
        .get(5)
        .and_then(|a| strata_rdma::Descriptor::parse(a).ok())
        .filter(|d| d.len == desc.len && member_process(ctx, d));
    let node = node.clone();
    let key = own_key(&args[1]);
    Out::Later(Box::pin(async move {
        if let Some(d) = same_host {
            match pull(&node, &d, &res, Direction::Replica).await {
                Ok(()) => {
                    node.store.commit_copy(key, res, version, expire, now_ms());
                    return Reply::Ok;
                }
                Err(e) => tracing::debug!(
                    "replica copy by cross-memory attach failed ({e}); over the network"
                ),
            }
        }
        match pull(&node, &desc, &res, Direction::Replica).await {
            Ok(()) => {
                node.store.commit_copy(key, res, version, expire, now_ms());
                Reply::Ok
            }
            Err(e) => e.into(),
        }
    }))
}

/// Whether `d` is a `cma` descriptor naming a ring member's process that
/// this node may read (same host, pid namespace and user).
fn member_process(ctx: &Ctx<'_>, d: &strata_rdma::Descriptor) -> bool {
    let Some(cma) = &ctx.node.cma else {
        return false;
    };
    if d.transport != strata_rdma::TransportKind::Cma {
        return false;
    }
    let ring = ctx.node.cluster.ring();
    ring.nodes().iter().any(|n| {
        n.process
            .as_ref()
            .is_some_and(|p| d.process() == Some((p.pid, p.start)) && cma.can_read(p))
    })
}
