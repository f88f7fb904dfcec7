//! DRAM over NVMe: values evicted from DRAM go down to the NVMe tier, and a
//! read of a key that is only there brings it back up (promotion) before it
//! is served. Values are always served from DRAM, so every reader (inline
//! GET, zero-copy lease, replication) keeps working on arena memory.
//!
//! # How a value moves
//!
//! - **Down.** Eviction runs under the store's index lock, so
//!   [`Spill::evicted`] only copies the value into a heap buffer (with a
//!   small header: version, expiry, creation time) and queues it. Writer
//!   tasks put queued values into the NVMe tier, a few at a time, one at a
//!   time per key, so an older copy can never land after a newer one. A
//!   queued value is already readable: promotion looks in the queue first.
//!   The queue is bounded by bytes (`queue_bytes`); when a burst of
//!   evictions outruns the device, further evictions are dropped and
//!   counted (`dropped`), as any cache drops. Writers that want to avoid
//!   that wait for room first ([`Spill::wait_for_room`]).
//! - **Up.** [`Spill::promote`] reads the copy (queue or NVMe), reserves
//!   DRAM, and publishes it with [`Store::commit_promoted`]: only if no
//!   write, delete or newer eviction of the key happened meanwhile (those
//!   mark the promotion stale). The NVMe copy stays: the value is then in
//!   both tiers with one version, and evicting it again (unchanged) costs
//!   no write. Without this a read-heavy working set larger than DRAM
//!   rewrote every value on each trip and foyer, which reclaims whole
//!   blocks oldest first, dropped live values to make room.
//! - **Gone.** A DRAM write or delete of a key forgets its lower copy at
//!   once ([`LowerTier::forget`]); a write that lands afterwards for a
//!   forgotten key is removed again when it completes.
//!
//! `FLUSHALL` cannot enumerate foyer's index: it records the time of the
//! flush (in a file beside the block files, so it survives a restart) and
//! copies created before it are treated as absent and removed when met.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::{mpsc, Notify, Semaphore};
use xxhash_rust::xxh3::Xxh3Builder;

use crate::below::Below;
use crate::keylog::{self, KeyLog};
use crate::nvme::{Backend, FoyerBackend, NvmeError, NvmeStats, NvmeTier};
use crate::store::{Evicted, LowerTier, Store, StoreError};

/// Bytes in front of every value on NVMe.
pub const HEADER_BYTES: u64 = 32;
/// The header's form: `STV2` has no checksum of its own (the field is 0).
const MAGIC: &[u8; 4] = b"STV2";
/// The form before it, still read: its field is the value's CRC32C.
const MAGIC_V1: &[u8; 4] = b"STV1";
/// No expiry, in the header's expiry field.
const NO_EXPIRY: u64 = u64::MAX;
/// The file that remembers the last `FLUSHALL`.
const FLUSH_MARK_FILE: &str = "strata-flushed-at";

/// Dropped keys [`Spill::reap_lost`] handles per call.
const REAP_BATCH: usize = 16_384;
/// Calls of [`Spill::reap_lost`] (every 100 ms on a node) a dropped key
/// foyer still indexes is looked at again before it counts as rewritten
/// (a read that finds it gone still reports it).
const LOST_LOOKS: u8 = 100;
/// Dropped keys waiting for foyer's index to let go, at most.
const LOST_LATER_MAX: usize = 65_536;

#[derive(Debug, Clone)]
pub struct SpillConfig {
    /// Most bytes of evicted values waiting to be written.
    pub queue_bytes: u64,
    /// Writes to the NVMe tier in flight at once.
    pub writers: usize,
}

impl Default for SpillConfig {
    fn default() -> Self {
        SpillConfig {
            queue_bytes: 256 << 20,
            writers: 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PromoteError {
    #[error(transparent)]
    Nvme(#[from] NvmeError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Figures for INFO and /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Values (and their bytes, with headers) queued or being written.
    pub queued: u64,
    pub queued_bytes: u64,
    /// Values written to NVMe, and their bytes (with headers).
    pub spilled: u64,
    pub spilled_bytes: u64,
    /// Evictions not kept: the queue was full, or the value is larger than
    /// the NVMe tier accepts.
    pub dropped: u64,
    pub too_large: u64,
    /// Writes that failed (the value was lost from the cache).
    pub write_errors: u64,
    /// Values brought back into DRAM, and their bytes.
    pub promoted: u64,
    pub promoted_bytes: u64,
    /// Reads from NVMe that failed (I/O or checksum).
    pub read_errors: u64,
    /// Evictions of promoted, unchanged values: their NVMe copy was still
    /// there, so nothing was written.
    pub kept: u64,
    pub nvme: NvmeStats,
}

struct Pending {
    gen: u64,
    blob: Bytes,
}

#[derive(Default)]
struct Promotion {
    refs: u32,
    /// A write, delete or eviction of the key happened since it started.
    stale: bool,
}

#[derive(Default)]
struct State {
    /// Keys this process put below DRAM (queued or written) and has not
    /// forgotten, with their expiry: `EXISTS` and `PREFIX` answer from it
    /// without reading NVMe. Keys recovered at start are in it when the key
    /// log (beside the block files) named them. Entries whose NVMe copy
    /// foyer reclaimed are pruned when met.
    below: Below,
    pending: HashMap<Bytes, Pending, Xxh3Builder>,
    /// Keys with a write to NVMe in flight (one per key at a time).
    writing: HashSet<Bytes, Xxh3Builder>,
    promoting: HashMap<Bytes, Promotion, Xxh3Builder>,
    next_gen: u64,
    /// Keys a reclaim dropped that foyer still indexed when last looked at
    /// (its index lets go a moment after the reclaim), with the looks so
    /// far; see [`Spill::reap_lost`].
    lost_later: Vec<(Bytes, u8)>,
}

impl State {
    fn take_pending(&mut self, key: &[u8], bytes: &AtomicU64) -> Option<Pending> {
        let p = self.pending.remove(key)?;
        bytes.fetch_sub(p.blob.len() as u64, Relaxed);
        Some(p)
    }

    fn mark_stale(&mut self, key: &[u8]) {
        if let Some(p) = self.promoting.get_mut(key) {
            p.stale = true;
        }
    }
}

#[derive(Default)]
struct Counters {
    spilled: AtomicU64,
    spilled_bytes: AtomicU64,
    dropped: AtomicU64,
    too_large: AtomicU64,
    write_errors: AtomicU64,
    promoted: AtomicU64,
    promoted_bytes: AtomicU64,
    read_errors: AtomicU64,
    kept: AtomicU64,
}

/// The NVMe tier under a store. Create with [`Spill::start`], then
/// [`Store::attach_lower`] it.
pub struct Spill<B: Backend = FoyerBackend> {
    tier: NvmeTier<B>,
    cfg: SpillConfig,
    state: Mutex<State>,
    /// Sum of the queued blobs' lengths (kept under `state`, read without).
    queued_bytes: AtomicU64,
    tx: mpsc::UnboundedSender<(Bytes, u64)>,
    room: Notify,
    /// Copies created before this time (Unix ms) were flushed.
    flushed_at_ms: AtomicU64,
    mark_dir: Option<PathBuf>,
    /// The keys written to NVMe, for the next start (`None` without
    /// `mark_dir`, or when the file cannot be opened).
    keylog: Option<KeyLog>,
    counters: Counters,
}

impl<B: Backend> Spill<B> {
    /// Wraps an opened tier and starts its writers. `mark_dir` is where the
    /// `FLUSHALL` mark is kept (the tier's directory; `None` in tests that
    /// do not restart). Must run inside a tokio runtime.
    pub fn start(tier: NvmeTier<B>, cfg: SpillConfig, mark_dir: Option<PathBuf>) -> Arc<Self> {
        let flushed_at = mark_dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join(FLUSH_MARK_FILE)).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = State::default();
        let keylog = mark_dir.as_ref().and_then(|d| match KeyLog::open(d) {
            Ok((log, entries)) => {
                let now = now_ms();
                let seen = entries.len();
                for e in entries {
                    let live = e.created_ms >= flushed_at
                        && e.expire_at_ms.is_none_or(|at| at > now)
                        && tier.contains(&e.key);
                    if live {
                        state.below.insert(e.key, e.expire_at_ms, false);
                    } else {
                        state.below.remove(&e.key);
                    }
                }
                if seen > 0 {
                    tracing::info!(
                        recovered = state.below.len(),
                        records = seen,
                        "nvme: keys known from the key log"
                    );
                }
                let live: Vec<keylog::Entry> = state
                    .below
                    .iter()
                    .map(|(k, e)| keylog::Entry {
                        key: k.clone(),
                        expire_at_ms: e.expire_at_ms,
                        created_ms: now,
                    })
                    .collect();
                if let Err(e) = log.rewrite(|| live) {
                    tracing::warn!(error = %e, "nvme: cannot compact the key log");
                }
                Some(log)
            }
            Err(e) => {
                tracing::warn!(error = %e, "nvme: no key log; keys on NVMe are unknown after a restart until read");
                None
            }
        });
        let spill = Arc::new(Spill {
            tier,
            cfg,
            state: Mutex::new(state),
            queued_bytes: AtomicU64::new(0),
            tx,
            room: Notify::new(),
            flushed_at_ms: AtomicU64::new(flushed_at),
            mark_dir,
            keylog,
            counters: Counters::default(),
        });
        tokio::spawn(writer_loop(Arc::downgrade(&spill), rx));
        spill
    }

    pub fn tier(&self) -> &NvmeTier<B> {
        &self.tier
    }

    /// Largest value (without header) the tier keeps.
    fn max_value(&self) -> u64 {
        self.tier_max().saturating_sub(HEADER_BYTES)
    }

    fn tier_max(&self) -> u64 {
        self.tier.max_value_bytes()
    }

    /// Whether a copy of `key` may be below DRAM (queued or on NVMe). May
    /// say yes for a key NVMe dropped since; [`Spill::promote`] is exact.
    pub fn contains(&self, key: &[u8]) -> bool {
        if self.state.lock().pending.contains_key(key) {
            return true;
        }
        self.tier.contains(key)
    }

    /// Whether a live copy of `key` is below DRAM, answered without I/O:
    /// `Some` for keys this process put there (checked against foyer's
    /// index, which drops the keys of reclaimed blocks, and against their
    /// expiry), and for keys foyer does not index at all; `None` for a key
    /// foyer indexes that this process did not write (recovered at start):
    /// only reading it tells whether it expired or was flushed.
    pub fn exists_below(&self, key: &[u8], now_ms: u64) -> Option<bool> {
        let st = self.state.lock();
        match st.below.get(key) {
            Some(e) => {
                let live = e.expire_at_ms.is_none_or(|at| at > now_ms);
                Some(live && (st.pending.contains_key(key) || self.tier.contains(key)))
            }
            None if self.tier.contains(key) => None,
            None => Some(false),
        }
    }

    /// Reports values the NVMe tier's reclaim dropped: each key whose only
    /// copy was below DRAM leaves the index of keys below, and the store's
    /// observer hears `Evicted` for it (unless a newer copy is queued or
    /// written, or the key is in DRAM again). Returns how many were
    /// reported. The node calls this periodically; a reclaim runs inside
    /// foyer, where calling up into the store is not allowed.
    pub fn reap_lost(&self, store: &Store, now_ms: u64) -> usize {
        let fresh = self.tier.take_lost(REAP_BATCH);
        let gone: Vec<Bytes> = {
            let mut st = self.state.lock();
            if fresh.is_empty() && st.lost_later.is_empty() {
                return 0;
            }
            let mut lost = std::mem::take(&mut st.lost_later);
            lost.extend(fresh.into_iter().map(|k| (k, 0)));
            let mut gone = Vec::with_capacity(lost.len());
            for (k, looks) in lost {
                if st.pending.contains_key(&k) {
                    // A newer value is on its way down: not gone.
                    continue;
                }
                if self.tier.contains(&k) {
                    // Still indexed: the reclaim is finishing, or a newer
                    // copy landed. Look again for a while.
                    if looks < LOST_LOOKS && st.lost_later.len() < LOST_LATER_MAX {
                        st.lost_later.push((k, looks + 1));
                    }
                    continue;
                }
                // Reported once: by whoever takes it out of the index (a
                // read that finds it gone does too).
                if st.below.remove(&k) {
                    gone.push(k);
                }
            }
            gone
        };
        // The spill's lock is released first: the store's lock comes
        // before it (LowerTier calls), never after.
        let mut n = 0;
        for k in gone {
            if !store.exists(&k, now_ms) {
                store.note(crate::events::TierEvent::Evicted, &k);
                n += 1;
            }
        }
        n
    }

    /// The keys this process put below DRAM that `filter` accepts (a
    /// snapshot; cluster repair walks it after DRAM's keys).
    pub fn keys_below(&self, mut filter: impl FnMut(&[u8]) -> bool) -> Vec<Bytes> {
        let st = self.state.lock();
        st.below.keys().filter(|k| filter(k)).cloned().collect()
    }

    /// Brings `key` up into `store` if a live copy is below. Returns whether
    /// it is now in DRAM because of this call. An error means the copy
    /// could not be read (and was dropped when it is corrupt) or DRAM has
    /// no room; wrong bytes are never published.
    pub async fn promote(
        &self,
        store: &Store,
        key: &Bytes,
        now_ms: u64,
    ) -> Result<bool, PromoteError> {
        let _registered = PromotionGuard::new(self, key);
        let queued = self.state.lock().pending.get(key).map(|p| p.blob.clone());
        let blob = match queued {
            Some(b) => b,
            None => match self.tier.get(key).await {
                Ok(Some(v)) => v.bytes,
                Ok(None) => {
                    // Reclaimed by foyer since it was indexed here: gone,
                    // if the reaper has not said so already.
                    if self.drop_copy(key) && !store.exists(key, now_ms) {
                        store.note(crate::events::TierEvent::Evicted, key);
                    }
                    return Ok(false);
                }
                Err(e) => {
                    self.counters.read_errors.fetch_add(1, Relaxed);
                    return Err(e.into());
                }
            },
        };
        let Some(header) = Header::parse(&blob) else {
            // The block checksum matched, so the writer wrote this: not ours.
            self.counters.read_errors.fetch_add(1, Relaxed);
            self.drop_copy(key);
            return Err(NvmeError::Corrupt.into());
        };
        let expired = header.expire_at_ms.is_some_and(|at| at <= now_ms);
        let dead = expired || header.created_ms < self.flushed_at_ms.load(Relaxed);
        if dead {
            // A TTL that passed while the only copy was below is reported
            // now, when a read finds it (FLUSHALL's are not events).
            if self.drop_copy(key) && expired && !store.exists(key, now_ms) {
                store.note(crate::events::TierEvent::Expired, key);
            }
            return Ok(false);
        }
        let value = &blob[HEADER_BYTES as usize..];
        let mut res = store.reserve(value.len() as u64)?;
        res.as_mut_slice().copy_from_slice(value);
        let stored = store.commit_promoted(
            key.clone(),
            res,
            header.version,
            header.expire_at_ms,
            now_ms,
            || {
                // Runs under the store's index lock, right before the value
                // is published: the copy below stays (see the module notes)
                // and is marked as in DRAM in the same critical section, so
                // SCAN and DBSIZE never see it twice or not at all.
                let mut st = self.state.lock();
                if st.promoting.get(key).is_some_and(|p| p.stale) {
                    return false;
                }
                st.below.insert(key.clone(), header.expire_at_ms, true);
                true
            },
        );
        if stored {
            self.counters.promoted.fetch_add(1, Relaxed);
            self.counters
                .promoted_bytes
                .fetch_add(value.len() as u64, Relaxed);
        }
        Ok(stored)
    }

    /// Drops the lower copy of `key` unless something changed it meanwhile.
    /// Returns whether the key was in the index of keys below.
    fn drop_copy(&self, key: &Bytes) -> bool {
        let mut st = self.state.lock();
        if st.promoting.get(key).is_some_and(|p| p.stale) {
            return false;
        }
        st.take_pending(key, &self.queued_bytes);
        let was_below = st.below.remove(key.as_ref());
        self.tier.forget(key);
        drop(st);
        self.room.notify_waiters();
        was_below
    }

    /// Waits (at most `max`) until the queue is below three quarters full,
    /// so that a writer's evictions are kept rather than dropped.
    pub async fn wait_for_room(&self, max: Duration) {
        let limit = self.cfg.queue_bytes / 4 * 3;
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let notified = self.room.notified();
            if self.queued_bytes.load(Relaxed) <= limit {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    /// Whether writers should wait for room before evicting more.
    pub fn congested(&self) -> bool {
        self.queued_bytes.load(Relaxed) > self.cfg.queue_bytes / 4 * 3
    }

    /// Waits (at most `max`) until every queued value is written, then
    /// until the tier's writes are on the device. For a graceful stop.
    pub async fn drain(&self, max: Duration) -> Result<(), NvmeError> {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let notified = self.room.notified();
            if self.queued_bytes.load(Relaxed) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        self.tier.flush().await
    }

    pub fn stats(&self) -> SpillStats {
        let c = &self.counters;
        let queued = self.state.lock().pending.len() as u64;
        SpillStats {
            queued,
            queued_bytes: self.queued_bytes.load(Relaxed),
            spilled: c.spilled.load(Relaxed),
            spilled_bytes: c.spilled_bytes.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            too_large: c.too_large.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            promoted: c.promoted.load(Relaxed),
            promoted_bytes: c.promoted_bytes.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            kept: c.kept.load(Relaxed),
            nvme: self.tier.stats(),
        }
    }

    /// One write of a queued value; at most one per key runs at a time.
    async fn write(self: Arc<Self>, key: Bytes, gen: u64) {
        let blob = {
            let mut st = self.state.lock();
            let current = match st.pending.get(&key) {
                Some(p) if p.gen == gen => p.blob.clone(),
                // Superseded or forgotten before its turn.
                _ => return,
            };
            if !st.writing.insert(key.clone()) {
                // The key's previous write is still running; it re-queues
                // the newest value when it finishes.
                return;
            }
            current
        };
        let len = blob.len() as u64;
        let result = self.tier.insert(key.clone(), blob).await;
        let mut st = self.state.lock();
        st.writing.remove(&key);
        let mine = st.pending.get(&key).is_some_and(|p| p.gen == gen);
        let mut landed = None;
        match result {
            Ok(()) if mine => {
                if let Some(p) = st.take_pending(&key, &self.queued_bytes) {
                    landed = Some(p.blob);
                }
                self.counters.spilled.fetch_add(1, Relaxed);
                self.counters.spilled_bytes.fetch_add(len, Relaxed);
            }
            Err(e) if mine => {
                self.counters.write_errors.fetch_add(1, Relaxed);
                st.take_pending(&key, &self.queued_bytes);
                st.below.remove(&key);
                tracing::warn!(error = %e, "nvme: spill write failed; the evicted value is dropped");
            }
            // Superseded while being written: written, deleted or promoted
            // meanwhile. A copy that landed is obsolete (and a write that
            // failed only because a forget dropped it from foyer's index
            // lost nothing).
            Ok(()) | Err(_) => {
                if !st.pending.contains_key(&key) {
                    self.tier.forget(&key);
                }
            }
        }
        // A newer value of this key arrived during the write: its turn now.
        let next = st.pending.get(&key).map(|p| p.gen);
        let live = st.below.len();
        drop(st);
        if let (Some(log), Some(blob)) = (&self.keylog, landed) {
            self.log_key(log, &key, &blob, live);
        }
        if let Some(next) = next {
            let _ = self.tx.send((key, next));
        }
        self.room.notify_waiters();
    }
}

impl<B: Backend> Spill<B> {
    /// Records a landed write in the key log, compacting it when it has
    /// grown well past the live set.
    fn log_key(&self, log: &KeyLog, key: &[u8], blob: &[u8], live: usize) {
        let (expire, created) = Header::times(blob);
        if let Err(e) = log.append(key, expire, created) {
            tracing::warn!(error = %e, "nvme: cannot record a key in the key log");
        }
        if log.wants_compaction(live) {
            let now = now_ms();
            let compacted = log.rewrite(|| {
                let st = self.state.lock();
                st.below
                    .iter()
                    .map(|(k, e)| keylog::Entry {
                        key: k.clone(),
                        expire_at_ms: e.expire_at_ms,
                        created_ms: now,
                    })
                    .collect::<Vec<_>>()
            });
            if let Err(e) = compacted {
                tracing::warn!(error = %e, "nvme: cannot compact the key log");
            }
        }
    }
}

impl<B: Backend> LowerTier for Spill<B> {
    fn evicted(&self, key: &Bytes, value: &[u8], info: Evicted) -> bool {
        {
            let mut st = self.state.lock();
            // Read back from NVMe and unchanged: the copy there is this one,
            // and now the only one.
            if info.clean && (st.pending.contains_key(key) || self.tier.contains(key)) {
                st.below.insert(key.clone(), info.expire_at_ms, false);
                self.counters.kept.fetch_add(1, Relaxed);
                return true;
            }
            // Whatever was known below for this key is gone (foyer reclaimed
            // a clean copy); a copy queued now is indexed afresh.
            st.below.remove(key);
        }
        if value.len() as u64 > self.max_value() {
            self.counters.too_large.fetch_add(1, Relaxed);
            return false;
        }
        let len = value.len() as u64 + HEADER_BYTES;
        if self.queued_bytes.load(Relaxed) + len > self.cfg.queue_bytes {
            self.counters.dropped.fetch_add(1, Relaxed);
            return false;
        }
        let mut blob = BytesMut::with_capacity(len as usize);
        Header {
            version: info.version,
            expire_at_ms: info.expire_at_ms,
            created_ms: info.created_ms,
        }
        .put(&mut blob);
        blob.put_slice(value);
        let blob = blob.freeze();
        let gen = {
            let mut st = self.state.lock();
            st.next_gen += 1;
            let gen = st.next_gen;
            st.take_pending(key, &self.queued_bytes);
            self.queued_bytes.fetch_add(len, Relaxed);
            st.pending.insert(key.clone(), Pending { gen, blob });
            st.below.insert(key.clone(), info.expire_at_ms, false);
            st.mark_stale(key);
            gen
        };
        let _ = self.tx.send((key.clone(), gen));
        true
    }

    fn forget(&self, key: &[u8]) -> bool {
        let mut st = self.state.lock();
        st.mark_stale(key);
        st.below.remove(key);
        let queued = st.take_pending(key, &self.queued_bytes).is_some();
        // Every DRAM write comes through here: no allocation, one hash
        // lookup in foyer's index when the key is not below.
        let on_nvme = self.tier.forget(key);
        drop(st);
        if queued {
            self.room.notify_waiters();
        }
        queued || on_nvme
    }

    fn scan(
        &self,
        cursor: u64,
        count: usize,
        now_ms: u64,
        visit: &mut dyn FnMut(u64, &Bytes),
    ) -> u64 {
        let mut st = self.state.lock();
        let mut next = 0;
        let mut last_hash = None;
        let mut reclaimed = Vec::new();
        for (visited, (h, k)) in st.below.scan_from(cursor).enumerate() {
            if visited >= count.max(1) && last_hash != Some(h) {
                next = h;
                break;
            }
            last_hash = Some(h);
            let Some(e) = st.below.get(k) else { continue };
            if !st.pending.contains_key(k) && !self.tier.contains(k) {
                // foyer reclaimed its block: forget it here too.
                reclaimed.push(k.clone());
                continue;
            }
            if e.expire_at_ms.is_none_or(|at| at > now_ms) {
                visit(h, k);
            }
        }
        for k in reclaimed {
            st.below.remove(&k);
        }
        next
    }

    fn len_only_below(&self) -> u64 {
        self.state.lock().below.only_below() as u64
    }

    fn clear(&self, now_ms: u64) {
        {
            let mut st = self.state.lock();
            st.pending.clear();
            st.below.clear();
            self.queued_bytes.store(0, Relaxed);
            for p in st.promoting.values_mut() {
                p.stale = true;
            }
        }
        if let Some(log) = &self.keylog {
            if let Err(e) = log.rewrite(Vec::new) {
                tracing::warn!(error = %e, "nvme: cannot empty the key log");
            }
        }
        self.flushed_at_ms.fetch_max(now_ms + 1, Relaxed);
        if let Some(dir) = &self.mark_dir {
            let tmp = dir.join(format!("{FLUSH_MARK_FILE}.tmp"));
            let at = self.flushed_at_ms.load(Relaxed);
            let written = std::fs::write(&tmp, at.to_string())
                .and_then(|()| std::fs::rename(&tmp, dir.join(FLUSH_MARK_FILE)));
            if let Err(e) = written {
                tracing::warn!(error = %e, "nvme: cannot record FLUSHALL; flushed values may come back after a restart");
            }
        }
        self.room.notify_waiters();
    }
}

/// Unix time in ms (the clock creation times and expiries use).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Registers a promotion of a key for as long as it runs.
struct PromotionGuard<'a, B: Backend> {
    spill: &'a Spill<B>,
    key: &'a Bytes,
}

impl<'a, B: Backend> PromotionGuard<'a, B> {
    fn new(spill: &'a Spill<B>, key: &'a Bytes) -> Self {
        let mut st = spill.state.lock();
        st.promoting.entry(key.clone()).or_default().refs += 1;
        PromotionGuard { spill, key }
    }
}

impl<B: Backend> Drop for PromotionGuard<'_, B> {
    fn drop(&mut self) {
        let mut st = self.spill.state.lock();
        if let Some(p) = st.promoting.get_mut(self.key) {
            p.refs -= 1;
            if p.refs == 0 {
                st.promoting.remove(self.key);
            }
        }
    }
}

async fn writer_loop<B: Backend>(
    spill: Weak<Spill<B>>,
    mut rx: mpsc::UnboundedReceiver<(Bytes, u64)>,
) {
    let writers = spill.upgrade().map_or(1, |s| s.cfg.writers.max(1));
    let slots = Arc::new(Semaphore::new(writers));
    while let Some((key, gen)) = rx.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(spill) = spill.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            spill.write(key, gen).await;
            drop(permit);
        });
    }
}

/// What is stored in front of a value on NVMe (little endian):
/// magic `STV2`, 4 reserved bytes (0), version, expiry (Unix ms,
/// `u64::MAX` = none), creation time (Unix ms).
///
/// The value has no checksum of its own here: the NVMe tier sums every
/// blob it writes (header and value) and checks that sum on every read,
/// so a second sum of the same bytes would cost a pass on every spill and
/// every promotion and catch nothing more. (Form `STV1`, written by builds
/// before 2026-12-03, carried the value's CRC32C in the reserved field;
/// it is still read and checked. Older builds refuse `STV2` blobs as
/// foreign, so a downgrade starts with an empty NVMe tier.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    version: u64,
    expire_at_ms: Option<u64>,
    created_ms: u64,
}

impl Header {
    fn put(&self, buf: &mut BytesMut) {
        buf.put_slice(MAGIC);
        buf.put_u32_le(0);
        buf.put_u64_le(self.version);
        buf.put_u64_le(self.expire_at_ms.unwrap_or(NO_EXPIRY));
        buf.put_u64_le(self.created_ms);
    }

    /// Expiry and creation time of a blob this process built (no checks).
    fn times(blob: &[u8]) -> (Option<u64>, u64) {
        if blob.len() < HEADER_BYTES as usize {
            return (None, 0);
        }
        let u64_at = |i: usize| u64::from_le_bytes(blob[i..i + 8].try_into().expect("8 bytes"));
        let expire = u64_at(16);
        ((expire != NO_EXPIRY).then_some(expire), u64_at(24))
    }

    /// The header, if `blob` (as the tier returned it, already checked
    /// against the tier's sum) starts with one; an `STV1` blob's value
    /// must also match the checksum in its header.
    fn parse(blob: &[u8]) -> Option<Header> {
        if blob.len() < HEADER_BYTES as usize {
            return None;
        }
        let magic = &blob[..4];
        if magic == MAGIC_V1 {
            let checksum = u32::from_le_bytes(blob[4..8].try_into().expect("4 bytes"));
            if crate::checksum::crc32c(&blob[HEADER_BYTES as usize..]) != checksum {
                return None;
            }
        } else if magic != MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(blob[i..i + 8].try_into().expect("8 bytes"));
        let expire = u64_at(16);
        Some(Header {
            version: u64_at(8),
            expire_at_ms: (expire != NO_EXPIRY).then_some(expire),
            created_ms: u64_at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_refuses_foreign_bytes() {
        let value = b"some value bytes";
        let h = Header {
            version: 42 << 20 | 7,
            expire_at_ms: Some(123_456),
            created_ms: 99,
        };
        let mut buf = BytesMut::new();
        h.put(&mut buf);
        assert_eq!(buf.len() as u64, HEADER_BYTES);
        assert_eq!(&buf[..8], b"STV2\0\0\0\0");
        buf.put_slice(value);
        assert_eq!(Header::parse(&buf), Some(h));
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert_eq!(Header::parse(&bad), None, "foreign bytes are refused");
        assert_eq!(Header::parse(&buf[..10]), None);
        let none = Header {
            expire_at_ms: None,
            ..h
        };
        let mut buf = BytesMut::new();
        none.put(&mut buf);
        buf.put_slice(value);
        assert_eq!(Header::parse(&buf).unwrap().expire_at_ms, None);
    }

    /// Blobs an earlier build left on NVMe: read, and their own checksum
    /// still checked.
    #[test]
    fn a_v1_header_is_read_and_its_value_checked() {
        let value = b"written by an earlier build";
        let mut buf = BytesMut::new();
        buf.put_slice(b"STV1");
        buf.put_u32_le(crate::checksum::crc32c(value));
        buf.put_u64_le(5 << 20);
        buf.put_u64_le(NO_EXPIRY);
        buf.put_u64_le(5);
        buf.put_slice(value);
        let want = Header {
            version: 5 << 20,
            expire_at_ms: None,
            created_ms: 5,
        };
        assert_eq!(Header::parse(&buf), Some(want));
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert_eq!(Header::parse(&buf), None, "value damage is caught");
    }
}
