//! Polling a future and the sockets for a while before sleeping: the
//! node's `busy_poll_us` (waiting for a client's next request) and the
//! client's `spin_us` (waiting for a reply) share it.
//!
//! Where an idle CPU halts (a VM whose `guest_halt_poll_ns` is 0, deep
//! C-states), waking a sleeping thread costs more than the work of a small
//! request: on a 2-vCPU VM a 64 KiB GET spent more than half its time in
//! the node's and the caller's wake-ups (docs/BENCHMARKS.md §2i).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Bounds one spin in all, as a multiple of its idle window: a reply that
/// trickles in forever must not hold a core forever. At the largest window
/// (1 ms) that is 64 ms, longer than a 64 MiB transfer over loopback here.
pub const SPIN_TURNS_MAX: u32 = 64;

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

    /// Runs `f`, first polling it without sleeping while fewer than `cap`
    /// futures spin now and `f` keeps being woken: the spin ends once
    /// `spin` has passed with no wake-up (0: never spin), or after
    /// [`SPIN_TURNS_MAX`] × `spin` in all. Each turn yields to the
    /// runtime, which then polls its I/O driver with a zero timeout
    /// (tokio runs yielded tasks only after that poll), so readiness is
    /// seen within a syscall of its arrival and the thread never pays a
    /// sleep and a wake-up for it.
    ///
    /// The window restarts at each wake-up because a long reply arrives
    /// as many bursts: a budget counted from the start ran out in the
    /// middle of a 1 MiB reply (~300 µs here), after which the reader
    /// slept and woke once per burst (docs/BENCHMARKS.md §2i).
    ///
    /// `ran_out` runs when the spin ends with `f` still pending, before
    /// `f` is awaited as usual. Also returns whether `f` finished while
    /// spinning.
    ///
    /// `f` comes pinned by the caller so that it is held once, in the
    /// caller's frame: taken by value, it sat in this future three times
    /// (the argument, the pinned copy, the plain await), and a 744-byte
    /// exchange grew to 2.4 KiB, copied on each call.
    pub async fn run<F: Future + ?Sized>(
        &self,
        mut f: Pin<&mut F>,
        spin: Duration,
        ran_out: impl FnOnce(),
    ) -> (F::Output, bool) {
        let Some(slot) = self.slot(spin) else {
            return (f.await, false);
        };
        let start = Instant::now();
        let mut last_wake = start;
        // The task's waker wrapped once (again only if the task's changes).
        let mut woken: Option<(Arc<Woken>, Waker)> = None;
        loop {
            let once = std::future::poll_fn(|cx| {
                let (_, waker) = match woken.take() {
                    Some((w, waker)) if w.inner.will_wake(cx.waker()) => woken.insert((w, waker)),
                    _ => {
                        let w = Woken::new(cx.waker());
                        woken.insert((w.clone(), Waker::from(w)))
                    }
                };
                Poll::Ready(f.as_mut().poll(&mut Context::from_waker(waker)))
            })
            .await;
            if let Poll::Ready(v) = once {
                return (v, true);
            }
            let now = Instant::now();
            if woken.as_ref().is_some_and(|(w, _)| w.take()) {
                last_wake = now;
            }
            if now - last_wake >= spin || now - start >= spin * SPIN_TURNS_MAX {
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

/// The task's waker, noting each wake-up: the spinning future made
/// progress (bytes arrived, a write drained) since the last look.
struct Woken {
    inner: Waker,
    woke: AtomicBool,
}

impl Woken {
    fn new(inner: &Waker) -> Arc<Self> {
        Arc::new(Self {
            inner: inner.clone(),
            woke: AtomicBool::new(false),
        })
    }

    /// Whether it was woken since the last call.
    fn take(&self) -> bool {
        self.woke.swap(false, Ordering::AcqRel)
    }
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woke.store(true, Ordering::Release);
        self.inner.wake_by_ref();
    }
}

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
        assert_eq!(
            s.run(std::pin::pin!(async { 7 }), SPIN, || ran_out = true)
                .await,
            (7, true)
        );
        assert!(!ran_out);
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_future_is_awaited_after_the_spin_runs_out() {
        let s = Spinner::quarter_of(4);
        let start = Instant::now();
        let mut ran_out = false;
        let f = std::pin::pin!(tokio::time::sleep(Duration::from_millis(20)));
        let ((), found) = s
            .run(f, Duration::from_micros(200), || ran_out = true)
            .await;
        assert!(!found && ran_out);
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn wake_ups_keep_the_spin_going_past_its_window() {
        // Ten messages 5 ms apart take ~50 ms, far past the 20 ms window:
        // a budget counted from the start would run out; one counted from
        // the last wake-up keeps spinning and finds the end.
        let s = Spinner::quarter_of(4);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sender = std::thread::spawn(move || {
            for i in 0..10 {
                std::thread::sleep(Duration::from_millis(5));
                tx.send(i).expect("receiver alive");
            }
        });
        let start = Instant::now();
        let all = std::pin::pin!(async {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
            }
            n
        });
        let mut ran_out = false;
        let (n, found) = s
            .run(all, Duration::from_millis(20), || ran_out = true)
            .await;
        sender.join().expect("sender");
        assert_eq!(n, 10);
        assert!(start.elapsed() >= Duration::from_millis(40));
        assert!(found && !ran_out, "spun through the wake-ups");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_future_woken_forever_stops_spinning_at_the_ceiling() {
        // Wakes itself on every poll, so the idle window never ends it:
        // only the ceiling of SPIN_TURNS_MAX windows (6.4 ms) does.
        let s = Spinner::quarter_of(4);
        let start = Instant::now();
        let until = start + Duration::from_millis(60);
        let restless = std::pin::pin!(std::future::poll_fn(|cx| {
            if Instant::now() >= until {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        let mut spun_for = None;
        let ((), found) = s
            .run(restless, Duration::from_micros(100), || {
                spun_for = Some(start.elapsed())
            })
            .await;
        let spun_for = spun_for.expect("the spin ran out");
        assert!(!found);
        assert!(spun_for >= Duration::from_micros(6400), "{spun_for:?}");
        assert!(spun_for < Duration::from_millis(60), "{spun_for:?}");
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }
}
