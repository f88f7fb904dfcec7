//! The live figures on a phase's progress bar: GB/s and p99 latency over the
//! last second, next to indicatif's ops and ops/s. They exist only while the
//! bar is drawn (stderr is a terminal); otherwise workers never touch them
//! and the report is the only output.
//!
//! Cost on the hot path, which is why it looks like this: bytes need nothing
//! new, since every value is `size` bytes and the phase already counts values
//! done. Latencies go into a worker-local buffer, and the worker takes the one
//! shared mutex only every [`FLUSH_SAMPLES`] operations or [`FLUSH_INTERVAL`],
//! to record the buffer into the shared window histogram (64 O(1) records,
//! well under a microsecond held) — one lock per 64 operations of tens of
//! microseconds or more. `hdrhistogram::sync` was the alternative; its
//! refresh waits for each recorder's next record, so one worker stuck on a
//! slow 16 MiB transfer would stall the bar.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report;

/// A worker flushes its latencies after this many operations ...
const FLUSH_SAMPLES: usize = 64;
/// ... or after this long, so slow operations still show within a window.
const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// The figures cover this much of the recent past.
const WINDOW: Duration = Duration::from_secs(1);

/// Shared by a phase's workers and its ticker.
pub struct Live {
    /// Bytes per value.
    size: u64,
    /// Latencies (µs, one per value) recorded since the last window closed.
    recent: Mutex<Histogram<u64>>,
    /// When the current window opened and the values done then; only the
    /// ticker uses it.
    window: Mutex<(Instant, u64)>,
}

impl Live {
    pub fn new(size: usize) -> Self {
        Self {
            size: size as u64,
            recent: Mutex::new(report::histogram()),
            window: Mutex::new((Instant::now(), 0)),
        }
    }

    /// Called by the ticker with the phase's values done: once a window has
    /// passed, the figures over it (and a new window opens), else `None`.
    pub fn tick(&self, done: u64) -> Option<String> {
        let mut window = self.window.lock().ok()?;
        let (opened, done_then) = *window;
        let secs = opened.elapsed();
        if secs < WINDOW {
            return None;
        }
        *window = (Instant::now(), done);
        drop(window);
        let mut recent = self.recent.lock().ok()?;
        let p99 = (!recent.is_empty()).then(|| recent.value_at_quantile(0.99));
        recent.reset();
        drop(recent);
        let bytes = done.saturating_sub(done_then) * self.size;
        Some(figures(bytes, secs, p99))
    }
}

/// `1.23 GB/s p99 456µs`; p99 `-` when nothing finished in the window.
fn figures(bytes: u64, over: Duration, p99_us: Option<u64>) -> String {
    let gbps = bytes as f64 / over.as_secs_f64().max(1e-9) / 1e9;
    let p99 = match p99_us {
        None => "-".to_owned(),
        Some(us) if us < 1_000 => format!("{us}µs"),
        Some(us) if us < 1_000_000 => format!("{:.1}ms", us as f64 / 1e3),
        Some(us) => format!("{:.2}s", us as f64 / 1e6),
    };
    format!("{gbps:.2} GB/s p99 {p99}")
}

/// One worker's latencies not yet in the shared window.
pub struct Samples {
    /// (latency µs, values it covers).
    buf: Vec<(u64, u64)>,
    since: Instant,
}

impl Samples {
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(FLUSH_SAMPLES),
            since: Instant::now(),
        }
    }

    pub fn record(&mut self, live: &Live, us: u64, values: u64) {
        self.buf.push((us.max(1), values));
        if self.buf.len() >= FLUSH_SAMPLES || self.since.elapsed() >= FLUSH_INTERVAL {
            self.flush(live);
        }
    }

    fn flush(&mut self, live: &Live) {
        // A poisoned lock means a worker panicked; the run fails anyway and
        // the bar may go without its figures.
        if let Ok(mut recent) = live.recent.lock() {
            for &(us, values) in &self.buf {
                let _ = recent.record_n(us, values);
            }
        }
        self.buf.clear();
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_show_gb_per_second_and_p99_in_readable_units() {
        let s = Duration::from_secs(1);
        assert_eq!(figures(2_500_000_000, s, Some(456)), "2.50 GB/s p99 456µs");
        assert_eq!(figures(0, s, Some(12_345)), "0.00 GB/s p99 12.3ms");
        assert_eq!(
            figures(1_000_000_000, s * 2, Some(2_500_000)),
            "0.50 GB/s p99 2.50s"
        );
        assert_eq!(figures(0, s, None), "0.00 GB/s p99 -");
    }

    #[test]
    fn a_window_reports_only_what_finished_in_it() {
        let live = Live::new(1 << 20);
        let mut samples = Samples::new();
        for _ in 0..FLUSH_SAMPLES {
            samples.record(&live, 800, 1);
        }
        assert_eq!(live.tick(64), None, "a window is a second long");
        *live.window.lock().unwrap() = (Instant::now() - WINDOW, 0);
        let first = live.tick(64).expect("the window has passed");
        assert!(first.ends_with("p99 800µs"), "{first}");
        *live.window.lock().unwrap() = (Instant::now() - WINDOW, 64);
        let second = live.tick(64).expect("the window has passed");
        assert!(second.starts_with("0.00 GB/s p99 -"), "{second}");
    }
}
