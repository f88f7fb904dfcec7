//! A [`Backend`] that fails or damages I/O on demand, for tests that prove
//! the tier never loses track of a failed write and never serves wrong
//! bytes.
//!
//! It sits where foyer's device would be wrapped if foyer 0.22 allowed it
//! (its `Device`/`IoEngine` traits are sealed): under the tier's checksum
//! and error handling, above the real backend. Faults are switched through
//! a shared [`Faults`] handle while the tier runs. Never used in production.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;

use super::{Backend, Entry, NvmeError, Usage};

/// Switches read by [`Faulty`] on every call.
#[derive(Debug, Default)]
pub struct Faults {
    /// `put` fails as a device write error would: nothing is stored.
    pub fail_writes: AtomicBool,
    /// `load` fails with an I/O error.
    pub fail_reads: AtomicBool,
    /// `load` returns the stored bytes with one bit flipped.
    pub corrupt_reads: AtomicBool,
}

impl Faults {
    pub fn clear(&self) {
        self.fail_writes.store(false, Relaxed);
        self.fail_reads.store(false, Relaxed);
        self.corrupt_reads.store(false, Relaxed);
    }
}

pub struct Faulty<B> {
    inner: B,
    faults: Arc<Faults>,
}

impl<B: Backend> Faulty<B> {
    pub fn new(inner: B) -> (Self, Arc<Faults>) {
        let faults = Arc::new(Faults::default());
        (
            Faulty {
                inner,
                faults: faults.clone(),
            },
            faults,
        )
    }
}

fn injected(op: &'static str) -> NvmeError {
    NvmeError::Io {
        op,
        reason: "injected fault".into(),
    }
}

impl<B: Backend> Backend for Faulty<B> {
    async fn put(&self, key: Bytes, entry: Entry) -> Result<(), NvmeError> {
        if self.faults.fail_writes.load(Relaxed) {
            return Err(injected("write"));
        }
        self.inner.put(key, entry).await
    }

    async fn load(&self, key: &Bytes) -> Result<Option<Entry>, NvmeError> {
        if self.faults.fail_reads.load(Relaxed) {
            return Err(injected("read"));
        }
        let entry = self.inner.load(key).await?;
        if !self.faults.corrupt_reads.load(Relaxed) {
            return Ok(entry);
        }
        Ok(entry.map(|mut entry| {
            let mut bytes = entry.bytes.to_vec();
            match bytes.first_mut() {
                Some(b) => *b ^= 0x01,
                None => entry.checksum ^= 0x01,
            }
            entry.bytes = Bytes::from(bytes);
            entry
        }))
    }

    fn delete(&self, key: &[u8]) {
        self.inner.delete(key);
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.inner.contains(key)
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }

    async fn close(&self) -> Result<(), NvmeError> {
        self.inner.close().await
    }

    fn usage(&self) -> Usage {
        self.inner.usage()
    }

    fn take_lost(&self, max: usize) -> Vec<Bytes> {
        self.inner.take_lost(max)
    }
}
