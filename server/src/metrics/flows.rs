//! What flows through the node: payload transfers by direction and
//! transport, and the prefix lookups engines make. Like the rest of the
//! metrics, plain atomics are the source (INFO reads them), histograms
//! included ([`super::histogram`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use metrics::{Counter, Key, Label, Recorder, Unit};
use strata_rdma::TransportKind;

use super::histogram::{Family, Histogram};
use super::{LATENCY_BUCKETS, META};

static TRANSFER_SECONDS: Family = Family::new(
    "strata_transfer_seconds",
    "Time of one transfer (a PUT's pull, an MPUT batch's pulls, a replica pull; for out: from the GET's lease to its RELEASE), by direction and transport.",
    LATENCY_BUCKETS,
    1e9,
);

static PREFIX_RUN_BLOCKS: Family = Family::new(
    "strata_prefix_run_blocks",
    "Blocks found per PREFIX lookup (the length of the stored run).",
    RUN_BUCKETS,
    1.0,
);

/// Which way a payload moved, as the node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Pulled by this node for a client's `PUT`/`MPUT`.
    In,
    /// Handed to a client's zero-copy `GET` (the client reads it).
    Out,
    /// Pulled by this node as a replica copy (`STRATA.REPLICATE`, repair).
    Replica,
}

impl Direction {
    pub const ALL: [Direction; 3] = [Direction::In, Direction::Out, Direction::Replica];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::Replica => "replica",
        }
    }
}

pub const TRANSPORTS: [TransportKind; 4] = [
    TransportKind::Tcp,
    TransportKind::Tls,
    TransportKind::Rdma,
    TransportKind::Cma,
];

fn transport_name(t: TransportKind) -> &'static str {
    match t {
        TransportKind::Tcp => "tcp",
        TransportKind::Tls => "tls",
        TransportKind::Rdma => "rdma",
        TransportKind::Cma => "cma",
    }
}

/// One (direction, transport) pair.
#[derive(Debug)]
pub struct Flow {
    pub direction: Direction,
    pub transport: &'static str,
    pub transfers: AtomicU64,
    pub bytes: AtomicU64,
    pub usec: AtomicU64,
    bytes_out: Counter,
    seconds: Histogram,
}

/// Every (direction, transport) pair, registered at start so each series
/// exists (at 0) before the first transfer: dashboards see flat lines, not
/// gaps.
#[derive(Debug)]
pub struct Transfers {
    flows: Vec<Flow>,
}

impl Transfers {
    pub(super) fn register(r: &impl Recorder) -> Transfers {
        r.describe_counter(
            "strata_transfer_bytes_total".into(),
            Some(Unit::Bytes),
            "Payload bytes moved by the data plane, by direction (in: pulled for PUT, out: leased to GET, replica: pulled as a replica copy) and transport.".into(),
        );
        let mut flows = Vec::with_capacity(Direction::ALL.len() * TRANSPORTS.len());
        for direction in Direction::ALL {
            for t in TRANSPORTS {
                let labels = || {
                    vec![
                        Label::new("direction", direction.as_str()),
                        Label::new("transport", transport_name(t)),
                    ]
                };
                flows.push(Flow {
                    direction,
                    transport: transport_name(t),
                    transfers: AtomicU64::new(0),
                    bytes: AtomicU64::new(0),
                    usec: AtomicU64::new(0),
                    bytes_out: r.register_counter(
                        &Key::from_parts("strata_transfer_bytes_total", labels()),
                        &META,
                    ),
                    seconds: TRANSFER_SECONDS.series(format!(
                        "direction=\"{}\",transport=\"{}\",",
                        direction.as_str(),
                        transport_name(t)
                    )),
                });
            }
        }
        Transfers { flows }
    }

    fn flow(&self, direction: Direction, transport: TransportKind) -> &Flow {
        let d = Direction::ALL.iter().position(|&x| x == direction);
        let t = TRANSPORTS.iter().position(|&x| x == transport);
        &self.flows[d.unwrap_or(0) * TRANSPORTS.len() + t.unwrap_or(0)]
    }

    /// Counts one transfer of `bytes` that took `elapsed`.
    pub fn record(
        &self,
        direction: Direction,
        transport: TransportKind,
        bytes: u64,
        elapsed: Duration,
    ) {
        let f = self.flow(direction, transport);
        f.transfers.fetch_add(1, Relaxed);
        f.bytes.fetch_add(bytes, Relaxed);
        f.usec.fetch_add(elapsed.as_micros() as u64, Relaxed);
        f.seconds.record_duration(elapsed);
    }

    /// Counts bytes whose time is recorded later (a GET's lease: its time
    /// is known at RELEASE).
    pub fn add_bytes(&self, direction: Direction, transport: TransportKind, bytes: u64) {
        let f = self.flow(direction, transport);
        f.transfers.fetch_add(1, Relaxed);
        f.bytes.fetch_add(bytes, Relaxed);
    }

    /// The time of a transfer counted by [`Transfers::add_bytes`].
    pub fn add_time(&self, direction: Direction, transport: TransportKind, elapsed: Duration) {
        let f = self.flow(direction, transport);
        f.usec.fetch_add(elapsed.as_micros() as u64, Relaxed);
        f.seconds.record_duration(elapsed);
    }

    pub fn flows(&self) -> &[Flow] {
        &self.flows
    }

    pub(super) fn export(&self) {
        for f in &self.flows {
            f.bytes_out.absolute(f.bytes.load(Relaxed));
        }
    }

    pub(super) fn render(&self, out: &mut String) {
        TRANSFER_SECONDS.render(out, self.flows.iter().map(|f| &f.seconds));
    }
}

/// Runs found by `PREFIX`: how much of a prompt's chain of blocks was
/// already stored.
#[derive(Debug)]
pub struct Prefixes {
    pub lookups: AtomicU64,
    /// Blocks asked for (keys named), over all lookups.
    pub requested: AtomicU64,
    /// Blocks found (the length of each run), over all lookups.
    pub found: AtomicU64,
    lookups_out: Counter,
    requested_out: Counter,
    found_out: Counter,
    run: Histogram,
}

/// Bucket bounds of `strata_prefix_run_blocks`: engines ask for chains of
/// up to a few thousand blocks.
pub const RUN_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

impl Prefixes {
    pub(super) fn register(r: &impl Recorder) -> Prefixes {
        let counter = |name: &'static str, help: &'static str| {
            r.describe_counter(name.into(), Some(Unit::Count), help.into());
            r.register_counter(&Key::from_name(name), &META)
        };
        Prefixes {
            lookups: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            found: AtomicU64::new(0),
            lookups_out: counter("strata_prefix_lookups_total", "PREFIX lookups."),
            requested_out: counter(
                "strata_prefix_blocks_requested_total",
                "Blocks (keys) named by PREFIX lookups.",
            ),
            found_out: counter(
                "strata_prefix_blocks_found_total",
                "Blocks PREFIX lookups found stored, from the first: found / requested is the prefix hit rate.",
            ),
            run: PREFIX_RUN_BLOCKS.series(String::new()),
        }
    }

    /// One lookup of `requested` blocks that found the first `found`.
    pub fn record(&self, requested: usize, found: usize) {
        self.lookups.fetch_add(1, Relaxed);
        self.requested.fetch_add(requested as u64, Relaxed);
        self.found.fetch_add(found as u64, Relaxed);
        self.run.record(found as u64);
    }

    pub(super) fn export(&self) {
        self.lookups_out.absolute(self.lookups.load(Relaxed));
        self.requested_out.absolute(self.requested.load(Relaxed));
        self.found_out.absolute(self.found.load(Relaxed));
    }

    pub(super) fn render(&self, out: &mut String) {
        PREFIX_RUN_BLOCKS.render(out, [&self.run]);
    }
}
