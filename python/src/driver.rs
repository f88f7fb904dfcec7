//! Where a Python call's future runs, and who drives the sockets.
//!
//! `threads = 0` (the default): a current-thread runtime that the calling
//! thread itself drives while it waits (`block_on`), so the kernel wakes
//! the caller straight from `epoll_wait` when a reply arrives. With worker
//! threads, a reply wakes a worker first, which then wakes the caller: two
//! thread wake-ups per arriving burst instead of one; no call measured
//! slower for it (docs/bench-notes/python-sdk.md).
//!
//! Between calls nobody would drive the runtime, yet its tasks (the health
//! check, the data-plane listener, RDMA lifelines) must run, so an idle
//! thread takes the runtime over once no call has run for [`IDLE_GRACE`],
//! and gives it back as soon as a call starts. Calls that follow each
//! other closely (the common case: an engine's save or load loop) never
//! meet the idle thread. Several Python threads may call at once: one
//! drives the runtime, the others run their own futures on their own
//! threads and are woken by it (tokio's current-thread `block_on`).
//!
//! `spin_us` (opt-in, `threads = 0` only) is the client's own
//! (`ClientConfig::spin_us`): each exchange with a node polls its sockets
//! before the calling thread sleeps.
//!
//! `threads >= 1`: a multi-thread runtime with that many workers; the
//! caller still runs its future itself (`block_on`), and the workers poll
//! the sockets and run the spawned tasks (the data plane's sends of large
//! PUT payloads, in parallel).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};
use tokio::sync::Notify;

/// How long the runtime stays with the callers after the last call ends
/// before the idle thread drives it: long enough that a loop of calls never
/// hands it over, short enough that a health check is at most this late.
pub(crate) const IDLE_GRACE: Duration = Duration::from_millis(5);

pub(crate) struct Driver {
    rt: Arc<Runtime>,
    /// `None` with worker threads (they drive the runtime).
    idle: Option<Idle>,
}

struct Idle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Calls inside `block_on` now.
    calls: AtomicUsize,
    /// When the last call ended, in ns since `epoch`.
    last_end_ns: AtomicU64,
    epoch: Instant,
    /// A call wants the runtime: the idle thread leaves `block_on`.
    wanted: Notify,
    stop: AtomicBool,
    /// Only for waking the idle thread at stop; it otherwise polls `calls`
    /// every `IDLE_GRACE`, so a call never pays a wake-up to end.
    lock: Mutex<()>,
    stopped: Condvar,
}

impl Shared {
    fn since_last_end(&self) -> Duration {
        let now = self.epoch.elapsed().as_nanos() as u64;
        Duration::from_nanos(now.saturating_sub(self.last_end_ns.load(Ordering::Acquire)))
    }
}

/// Marks a call as running from its creation to its drop, panics included.
struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let s = self.0;
        let now = s.epoch.elapsed().as_nanos() as u64;
        s.last_end_ns.store(now, Ordering::Release);
        s.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Driver {
    /// `threads == 0`: the callers drive the runtime; otherwise that many
    /// worker threads do.
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        if threads > 0 {
            let rt = Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("strata-py")
                .enable_all()
                .build()?;
            return Ok(Self {
                rt: Arc::new(rt),
                idle: None,
            });
        }
        let rt = Arc::new(Builder::new_current_thread().enable_all().build()?);
        let shared = Arc::new(Shared {
            calls: AtomicUsize::new(0),
            last_end_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            wanted: Notify::new(),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            stopped: Condvar::new(),
        });
        let thread = std::thread::Builder::new()
            .name("strata-py-idle".into())
            .spawn({
                let (rt, shared) = (rt.clone(), shared.clone());
                move || idle_loop(&rt, &shared)
            })?;
        Ok(Self {
            rt,
            idle: Some(Idle {
                shared,
                thread: Some(thread),
            }),
        })
    }

    /// Runs `f` to completion on this thread.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        let Some(idle) = &self.idle else {
            return self.rt.block_on(f);
        };
        let s = &*idle.shared;
        s.calls.fetch_add(1, Ordering::AcqRel);
        let _running = Running(s);
        // Stores a permit if the idle thread is not in `block_on`, so that
        // one about to enter it leaves at once.
        s.wanted.notify_one();
        self.rt.block_on(f)
    }

    /// Stops the idle thread and hands back the runtime, for shutdown.
    pub(crate) fn into_runtime(mut self) -> Arc<Runtime> {
        self.stop_idle();
        self.rt.clone()
    }

    fn stop_idle(&mut self) {
        if let Some(idle) = self.idle.as_mut() {
            idle.shared.stop.store(true, Ordering::Release);
            idle.shared.wanted.notify_one();
            {
                let _g = idle.shared.lock.lock();
                idle.shared.stopped.notify_all();
            }
            if let Some(t) = idle.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop_idle();
    }
}

/// Drives the runtime whenever no call has run for `IDLE_GRACE`.
fn idle_loop(rt: &Runtime, s: &Shared) {
    loop {
        {
            let mut guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                let since = s.since_last_end();
                let busy = s.calls.load(Ordering::Acquire) > 0;
                if !busy && since >= IDLE_GRACE {
                    break;
                }
                let wait = match busy {
                    true => IDLE_GRACE,
                    false => (IDLE_GRACE - since).max(IDLE_GRACE / 16),
                };
                guard = match s.stopped.wait_timeout(guard, wait) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
        }
        // Leaves when a call starts (or at stop); a stale permit from a
        // call that already ended only costs one more turn of the loop.
        rt.block_on(s.wanted.notified());
    }
}
