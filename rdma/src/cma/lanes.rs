//! One large read copied by several threads at once.
//!
//! A single `process_vm_readv` of a value that is not in cache runs at
//! one core's memory speed; two threads reading halves of it move large
//! values faster where a second core is free
//! (docs/bench-notes/cross-memory-attach.md; at 1 MiB the hand-off costs
//! about as much as half the copy saves). So a read of at least
//! [`SPLIT_MIN_BYTES`] is cut into pieces: the calling thread reads the
//! last one and helper threads the others.
//!
//! The caller never waits on a helper that has not started its piece: once
//! done with its own, it takes back every piece no helper has claimed yet
//! and reads it itself, so a busy or slow-to-wake helper costs a channel
//! send, never a stall. And the call never returns while a helper may still
//! be writing into the destination: it waits for every piece a helper
//! claimed, whatever happened to the others.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use super::Peer;
use crate::TransferError;

/// Reads shorter than this stay on the calling thread.
pub const SPLIT_MIN_BYTES: usize = 2 << 20;
/// No piece is shorter than this (a page multiple, so that pieces start
/// on page boundaries when the read does).
const PIECE_MIN_BYTES: usize = 1 << 20;
/// The most lanes a reader may have.
pub const LANES_MAX: usize = 16;
/// Lanes of a reader unless configured: two, the caller and one helper
/// (what this project's 2-core machine can show; more cores and memory
/// channels may take more, `cma_lanes`).
pub const DEFAULT_LANES: usize = 2;

/// A piece of a read, handed to the helpers.
struct Piece {
    /// Set by whoever reads the piece: a helper, or the caller taking it
    /// back.
    taken: AtomicBool,
    peer: Arc<Peer>,
    remote: u64,
    /// Where the piece goes in the caller's destination.
    local: usize,
    len: usize,
    /// A helper's outcome, once it has read the piece.
    result: Mutex<Option<Result<(), TransferError>>>,
    done: Condvar,
}

impl Piece {
    /// Reads the piece if nobody has claimed it yet; `None` if somebody had.
    ///
    /// # Safety
    /// `[local, local + len)` must be valid for writes and touched by
    /// nobody else until the piece's reader is done.
    unsafe fn claim_and_read(&self) -> Option<Result<(), TransferError>> {
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: forwarded from this function's contract.
        Some(unsafe { self.peer.read(self.remote, self.local as *mut u8, self.len) })
    }

    /// Waits for the helper that claimed the piece.
    fn wait(&self) -> Result<(), TransferError> {
        let mut result = self.result.lock();
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            self.done.wait(&mut result);
        }
    }
}

/// Helper threads for one reader, started on its first large read.
pub(super) struct Lanes {
    lanes: usize,
    /// Pieces the helpers read (the rest of every long read the callers
    /// read themselves).
    helped: Arc<AtomicU64>,
    /// Pieces for the helpers; `None` when they could not be started.
    jobs: OnceLock<Option<mpsc::Sender<Arc<Piece>>>>,
}

impl Lanes {
    /// `lanes` threads per read, the caller's included (1: no helpers);
    /// pieces the helpers copy are counted in `helped`.
    pub(super) fn new(lanes: usize, helped: Arc<AtomicU64>) -> Lanes {
        Lanes {
            lanes: lanes.clamp(1, LANES_MAX),
            helped,
            jobs: OnceLock::new(),
        }
    }

    pub(super) fn count(&self) -> usize {
        self.lanes
    }

    /// Copies `[remote, remote + len)` of `peer` into `local`, in pieces
    /// over the lanes when it is long enough.
    ///
    /// # Safety
    /// `local` must be valid for writes of `len` bytes, and nothing else
    /// may access that range during the call.
    pub(super) unsafe fn read(
        &self,
        peer: &Arc<Peer>,
        remote: u64,
        local: *mut u8,
        len: usize,
    ) -> Result<(), TransferError> {
        let pieces = self.lanes.min(len / PIECE_MIN_BYTES);
        // Short reads never start the helpers.
        let jobs = (len >= SPLIT_MIN_BYTES && pieces > 1)
            .then(|| self.jobs())
            .flatten();
        let Some(jobs) = jobs else {
            // SAFETY: forwarded from this function's contract.
            return unsafe { peer.read(remote, local, len) };
        };
        let piece = (len / pieces) & !(PIECE_MIN_BYTES - 1);
        let handed: Vec<Arc<Piece>> = (0..pieces - 1)
            .map(|i| {
                let p = Arc::new(Piece {
                    taken: AtomicBool::new(false),
                    peer: peer.clone(),
                    remote: remote + (i * piece) as u64,
                    local: local as usize + i * piece,
                    len: piece,
                    result: Mutex::new(None),
                    done: Condvar::new(),
                });
                // A closed channel (helpers gone) leaves the piece to the
                // caller below.
                let _ = jobs.send(p.clone());
                p
            })
            .collect();
        let own = (pieces - 1) * piece;
        // SAFETY: `own..len` lies in the destination and is no piece's.
        let mut result = unsafe { peer.read(remote + own as u64, local.add(own), len - own) };
        for p in &handed {
            if result.is_err() {
                // The read has failed: an unclaimed piece is not read at
                // all, a claimed one is waited for.
                if p.taken.swap(true, Ordering::AcqRel) {
                    let _ = p.wait();
                }
                continue;
            }
            // SAFETY: each piece is its own part of the destination.
            let r = unsafe { p.claim_and_read() }.unwrap_or_else(|| p.wait());
            result = result.and(r);
        }
        result
    }

    /// The helpers' queue, starting them on first use.
    fn jobs(&self) -> Option<&mpsc::Sender<Arc<Piece>>> {
        if self.lanes == 1 {
            return None;
        }
        self.jobs.get_or_init(|| self.start()).as_ref()
    }

    fn start(&self) -> Option<mpsc::Sender<Arc<Piece>>> {
        let (tx, rx) = mpsc::channel::<Arc<Piece>>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 1..self.lanes {
            let (rx, helped) = (rx.clone(), self.helped.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("strata-cma-lane-{i}"))
                .spawn(move || helper(&rx, &helped));
            if let Err(e) = spawned {
                // Fewer helpers only means the caller reads more itself.
                tracing::warn!(error = %e, "cma: cannot start a copy lane; reads use fewer");
                if i == 1 {
                    return None;
                }
                break;
            }
        }
        Some(tx)
    }
}

/// A helper: reads the pieces nobody has claimed until the reader goes.
fn helper(rx: &std::sync::Mutex<mpsc::Receiver<Arc<Piece>>>, helped: &AtomicU64) {
    loop {
        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(piece) = next else { return };
        // SAFETY: the caller keeps the destination valid and untouched
        // until every piece a helper claimed has its result.
        if let Some(r) = unsafe { piece.claim_and_read() } {
            helped.fetch_add(1, Ordering::Relaxed);
            *piece.result.lock() = Some(r);
            piece.done.notify_one();
        }
    }
}
