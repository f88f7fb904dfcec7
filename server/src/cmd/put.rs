//! `PUT key desc [NX] [TTL ms] [REPLICAS n]`: the node pulls the value from the
//! client's memory with a one-sided read, straight into a reserved arena
//! chunk, and publishes it only once every byte has arrived. A failed or
//! cut transfer frees the chunk: nothing partial is ever visible, and an
//! old value under the same key stays as it was.

use std::time::Instant;

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};
use strata_rdma::{Descriptor, Transport, TransportKind};
use strata_tiering::{Condition, Expiry, Reservation};

use super::{desc_arg, int_arg, own_key, store_error, transfer_error, Ctx, Out};
use crate::clock::now_ms;
use crate::metrics::Direction;
use crate::node::Node;
use crate::pubsub::keyspace::Event;
use crate::services::replicate;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (cond, expiry, copies) = match parse_options(&args[3..], ctx.now_ms) {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    // NX only asks whether the key exists: the NVMe index answers that
    // without promoting a value the write would not replace.
    if cond == Condition::IfAbsent {
        if let Some(out) = ctx.fetch_for_existence(&args[1..2]) {
            return out;
        }
    }
    if let Some(out) = ctx.wait_for_room() {
        return out;
    }
    if cond == Condition::IfAbsent && ctx.exists(&args[1]) {
        return Reply::Nil.into();
    }
    let (desc, res) = match prepare(ctx.node, ctx.session.cma_peer, &args[2]) {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let node = ctx.node.clone();
    let key = own_key(&args[1]);
    let copies = copies.unwrap_or(node.cfg.replica_num) as usize;
    let internal = ctx.internal;
    let peer = ctx.session.peer;
    let targets = if internal {
        Vec::new()
    } else {
        replicate::targets(&node, &key, copies)
    };
    Out::Later(Box::pin(async move {
        if let Err(e) = pull(&node, &desc, &res, Direction::In).await {
            return e.into();
        }
        if peer.gone() {
            return client_gone(&node).into();
        }
        if !node.store.commit(key.clone(), res, cond, expiry, now_ms()) {
            return Reply::Nil;
        }
        if !internal {
            node.notify_owned(Event::Set, &key);
        }
        // A value the GPU tier cannot copy out for the replicas is reported:
        // the write is not as safe as an OK would say.
        match node.store.peek_with_expiry(&key, now_ms()) {
            // A replica's own copy (an internal write) is not a new write.
            Ok(Some((value, exp))) if !internal => {
                let all = replicate::push_write(&node, key, value, exp, targets, copies).await;
                replicate::write_reply(&node, all, Reply::Ok)
            }
            Ok(_) => Reply::Ok,
            Err(e) => super::store_error(e).into(),
        }
    }))
}

/// The pulled value of a client that has gone is never published: it
/// may have reused its memory while the pull ran (see `crate::peer`).
pub fn client_gone(node: &Node) -> CommandError {
    node.metrics
        .counters
        .puts_abandoned_total
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CommandError::err("client closed the connection during the transfer; nothing stored")
}

/// Checks a client descriptor and reserves room for its bytes. A `cma`
/// descriptor must name the process that proved itself on this connection
/// (`cma_peer`, see `STRATA.CMA`).
pub fn prepare(
    node: &Node,
    cma_peer: Option<(u32, u64)>,
    desc: &[u8],
) -> Result<(Descriptor, Reservation), CommandError> {
    let desc = desc_arg(desc)?;
    if desc.transport == TransportKind::Cma {
        if node.cma.is_none() {
            return Err(CommandError::new(
                ErrorCode::NoCma,
                "cross-memory attach is off on this node (cma: off)",
            ));
        }
        if cma_peer.is_none() || desc.process() != cma_peer {
            return Err(CommandError::new(
                ErrorCode::NoCma,
                "the cma descriptor names a process that has not proven itself on this connection (STRATA.CMA)",
            ));
        }
    } else {
        super::network_desc(node, desc.transport, true)?;
    }
    if desc.epoch.is_some() {
        return Err(CommandError::new(
            ErrorCode::BadDesc,
            "a PUT source descriptor carries no epoch",
        ));
    }
    let res = node.store.reserve(desc.len).map_err(store_error)?;
    Ok((desc, res))
}

/// The one-sided read of the payload into the reservation, counted as a
/// transfer in `direction`.
pub async fn pull(
    node: &Node,
    desc: &Descriptor,
    res: &Reservation,
    direction: Direction,
) -> Result<(), CommandError> {
    if desc.len == 0 {
        return Ok(());
    }
    let start = Instant::now();
    if desc.transport == TransportKind::Cma {
        cma_pull(node, desc, res)?;
    } else {
        let offset = node.arena_offset(res.addr());
        node.transport
            .read(desc, &node.arena_region, offset)
            .await
            .map_err(transfer_error)?;
    }
    node.metrics
        .transfers
        .record(direction, desc.transport, desc.len, start.elapsed());
    Ok(())
}

/// The payload of a `cma` descriptor, copied out of the client process.
/// A read the kernel does not permit is `-NOCMA`: the client goes on over
/// the network.
pub fn cma_pull(node: &Node, desc: &Descriptor, res: &Reservation) -> Result<(), CommandError> {
    let Some(cma) = &node.cma else {
        return Err(CommandError::new(ErrorCode::NoCma, "cma: off"));
    };
    // SAFETY: the reservation is `desc.len` bytes of arena memory that
    // nothing else reads or writes until it is committed or dropped, and
    // it outlives this synchronous call.
    match unsafe { cma.read(desc, res.addr() as *mut u8) } {
        Ok(()) => Ok(()),
        Err(strata_rdma::TransferError::Io(e)) => Err(CommandError::new(
            ErrorCode::NoCma,
            format!("cannot read the client process: {e}"),
        )),
        Err(e) => Err(transfer_error(e)),
    }
}

fn parse_options(
    opts: &[Bytes],
    now_ms: u64,
) -> Result<(Condition, Expiry, Option<u32>), CommandError> {
    let mut cond = Condition::Always;
    let mut expiry = Expiry::Persist;
    let mut copies = None;
    let mut i = 0;
    while i < opts.len() {
        match opts[i].to_ascii_uppercase().as_slice() {
            b"NX" if cond == Condition::Always => cond = Condition::IfAbsent,
            b"TTL" if expiry == Expiry::Persist => {
                let ms = int_arg(opts.get(i + 1).ok_or_else(CommandError::syntax)?)?;
                let at = u64::try_from(ms)
                    .ok()
                    .filter(|&ms| ms > 0)
                    .and_then(|ms| ms.checked_add(now_ms))
                    .ok_or_else(|| CommandError::err("invalid expire time in 'put' command"))?;
                expiry = Expiry::At(at);
                i += 1;
            }
            b"REPLICAS" if copies.is_none() => {
                let n = int_arg(opts.get(i + 1).ok_or_else(CommandError::syntax)?)?;
                if !(1..=8).contains(&n) {
                    return Err(CommandError::err("REPLICAS must be between 1 and 8"));
                }
                copies = Some(n as u32);
                i += 1;
            }
            _ => return Err(CommandError::syntax()),
        }
        i += 1;
    }
    Ok((cond, expiry, copies))
}
