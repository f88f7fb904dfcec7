//! `MPUT key desc [key desc ...]`: several PUTs in one round trip. Each
//! pair succeeds or fails on its own (one `+OK` or error per pair, in
//! order). The node pulls every payload in one batch of reads
//! ([`Transport::read_many`]): over TCP all the reads for one client go
//! out at once on each connection, so the batch costs one data-plane round
//! trip whatever its size.

use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use strata_proto::{CommandError, Reply};
use strata_rdma::{ReadOp, Transport, TransportKind};
use strata_tiering::{Condition, Expiry};

use super::put::{cma_pull, prepare};
use super::{own_key, transfer_error, Ctx, Out};
use crate::clock::now_ms;
use crate::metrics::Direction;
use crate::pubsub::keyspace::Event;
use crate::services::replicate;

/// A batch is one request's worth of blocks; larger ones are split by the
/// client.
const MAX_PAIRS: usize = 1024;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let pairs = &args[1..];
    if !pairs.len().is_multiple_of(2) {
        return CommandError::wrong_arity("mput").into();
    }
    if pairs.len() / 2 > MAX_PAIRS {
        return CommandError::err(format!("at most {MAX_PAIRS} pairs per MPUT")).into();
    }
    if let Some(out) = ctx.wait_for_room() {
        return out;
    }
    let node = ctx.node.clone();
    let internal = ctx.internal;
    let peer = ctx.session.peer;
    let copies = node.cfg.replica_num as usize;
    // One reply per pair; a pair whose descriptor or reservation failed
    // has its reply now, the others after their transfer.
    let mut replies: Vec<Option<Reply>> = Vec::with_capacity(pairs.len() / 2);
    let mut pulls = Vec::with_capacity(pairs.len() / 2);
    for (i, kv) in pairs.chunks_exact(2).enumerate() {
        match prepare(&node, ctx.session.cma_peer, &kv[1]) {
            Ok((desc, res)) => {
                let key = own_key(&kv[0]);
                let targets = if internal {
                    Vec::new()
                } else {
                    replicate::targets(&node, &key, copies)
                };
                pulls.push((i, key, desc, res, targets));
                replies.push(None);
            }
            Err(e) => replies.push(Some(e.into())),
        }
    }
    Out::Later(Box::pin(async move {
        // Payloads named by `cma` descriptors are copied here and now;
        // the others go to the data plane as one batch.
        let network = |d: &strata_rdma::Descriptor| d.len > 0 && d.transport != TransportKind::Cma;
        let ops: Vec<ReadOp<'_>> = pulls
            .iter()
            .filter(|p| network(&p.2))
            .map(|(_, _, desc, res, _)| ReadOp {
                src: desc,
                dst: &node.arena_region,
                dst_offset: node.arena_offset(res.addr()),
            })
            .collect();
        let start = Instant::now();
        let mut read = node.transport.read_many(&ops).await.into_iter();
        // One transfer per batch: the node pulls all of it in one round.
        if !ops.is_empty() {
            let bytes = ops.iter().map(|o| o.src.len).sum();
            node.metrics.transfers.record(
                Direction::In,
                node.transport.kind(),
                bytes,
                start.elapsed(),
            );
        }
        // Asked once for every value pulled over the network (all of them
        // arrived above), and after each cross-memory copy for its value.
        let gone_after_network = !ops.is_empty() && peer.gone();
        drop(ops);
        let mut writes = Vec::with_capacity(pulls.len());
        for (i, key, desc, res, targets) in pulls {
            // Zero-length values need no read.
            let pulled = if network(&desc) {
                read.next()
                    .expect("one result per read")
                    .map_err(transfer_error)
            } else if desc.len > 0 {
                let start = Instant::now();
                cma_pull(&node, &desc, &res).inspect(|()| {
                    node.metrics.transfers.record(
                        Direction::In,
                        TransportKind::Cma,
                        desc.len,
                        start.elapsed(),
                    )
                })
            } else {
                Ok(())
            };
            if let Err(e) = pulled {
                replies[i] = Some(e.into());
                continue;
            }
            let gone = match (network(&desc), desc.len > 0) {
                (true, _) => gone_after_network,
                (false, true) => peer.gone(),
                (false, false) => false,
            };
            if gone {
                replies[i] = Some(super::put::client_gone(&node).into());
                continue;
            }
            let now = now_ms();
            node.store
                .commit(key.clone(), res, Condition::Always, Expiry::Persist, now);
            if !internal {
                node.notify_owned(Event::Set, &key);
            }
            match node.store.peek(&key, now) {
                Ok(Some(value)) if !internal => writes.push(
                    replicate::push_write(&node, key, value, None, targets, copies)
                        .map(move |all| (i, all)),
                ),
                Ok(_) => {}
                Err(e) => {
                    replies[i] = Some(super::store_error(e).into());
                    continue;
                }
            }
            replies[i] = Some(Reply::Ok);
        }
        // Every pair's copies go to the replicas concurrently.
        for (i, all) in futures::future::join_all(writes).await {
            replies[i] = Some(replicate::write_reply(&node, all, Reply::Ok));
        }
        Reply::Array(
            replies
                .into_iter()
                .map(|r| r.expect("a reply for every pair"))
                .collect(),
        )
    }))
}
