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
    #[serde(rename = "GBps")]
    pub gbps: f64,
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
