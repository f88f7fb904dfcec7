//! Completion dispatch: one thread per transport waits on the completion
//! channel, drains the shared completion queue and wakes the task that
//! posted each work request.
//!
//! Idle, the thread sleeps in poll(2) on the channel's fd (woken by the
//! device's interrupt or, at the latest, every [`IDLE_WAKE`] to notice a
//! shutdown): an idle node burns no core. Busy, each wake drains every
//! completion before re-arming.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdma_mummy_sys::{ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_req_notify_cq};
use sideway::ibverbs::completion::CompletionQueue;
use tokio::sync::oneshot;

use super::nic::Nic;

/// How long the thread sleeps without an event before checking for
/// shutdown.
const IDLE_WAKE: Duration = Duration::from_millis(100);

/// Status of one finished work request (`ibv_wc_status`, 0 = success).
pub(crate) type WcStatus = u32;

/// Tasks waiting for their work requests, by wr_id.
#[derive(Default)]
pub(crate) struct Completions {
    waiters: Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    next_id: AtomicU64,
    stop: AtomicBool,
}

impl Completions {
    /// A fresh wr_id and the receiver its completion will be sent to.
    /// Register before posting, so a fast completion finds its waiter.
    pub(crate) fn expect(&self) -> (u64, oneshot::Receiver<WcStatus>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, tx);
        (id, rx)
    }

    /// Forgets a wr_id whose post failed or whose task gave up.
    pub(crate) fn forget(&self, id: u64) {
        self.waiters.lock().remove(&id);
    }

    fn complete(&self, id: u64, status: WcStatus) {
        if let Some(tx) = self.waiters.lock().remove(&id) {
            // The task may have timed out and gone; nothing to do then.
            let _ = tx.send(status);
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Runs the dispatch loop until [`Completions::stop`]; returns after
/// acknowledging every event it took, so the CQ can then be destroyed.
pub(crate) fn run(nic: Arc<Nic>, done: Arc<Completions>) {
    // SAFETY: the CQ lives as long as `nic`, which this thread holds.
    let cq: *mut ibv_cq = unsafe { nic.cq.cq() }.as_ptr();
    let fd = nic.channel.as_raw_fd();
    while !done.stop.load(Ordering::Acquire) {
        drain(&nic, &done);
        // SAFETY: `cq` is a live CQ (see above).
        if unsafe { ibv_req_notify_cq(cq, 0) } != 0 {
            tracing::error!("ibv_req_notify_cq failed; completions fall back to polling");
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        // A completion that arrived between the drain and the arm raises
        // no event: drain once more before sleeping.
        if drain(&nic, &done) {
            continue;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, IDLE_WAKE.as_millis() as i32) };
        if ready > 0 {
            take_events(&nic);
        }
    }
}

/// Takes and acknowledges every pending event on the (non-blocking)
/// channel.
fn take_events(nic: &Nic) {
    loop {
        let mut ev_cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live (held by `nic`) and set O_NONBLOCK, so
        // this returns -1 at once when no event is pending.
        let got =
            unsafe { ibv_get_cq_event(nic.channel.comp_channel().as_ptr(), &mut ev_cq, &mut ctx) };
        if got != 0 {
            return;
        }
        // SAFETY: `ev_cq` is the CQ the event was for (ours); every event
        // must be acknowledged before the CQ is destroyed.
        unsafe { ibv_ack_cq_events(ev_cq, 1) };
    }
}

/// Hands every completion now in the CQ to its waiter; true if any.
fn drain(nic: &Nic, done: &Completions) -> bool {
    let mut any = false;
    while let Ok(poller) = nic.cq.start_poll() {
        for wc in poller {
            any = true;
            done.complete(wc.wr_id(), wc.status());
        }
    }
    any
}
