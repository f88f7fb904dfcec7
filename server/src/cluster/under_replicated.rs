//! Keys held with fewer copies than wanted, so that they are visible (INFO,
//! `/metrics`, `/health`) and pushed again until they have them.
//!
//! A write is acknowledged once the local copy is committed and every
//! replica push has answered; a push that failed (a replica down, slow or
//! full) leaves the value with fewer copies than `replica_num` asks. Such
//! keys are remembered here, bounded, and a background pass
//! (`replicate::retry_loop`) pushes them again every few seconds. A key
//! leaves the set when a push reaches every replica, when it is deleted,
//! or when it no longer exists here.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};

use bytes::Bytes;
use parking_lot::Mutex;

/// Most keys remembered; beyond it the set is marked as overflowed and the
/// count is a lower bound (repair on the next ring change still visits
/// every key).
pub const TRACKED_MAX: usize = 1 << 20;
/// Keys pushed again per pass.
const RETRY_BATCH: usize = 1024;

#[derive(Debug, Default)]
pub struct UnderReplicated {
    keys: Mutex<HashSet<Bytes>>,
    overflowed: AtomicBool,
    /// Acknowledged writes that had fewer copies than asked.
    pub writes_total: AtomicU64,
}

impl UnderReplicated {
    /// After a write of `key` asked for `wanted` copies and `held` exist.
    pub fn note_write(&self, key: &Bytes, wanted: usize, held: usize) {
        if held < wanted {
            self.writes_total.fetch_add(1, Relaxed);
        }
        self.note(key, wanted, held);
    }

    /// After any push of `key` (a write, repair or retry).
    pub fn note(&self, key: &Bytes, wanted: usize, held: usize) {
        let mut keys = self.keys.lock();
        if held >= wanted {
            keys.remove(key);
        } else if keys.len() < TRACKED_MAX {
            keys.insert(key.clone());
        } else if !keys.contains(key) {
            self.overflowed.store(true, Relaxed);
        }
    }

    pub fn forget(&self, key: &[u8]) {
        self.keys.lock().remove(key);
    }

    /// Keys known to have fewer copies than wanted (a lower bound once
    /// more than [`TRACKED_MAX`] were).
    pub fn len(&self) -> usize {
        self.keys.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Relaxed)
    }

    /// Up to [`RETRY_BATCH`] of the tracked keys, for a retry pass.
    pub fn batch(&self) -> Vec<Bytes> {
        self.keys.lock().iter().take(RETRY_BATCH).cloned().collect()
    }
}
