//! Opt-in busy polling of client connections (`busy_poll_us`).
//!
//! Between one request and the next, a connection normally sleeps until
//! the kernel says its socket is readable, and the runtime thread that
//! serves it sleeps in `epoll_wait` if nothing else is runnable. Waking
//! that thread is the largest fixed cost of a small request on a virtual
//! machine whose idle vCPUs halt at once (and on hosts whose idle cores
//! drop into deep C-states). Measured on a 2-vCPU VM with
//! `haltpoll.guest_halt_poll_ns=0` (docs/BENCHMARKS.md §2i), one client's
//! 4 KiB GET p50 went from 146 to 48 µs with `busy_poll_us` 200, a 64 KiB
//! GET from 183 to 90 µs; 1 MiB did not move.
//!
//! With `busy_poll_us` > 0, a connection that has answered everything it
//! was sent polls its socket for up to that long before it sleeps: each
//! turn yields to the runtime, which polls its I/O driver with a zero
//! timeout before it runs yielded tasks, then tries the read again. So the
//! thread never sleeps while requests keep coming closer together than
//! that, at the price of a busy core while they do.
//!
//! At most [`BusyPoll::cap`] connections spin at once (a quarter of the
//! runtime's threads, at least one): each spinning connection can keep a
//! runtime thread from sleeping, and the others must keep room for the
//! work. The rest wait as usual.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// Longest `busy_poll_us`: beyond a millisecond the requests are far apart
/// enough that a wake-up is a small part of their time, and the spinning
/// core is mostly wasted.
pub const BUSY_POLL_US_MAX: u64 = 1000;

#[derive(Debug)]
pub struct BusyPoll {
    spin: Duration,
    cap: usize,
    spinning: AtomicUsize,
}

impl BusyPoll {
    /// `spin_us` 0 turns it off; `threads` is the runtime's thread count.
    pub fn new(spin_us: u64, threads: usize) -> Self {
        Self {
            spin: Duration::from_micros(spin_us.min(BUSY_POLL_US_MAX)),
            cap: (threads / 4).max(1),
            spinning: AtomicUsize::new(0),
        }
    }

    /// How long a connection may spin.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Connections that may spin at once.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The right to spin now, if busy polling is on and fewer than `cap`
    /// connections spin. Given back on drop, so a connection dropped
    /// mid-spin (closed, node stopping) never keeps it.
    pub fn slot(&self) -> Option<Slot<'_>> {
        if self.spin.is_zero() {
            return None;
        }
        if self.spinning.fetch_add(1, Relaxed) >= self.cap {
            self.spinning.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Slot(self))
    }
}

/// See [`BusyPoll::slot`].
pub struct Slot<'a>(&'a BusyPoll);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.spinning.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_gives_no_slot() {
        assert!(BusyPoll::new(0, 16).slot().is_none());
    }

    #[test]
    fn at_most_cap_connections_spin_and_dropping_a_slot_frees_it() {
        let bp = BusyPoll::new(50, 8);
        assert_eq!(bp.cap(), 2);
        let a = bp.slot().expect("first");
        let b = bp.slot().expect("second");
        assert!(bp.slot().is_none(), "a third over the cap");
        drop(a);
        let c = bp.slot().expect("room again");
        drop((b, c));
        assert_eq!(bp.spinning.load(Relaxed), 0);
    }

    #[test]
    fn a_small_runtime_still_lets_one_spin_and_spin_is_bounded() {
        let bp = BusyPoll::new(10_000_000, 1);
        assert_eq!(bp.cap(), 1);
        assert_eq!(bp.spin(), Duration::from_micros(BUSY_POLL_US_MAX));
        assert!(bp.slot().is_some());
    }
}
