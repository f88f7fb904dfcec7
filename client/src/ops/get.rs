//! The zero-copy `GET key desc [INLINE n] [RANGE from len]` of one value
//! into a registered buffer, and the parsing of what a node answers: the
//! value placed in the buffer or in a reply, or a lease on it to read and
//! release. `batch` sends many of them at once.

use std::sync::Arc;

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::{Descriptor, Region, TransportKind};
use strata_ring::key_slot;

use super::transfer::{guarded, Descs};
use crate::conn::{expect_int, unexpected, Reply, Sink};
use crate::node::{backoff, Idempotent, Node};
use crate::router::Access;
use crate::{Buffer, Client, Error, Result};

impl Client {
    /// Reads the value of `key` into `buf` at `offset`; returns its length.
    /// `NotFound` if absent, `TooLarge` if it does not fit from `offset` on.
    pub async fn get_into(&self, key: &[u8], buf: &mut Buffer, offset: usize) -> Result<usize> {
        let region = buf.region();
        let capacity = region_tail(region, offset)?;
        let dst = self.descs(region, offset..offset + capacity)?;
        let dst = &dst;
        let mut attempt = 0;
        loop {
            let read = self
                .router
                .routed(key_slot(key), Access::Read, Idempotent::Yes, |node| {
                    self.get_on(node, key, dst, region, offset, capacity)
                })
                .await;
            match read {
                Err(Error::Stale(_)) if attempt < self.cfg.retry_attempts => {
                    attempt += 1;
                    backoff(attempt).await;
                }
                other => return other,
            }
        }
    }

    /// GET with a destination on `node`, the read, and the release.
    async fn get_on(
        &self,
        node: Arc<Node>,
        key: &[u8],
        dst: &Descs,
        region: &Region,
        offset: usize,
        capacity: usize,
    ) -> Result<usize> {
        let link = node.cma_link();
        let retries = self.cfg.retry_attempts;
        if link.is_none() && self.splits(&node, capacity) {
            // Boxed: off by default, and inline it would double the size
            // of every GET's future (8 KiB), which each call moves.
            match Box::pin(self.get_halves(&node, key, dst, region, offset, capacity)).await {
                Err(Error::Server { code, msg }) if code == "ERR" && msg.contains("syntax") => {
                    node.refuse_ranges()
                }
                // A write landed between the two halves: the value again,
                // whole, in one reply.
                Err(Error::Stale(_)) => {}
                other => return other,
            }
        }
        let sent = std::time::Instant::now();
        let first = dst.pick(link.is_some()).as_bytes();
        let inline = self.inline_option(link.is_some(), false);
        let get = |desc| get_args(key, desc, &inline);
        let sink = inline.as_ref().map(|_| sink(region, offset, capacity));
        let reply = match node
            .call_placed(&get(first), sink, Idempotent::Yes, retries)
            .await
        {
            // The connection was replaced by one without CMA meanwhile.
            Err(Error::Server { code, .. }) if code == "NOCMA" => {
                let net = dst.net.as_bytes();
                node.call_placed(&get(net), sink, Idempotent::Yes, retries)
                    .await
            }
            other => other,
        }?;
        let lease = match Got::parse(reply)? {
            Got::Placed(len) => return Ok(len),
            Got::Inline(bytes) => return copy_inline(&bytes, region, offset, capacity),
            Got::Lease(lease) => lease,
        };
        let read = self.pull(link, &lease, region, offset, capacity).await;
        let live = lease.src.transport == TransportKind::Cma
            && link.is_some_and(|l| l.lease_still_live(sent.elapsed()));
        if guarded(&lease) || live {
            node.release(&[lease.id]).await;
            return read;
        }
        let live = node.release_confirmed(&[lease.id]).await?;
        if live < 1 {
            return Err(Error::Stale(
                "the lease ended before the read finished; the bytes are not trusted".into(),
            ));
        }
        read
    }

    /// A GET as its two halves, one on each of `node`'s lanes at once, each
    /// read from its socket straight into its part of the destination. The
    /// node answers every range with the value's version and length: equal
    /// versions mean one write (a write in between is `Stale`, and the
    /// caller reads the value whole). The destination fits the whole value, which the
    /// node checks first (`TooLarge`), and is at most `inline_get_max`, so
    /// the value always comes inline.
    async fn get_halves(
        &self,
        node: &Node,
        key: &[u8],
        dst: &Descs,
        region: &Region,
        offset: usize,
        capacity: usize,
    ) -> Result<usize> {
        let retries = self.cfg.retry_attempts;
        let n = self.cfg.inline_get_max.to_string();
        // The cut on a page boundary, so that each half copies whole pages.
        let cut = (capacity / 2).next_multiple_of(4096).min(capacity);
        let (cut_s, rest_s) = (cut.to_string(), (capacity - cut).to_string());
        let desc = dst.net.as_bytes();
        let first: [&[u8]; 8] = [
            b"GET",
            key,
            desc,
            b"INLINE",
            n.as_bytes(),
            b"RANGE",
            b"0",
            cut_s.as_bytes(),
        ];
        let mut second = first;
        second[6..].copy_from_slice(&[cut_s.as_bytes(), rest_s.as_bytes()]);
        let (a, b) = tokio::join!(
            node.call_lane(
                0,
                &first,
                Some(sink(region, offset, cut)),
                Idempotent::Yes,
                retries
            ),
            node.call_lane(
                1,
                &second,
                Some(sink(region, offset + cut, capacity - cut)),
                Idempotent::Yes,
                retries
            ),
        );
        let (a, b) = (range_of(a?)?, range_of(b?)?);
        if a.0 != b.0 || a.1 != b.1 {
            return Err(Error::Stale(
                "the value changed between its two halves; the bytes are not trusted".into(),
            ));
        }
        let total = a.1;
        let want = |from: usize, room: usize| (total.saturating_sub(from as u64)).min(room as u64);
        if total > capacity as u64
            || a.2 as u64 != want(0, cut)
            || b.2 as u64 != want(cut, capacity - cut)
        {
            return Err(Error::Protocol(format!(
                "ranges of {} and {} bytes for a value of {total} bytes cut at {cut}",
                a.2, b.2
            )));
        }
        Ok(total as usize)
    }
}

/// A GET's answer: where the value is, the lease pinning it, its length.
pub(crate) struct Lease {
    pub(crate) src: Descriptor,
    pub(crate) id: i64,
    pub(crate) len: u64,
}

impl Lease {
    fn parse(reply: BytesFrame) -> Result<Self> {
        let BytesFrame::Array(parts) = reply else {
            return Err(unexpected("[source, lease, len]", &reply));
        };
        let [src, id, len] = <[BytesFrame; 3]>::try_from(parts)
            .map_err(|parts| unexpected("[source, lease, len]", &BytesFrame::Array(parts)))?;
        let src = match src {
            BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Descriptor::parse(&b)
                .map_err(|e| Error::Protocol(format!("source descriptor: {e}")))?,
            other => return Err(unexpected("a source descriptor", &other)),
        };
        let id = expect_int(id)?;
        let len = expect_int(len)?;
        let len =
            u64::try_from(len).map_err(|_| Error::Protocol("negative value length".into()))?;
        if src.len != len {
            return Err(Error::Protocol(format!(
                "source descriptor of {} bytes for a value of {len}",
                src.len
            )));
        }
        Ok(Self { src, id, len })
    }
}

/// Whether a leased value fits a destination of `capacity` bytes.
pub(crate) fn fits(lease: &Lease, capacity: usize) -> Result<()> {
    if lease.len > capacity as u64 {
        return Err(Error::TooLarge(format!(
            "value of {} bytes does not fit the destination of {capacity} bytes",
            lease.len
        )));
    }
    Ok(())
}

/// What a zero-copy GET answered.
pub(crate) enum Got {
    /// A lease on the value, to read through the data plane.
    Lease(Lease),
    /// The value itself (`INLINE`: it was small), already in the
    /// destination: its length.
    Placed(usize),
    /// The value itself, in a reply buffer (it did not fit the destination,
    /// which `copy_inline` reports).
    Inline(Bytes),
}

impl Got {
    pub(crate) fn parse(reply: Reply) -> Result<Self> {
        match reply {
            Reply::Placed(len) => Ok(Got::Placed(len)),
            Reply::PlacedRange { .. } => Err(Error::Protocol(
                "a range where the whole value was asked for".into(),
            )),
            Reply::Frame(BytesFrame::BulkString(b)) => Ok(Got::Inline(b)),
            Reply::Frame(other) => Lease::parse(other).map(Got::Lease),
        }
    }
}

/// (version, value length, bytes placed) of a ranged GET's reply.
fn range_of(reply: Reply) -> Result<(u64, u64, usize)> {
    match reply {
        Reply::PlacedRange {
            version,
            total,
            len,
        } => Ok((version, total, len)),
        Reply::Placed(_) => Err(Error::Protocol(
            "a whole value where a range was asked for".into(),
        )),
        Reply::Frame(other) => Err(unexpected("a range of the value", &other)),
    }
}

/// `GET key desc`, with `INLINE n` when `inline` is set.
pub(crate) fn get_args<'a>(
    key: &'a [u8],
    desc: &'a [u8],
    inline: &'a Option<String>,
) -> Vec<&'a [u8]> {
    let mut args: Vec<&[u8]> = vec![b"GET", key, desc];
    if let Some(n) = inline {
        args.extend([b"INLINE" as &[u8], n.as_bytes()]);
    }
    args
}

/// Where a GET into `region` at `offset` (`capacity` bytes from there to
/// the region's end) may have its inline reply written by the connection.
pub(crate) fn sink(region: &Region, offset: usize, capacity: usize) -> Sink {
    debug_assert!(offset as u64 + capacity as u64 <= region.len());
    // SAFETY: the range is the region's tail from `offset` (`region_tail`
    // computed `capacity`), memory the caller lent this get exclusively
    // (`&mut Buffer`) until it returns, which outlasts the exchange.
    unsafe { Sink::new((region.addr() + offset as u64) as *mut u8, capacity) }
}

/// Copies a value that came back inline into `region` at `offset`, where
/// the GET's destination of `capacity` bytes starts.
pub(crate) fn copy_inline(
    bytes: &[u8],
    region: &Region,
    offset: usize,
    capacity: usize,
) -> Result<usize> {
    if bytes.len() > capacity {
        return Err(Error::TooLarge(format!(
            "value of {} bytes does not fit the destination of {capacity} bytes",
            bytes.len()
        )));
    }
    let end = (offset as u64).checked_add(bytes.len() as u64);
    if end.is_none_or(|end| end > region.len()) {
        return Err(Error::Invalid("range outside the buffer"));
    }
    let dst = (region.addr() + offset as u64) as *mut u8;
    // SAFETY: `[dst, dst + len)` lies in `region` (checked above), memory
    // the caller lent this get exclusively (`&mut Buffer`); `bytes` is a
    // reply buffer of ours, so the two cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    Ok(bytes.len())
}

/// Bytes of `region` from `offset` to its end.
pub(crate) fn region_tail(region: &Region, offset: usize) -> Result<usize> {
    (region.len() as usize)
        .checked_sub(offset)
        .ok_or(Error::Invalid("offset past the end of the buffer"))
}
