//! Batches of zero-copy operations: `put_many` (pipelined SETs of the
//! small values and one MPUT of the rest, per node) and `get_many` (the
//! GETs of each node pipelined, their reads together, one RELEASE), with
//! the parsing of their replies. An item refused as busy or by `-NOCMA`,
//! or a GET whose lease ended before its read, goes again alone
//! (`put_from`, `get_into`).

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::{Descriptor, ReadOp, Transport, TransportKind};
use strata_ring::key_slot;

use super::get::{copy_inline, fits, get_args, region_tail, sink, Got, Lease};
use super::transfer::{guarded, Descs};
use crate::cma::Link;
use crate::conn::{expect_ok, unexpected, Sink};
use crate::node::{Idempotent, Node};
use crate::router::Access;
use crate::{Buffer, Client, Error, Result, BATCH_MAX};

impl Client {
    /// Puts every `(key, buffer, range)` with MPUT: up to [`BATCH_MAX`]
    /// pairs at a time, one MPUT per node owning some of them, the nodes
    /// concurrently. One result per item, in order.
    pub async fn put_many<K: AsRef<[u8]>>(
        &self,
        items: &[(K, &Buffer, Range<usize>)],
    ) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks(BATCH_MAX) {
            results.extend(self.put_chunk(chunk).await);
        }
        // A pair refused as busy was not applied: try it alone, with retries.
        for (i, (key, buf, range)) in items.iter().enumerate() {
            if matches!(results[i], Err(Error::Busy(_))) || no_cma(&results[i]) {
                results[i] = self.put_from(key.as_ref(), buf, range.clone()).await;
            }
        }
        results
    }

    async fn put_chunk<K: AsRef<[u8]>>(
        &self,
        chunk: &[(K, &Buffer, Range<usize>)],
    ) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(chunk.len());
        // (item, descriptor, payload if it may go inline) of the pairs
        // that go out. The descriptor's text is written only for pairs
        // that go in the MPUT: most of a batch of small values goes as
        // SETs.
        let mut sent: Vec<(usize, Descriptor, Option<&[u8]>)> = Vec::with_capacity(chunk.len());
        for (i, (_, buf, range)) in chunk.iter().enumerate() {
            match self.describe(buf.region(), range.clone()) {
                Ok(d) => {
                    let inline = self.inline_put(buf.region(), range.clone());
                    sent.push((i, d, inline));
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let slots = slots_of(sent.iter().map(|s| chunk[s.0].0.as_ref()));
        let sent = &sent;
        let outcomes = self
            .router
            .routed_batch(&slots, Access::Write, Idempotent::Yes, |node, idx| {
                // Over TCP, small payloads go as pipelined SETs written
                // from the buffers (one round trip, as `put_from`); the
                // rest as one MPUT whose payloads the node pulls, after
                // the SETs in the same write.
                let cma = node.cma_put();
                // Positions in `idx`.
                let (sets, pulled): (Vec<usize>, Vec<usize>) =
                    (0..idx.len()).partition(|&p| !cma && sent[idx[p]].2.is_some());
                let commands: Vec<Vec<&[u8]>> = sets
                    .iter()
                    .map(|&p| {
                        let (i, _, value) = &sent[idx[p]];
                        vec![
                            b"SET" as &[u8],
                            chunk[*i].0.as_ref(),
                            value.expect("partitioned"),
                        ]
                    })
                    .collect();
                let descs: Vec<String> = pulled
                    .iter()
                    .map(|&p| self.desc_text(&sent[idx[p]].1, cma))
                    .collect();
                async move {
                    let mut commands = commands;
                    if !pulled.is_empty() {
                        let mut mput: Vec<&[u8]> = Vec::with_capacity(1 + 2 * pulled.len());
                        mput.push(b"MPUT");
                        for (&p, desc) in pulled.iter().zip(&descs) {
                            mput.push(chunk[sent[idx[p]].0].0.as_ref());
                            mput.push(desc.as_bytes());
                        }
                        commands.push(mput);
                    }
                    let commands: Vec<&[&[u8]]> = commands.iter().map(Vec::as_slice).collect();
                    let replies = node.exchange(&commands, Idempotent::Yes).await?;
                    batch_put_results(replies, &sets, &pulled)
                }
            })
            .await;
        for ((i, _, _), outcome) in sent.iter().zip(outcomes) {
            results[*i] = outcome;
        }
        results
    }

    /// Reads every `(key, buffer, offset)`: up to [`BATCH_MAX`] items at a
    /// time, the GETs for each node pipelined in one write (the nodes
    /// concurrently), the sources read concurrently, each node's leases
    /// released by one RELEASE. One result per item.
    pub async fn get_many<K: AsRef<[u8]>>(
        &self,
        items: &mut [(K, &mut Buffer, usize)],
    ) -> Vec<Result<usize>> {
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks_mut(BATCH_MAX) {
            results.extend(self.get_chunk(chunk).await);
        }
        // Busy (lease limit) and stale reads were not served: retry alone.
        for (i, (key, buf, offset)) in items.iter_mut().enumerate() {
            if matches!(results[i], Err(Error::Busy(_) | Error::Stale(_))) || no_cma(&results[i]) {
                results[i] = self.get_into(key.as_ref(), buf, *offset).await;
            }
        }
        results
    }

    async fn get_chunk<K: AsRef<[u8]>>(
        &self,
        chunk: &[(K, &mut Buffer, usize)],
    ) -> Vec<Result<usize>> {
        let mut results: Vec<Result<usize>> = Vec::with_capacity(chunk.len());
        // (item, capacity, destination) of the GETs that go out.
        let mut sent: Vec<(usize, usize, Descs)> = Vec::with_capacity(chunk.len());
        for (i, (_, buf, offset)) in chunk.iter().enumerate() {
            let dst = region_tail(buf.region(), *offset)
                .and_then(|cap| Ok((cap, self.descs(buf.region(), *offset..*offset + cap)?)));
            match dst {
                Ok((cap, d)) => {
                    sent.push((i, cap, d));
                    results.push(Ok(0));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let slots = slots_of(sent.iter().map(|s| chunk[s.0].0.as_ref()));
        let sent = &sent;
        let outcomes = self
            .router
            .routed_batch(&slots, Access::Read, Idempotent::Yes, |node, idx| {
                self.get_batch_on(node, idx, chunk, sent)
            })
            .await;
        for ((i, _, _), outcome) in sent.iter().zip(outcomes) {
            results[*i] = outcome;
        }
        results
    }

    /// The GETs of `sent[idx]` on `node` in one write, their reads, one
    /// RELEASE; one result per index.
    async fn get_batch_on<K: AsRef<[u8]>>(
        &self,
        node: Arc<Node>,
        idx: Vec<usize>,
        chunk: &[(K, &mut Buffer, usize)],
        sent: &[(usize, usize, Descs)],
    ) -> Result<Vec<Result<usize>>> {
        let link = node.cma_link();
        let started = Instant::now();
        let inline = self.inline_option(link.is_some(), true);
        let commands: Vec<Vec<&[u8]>> = idx
            .iter()
            .map(|&j| {
                let (i, _, dst) = &sent[j];
                get_args(
                    chunk[*i].0.as_ref(),
                    dst.pick(link.is_some()).as_bytes(),
                    &inline,
                )
            })
            .collect();
        let commands: Vec<&[&[u8]]> = commands.iter().map(Vec::as_slice).collect();
        let sinks: Vec<Option<Sink>> = idx
            .iter()
            .map(|&j| {
                let (i, capacity, _) = &sent[j];
                let (_, buf, offset) = &chunk[*i];
                inline
                    .as_ref()
                    .map(|_| sink(buf.region(), *offset, *capacity))
            })
            .collect();
        let replies = node
            .exchange_placed(&commands, &sinks, Idempotent::Yes)
            .await?;
        let mut out: Vec<Result<usize>> = idx.iter().map(|_| Ok(0)).collect();
        let mut leases = Vec::with_capacity(idx.len());
        for (k, reply) in replies.into_iter().enumerate() {
            match reply.and_then(Got::parse) {
                Ok(Got::Placed(len)) => out[k] = Ok(len),
                Ok(Got::Lease(lease)) => leases.push((k, lease)),
                Ok(Got::Inline(bytes)) => {
                    let (i, capacity, _) = &sent[idx[k]];
                    let (_, buf, offset) = &chunk[*i];
                    out[k] = copy_inline(&bytes, buf.region(), *offset, *capacity);
                }
                Err(e) => out[k] = Err(e),
            }
        }
        let mut outcomes = self.read_leases(link, &leases, &idx, chunk, sent).await;
        release_leases(&node, link, started, &leases, &mut outcomes).await?;
        for ((k, _), outcome) in leases.iter().zip(outcomes) {
            out[*k] = outcome;
        }
        Ok(out)
    }

    /// Every read of the batch at once: over TCP one data-plane round trip
    /// per connection for the whole batch. One outcome per lease, whose
    /// first field is its position in `idx`.
    async fn read_leases<K: AsRef<[u8]>>(
        &self,
        link: Option<Link>,
        leases: &[(usize, Lease)],
        idx: &[usize],
        chunk: &[(K, &mut Buffer, usize)],
        sent: &[(usize, usize, Descs)],
    ) -> Vec<Result<usize>> {
        let mut outcomes: Vec<Result<usize>> = Vec::with_capacity(leases.len());
        let mut ops = Vec::with_capacity(leases.len());
        for (k, lease) in leases {
            let (i, capacity, _) = &sent[idx[*k]];
            let (_, buf, offset) = &chunk[*i];
            outcomes.push(fits(lease, *capacity).map(|()| lease.len as usize));
            if lease.src.transport == TransportKind::Cma {
                // Copied here and now; only the network reads are batched.
                if let Some(Ok(_)) = outcomes.last() {
                    let copied = self.cma_pull(link, lease, buf.region(), *offset);
                    if let Err(e) = copied {
                        *outcomes.last_mut().expect("just pushed") = Err(e);
                    }
                }
                continue;
            }
            if outcomes.last().is_some_and(Result::is_ok) && lease.len > 0 {
                ops.push(ReadOp {
                    src: &lease.src,
                    dst: buf.region(),
                    dst_offset: *offset as u64,
                });
            }
        }
        let mut read = self.transport.read_many(&ops).await.into_iter();
        for (o, (_, lease)) in outcomes.iter_mut().zip(leases) {
            if o.is_ok() && lease.len > 0 && lease.src.transport != TransportKind::Cma {
                if let Err(e) = read.next().expect("one result per read") {
                    *o = Err(e.into());
                }
            }
        }
        outcomes
    }
}

/// One RELEASE of a batch's leases, `started` before their GETs went out;
/// it must confirm them when some read was not checked as it was served
/// (see `guarded`), and a lease that had ended makes every read that
/// succeeded `Stale`.
async fn release_leases(
    node: &Node,
    link: Option<Link>,
    started: Instant,
    leases: &[(usize, Lease)],
    outcomes: &mut [Result<usize>],
) -> Result<()> {
    let ids: Vec<i64> = leases.iter().map(|(_, l)| l.id).collect();
    let cma_live = link.is_some_and(|l| l.lease_still_live(started.elapsed()));
    if leases
        .iter()
        .all(|(_, l)| guarded(l) || (l.src.transport == TransportKind::Cma && cma_live))
    {
        node.release(&ids).await;
    } else {
        // See `guarded`. Which lease ended is not said, so
        // every read of the batch is retried alone.
        let live = node.release_confirmed(&ids).await?;
        if live < ids.len() as i64 {
            for o in outcomes.iter_mut().filter(|o| o.is_ok()) {
                *o = Err(Error::Stale(
                    "a lease of the batch ended before its read finished".into(),
                ));
            }
        }
    }
    Ok(())
}

/// A `-NOCMA` reply: the request goes again, alone, over the network.
fn no_cma<T>(r: &Result<T>) -> bool {
    matches!(r, Err(Error::Server { code, .. }) if code == "NOCMA")
}

/// The replies to one node's part of a batch put (the SETs, then the MPUT
/// if `pulled` is not empty) as one result per item: `sets` and `pulled`
/// are the items' positions, which together cover `0..n` once.
fn batch_put_results(
    mut replies: Vec<Result<BytesFrame>>,
    sets: &[usize],
    pulled: &[usize],
) -> Result<Vec<Result<()>>> {
    let mput: Vec<Result<()>> = match pulled.is_empty() {
        true => Vec::new(),
        false => match replies.pop() {
            Some(Ok(BytesFrame::Array(r))) if r.len() == pulled.len() => {
                r.into_iter().map(mput_pair).collect()
            }
            Some(Err(e)) => pulled.iter().map(|_| Err(e.duplicate())).collect(),
            Some(Ok(other)) => {
                let e = unexpected("one reply per MPUT pair", &other);
                pulled.iter().map(|_| Err(e.duplicate())).collect()
            }
            None => return Err(Error::Protocol("no reply to MPUT".into())),
        },
    };
    let mut out: Vec<Option<Result<()>>> = (0..sets.len() + pulled.len()).map(|_| None).collect();
    let set_results = replies
        .into_iter()
        .map(|r| r.and_then(expect_ok).and_then(set_stored));
    for (&p, r) in sets.iter().zip(set_results).chain(pulled.iter().zip(mput)) {
        out[p] = Some(r);
    }
    Ok(out
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Protocol("no reply for a pair".into()))))
        .collect())
}

/// A SET without NX always stores or fails.
fn set_stored(stored: bool) -> Result<()> {
    match stored {
        true => Ok(()),
        false => Err(Error::Protocol("nil reply to SET without NX".into())),
    }
}

/// One MPUT pair's reply.
fn mput_pair(reply: BytesFrame) -> Result<()> {
    match reply {
        BytesFrame::Error(text) => Err(Error::from_reply(&text)),
        other => match expect_ok(other)? {
            true => Ok(()),
            false => Err(Error::Protocol("nil reply to an MPUT pair".into())),
        },
    }
}

/// The slots of `keys`, in order: what a routed batch is grouped by.
fn slots_of<'a>(keys: impl Iterator<Item = &'a [u8]>) -> Vec<u16> {
    keys.map(key_slot).collect()
}
