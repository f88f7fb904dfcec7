//! How a payload travels, chosen in one place. A PUT's bytes go in the
//! command (`SET`) over TCP when they are few, else the node pulls them
//! by a descriptor: a `cma` one where the node can read this process, else
//! the data plane's (TCP or RDMA). A GET's value comes in the reply up to
//! a bound that depends on the path (one-sided reads take over sooner) and
//! on whether it is one of a batch, else as a lease whose source this
//! client reads by cross-memory attach or over the data plane; over TCP a
//! large one may come as two ranges on two lanes. Whether a read needs its
//! lease confirmed depends on the path too (`guarded`). This module sends
//! no command: the operations send them, as it chose.

use std::ops::Range;

use strata_rdma::{Descriptor, Region, Transport, TransportKind};

use super::get::{fits, Lease};
use crate::cma::Link;
use crate::config::{BATCH_INLINE_GET_MAX, ONE_SIDED_INLINE_GET_MAX};
use crate::node::Node;
use crate::{Client, Error, Result};

/// A buffer range named for a PUT or GET: by the network data plane, and
/// by cross-memory attach where this process may use it.
pub(crate) struct Descs {
    pub(crate) net: String,
    cma: Option<String>,
}

impl Descs {
    /// The one to send: the `cma` one when `cma` (the node reads this
    /// process by cross-memory attach) and there is one, else the network's.
    pub(crate) fn pick(&self, cma: bool) -> &str {
        match (&self.cma, cma) {
            (Some(c), true) => c,
            _ => &self.net,
        }
    }
}

impl Client {
    /// The data plane's descriptor of `region[range]`, checked to lie in it.
    pub(crate) fn describe(&self, region: &Region, range: Range<usize>) -> Result<Descriptor> {
        if range.start > range.end {
            return Err(Error::Invalid("range start after its end"));
        }
        let len = (range.end - range.start) as u64;
        self.transport
            .describe(region, range.start as u64, len, None)
            .map_err(|_| Error::Invalid("range outside the buffer"))
    }

    /// The descriptors of `region[range]`: the data plane's, and a `cma`
    /// one when this process may use cross-memory attach.
    pub(crate) fn descs(&self, region: &Region, range: Range<usize>) -> Result<Descs> {
        let net = self.describe(region, range)?;
        let cma = self
            .router
            .cma
            .as_ref()
            .map(|l| l.describe(net.addr, net.len, net.rkey).to_string());
        Ok(Descs {
            net: net.to_string(),
            cma,
        })
    }

    /// The text of `net`'s descriptor, or of its `cma` twin when `cma` and
    /// this process may use cross-memory attach (as [`Descs::pick`]).
    pub(crate) fn desc_text(&self, net: &Descriptor, cma: bool) -> String {
        match self.router.cma.as_ref().filter(|_| cma) {
            Some(l) => l.describe(net.addr, net.len, net.rkey).to_string(),
            None => net.to_string(),
        }
    }

    /// The bytes of a PUT of `region[range]` that goes inline over TCP
    /// (see [`ClientConfig::inline_put_max`]); `None` when it goes by a
    /// one-sided read. `range` lies in `region` (`descs` checked it).
    pub(crate) fn inline_put<'a>(
        &self,
        region: &'a Region,
        range: Range<usize>,
    ) -> Option<&'a [u8]> {
        if !self.transport.kind().over_tcp() {
            return None;
        }
        // A TLS client without a certificate serves no pulls: everything
        // goes inline, bounded by the node's max_request_size.
        let serves_pulls = self.cfg.tls.as_ref().is_none_or(|t| t.cert_file.is_some());
        if serves_pulls && range.len() as u64 > self.cfg.inline_put_max {
            return None;
        }
        let start = (region.addr() + range.start as u64) as *const u8;
        // SAFETY: `range` lies inside `region` (checked by `descs`), memory
        // registered for transfers and valid for reads while `region` is
        // borrowed; the caller lent it to this put, as for the node's pull.
        Some(unsafe { std::slice::from_raw_parts(start, range.len()) })
    }

    /// The `INLINE` argument of zero-copy GETs to a node, if any: `cma`
    /// when its reads go by cross-memory attach, `batch` for `get_many`.
    pub(crate) fn inline_option(&self, cma: bool, batch: bool) -> Option<String> {
        let mut max = self.cfg.inline_get_max;
        if cma || self.transport.kind() == TransportKind::Rdma {
            max = max.min(ONE_SIDED_INLINE_GET_MAX);
        }
        if batch {
            max = max.min(BATCH_INLINE_GET_MAX);
        }
        (max > 0).then(|| max.to_string())
    }

    /// Whether a single GET into `capacity` bytes from `node` goes as two
    /// ranges (see [`ClientConfig::split_get_min`]).
    pub(crate) fn splits(&self, node: &Node, capacity: usize) -> bool {
        let capacity = capacity as u64;
        self.transport.kind().over_tcp()
            && self.cfg.split_get_min > 0
            && capacity >= self.cfg.split_get_min
            && capacity <= self.cfg.inline_get_max
            && node.ranges()
    }

    /// Reads a leased source into `region` at `offset`: by cross-memory
    /// attach from the node's process (`link`) for a `cma` source.
    pub(crate) async fn pull(
        &self,
        link: Option<Link>,
        lease: &Lease,
        region: &Region,
        offset: usize,
        capacity: usize,
    ) -> Result<usize> {
        let len = lease.len;
        fits(lease, capacity)?;
        if lease.src.transport == TransportKind::Cma {
            self.cma_pull(link, lease, region, offset)?;
        } else if len > 0 {
            self.transport
                .read(&lease.src, region, offset as u64)
                .await?;
        }
        Ok(len as usize)
    }

    /// Copies a `cma` source (already checked to fit) out of the node.
    pub(crate) fn cma_pull(
        &self,
        link: Option<Link>,
        lease: &Lease,
        region: &Region,
        offset: usize,
    ) -> Result<()> {
        let (Some(local), Some(link)) = (self.router.cma.as_ref(), link) else {
            return Err(Error::Protocol(
                "a cma source from a node this connection has no cma with".into(),
            ));
        };
        if lease.len == 0 {
            return Ok(());
        }
        let end = (offset as u64).checked_add(lease.len);
        if end.is_none_or(|end| end > region.len()) {
            return Err(Error::Invalid("range outside the buffer"));
        }
        let dst = (region.addr() + offset as u64) as *mut u8;
        // SAFETY: `[dst, dst + len)` lies in `region` (checked above),
        // memory the caller lent this get exclusively (`&mut Buffer`).
        unsafe { local.read(link, &lease.src, dst) }
    }
}

/// Whether a read of `lease` was checked by the node as it was served
/// (TCP: a read after the lease ended fails with STALE). Over RDMA the
/// node cannot see the read: the bytes count only if RELEASE confirms the
/// lease was still live, i.e. the value stayed pinned for the whole read.
/// That costs one round trip per GET (or batch). Over CMA the same holds,
/// except that a read which ended well within the lease's TTL (the node's
/// clock is this host's) needs no confirmation (`Link::lease_still_live`).
pub(crate) fn guarded(lease: &Lease) -> bool {
    lease.src.transport.over_tcp()
}
