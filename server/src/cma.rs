//! Cross-memory attach for clients on this host (`cma: auto`): a client
//! that proves on its connection that it is a process of this node's user
//! in this pid namespace (`STRATA.CMA`) may name its own memory in `cma`
//! descriptors (the node copies PUT payloads straight out of it) and gets
//! `cma` source descriptors for GETs (it copies the value straight out of
//! the arena, then confirms the lease with RELEASE, as over RDMA).
//!
//! The proof binds one process to one connection: the node hands out a
//! random nonce, the client writes it into its own memory, and the node
//! reads it back from the pid the client names. A connection can then only
//! ever make the node read the memory of the process that proved itself,
//! never a third process's.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use strata_rdma::cma::{nonce, NONCE_BYTES};
use strata_rdma::cma::{same_user, CmaReader, Identity};
use strata_rdma::{Descriptor, TransferError};

/// Reads at least this long tell the runtime that they block (about
/// 0.5 ms of copying at memory speed).
const BLOCKING_READ_BYTES: u64 = 4 << 20;

/// The node's side of CMA.
pub struct Cma {
    pub me: Identity,
    pub reader: CmaReader,
    /// Random bytes at a fixed address: a client reads them (`probe_addr`)
    /// to learn whether the kernel lets it read this process.
    probe: Box<[u8; NONCE_BYTES]>,
    /// Connections that proved themselves.
    pub sessions: AtomicU64,
    /// Proofs refused (another user, pid namespace or host; the read not
    /// permitted; wrong bytes).
    pub refused: AtomicU64,
}

impl Cma {
    /// `None` when `cma: off`, or when this process cannot describe itself
    /// (no /proc: then it says so once). Long reads go over `lanes`
    /// threads (`cma_lanes`).
    pub fn start(mode: &str, lanes: usize) -> Option<Cma> {
        if mode == "off" {
            return None;
        }
        match Identity::current().and_then(|me| {
            nonce()
                .map(|n| (me, n))
                .ok_or_else(|| std::io::Error::other("getrandom failed"))
        }) {
            Ok((me, probe)) => Some(Cma {
                me,
                reader: CmaReader::with_lanes(lanes),
                probe: Box::new(probe),
                sessions: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cross-memory attach unavailable (no /proc or no getrandom); same-host clients use the network data plane");
                None
            }
        }
    }

    /// This process as the ring publishes it, for same-host peers.
    pub fn record(&self) -> strata_ring::ProcessRecord {
        let me = &self.me;
        strata_ring::ProcessRecord {
            pid: me.pid,
            start: me.start,
            boot_id: me.boot_id.clone(),
            pid_ns: me.pid_ns,
            uid: me.uid,
        }
    }

    /// Whether a peer's process, as its ring record names it, is one this
    /// node may read by cross-memory attach: same host, pid namespace and
    /// user. (The kernel still has the last word; a refused read falls
    /// back to the network.)
    pub fn can_read(&self, peer: &strata_ring::ProcessRecord) -> bool {
        let other = strata_rdma::cma::Identity {
            pid: peer.pid,
            start: peer.start,
            boot_id: peer.boot_id.clone(),
            pid_ns: peer.pid_ns,
            uid: peer.uid,
        };
        self.me.mismatch(&other).is_none() && peer.pid != self.me.pid
    }

    pub fn probe_addr(&self) -> u64 {
        self.probe.as_ptr() as u64
    }

    pub fn probe(&self) -> &[u8; NONCE_BYTES] {
        &self.probe
    }

    /// Checks a client's proof: `pid` (started at `start`) holds `nonce`
    /// at `addr`. `Err` says why not, for the client's log.
    pub fn prove(
        &self,
        pid: u32,
        start: u64,
        addr: u64,
        nonce: &[u8; NONCE_BYTES],
    ) -> Result<(), String> {
        let refuse = |why: String| {
            self.refused.fetch_add(1, Relaxed);
            Err(why)
        };
        if !same_user(pid) {
            return refuse(format!(
                "process {pid} is not of this node's user (or not in its pid namespace)"
            ));
        }
        let desc = strata_rdma::cma::describe(
            &Identity {
                pid,
                start,
                ..self.me.clone()
            },
            addr,
            NONCE_BYTES as u64,
            0,
            None,
        );
        let mut got = [0u8; NONCE_BYTES];
        // SAFETY: `got` is a local buffer of exactly desc.len bytes.
        match unsafe { self.reader.read(&desc, got.as_mut_ptr()) } {
            Ok(()) if &got == nonce => {
                self.sessions.fetch_add(1, Relaxed);
                Ok(())
            }
            Ok(()) => refuse("the nonce is not at that address of that process".into()),
            Err(e) => refuse(format!("cannot read process {pid}: {e}")),
        }
    }

    /// Copies the bytes `src` names into `dst`. A long copy runs in
    /// `block_in_place`, so the runtime moves this worker's other tasks
    /// elsewhere meanwhile; it never outlives the call (unlike a task on
    /// the blocking pool, which could still be writing after the caller's
    /// reservation was freed).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `src.len` bytes, and nothing else
    /// may access that range during the call.
    pub unsafe fn read(&self, src: &Descriptor, dst: *mut u8) -> Result<(), TransferError> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let multi =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        if src.len >= BLOCKING_READ_BYTES && multi {
            // SAFETY: forwarded from this function's contract.
            tokio::task::block_in_place(|| unsafe { self.reader.read(src, dst) })
        } else {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.reader.read(src, dst) }
        }
    }
}
