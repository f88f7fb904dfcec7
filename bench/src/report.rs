//! Per-(size, op) results: latency histograms merged from all tasks, the
//! human table and the JSON lines every comparison script reads.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds up to this (a minute).
const LATENCY_US_MAX: u64 = 60_000_000;

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("static histogram bounds are valid")
}

/// One output line; field names are the schema shared with
/// `mooncake_bench.py` and `compare.sh`.
#[derive(Debug, Serialize)]
pub struct Row {
    pub system: String,
    pub scenario: String,
    pub api: String,
    pub threads: usize,
    pub procs: usize,
    pub size: usize,
    pub op: String,
    pub n: u64,
    pub secs: f64,
    pub ops_s: f64,
    /// Bytes over the phase's wall-clock time: includes the bench's own
    /// filling and checking of every value between calls.
    #[serde(rename = "GBps")]
    pub gbps: f64,
    /// Bytes over the time spent inside the calls (`threads × batch ×
    /// size / mean_us`): what the system moves, without the bench's work
    /// between calls. The figure to set beside a ceiling that does no such
    /// work (iperf3, a bare `process_vm_readv` loop).
    #[serde(rename = "busy_GBps")]
    pub busy_gbps: f64,
    /// Mean latency of one call (a whole batch for batched calls).
    pub mean_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub errors: u64,
    pub mismatches: u64,
}

pub struct RowMeta<'a> {
    pub system: &'a str,
    pub scenario: &'a str,
    pub api: &'a str,
    pub threads: usize,
    pub size: usize,
    /// Values per call.
    pub batch: usize,
}

impl Row {
    pub fn new(
        meta: &RowMeta<'_>,
        op: &str,
        hist: &Histogram<u64>,
        secs: f64,
        errors: u64,
        mismatches: u64,
    ) -> Self {
        let n = hist.len();
        let secs = secs.max(1e-9);
        // Each call's latency is recorded once per value it moved, so the
        // mean is a call's.
        let mean_us = hist.mean();
        let busy_gbps = if mean_us > 0.0 {
            (meta.threads * meta.batch.max(1) * meta.size) as f64 / mean_us / 1e3
        } else {
            0.0
        };
        Self {
            system: meta.system.to_owned(),
            scenario: meta.scenario.to_owned(),
            api: meta.api.to_owned(),
            threads: meta.threads,
            procs: 1,
            size: meta.size,
            op: op.to_owned(),
            n,
            secs,
            ops_s: n as f64 / secs,
            gbps: n as f64 * meta.size as f64 / secs / 1e9,
            busy_gbps,
            mean_us,
            p50_us: hist.value_at_quantile(0.5),
            p99_us: hist.value_at_quantile(0.99),
            p999_us: hist.value_at_quantile(0.999),
            errors,
            mismatches,
        }
    }
}

pub fn print_header() {
    println!(
        "{:<8} {:<10} {:<8} {:>3} {:>9} {:<4} {:>8} {:>7} {:>10} {:>7} {:>8} {:>8} {:>8} {:>6}",
        "system",
        "scenario",
        "api",
        "c",
        "size",
        "op",
        "n",
        "secs",
        "ops/s",
        "GB/s",
        "p50us",
        "p99us",
        "p999us",
        "errors"
    );
}

pub fn print_row(r: &Row) {
    println!(
        "{:<8} {:<10} {:<8} {:>3} {:>9} {:<4} {:>8} {:>7.2} {:>10.0} {:>7.3} {:>8} {:>8} {:>8} {:>6}",
        r.system,
        r.scenario,
        r.api,
        r.threads,
        show_size(r.size),
        r.op,
        r.n,
        r.secs,
        r.ops_s,
        r.gbps,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.errors + r.mismatches
    );
}

pub fn show_size(n: usize) -> String {
    for (unit, size) in [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    format!("{n}B")
}
