//! Polling for a reply instead of sleeping: each exchange with a node
//! polls its sockets until a window passes with nothing arriving (see
//! `strata_rdma::spin`). Before the reply begins the window is
//! `ClientConfig::spin_us` (opt-in), once it is arriving
//! `stream_spin_us` (on by default). The node's side of the same waits
//! are its `busy_poll_us` and `stream_poll_us`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Most a call may spin (`spin_us`, `stream_spin_us` ≤ 1000).
pub const SPIN_MAX: Duration = Duration::from_millis(1);

/// `ClientConfig::stream_spin_us` unless set.
pub const DEFAULT_STREAM_SPIN_US: u64 = strata_rdma::spin::STREAM_US_DEFAULT;

/// `ClientConfig::echo_spin_us` unless set.
pub const DEFAULT_ECHO_SPIN_US: u64 = strata_rdma::spin::ECHO_US_DEFAULT;

/// The polling windows of a client's exchanges with a node.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Windows {
    /// `ClientConfig::spin_us`: before a reply begins.
    pub spin: Duration,
    /// `ClientConfig::stream_spin_us`: once it is arriving.
    pub stream: Duration,
    /// `ClientConfig::echo_spin_us`: the cap on the wait after a long
    /// request write (see `strata_rdma::spin::echo`).
    pub echo: Duration,
}

impl Windows {
    pub(crate) fn of(cfg: &crate::ClientConfig) -> Self {
        Self {
            spin: Duration::from_micros(cfg.spin_us),
            stream: Duration::from_micros(cfg.stream_spin_us),
            echo: Duration::from_micros(cfg.echo_spin_us),
        }
    }

    /// How long to poll for an exchange's first reply bytes: `spin`, or
    /// after a request write that took `wrote`, as long again (up to
    /// `echo`), or while `few` exchanges are in flight (see
    /// [`InFlight::few`]), as long as reading the `expected` bytes the
    /// replies may bring into their buffers will take (up to `echo`).
    ///
    /// A large GET's request is short, but its reply keeps the thread
    /// busy about as long as a large PUT's payload does, so the wait for
    /// its first bytes is worth polling through as the wait for a large
    /// PUT's `+OK` is: the caller then no longer sleeps once per large GET
    /// (docs/bench-notes/polling-after-a-transfer.md).
    pub(crate) fn reply_wait(&self, wrote: Duration, expected: usize, few: bool) -> Duration {
        use strata_rdma::spin::{copy_time, echo};
        let mut wait = self.spin.max(echo(wrote, self.echo));
        if few {
            wait = wait.max(echo(copy_time(expected as u64), self.echo));
        }
        wait
    }
}

/// Runs `f`, spinning while it keeps being woken within `spin` (before
/// its first wake-up) or `stream` (after it) when a quarter of the cores
/// (shared by every client of this process) are not spinning already.
/// `f` comes pinned so that only the caller holds it (see
/// `Spinner::run`).
pub(crate) async fn spun<F: Future + ?Sized>(
    f: Pin<&mut F>,
    spin: Duration,
    stream: Duration,
) -> F::Output {
    strata_rdma::spin::shared()
        .run(f, spin, stream, || {})
        .await
        .0
}

/// Exchanges with nodes now in flight in this process, over all clients.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts an exchange as in flight from its creation to its drop.
pub(crate) struct InFlight(());

impl InFlight {
    pub(crate) fn enter() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        Self(())
    }

    /// Whether few enough exchanges are in flight now that a thread
    /// waiting for this one's reply would otherwise go idle: no more than
    /// may spin at once (a quarter of the cores). With more, the threads
    /// find other replies to read while this one's is on its way, and
    /// polling for it only takes turns from them
    /// (docs/bench-notes/polling-after-a-transfer.md).
    pub(crate) fn few(&self) -> bool {
        IN_FLIGHT.load(Ordering::Acquire) <= strata_rdma::spin::shared().cap()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    fn windows(spin: u64) -> Windows {
        Windows {
            spin: Duration::from_micros(spin),
            stream: 50 * US,
            echo: 200 * US,
        }
    }

    #[test]
    fn a_large_reply_expected_is_polled_for_as_long_as_reading_it_takes() {
        let w = windows(0);
        // 256 KiB at about 4 GB/s: 64 µs; 1 MiB and more: the cap.
        assert_eq!(w.reply_wait(US, 256 << 10, true), 64 * US);
        assert_eq!(w.reply_wait(US, 1 << 20, true), 200 * US);
        assert_eq!(w.reply_wait(US, 64 << 20, true), 200 * US);
        // Too short a read to poll for, as too short a write is.
        assert_eq!(w.reply_wait(US, 64 << 10, true), Duration::ZERO);
        assert_eq!(w.reply_wait(10 * US, 0, true), Duration::ZERO);
        // Without `echo_spin_us`, nothing.
        let off = Windows {
            echo: Duration::ZERO,
            ..w
        };
        assert_eq!(off.reply_wait(300 * US, 1 << 20, true), Duration::ZERO);
    }

    #[test]
    fn with_many_exchanges_in_flight_only_the_write_counts() {
        let w = windows(0);
        assert_eq!(w.reply_wait(US, 1 << 20, false), Duration::ZERO);
        assert_eq!(w.reply_wait(40 * US, 1 << 20, false), 40 * US);
        // `spin_us` applies whatever else is in flight.
        assert_eq!(windows(30).reply_wait(US, 1 << 20, false), 30 * US);
        assert_eq!(windows(300).reply_wait(US, 1 << 20, true), 300 * US);
    }

    #[test]
    fn more_exchanges_in_flight_than_may_spin_are_not_few() {
        let cap = strata_rdma::spin::shared().cap();
        let held: Vec<InFlight> = (0..=cap).map(|_| InFlight::enter()).collect();
        assert!(!held[0].few());
    }
}
