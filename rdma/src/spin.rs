//! Polling a future and the sockets for a while before sleeping: the
//! node's `busy_poll_us` (waiting for a client's next request) and the
//! client's `spin_us` (waiting for a reply) share it.
//!
//! Where an idle CPU halts (a VM whose `guest_halt_poll_ns` is 0, deep
//! C-states), waking a sleeping thread costs more than the work of a small
//! request, and a small call waits for the node's and the caller's
//! wake-ups in series (docs/bench-notes/waking-sleeping-cpus.md).

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

/// A turn that gives the runtime back for longer than this found other
/// work to run on this thread (ten times as long in a debug build, whose
/// idle turns are that much slower). After [`BUSY_TURNS`] such
/// turns in a row the thread is not going to sleep anyway, so spinning
/// saves no wake-up and only adds a poll of the I/O driver per turn, and
/// the spin ends. An idle turn is a small fraction of this. Without this
/// rule, a node pinned to one CPU and polling slowed four clients' large
/// PUTs, whose payloads the same thread was busy taking in
/// (docs/bench-notes/polling-mid-transfer.md).
pub const BUSY_TURN: Duration = if cfg!(debug_assertions) {
    Duration::from_micros(100)
} else {
    Duration::from_micros(10)
};

/// Long turns in a row that end a spin (see [`BUSY_TURN`]): one alone may
/// be the thread being preempted.
pub const BUSY_TURNS: u32 = 2;

/// Default window once a transfer is under way (the node's
/// `stream_poll_us`, the client's `stream_spin_us`): the reading side's
/// polling (the client's for a GET, the node's for a PUT) spares a large
/// call its sleeps between bursts, and the bursts of a transfer over
/// loopback come well within this (docs/bench-notes/polling-mid-transfer.md).
pub const STREAM_US_DEFAULT: u64 = 50;

/// Default cap on the wait after a long exchange (the node's
/// `echo_poll_us`, the client's `echo_spin_us`; see [`echo`]). A 1 MiB
/// request or reply over loopback takes about this long, and the other
/// side's turn-around after it is well within that; a longer transfer
/// gains nothing from a longer poll
/// (docs/bench-notes/polling-after-a-transfer.md).
pub const ECHO_US_DEFAULT: u64 = 200;

/// How fast one side of an exchange is assumed to move a value's bytes,
/// in bytes per µs (about 4 GB/s), where the time a transfer will take
/// has to be guessed rather than clocked: the node's wait while a client
/// copies a value leased to it, the client's wait for a large reply it
/// expects. A guess between a cross-memory copy and a loopback TCP read
/// of the same bytes (docs/bench-notes/polling-after-a-transfer.md);
/// erring long costs at most the echo cap of polling, erring short a
/// wake-up.
pub const COPY_BYTES_PER_US: u64 = 4096;

/// About how long moving `bytes` takes at [`COPY_BYTES_PER_US`].
pub fn copy_time(bytes: u64) -> Duration {
    Duration::from_micros(bytes / COPY_BYTES_PER_US)
}

/// Below this, an exchange is too short for [`echo`] to poll after it: a
/// small call's turn-around includes the other side's own wake-up, which
/// a window this short would not outlast, so it would only spend turns.
/// Small calls keep to `busy_poll_us` / `spin_us` (opt-in).
pub const ECHO_MIN: Duration = Duration::from_micros(20);

/// How long to poll for what comes next after an exchange that took
/// `took`: as long again, up to `cap`; nothing if it took less than
/// [`ECHO_MIN`] or `cap` is zero.
///
/// After a long request has been taken in, the node's reply follows about
/// as long after as the transfer took (the client's wait for a large
/// PUT's `+OK`), and after a long reply has been written, the client's
/// next request follows once it has read it (the node's wait between
/// large GETs). Sleeping through those waits puts a wake-up on the path
/// of every large call; polling through them costs at most as much CPU
/// as the transfer itself did, and only right after one. Where idle
/// vCPUs halt at once this takes a wake-up off every large call and
/// leaves small calls and busy nodes as they were
/// (docs/bench-notes/polling-after-a-transfer.md).
pub fn echo(took: Duration, cap: Duration) -> Duration {
    if took < ECHO_MIN {
        return Duration::ZERO;
    }
    took.min(cap)
}

/// The spinner of this process's transfers (a quarter of its cores): the
/// client's exchanges and the TCP data plane's reads share it, so that
/// together they keep no more cores awake than either alone would.
pub fn shared() -> &'static Spinner {
    static SHARED: std::sync::OnceLock<Spinner> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        Spinner::quarter_of(std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Lets at most `cap` futures spin at once: each spinning one can keep a
/// thread from sleeping, and the rest of the work needs the other cores.
#[derive(Debug)]
pub struct Spinner {
    cap: usize,
    spinning: AtomicUsize,
    /// [`BUSY_TURN`]; `None` in tests that need a spin to last.
    busy_turn: Option<Duration>,
}

impl Spinner {
    /// A quarter of `threads`, at least one: callers spinning at once take
    /// the cores the node and the other callers need, and with four of
    /// them on two cores small calls ran slower than sleeping callers'
    /// (docs/bench-notes/waking-sleeping-cpus.md).
    pub fn quarter_of(threads: usize) -> Self {
        Self {
            cap: (threads / 4).max(1),
            spinning: AtomicUsize::new(0),
            busy_turn: Some(BUSY_TURN),
        }
    }

    /// Never ends a spin for a busy thread (for tests whose threads may be
    /// preempted at any time).
    #[cfg(test)]
    fn patient(mut self) -> Self {
        self.busy_turn = None;
        self
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Runs `f`, polling it without sleeping while fewer than `cap`
    /// futures spin now and `f` keeps being woken: the spin ends once a
    /// window has passed with no wake-up, or after [`SPIN_TURNS_MAX`]
    /// windows in all. Until `f`'s first wake-up the window is `idle`
    /// (0: sleep as usual until then); after it, `stream` if longer. Each
    /// turn yields to the runtime, which then polls its I/O driver with a
    /// zero timeout (tokio runs yielded tasks only after that poll), so
    /// readiness is seen within a syscall of its arrival and the thread
    /// never pays a sleep and a wake-up for it.
    ///
    /// The window restarts at each wake-up because a long reply arrives
    /// as many bursts: a budget counted from the start ran out in the
    /// middle of a long reply, after which the reader slept and woke
    /// once per burst (docs/bench-notes/waking-sleeping-cpus.md). `stream`
    /// is for exactly that: a future woken once and still pending is in
    /// the middle of a transfer whose next bytes are microseconds away,
    /// so polling for them costs a core only for as long as the transfer
    /// runs, and never while nothing is coming.
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
        idle: Duration,
        stream: Duration,
        ran_out: impl FnOnce(),
    ) -> (F::Output, bool) {
        let after = idle.max(stream);
        if after.is_zero() {
            return (f.await, false);
        }
        // The task's waker wrapped once (again only if the task's changes).
        let mut woken: Option<(Arc<Woken>, Waker)> = None;
        let mut poll = |cx: &mut Context<'_>| {
            let (_, waker) = match woken.take() {
                Some((w, waker)) if w.inner.will_wake(cx.waker()) => woken.insert((w, waker)),
                _ => {
                    let w = Woken::new(cx.waker());
                    woken.insert((w.clone(), Waker::from(w)))
                }
            };
            let p = f.as_mut().poll(&mut Context::from_waker(waker));
            (p, woken.as_ref().is_some_and(|(w, _)| w.take()))
        };
        // Spins until it finds `f` ready (and returns) or breaks out, to
        // await `f` as usual.
        'spin: {
            let mut window = idle;
            let mut slot = self.slot(idle);
            if slot.is_none() {
                if stream.is_zero() {
                    break 'spin;
                }
                // Sleep as usual until the first wake-up that leaves `f`
                // still pending: from there on it is mid-transfer.
                let first = std::future::poll_fn(|cx| match poll(cx) {
                    (Poll::Ready(v), _) => Poll::Ready(Some(v)),
                    (Poll::Pending, true) => Poll::Ready(None),
                    (Poll::Pending, false) => Poll::Pending,
                })
                .await;
                if let Some(v) = first {
                    return (v, false);
                }
                slot = self.slot(after);
                if slot.is_none() {
                    break 'spin;
                }
                window = after;
            }
            let start = Instant::now();
            let mut last_wake = start;
            // Turns that found other work on this thread (see `BUSY_TURN`).
            let mut busy = 0;
            loop {
                let (once, woke) = std::future::poll_fn(|cx| Poll::Ready(poll(cx))).await;
                if let Poll::Ready(v) = once {
                    return (v, true);
                }
                let now = Instant::now();
                if woke {
                    last_wake = now;
                    window = after;
                }
                if now - last_wake >= window
                    || now - start >= after * SPIN_TURNS_MAX
                    || busy >= BUSY_TURNS
                {
                    drop(slot);
                    ran_out();
                    break 'spin;
                }
                tokio::task::yield_now().await;
                if let Some(long) = self.busy_turn {
                    busy = if now.elapsed() > long { busy + 1 } else { 0 };
                }
            }
        }
        (std::future::poll_fn(|cx| poll(cx).0).await, false)
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
    fn echo_polls_as_long_as_the_exchange_took_up_to_the_cap() {
        let us = Duration::from_micros;
        let cap = us(200);
        assert_eq!(echo(us(19), cap), Duration::ZERO, "too short to poll after");
        assert_eq!(echo(us(20), cap), us(20));
        assert_eq!(echo(us(150), cap), us(150));
        assert_eq!(echo(us(5000), cap), cap);
        assert_eq!(echo(us(150), Duration::ZERO), Duration::ZERO, "off");
    }

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
    async fn stream_only_sleeps_until_the_first_wake_up_then_spins() {
        // A transfer whose first burst comes after 30 ms and whose second
        // 20 ms after that: with only a stream window of 200 ms, the wait
        // for the first burst is a plain sleep (no slot held, no spin),
        // and the 20 ms after it are spun through. (With 2 ms between the
        // bursts, a loaded machine now and then woke the receiver only
        // after both had come, and nothing was left to spin for.)
        let s = Spinner::quarter_of(4).patient();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send(()).expect("receiver alive");
            std::thread::sleep(Duration::from_millis(20));
            tx.send(()).expect("receiver alive");
        });
        let held_while_idle = std::cell::Cell::new(None);
        let spinning = &s.spinning;
        let two = std::pin::pin!(async {
            held_while_idle.set(Some(spinning.load(Ordering::Acquire)));
            rx.recv().await.expect("first");
            rx.recv().await.expect("second");
        });
        let mut ran_out = false;
        let ((), found) = s
            .run(two, Duration::ZERO, Duration::from_millis(200), || {
                ran_out = true
            })
            .await;
        sender.join().expect("sender");
        assert_eq!(
            held_while_idle.get(),
            Some(0),
            "no slot before the first wake-up"
        );
        assert!(found && !ran_out, "spun from the first burst to the end");
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn stream_only_never_spins_for_a_call_done_at_its_first_wake_up() {
        let s = Spinner::quarter_of(4).patient();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The value is sent well after the first poll has begun (not after
        // the thread starts: under the soft-RoCE VM's emulation the first
        // poll can come later than a fixed delay, and a send during it is a
        // wake-up with the future still pending, which rightly spins).
        let (polled_tx, polled_rx) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            polled_rx.recv().expect("first poll");
            std::thread::sleep(Duration::from_millis(20));
            tx.send(3).expect("receiver alive");
        });
        let mut ran_out = false;
        let one = std::pin::pin!(async {
            polled_tx.send(()).expect("sender alive");
            rx.await.expect("sent")
        });
        let (v, found) = s
            .run(one, Duration::ZERO, Duration::from_millis(20), || {
                ran_out = true
            })
            .await;
        sender.join().expect("sender");
        assert_eq!(v, 3);
        assert!(!found && !ran_out, "finished without a spin");
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_spin_ends_when_other_tasks_keep_the_thread_busy() {
        // Another task on the same thread takes 1 ms each time it runs:
        // each turn of the spin lasts that long, so after BUSY_TURNS of
        // them the spin ends, long before its 2 s window would. (Generous
        // bounds: in the soft-RoCE VM, emulated, a 1 ms sleep took up to
        // 8 ms.) The future is a channel that `ran_out` completes, so the
        // test never waits out a timer.
        let s = Spinner::quarter_of(4);
        let stop = Arc::new(AtomicBool::new(false));
        let hog = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                    tokio::task::yield_now().await;
                }
            }
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let start = Instant::now();
        let mut spun_for = None;
        let (got, found) = s
            .run(
                std::pin::pin!(rx),
                Duration::from_secs(2),
                Duration::ZERO,
                || {
                    spun_for = Some(start.elapsed());
                    tx.send(()).expect("receiver waits");
                },
            )
            .await;
        stop.store(true, Ordering::Release);
        hog.await.expect("hog");
        got.expect("sent when the spin ended");
        let spun_for = spun_for.expect("the spin ended");
        assert!(!found);
        assert!(spun_for < Duration::from_millis(1000), "{spun_for:?}");
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_ready_future_is_found_while_spinning() {
        let s = Spinner::quarter_of(4).patient();
        let mut ran_out = false;
        assert_eq!(
            s.run(std::pin::pin!(async { 7 }), SPIN, SPIN, || ran_out = true)
                .await,
            (7, true)
        );
        assert!(!ran_out);
        assert_eq!(s.spinning.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_future_is_awaited_after_the_spin_runs_out() {
        let s = Spinner::quarter_of(4).patient();
        let start = Instant::now();
        let mut ran_out = false;
        let f = std::pin::pin!(tokio::time::sleep(Duration::from_millis(20)));
        let ((), found) = s
            .run(f, Duration::from_micros(200), Duration::ZERO, || {
                ran_out = true
            })
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
        let s = Spinner::quarter_of(4).patient();
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
            .run(all, Duration::from_millis(20), Duration::ZERO, || {
                ran_out = true
            })
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
        let s = Spinner::quarter_of(4).patient();
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
            .run(restless, Duration::from_micros(100), Duration::ZERO, || {
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
