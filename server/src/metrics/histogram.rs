//! Histograms kept as counts per bucket, rendered in the Prometheus text
//! format next to the exporter's output.
//!
//! The exporter's own histograms keep every observation (the value and a
//! timestamp, in blocks allocated as they fill) until an upkeep folds
//! them into buckets: an allocation every few dozen commands, and memory
//! that grows with the request rate between upkeeps, which showed in the
//! bytes per key `bench/index-memory.sh` measures
//! (docs/bench-notes/memory-per-key.md). Here recording
//! is two relaxed atomic adds into a fixed array, and memory never grows.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// One histogram series: its labels, counts per bucket (not cumulative;
/// the last one is `+Inf`) and the sum of what was recorded, in integer
/// units.
#[derive(Debug)]
pub struct Histogram {
    /// `k="v",` pairs, as rendered inside the braces (empty for none).
    labels: Box<str>,
    /// Upper bounds in units, ascending.
    limits: Box<[u64]>,
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    /// Buckets with upper bounds `bounds` (ascending, in the exported
    /// unit), recorded in units of `1 / scale` of it (1e9 for seconds
    /// recorded as nanoseconds).
    fn new(labels: String, bounds: &[f64], scale: f64) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            labels: labels.into(),
            limits: bounds.iter().map(|b| (b * scale).round() as u64).collect(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Counts one observation of `units`.
    pub fn record(&self, units: u64) {
        // Most observations fall in the first few buckets, where a forward
        // scan over the 13-18 bounds stops at once.
        let i = self
            .limits
            .iter()
            .position(|&l| units <= l)
            .unwrap_or(self.limits.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum.fetch_add(units, Relaxed);
    }

    /// Counts one duration, for a histogram in seconds made with scale 1e9.
    pub fn record_duration(&self, d: Duration) {
        self.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// Several series of one metric (one per label set), with its help text,
/// rendered as one family.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    bounds: &'static [f64],
    scale: f64,
}

impl Family {
    pub const fn new(
        name: &'static str,
        help: &'static str,
        bounds: &'static [f64],
        scale: f64,
    ) -> Family {
        Family {
            name,
            help,
            bounds,
            scale,
        }
    }

    /// A series of this family with `labels`, written as `k="v",` pairs
    /// (empty for none).
    pub fn series(&self, labels: String) -> Histogram {
        Histogram::new(labels, self.bounds, self.scale)
    }

    /// Appends the family to `out`, made of `series` (all of this family).
    pub fn render<'a>(&self, out: &mut String, series: impl IntoIterator<Item = &'a Histogram>) {
        let name = self.name;
        let _ = writeln!(out, "# HELP {name} {}", self.help);
        let _ = writeln!(out, "# TYPE {name} histogram");
        for h in series {
            let labels = &h.labels;
            // Counts are read one by one while others may record: a
            // scrape may see an observation in a bucket and not yet in
            // another's total, never a count that goes down.
            let mut cumulative = 0u64;
            for (bound, count) in self.bounds.iter().zip(h.counts.iter()) {
                cumulative += count.load(Relaxed);
                let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
            }
            cumulative += h.counts[self.bounds.len()].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
            let sum = h.sum.load(Relaxed) as f64 / self.scale;
            let braced = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.trim_end_matches(','))
            };
            let _ = writeln!(out, "{name}_sum{braced} {sum}");
            let _ = writeln!(out, "{name}_count{braced} {cumulative}");
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_render_cumulative() {
        const BOUNDS: &[f64] = &[1e-5, 1e-3, 1.0];
        let fam = Family::new("t_seconds", "Test.", BOUNDS, 1e9);
        let h = fam.series("cmd=\"get\",".to_string());
        h.record_duration(Duration::from_micros(10)); // on the first bound
        h.record_duration(Duration::from_micros(11));
        h.record_duration(Duration::from_millis(2));
        h.record_duration(Duration::from_secs(5)); // +Inf
        let mut out = String::new();
        fam.render(&mut out, [&h]);
        let want = "# HELP t_seconds Test.\n# TYPE t_seconds histogram\n\
            t_seconds_bucket{cmd=\"get\",le=\"0.00001\"} 1\n\
            t_seconds_bucket{cmd=\"get\",le=\"0.001\"} 2\n\
            t_seconds_bucket{cmd=\"get\",le=\"1\"} 3\n\
            t_seconds_bucket{cmd=\"get\",le=\"+Inf\"} 4\n\
            t_seconds_sum{cmd=\"get\"} 5.002021\n\
            t_seconds_count{cmd=\"get\"} 4\n\n";
        assert_eq!(out, want);
    }

    #[test]
    fn a_series_without_labels_renders_bare() {
        const BOUNDS: &[f64] = &[0.0, 2.0];
        let fam = Family::new("t_blocks", "Blocks.", BOUNDS, 1.0);
        let h = fam.series(String::new());
        h.record(0);
        h.record(3);
        let mut out = String::new();
        fam.render(&mut out, [&h]);
        assert!(out.contains("t_blocks_bucket{le=\"0\"} 1\n"), "{out}");
        assert!(out.contains("t_blocks_bucket{le=\"2\"} 1\n"), "{out}");
        assert!(out.contains("t_blocks_bucket{le=\"+Inf\"} 2\n"), "{out}");
        assert!(out.contains("t_blocks_sum 3\n"), "{out}");
        assert!(out.contains("t_blocks_count 2\n"), "{out}");
    }
}
