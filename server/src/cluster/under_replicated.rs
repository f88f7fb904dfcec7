//! Keys held with fewer copies than wanted, so that they are visible (INFO,
//! `/metrics`, `/health`) and pushed again until they have them.
//!
//! A write is acknowledged once the local copy is committed and every
//! replica push has answered; a push that failed (a replica down, slow or
//! full) leaves the value with fewer copies than `replica_num` asks. Such
//! keys are remembered here, bounded, and a background pass pushes them
//! again every few seconds. A key leaves the set when a push reaches every
//! replica, when it is deleted, or when it no longer exists here.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::clock::now_ms;
use crate::cluster::replicate;
use crate::node::Node;

/// Most keys remembered; beyond it the set is marked as overflowed and the
/// count is a lower bound (repair on the next ring change still visits
/// every key).
pub const TRACKED_MAX: usize = 1 << 20;
/// Keys pushed again per pass.
const RETRY_BATCH: usize = 1024;
const RETRY_EVERY: Duration = Duration::from_secs(5);

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

    fn batch(&self) -> Vec<Bytes> {
        self.keys.lock().iter().take(RETRY_BATCH).cloned().collect()
    }
}

/// Pushes under-replicated keys again, every few seconds, for as long as
/// the node runs.
pub async fn retry_loop(node: Arc<Node>) {
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        retry_once(&node).await;
    }
}

/// One pass over at most [`RETRY_BATCH`] tracked keys.
pub async fn retry_once(node: &Arc<Node>) {
    let tracked = &node.cluster.under_replicated;
    let wanted = node.cfg.replica_num as usize;
    for key in tracked.batch() {
        let (value, expire) = match node.store.peek_with_expiry(&key, now_ms()) {
            Ok(Some(found)) => found,
            // Gone (deleted, expired, evicted): nothing left to copy.
            Ok(None) => {
                tracked.forget(&key);
                continue;
            }
            Err(_) => continue,
        };
        // The key's replica set under the current ring; this node's own copy
        // counts only while it is a member (repair moves it otherwise).
        let ring = node.cluster.ring();
        let set = ring.replicas(strata_ring::key_slot(&key), wanted);
        let mine = usize::from(set.iter().any(|n| n.id == node.cluster.me.id));
        let targets: Vec<_> = set
            .into_iter()
            .filter(|n| n.id != node.cluster.me.id)
            .cloned()
            .collect();
        let ok = replicate::push(node, key.clone(), value, expire, targets).await;
        tracked.note(&key, wanted, mine + ok);
    }
}
