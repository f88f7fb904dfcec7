//! Opt-in polling for a reply before sleeping (`ClientConfig::spin_us`).
//!
//! A call normally sleeps until its reply arrives, and where an idle CPU
//! halts (a VM whose `guest_halt_poll_ns` is 0, deep C-states), waking it
//! costs more than the node's work on a small value: on a 2-vCPU VM a
//! 64 KiB GET spent more than half its time in the two wake-ups, the
//! node's and the caller's (docs/BENCHMARKS.md §2i). With `spin_us`, each
//! exchange with a node first polls its sockets for up to that long. The
//! node's side is its `busy_poll_us`.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Most a call may spin (`spin_us` ≤ 1000).
pub const SPIN_MAX: Duration = Duration::from_millis(1);

/// Runs `f`, first polling it and the sockets without sleeping for up to
/// `spin` if a [`SpinSlot`] is free. Each turn yields to the runtime,
/// which then polls its I/O driver with a zero timeout (tokio runs yielded
/// tasks only after that poll), so a reply is seen within a syscall of its
/// arrival and the thread never pays a sleep and a wake-up for it.
pub(crate) async fn spun<F: Future>(f: F, spin: Duration) -> F::Output {
    let Some(slot) = SpinSlot::take(spin) else {
        return f.await;
    };
    let mut f = pin!(f);
    let start = Instant::now();
    loop {
        let once = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
        if let Poll::Ready(v) = once {
            return v;
        }
        if start.elapsed() >= spin {
            drop(slot);
            return f.await;
        }
        tokio::task::yield_now().await;
    }
}

/// Calls spinning now, in this process (all clients).
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// A right to spin: at most a quarter of the cores (at least one) spin at
/// once in a process, so spinning callers never take the cores that the
/// node or the other callers need. Measured here (2 vCPUs, node on the
/// same host, docs/BENCHMARKS.md §5): four callers spinning 50 us each
/// cut 4 KiB GETs to half the sleeping callers' rate, and even one of the
/// four spinning cost a quarter; one caller alone ran 1.3-1.45x faster.
struct SpinSlot;

impl SpinSlot {
    fn take(spin: Duration) -> Option<Self> {
        if spin.is_zero() {
            return None;
        }
        static CAP: OnceLock<usize> = OnceLock::new();
        let cap = *CAP.get_or_init(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))
        });
        let taken = SPINNING.fetch_add(1, Ordering::AcqRel);
        if taken >= cap {
            SPINNING.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_ready_future_returns_at_once_and_the_slot_is_given_back() {
        assert_eq!(spun(async { 7 }, Duration::from_micros(500)).await, 7);
        assert_eq!(SPINNING.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_future_is_awaited_after_the_spin_runs_out() {
        let start = Instant::now();
        let f = tokio::time::sleep(Duration::from_millis(20));
        spun(f, Duration::from_micros(200)).await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(SPINNING.load(Ordering::Acquire), 0);
    }

    #[test]
    fn off_takes_no_slot() {
        assert!(SpinSlot::take(Duration::ZERO).is_none());
    }
}
