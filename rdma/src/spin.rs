//! Polling a future and the sockets for a while before sleeping: the
//! node's `busy_poll_us` (waiting for a client's next request) and the
//! client's `spin_us` (waiting for a reply) share it.
//!
//! Where an idle CPU halts (a VM whose `guest_halt_poll_ns` is 0, deep
//! C-states), waking a sleeping thread costs more than the work of a small
//! request: on a 2-vCPU VM a 64 KiB GET spent more than half its time in
//! the node's and the caller's wake-ups (docs/BENCHMARKS.md §2i).

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

/// Lets at most `cap` futures spin at once: each spinning one can keep a
/// thread from sleeping, and the rest of the work needs the other cores.
#[derive(Debug)]
pub struct Spinner {
    cap: usize,
    spinning: AtomicUsize,
}

impl Spinner {
    /// A quarter of `threads`, at least one. Measured here (2 vCPUs, node
    /// on the same host, docs/BENCHMARKS.md §5): four callers spinning at
    /// once cut 4 KiB GETs to half the sleeping callers' rate, and even one
    /// of the four spinning cost a quarter.
    pub fn quarter_of(threads: usize) -> Self {
        Self {
            cap: (threads / 4).max(1),
            spinning: AtomicUsize::new(0),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Runs `f`, first polling it without sleeping for up to `spin` if
    /// fewer than `cap` futures spin now (0: never). Each turn yields to
    /// the runtime, which then polls its I/O driver with a zero timeout
    /// (tokio runs yielded tasks only after that poll), so readiness is
    /// seen within a syscall of its arrival and the thread never pays a
    /// sleep and a wake-up for it. `ran_out` runs when the spin ends with
    /// `f` still pending, before `f` is awaited as usual. Also returns
    /// whether `f` finished while spinning.
    pub async fn run<F: Future>(
        &self,
        f: F,
        spin: Duration,
        ran_out: impl FnOnce(),
    ) -> (F::Output, bool) {
        let Some(slot) = self.slot(spin) else {
            return (f.await, false);
        };
        let mut f = pin!(f);
        let start = Instant::now();
        loop {
            let once = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
            if let Poll::Ready(v) = once {
                return (v, true);
            }
            if start.elapsed() >= spin {
                drop(slot);
                ran_out();
                return (f.await, false);
            }
            tokio::task::yield_now().await;
        }
    }

    /// The right to spin, given back on drop (so a future dropped
    /// mid-spin never keeps it).
    fn slot(&self, spin: Duration) -> Option<Slot<'_>> {
        if spin.is_zero() {
            return None;
        }
        if self.spinning.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.spinning.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(self))
    }
}

struct Slot<'a>(&'a Spinner);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.spinning.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(500);

    #[test]
    fn off_takes_no_slot() {
        assert!(Spinner::quarter_of(16).slot(Duration::ZERO).is_none());
    }

    #[test]
    fn at_most_cap_spin_and_dropping_a_slot_frees_it() {
        let s = Spinner::quarter_of(8);
        assert_eq!(s.cap(), 2);
        let a = s.slot(SPIN).expect("first");
        let b = s.slot(SPIN).expect("second");
        assert!(s.slot(SPIN).is_none(), "a third over the cap");
        drop(a);
        let c = s.slot(SPIN).expect("room again");
        drop((b, c));
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
        assert_eq!(Spinner::quarter_of(1).cap(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_ready_future_is_found_while_spinning() {
        let s = Spinner::quarter_of(4);
        let mut ran_out = false;
        assert_eq!(s.run(async { 7 }, SPIN, || ran_out = true).await, (7, true));
        assert!(!ran_out);
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_future_is_awaited_after_the_spin_runs_out() {
        let s = Spinner::quarter_of(4);
        let start = Instant::now();
        let mut ran_out = false;
        let f = tokio::time::sleep(Duration::from_millis(20));
        let ((), found) = s
            .run(f, Duration::from_micros(200), || ran_out = true)
            .await;
        assert!(!found && ran_out);
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }
}
