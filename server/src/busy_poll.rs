//! Opt-in busy polling of client connections (`busy_poll_us`).
//!
//! Between one request and the next, a connection normally sleeps until
//! the kernel says its socket is readable, and the runtime thread that
//! serves it sleeps in `epoll_wait` if nothing else is runnable. Waking
//! that thread is the largest fixed cost of a small request on a virtual
//! machine whose idle vCPUs halt at once (and on hosts whose idle cores
//! drop into deep C-states): a small call waits for two such wake-ups, the
//! node's for the request and the client's for the reply, and there they
//! are most of its time; a large call's waits are inside the transfer
//! (docs/bench-notes/waking-sleeping-cpus.md).
//!
//! With `busy_poll_us` > 0, a connection that has answered everything it
//! was sent polls its socket until that long passes with nothing arriving,
//! and only then sleeps: each
//! turn yields to the runtime, which polls its I/O driver with a zero
//! timeout before it runs yielded tasks, then tries the read again
//! (`strata_rdma::spin`, shared with the client's `spin_us`). So the
//! thread never sleeps while requests keep coming closer together than
//! that, at the price of a busy core while they do.
//!
//! At most `Spinner::cap` connections spin at once (a quarter of the
//! runtime's threads, at least one): each spinning connection can keep a
//! runtime thread from sleeping, and the others must keep room for the
//! work. The rest wait as usual.
//!
//! `stream_poll_us` (on by default, 50 µs) is the same polling in the
//! middle of a long request only: once a read has brought 16 KiB or more
//! of a request still incomplete, the connection polls for the rest
//! instead of sleeping between its bursts. It never polls while nothing
//! is coming, so it costs a core only while a transfer runs, and spares a
//! large PUT the sleeps between its bursts
//! (docs/bench-notes/polling-mid-transfer.md). It shares the slots with
//! `busy_poll_us`.
//!
//! `echo_poll_us` (on by default, at most 200 µs) polls between requests,
//! but only after one that took 20 µs or more from its first bytes to its
//! reply written, and only for as long again as it took
//! (`strata_rdma::spin::echo`): a client that has just received a long
//! reply, or had a long request taken in, sends its next one about that
//! soon if it is in a loop of them. So polling costs at most the CPU the
//! transfer itself did, and only right after one; small requests are left
//! to `busy_poll_us`. Values leased to the client for it to read itself
//! (cross-memory attach, the TCP data plane) count as that transfer too,
//! at about 4 GB/s: its next request follows once it has read them. A
//! short request answered inside the window (the RELEASE a client sends
//! once it has read a leased value) leaves the window open
//! ([`EchoWindow`]).
//! With it and the client's half (`echo_spin_us`), a loop of large calls
//! no longer puts a wake-up of the node's thread on every call
//! (docs/bench-notes/polling-after-a-transfer.md). Its polls are counted apart
//! (`strata_echo_poll_hits_total` / `_misses_total`), and it shares the
//! slots too.

use std::time::{Duration, Instant};

/// Longest `busy_poll_us`: beyond a millisecond the requests are far apart
/// enough that a wake-up is a small part of their time, and the spinning
/// core is mostly wasted.
pub const BUSY_POLL_US_MAX: u64 = 1000;

/// Until when a connection polls for its next request after a long run of
/// requests (`echo_poll_us`, see [`strata_rdma::spin::echo`]).
///
/// A short run answered inside the window leaves it as it is rather than
/// ending it: over cross-memory attach a client sends RELEASE as soon as
/// it has copied a leased value, ahead of its next GET, and a window
/// counted from the RELEASE alone (too short to poll after) put the node
/// to sleep until that GET, once per GET. Keeping the GET's window lets
/// the node poll through the client's copy and its RELEASE to the next
/// GET (docs/bench-notes/polling-after-a-transfer.md).
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoWindow {
    until: Option<Instant>,
}

impl EchoWindow {
    /// A run of requests that took `took` ended at `now`: poll as long
    /// again, up to `cap`, unless the window open already lasts longer.
    pub fn ran(&mut self, now: Instant, took: Duration, cap: Duration) {
        let window = strata_rdma::spin::echo(took, cap);
        if window.is_zero() {
            return;
        }
        let until = now + window;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// How much of the window is left at `now`.
    pub fn left(&self, now: Instant) -> Duration {
        self.until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(200);
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_long_run_opens_a_window_as_long_as_it_took_up_to_the_cap() {
        let t0 = Instant::now();
        let mut w = EchoWindow::default();
        assert_eq!(w.left(t0), Duration::ZERO);
        w.ran(t0, 50 * US, CAP);
        assert_eq!(w.left(t0), 50 * US);
        assert_eq!(w.left(t0 + 20 * US), 30 * US);
        assert_eq!(w.left(t0 + 60 * US), Duration::ZERO);
        let mut w = EchoWindow::default();
        w.ran(t0, 900 * US, CAP);
        assert_eq!(w.left(t0), CAP);
    }

    #[test]
    fn a_short_run_opens_nothing() {
        let t0 = Instant::now();
        let mut w = EchoWindow::default();
        w.ran(t0, 5 * US, CAP);
        assert_eq!(w.left(t0), Duration::ZERO);
    }

    #[test]
    fn a_short_run_inside_the_window_leaves_it_open() {
        let t0 = Instant::now();
        let mut w = EchoWindow::default();
        w.ran(t0, 300 * US, CAP);
        // The RELEASE after a leased GET, 100 µs into the window.
        w.ran(t0 + 100 * US, 5 * US, CAP);
        assert_eq!(w.left(t0 + 100 * US), 100 * US);
        // A long run inside it may extend it, never shorten it.
        w.ran(t0 + 150 * US, 30 * US, CAP);
        assert_eq!(w.left(t0 + 150 * US), 50 * US);
        w.ran(t0 + 160 * US, 150 * US, CAP);
        assert_eq!(w.left(t0 + 160 * US), 150 * US);
    }
}
