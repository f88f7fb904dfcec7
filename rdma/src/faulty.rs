//! A transport that fails on demand, for tests that prove a failed transfer
//! never leaves partial data behind.
//!
//! Wraps any [`Transport`]; faults are armed by the test and fire on the
//! next reads. Never used outside tests and fault drills.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Descriptor, ReadGuard, Region, TransferError, Transport, TransportKind};

/// A [`Transport`] whose reads can be made to fail.
pub struct FaultyTransport<T> {
    inner: T,
    /// Reads still to fail outright, before touching the destination.
    fail_reads: AtomicU64,
    /// If set, the next read writes only this many bytes, then fails.
    cut_after: Mutex<Option<u64>>,
    injected: AtomicU64,
}

impl<T: Transport> FaultyTransport<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            fail_reads: AtomicU64::new(0),
            cut_after: Mutex::new(None),
            injected: AtomicU64::new(0),
        }
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Makes the next `n` reads fail with an I/O error without moving bytes.
    pub fn fail_next_reads(&self, n: u64) {
        self.fail_reads.store(n, Ordering::SeqCst);
    }

    /// Makes the next read deliver only its first `bytes` bytes into the
    /// destination and then fail with [`TransferError::PeerClosed`], like a
    /// peer dying mid-payload. Reads no longer than `bytes` are unaffected
    /// (and disarm the fault).
    pub fn cut_next_read_after(&self, bytes: u64) {
        *self.cut_after.lock() = Some(bytes);
    }

    /// Faults that have fired so far.
    pub fn faults_injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn take_failure(&self) -> bool {
        self.fail_reads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl<T: Transport> Transport for FaultyTransport<T> {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        // SAFETY: same contract, passed through unchanged.
        unsafe { self.inner.register(addr, len, guard) }
    }

    async fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), TransferError> {
        if self.take_failure() {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(TransferError::Io(io::Error::other("injected read failure")));
        }
        let cut = self.cut_after.lock().take();
        match cut {
            Some(bytes) if bytes < src.len => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                let head = Descriptor {
                    len: bytes,
                    ..src.clone()
                };
                self.inner.read(&head, dst, dst_offset).await?;
                Err(TransferError::PeerClosed)
            }
            _ => self.inner.read(src, dst, dst_offset).await,
        }
    }
}
