//! The keyspace of one node: which key lives where, for how long, and what
//! to evict when memory runs short.
//!
//! Values live in the DRAM [`Arena`]; the index (key → slot) lives on the
//! heap beside it. A value is a `SlotRef`: the index holds one reference
//! and every reader (an inline GET being written to a socket, a lease handed
//! to a remote reader) holds another. The slot's chunk returns to the
//! allocator only when the last reference drops, so a value that is deleted,
//! overwritten or evicted while someone reads it is never reused under their
//! feet. A value with readers is "pinned" and is skipped by eviction.
//!
//! Writes are two-phase: [`Store::reserve`] takes a chunk (evicting if
//! needed) which the caller fills outside every lock, then
//! [`Store::commit`] publishes it atomically. A reservation dropped without
//! commit frees its chunk, so a cut transfer never leaves a partial value.
//!
//! With a GPU pool ([`Store::with_gpu`]) the GPU is the top tier: a newly
//! written value is moved up to it on commit, the least recently used GPU
//! values move down to DRAM when it is full, and DRAM evicts to the lower
//! tier as before. A key lives in exactly one of GPU or DRAM (plus perhaps
//! an older-or-equal copy below). Device memory is not CPU-addressable, so
//! a reader of a GPU value gets a private DRAM copy ("staged"): every
//! [`Value`] is readable with [`Value::as_slice`] and lies in the arena the
//! transport registered. GPU copies never run under the index lock: the
//! value being copied is pinned by the mover's reference, and the index
//! swaps to the copy only if the key still holds that very value, so a
//! write or delete that races a move always wins.
//!
//! The store never reads a clock: callers pass `now_ms`, which keeps expiry
//! deterministic in tests. It never sees RESP.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;

use crate::dram::{Arena, Chunk, SlabAllocator};
use crate::events::{Observer, TierEvent};
use crate::gpu::DeviceMemory;

mod index;
#[cfg(test)]
mod index_tests;
mod placement;
mod slot;
pub(crate) use index::scan_hash;
use index::{Entry, Index, LruCursor};
use slot::{Cells, GpuPool, Shared, Slot, SlotRef};

/// See [`Store::arena_handle`]. Each call returns `None` once the store is
/// gone (its arena unmapped), so a thread holding one stops by itself.
#[derive(Clone)]
pub struct ArenaHandle(std::sync::Weak<Shared>);

impl ArenaHandle {
    /// Bytes of the arena.
    pub fn capacity(&self) -> Option<u64> {
        self.0.upgrade().map(|s| s.arena.len())
    }

    /// See [`Arena::populate`]: faults a range in without changing a byte,
    /// safe while values in it are written and read.
    pub fn populate(&self, offset: u64, len: u64) -> Option<std::io::Result<()>> {
        self.0.upgrade().map(|s| s.arena.populate(offset, len))
    }

    /// See [`Arena::resident_bytes`].
    pub fn resident_bytes(&self, offset: u64, len: u64) -> Option<std::io::Result<u64>> {
        self.0
            .upgrade()
            .map(|s| s.arena.resident_bytes(offset, len))
    }
}

/// Store-wide settings, validated by the caller.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Size of the DRAM arena.
    pub capacity_bytes: u64,
    /// Largest single value.
    pub max_value_bytes: u64,
    /// Fraction of capacity above which writes evict first. Below 1.0 so
    /// that size-class fragmentation never makes a fitting value fail.
    pub high_watermark: f64,
    /// How long a delete is remembered (0 = not at all). A cluster member
    /// needs it: a copy of a deleted key arriving late from another node
    /// (repair, hand-off) must not bring the key back.
    pub tombstone_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    #[error("no space for {len} bytes: {used} of {capacity} bytes in use and nothing evictable")]
    NoSpace { len: u64, used: u64, capacity: u64 },
    #[error("cannot map the DRAM arena of {capacity} bytes: {reason}")]
    Arena { capacity: u64, reason: String },
    /// A copy out of GPU memory failed; the value is dropped (its bytes
    /// cannot be trusted) and the read reports it.
    #[error("GPU tier: {0}")]
    Device(String),
}

/// Where a value lives. Readers always get DRAM bytes: a GPU value is
/// copied into DRAM for them, and one found in a lower tier is promoted
/// into DRAM before it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Gpu,
    Dram,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Dram => "dram",
        }
    }
}

/// What a value carries when it leaves DRAM for a lower tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    pub version: u64,
    pub expire_at_ms: Option<u64>,
    pub created_ms: u64,
    /// Promoted from the lower tier and unchanged since.
    pub clean: bool,
}

/// The tier under DRAM (NVMe), as the store drives it.
///
/// The store keeps one invariant across tiers: a lower copy of a key is
/// never older than its DRAM value, and never outlives a write or delete.
/// So every DRAM write and delete of a key calls [`LowerTier::forget`] in
/// the same critical section, and eviction hands the value down with
/// [`LowerTier::evicted`]. A promoted value keeps its lower copy (same
/// version): KV-cache blocks are written once and read many times, and
/// evicting an unchanged value again then costs no write. Both are called with the
/// index lock held (lock order: index → the lower tier's own locks): they
/// must be quick, must not block on I/O and must never call back into the
/// store.
pub trait LowerTier: Send + Sync {
    /// `value` is leaving DRAM; keep a copy if there is room. Returns
    /// whether a copy is kept (the key is still stored).
    fn evicted(&self, key: &Bytes, value: &[u8], info: Evicted) -> bool;
    /// `key` was written or deleted in DRAM: drop any lower copy and make
    /// any promotion of it in flight fail. Returns whether a copy was there.
    fn forget(&self, key: &[u8]) -> bool;
    /// Every key was deleted (`FLUSHALL`).
    fn clear(&self, now_ms: u64);
    /// One SCAN step over the keys held below DRAM, in the store's scan
    /// order: visits keys from `cursor` on (at least `count`, and never
    /// splitting keys that share a hash), hands each live one to `visit`
    /// with its scan hash, and returns the hash to resume from (0 when
    /// done). Called with the index lock held, so a key moving between
    /// tiers meanwhile is seen on one side or the other.
    fn scan(
        &self,
        cursor: u64,
        count: usize,
        now_ms: u64,
        visit: &mut dyn FnMut(u64, &Bytes),
    ) -> u64;
    /// Keys whose only copy is below DRAM (for `DBSIZE`).
    fn len_only_below(&self) -> u64;
}

/// Condition for a write (`SET NX` / `SET XX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Condition {
    #[default]
    Always,
    IfAbsent,
    IfPresent,
}

/// What a write does to the key's time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expiry {
    /// No TTL (a plain SET clears an old one, as in Redis).
    #[default]
    Persist,
    /// Expire at this absolute time in ms.
    At(u64),
    /// Keep the old key's TTL (`KEEPTTL`).
    Keep,
}

/// A key's remaining life, as TTL/PTTL report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    Missing,
    Persistent,
    Ms(u64),
}

/// Facts about a stored value (`STRATA.META`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub len: u64,
    pub tier: Tier,
    pub created_ms: u64,
    pub expire_at_ms: Option<u64>,
    /// Unique per committed value; a new write of the same key gets a new one.
    pub epoch: u64,
    /// Orders writes of a key across nodes: `(ms << 20) | sequence` from
    /// the node that accepted the write. Replicas keep the newest.
    pub version: u64,
    /// Where the value lives in the arena (for descriptors).
    pub addr: usize,
}

/// Figures for INFO and /metrics. All byte counts are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    pub capacity_bytes: u64,
    /// Bytes of arena handed out to values (size-class rounded).
    pub used_bytes: u64,
    /// Arena bytes not free, including partly used slabs.
    pub reserved_bytes: u64,
    /// Sum of the stored values' lengths.
    pub value_bytes: u64,
    pub keys: u64,
    /// Keys with a TTL.
    pub expiring_keys: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub expired: u64,
    pub gpu: GpuStats,
}

/// The GPU tier's figures (all zero without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuStats {
    pub capacity_bytes: u64,
    /// Bytes of the pool handed out to values (size-class rounded).
    pub used_bytes: u64,
    pub value_bytes: u64,
    pub keys: u64,
    /// Reads served from a GPU value (also counted in the store's hits).
    pub hits: u64,
    /// Values moved up on write.
    pub uploads: u64,
    /// Values moved down to DRAM to make room.
    pub demotions: u64,
    /// Reads served through a DRAM copy.
    pub staged_reads: u64,
    /// Values that stayed in DRAM because the GPU had no unpinned room.
    pub full: u64,
    /// Failed copies (the log says which).
    pub errors: u64,
}

/// A pinned, readable value. Holding it keeps the bytes valid and unchanged.
#[derive(Clone)]
pub struct Value {
    slot: SlotRef,
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Value")
            .field("len", &self.slot.len)
            .field("epoch", &self.slot.epoch)
            .finish()
    }
}

impl Value {
    pub fn as_slice(&self) -> &[u8] {
        debug_assert_eq!(self.slot.place, Tier::Dram, "a Value is always in DRAM");
        // SAFETY: the chunk is allocated for as long as this slot lives
        // (freed only in Slot::drop), was fully written before commit, and
        // no one writes to a committed chunk.
        unsafe {
            self.slot
                .shared()
                .arena
                .slice(self.slot.offset, self.slot.len)
        }
    }

    pub fn len(&self) -> u64 {
        self.slot.len
    }

    pub fn is_empty(&self) -> bool {
        self.slot.len == 0
    }

    pub fn epoch(&self) -> u64 {
        self.slot.epoch
    }

    pub fn version(&self) -> u64 {
        self.slot.version
    }

    /// Address of the first byte, for handing out descriptors.
    pub fn addr(&self) -> usize {
        self.slot.shared().arena.base_addr() + self.slot.offset as usize
    }
}

/// A chunk being filled by a writer; freed if dropped uncommitted.
pub struct Reservation {
    shared: Arc<Shared>,
    chunk: Option<Chunk>,
    len: u64,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("len", &self.len)
            .finish()
    }
}

impl Reservation {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let chunk = self.chunk.expect("reservation used after commit");
        // SAFETY: the allocator handed this chunk to this reservation
        // alone; nobody else reads or writes it until commit.
        unsafe { self.shared.arena.slice_mut(chunk.offset, self.len) }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte, for a transport to read into.
    pub fn addr(&self) -> usize {
        self.shared.arena.base_addr() + self.chunk.map_or(0, |c| c.offset as usize)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(chunk) = self.chunk.take() {
            self.shared.alloc.lock().free(chunk);
        }
    }
}

/// Values one write may move down from the GPU to make room for itself
/// (a 16 MiB value in a pool of 4 KiB ones needs 4096) before it gives up
/// and stays in DRAM.
const MAX_GPU_MOVES_PER_WRITE: usize = 8192;

/// Allocates from `alloc` if that keeps it under `watermark_bytes`.
fn try_alloc_in(alloc: &Mutex<SlabAllocator>, watermark_bytes: u64, len: u64) -> Option<Chunk> {
    let mut alloc = alloc.lock();
    if alloc.reserved_bytes().saturating_add(len) > watermark_bytes.max(len) {
        return None;
    }
    alloc.alloc(len)
}

/// One node's keyspace (GPU and DRAM; the lower tier is attached).
pub struct Store {
    shared: Arc<Shared>,
    index: Mutex<Index>,
    cfg: StoreConfig,
    /// Highest arena reservation allowed before writes evict.
    watermark_bytes: u64,
    epoch: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    expired: AtomicU64,
    gpu_hits: AtomicU64,
    gpu_uploads: AtomicU64,
    gpu_demotions: AtomicU64,
    gpu_staged: AtomicU64,
    gpu_full: AtomicU64,
    gpu_errors: AtomicU64,
    /// The tier evictions go to, if any (attached once, after start).
    lower: OnceLock<Arc<dyn LowerTier>>,
    /// Told of evictions, tier moves and expiries (attached once).
    observer: OnceLock<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("cfg", &self.cfg).finish()
    }
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Result<Store, StoreError> {
        Store::with_gpu(cfg, None)
    }

    /// A store whose top tier is `gpu` (its whole length is the pool). The
    /// arena is page-locked with the device for fast copies; if that fails
    /// copies still work, slower, and the log says so.
    pub fn with_gpu(
        cfg: StoreConfig,
        gpu: Option<Arc<dyn DeviceMemory>>,
    ) -> Result<Store, StoreError> {
        let arena = Arena::new(cfg.capacity_bytes).map_err(|e| StoreError::Arena {
            capacity: cfg.capacity_bytes,
            reason: e.to_string(),
        })?;
        let watermark_bytes = (cfg.capacity_bytes as f64 * cfg.high_watermark) as u64;
        let gpu = gpu.map(|device| {
            if let Err(e) = device.pin_host(arena.base_addr(), arena.len()) {
                tracing::warn!(error = %e, "cannot page-lock the DRAM arena: GPU copies will be slower");
            }
            let len = device.len();
            GpuPool {
                alloc: Mutex::new(SlabAllocator::new(len)),
                value_bytes: AtomicU64::new(0),
                watermark_bytes: (len as f64 * cfg.high_watermark) as u64,
                device,
            }
        });
        Ok(Store {
            shared: Arc::new(Shared {
                gpu,
                alloc: Mutex::new(SlabAllocator::new(cfg.capacity_bytes)),
                arena,
                value_bytes: AtomicU64::new(0),
                cells: Mutex::new(Cells::new()),
            }),
            index: Mutex::new(Index::default()),
            watermark_bytes,
            cfg,
            epoch: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            gpu_hits: AtomicU64::new(0),
            gpu_uploads: AtomicU64::new(0),
            gpu_demotions: AtomicU64::new(0),
            gpu_staged: AtomicU64::new(0),
            gpu_full: AtomicU64::new(0),
            gpu_errors: AtomicU64::new(0),
            lower: OnceLock::new(),
            observer: OnceLock::new(),
        })
    }

    /// The GPU pool's description, if the store has one.
    pub fn gpu_device(&self) -> Option<String> {
        self.shared.gpu.as_ref().map(|g| g.device.describe())
    }

    /// Sends evictions to `lower` from now on. Once per store; a second call
    /// returns `false` and changes nothing.
    pub fn attach_lower(&self, lower: Arc<dyn LowerTier>) -> bool {
        self.lower.set(lower).is_ok()
    }

    /// Tells `observer` of every [`TierEvent`] from now on. Once per
    /// store; a second call returns `false` and changes nothing.
    pub fn observe(&self, observer: Arc<dyn Observer>) -> bool {
        self.observer.set(observer).is_ok()
    }

    pub(crate) fn note(&self, event: TierEvent, key: &[u8]) {
        if let Some(o) = self.observer.get() {
            o.tier_event(event, key);
        }
    }

    /// See [`LowerTier::forget`]. Called with the index lock held.
    fn forget_lower(&self, key: &[u8]) -> bool {
        self.lower.get().is_some_and(|l| l.forget(key))
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// The arena as one region `(addr, len)`, for transport registration.
    pub fn region(&self) -> (usize, u64) {
        (self.shared.arena.base_addr(), self.shared.arena.len())
    }

    /// A handle on the arena that does not keep the store alive: for
    /// faulting the arena in from a thread of the caller's
    /// (`cpu_memory_prefault`) while the store serves.
    pub fn arena_handle(&self) -> ArenaHandle {
        ArenaHandle(Arc::downgrade(&self.shared))
    }

    /// Refuses a value before anything is buffered when it can never fit.
    pub fn check_len(&self, len: u64) -> Result<(), StoreError> {
        let max = self.cfg.max_value_bytes.min(self.cfg.capacity_bytes);
        if len > max {
            return Err(StoreError::TooLarge { len, max });
        }
        Ok(())
    }

    /// Takes `len` bytes of arena, evicting least recently used unpinned
    /// values while the arena is above its high watermark or fragmented.
    pub fn reserve(&self, len: u64) -> Result<Reservation, StoreError> {
        self.check_len(len)?;
        if let Some(chunk) = self.try_alloc(len) {
            return Ok(self.reservation(chunk, len));
        }
        let mut index = self.index.lock();
        let chunk = self.alloc_dram_locked(&mut index, len)?;
        Ok(self.reservation(chunk, len))
    }

    /// A DRAM chunk of `len` bytes, evicting the least recently used
    /// unpinned DRAM values to the lower tier until one fits.
    fn alloc_dram_locked(&self, index: &mut Index, len: u64) -> Result<Chunk, StoreError> {
        let mut cursor = LruCursor::START;
        loop {
            if let Some(chunk) = self.try_alloc(len) {
                return Ok(chunk);
            }
            let Some((next, key)) = index.oldest_unpinned(Tier::Dram, cursor) else {
                let alloc = self.shared.alloc.lock();
                return Err(StoreError::NoSpace {
                    len,
                    used: alloc.reserved_bytes(),
                    capacity: self.cfg.capacity_bytes,
                });
            };
            cursor = next;
            if let Some(e) = index.remove(&key) {
                self.evicted(&key, e);
            }
        }
    }

    /// Counts an entry leaving DRAM and hands it to the lower tier.
    /// Called with the index lock held.
    fn evicted(&self, key: &Bytes, e: Entry) {
        self.evictions.fetch_add(1, Relaxed);
        self.evicted_bytes.fetch_add(e.slot.len, Relaxed);
        let mut kept = false;
        if let Some(lower) = self.lower.get() {
            let value = Value {
                slot: e.slot.clone(),
            };
            let info = Evicted {
                version: e.slot.version,
                expire_at_ms: e.expire_at_ms,
                created_ms: e.slot.created_ms(),
                clean: e.slot.clean,
            };
            kept = lower.evicted(key, value.as_slice(), info);
        }
        let event = if kept {
            TierEvent::Spilled
        } else {
            TierEvent::Evicted
        };
        self.note(event, key);
        // Dropping the last reference frees the chunk; the index lock is
        // held, which is the allowed order (index → alloc).
        drop(e);
    }

    /// Moves up to `max` of the least recently used unpinned values down
    /// a tier: DRAM's to the lower tier, and once DRAM has none left, the
    /// GPU's to DRAM (a graceful stop keeps the contents this way). Returns
    /// how many moved; 0 when nothing is left or there is no lower tier.
    pub fn demote_some(&self, max: usize) -> usize {
        if self.lower.get().is_none() {
            return 0;
        }
        let dram_empty = self
            .index
            .lock()
            .oldest_unpinned(Tier::Dram, LruCursor::START)
            .is_none();
        if self.shared.gpu.is_some() && dram_empty {
            let mut moved = 0;
            // A failed copy drops the value (counted): it still leaves the
            // GPU, so the loop ends.
            while moved < max && self.demote_gpu_oldest().unwrap_or(false) {
                moved += 1;
            }
            return moved;
        }
        let mut index = self.index.lock();
        let victims = index.oldest_unpinned_keys(Tier::Dram, max);
        for key in &victims {
            if let Some(e) = index.remove(key) {
                self.evicted(key, e);
            }
        }
        victims.len()
    }

    /// Allocates if that keeps the arena under the watermark.
    fn try_alloc(&self, len: u64) -> Option<Chunk> {
        try_alloc_in(&self.shared.alloc, self.watermark_bytes, len)
    }

    fn reservation(&self, chunk: Chunk, len: u64) -> Reservation {
        Reservation {
            shared: self.shared.clone(),
            chunk: Some(chunk),
            len,
        }
    }

    /// Publishes a filled reservation under `key` if `cond` holds. Returns
    /// whether it was stored; a refused reservation is freed.
    pub fn commit(
        &self,
        key: Bytes,
        res: Reservation,
        cond: Condition,
        expiry: Expiry,
        now_ms: u64,
    ) -> bool {
        let slot = self.seal(res, now_ms);
        let mut expired = Vec::new();
        // Whatever leaves the index is dropped after the lock is released,
        // so freeing chunks never lengthens the critical section.
        let (stored, _replaced_or_refused) = {
            let mut index = self.index.lock();
            let found = index.live_found(&key, now_ms, &mut expired);
            let old_expiry = found.map(|f| index.entry(f).expire_at_ms);
            let ok = match cond {
                Condition::Always => true,
                Condition::IfAbsent => old_expiry.is_none(),
                Condition::IfPresent => old_expiry.is_some(),
            };
            if ok {
                let at = match expiry {
                    Expiry::Persist => None,
                    Expiry::At(at) => Some(at),
                    Expiry::Keep => old_expiry.flatten(),
                };
                self.forget_lower(&key);
                let old = index
                    .insert_found(&key, found, slot.clone(), at)
                    .map(|e| e.slot);
                (true, old)
            } else {
                (false, None)
            }
        };
        self.note_expired(expired);
        if stored {
            self.raise(&key, &slot);
        }
        stored
    }

    /// Publishes several values at once (MSET): readers see all or none.
    pub fn commit_all(&self, items: Vec<(Bytes, Reservation)>, now_ms: u64) {
        let slots: Vec<(Bytes, SlotRef)> = items
            .into_iter()
            .map(|(k, r)| (k, self.seal(r, now_ms)))
            .collect();
        let mut garbage = Vec::with_capacity(slots.len());
        {
            let mut index = self.index.lock();
            for (k, slot) in &slots {
                self.forget_lower(k);
                garbage.extend(index.insert(k, slot.clone(), None));
            }
        }
        drop(garbage);
        for (k, slot) in &slots {
            self.raise(k, slot);
        }
    }

    fn seal(&self, res: Reservation, now_ms: u64) -> SlotRef {
        self.seal_version(res, now_ms, None, false)
    }

    /// Versions order writes of one key across nodes; a local write takes
    /// the wall clock with the epoch as tie-breaker.
    fn seal_version(
        &self,
        mut res: Reservation,
        now_ms: u64,
        version: Option<u64>,
        clean: bool,
    ) -> SlotRef {
        let chunk = res.chunk.take().expect("reservation sealed twice");
        self.shared.value_bytes.fetch_add(res.len, Relaxed);
        let epoch = self.epoch.fetch_add(1, Relaxed) + 1;
        SlotRef::new(
            &self.shared,
            Slot {
                offset: chunk.offset,
                len: res.len,
                epoch,
                version: version.unwrap_or((now_ms << 20) | (epoch & 0xf_ffff)),
                place: Tier::Dram,
                counted: true,
                clean,
            },
        )
    }

    /// Publishes a copy received from another node if it is newer than
    /// what is stored (or nothing is). Returns whether it was stored.
    pub fn commit_copy(
        &self,
        key: Bytes,
        res: Reservation,
        version: u64,
        expire_at_ms: Option<u64>,
        now_ms: u64,
    ) -> bool {
        self.commit_copy_inner(
            key,
            res,
            version,
            expire_at_ms,
            now_ms,
            None::<fn() -> bool>,
        )
    }

    /// Publishes a value read back from the lower tier if it is newer than
    /// what DRAM holds (or DRAM holds nothing) and `still_valid()` holds; it
    /// is asked under the index lock, so nothing can write or delete the
    /// key between the check and the insert. A promotion uses it to lose to
    /// any write, delete or eviction that came while it read. The lower
    /// copy is kept (see [`LowerTier`]).
    pub fn commit_promoted(
        &self,
        key: Bytes,
        res: Reservation,
        version: u64,
        expire_at_ms: Option<u64>,
        now_ms: u64,
        still_valid: impl FnOnce() -> bool,
    ) -> bool {
        self.commit_copy_inner(key, res, version, expire_at_ms, now_ms, Some(still_valid))
    }

    fn commit_copy_inner(
        &self,
        key: Bytes,
        res: Reservation,
        version: u64,
        expire_at_ms: Option<u64>,
        now_ms: u64,
        promoted: Option<impl FnOnce() -> bool>,
    ) -> bool {
        let promotion = promoted.is_some();
        let slot = self.seal_version(res, now_ms, Some(version), promotion);
        let mut expired = Vec::new();
        let (stored, upload, _replaced) = {
            let mut index = self.index.lock();
            let buried = index.tombstones.get(&key).is_some_and(|t| *t >= version);
            let found = index.live_found(&key, now_ms, &mut expired);
            let newer = !buried && found.is_none_or(|f| index.entry(f).slot.version < version);
            // A promoted value is being read right now, through DRAM: it
            // stays there. A copy from a peer is a write like any other.
            let (valid, upload) = match promoted {
                Some(still_valid) => (newer && still_valid(), false),
                None => {
                    if newer {
                        self.forget_lower(&key);
                    }
                    (newer, true)
                }
            };
            if valid {
                let old = index
                    .insert_found(&key, found, slot.clone(), expire_at_ms)
                    .map(|e| e.slot);
                (true, upload, old)
            } else {
                (false, false, None)
            }
        };
        self.note_expired(expired);
        if upload {
            self.raise(&key, &slot);
        }
        if stored && promotion {
            self.note(TierEvent::Promoted, &key);
        }
        stored
    }

    /// The newest version this node knows for `key`: its live value's, or
    /// its delete's.
    pub fn version_of(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        let tomb = self.index.lock().tombstones.get(key).copied();
        let live = self.meta(key, now_ms).map(|m| m.version);
        live.max(tomb)
    }

    /// The value, pinned, and marks it recently used. Fails only for a
    /// GPU value that cannot be copied into DRAM (no room, or a device
    /// error).
    pub fn get(&self, key: &[u8], now_ms: u64) -> Result<Option<Value>, StoreError> {
        let found = self.get_present(key, now_ms)?;
        if found.is_none() {
            self.note_miss();
        }
        Ok(found)
    }

    /// Like [`Store::get`], except that a miss is not counted: a caller
    /// that looks first and brings a missing key in from below (then asks
    /// again) counts a miss with [`Store::note_miss`] only if it stays one.
    /// Looking first costs a hit one index lookup instead of two.
    pub fn get_present(&self, key: &[u8], now_ms: u64) -> Result<Option<Value>, StoreError> {
        let mut expired = Vec::new();
        let found = {
            let mut index = self.index.lock();
            let found = index.live_found(key, now_ms, &mut expired);
            found.map(|f| {
                let slot = index.entry(f).slot.clone();
                index.touch_found(f);
                slot
            })
        };
        self.note_expired(expired);
        match found {
            Some(slot) => {
                self.hits.fetch_add(1, Relaxed);
                if slot.place == Tier::Gpu {
                    self.gpu_hits.fetch_add(1, Relaxed);
                }
                self.readable(key, slot).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Counts a read that found nothing (see [`Store::get_present`]).
    pub fn note_miss(&self) {
        self.misses.fetch_add(1, Relaxed);
    }

    /// The value, pinned, without counting a read or touching the LRU
    /// order (replication and repair read values nobody asked for).
    pub fn peek(&self, key: &[u8], now_ms: u64) -> Result<Option<Value>, StoreError> {
        Ok(self.peek_with_expiry(key, now_ms)?.map(|(v, _)| v))
    }

    /// Like [`Store::peek`], with the key's expiry.
    pub fn peek_with_expiry(
        &self,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<(Value, Option<u64>)>, StoreError> {
        let mut expired = Vec::new();
        let found = self
            .index
            .lock()
            .live(key, now_ms, &mut expired)
            .map(|e| (e.slot.clone(), e.expire_at_ms));
        self.note_expired(expired);
        match found {
            Some((slot, at)) => Ok(Some((self.readable(key, slot)?, at))),
            None => Ok(None),
        }
    }

    /// Like [`Store::get`] but reports only the facts, without pinning or
    /// counting a hit.
    pub fn meta(&self, key: &[u8], now_ms: u64) -> Option<Meta> {
        let mut expired = Vec::new();
        let meta = {
            let mut index = self.index.lock();
            index
                .live(key, now_ms, &mut expired)
                .map(|e| self.facts(e.slot, e.expire_at_ms))
        };
        self.note_expired(expired);
        meta
    }

    /// [`Store::meta`] and the CRC32C of the value's bytes as they are
    /// stored now (`STRATA.META`).
    ///
    /// The checksum is summed here, when asked, and not on write: nothing
    /// on the data path reads it (a GET is never checked against it, and
    /// the NVMe tier sums each blob as it writes it), so summing every
    /// PUT's payload would cost every write a pass over its bytes
    /// (docs/bench-notes/checksums-and-write-path.md) for a figure few
    /// ask for. And a sum of the stored bytes is the one that tells a
    /// caller whether the node still holds what was written. It runs
    /// outside the index lock, on a reference that keeps the bytes alive;
    /// a GPU value is summed through a bounded host buffer, piece by
    /// piece, without taking DRAM. Fails
    /// only for a GPU value that cannot be copied out (which is then
    /// dropped, as a read would).
    pub fn meta_summed(&self, key: &[u8], now_ms: u64) -> Result<Option<(Meta, u32)>, StoreError> {
        let mut expired = Vec::new();
        let found = {
            let mut index = self.index.lock();
            index
                .live(key, now_ms, &mut expired)
                .map(|e| (self.facts(e.slot, e.expire_at_ms), e.slot.clone()))
        };
        self.note_expired(expired);
        let Some((meta, slot)) = found else {
            return Ok(None);
        };
        let sum = match slot.place {
            Tier::Dram => crate::checksum::crc32c(Value { slot }.as_slice()),
            Tier::Gpu => self.sum_gpu(key, &slot)?,
        };
        Ok(Some((meta, sum)))
    }

    fn facts(&self, slot: &SlotRef, expire_at_ms: Option<u64>) -> Meta {
        Meta {
            len: slot.len,
            tier: slot.place,
            created_ms: slot.created_ms(),
            expire_at_ms,
            epoch: slot.epoch,
            version: slot.version,
            // A GPU value's offset in the pool (it has no host address).
            addr: match slot.place {
                Tier::Dram => self.shared.arena.base_addr() + slot.offset as usize,
                Tier::Gpu => slot.offset as usize,
            },
        }
    }

    pub fn exists(&self, key: &[u8], now_ms: u64) -> bool {
        let mut expired = Vec::new();
        let found = self.index.lock().live(key, now_ms, &mut expired).is_some();
        self.note_expired(expired);
        found
    }

    /// Removes `key`; returns whether it was there (and live). With
    /// tombstones on, the delete is remembered whether or not the key was
    /// here, so an older copy arriving later is refused.
    pub fn delete(&self, key: &[u8], now_ms: u64) -> bool {
        let mut expired = Vec::new();
        let removed = {
            let mut index = self.index.lock();
            let removed = match index.live(key, now_ms, &mut expired) {
                Some(_) => index.remove(key),
                None => None,
            };
            let below = self.forget_lower(key);
            index.bury(key, now_ms, self.cfg.tombstone_ms);
            (removed, below)
        };
        self.note_expired(expired);
        removed.0.is_some() || removed.1
    }

    /// Removes `key` only if its live value still has `version` (a copy
    /// handed off to another node is dropped, a newer write is not).
    pub fn delete_version(&self, key: &[u8], version: u64, now_ms: u64) -> bool {
        let mut expired = Vec::new();
        let removed = {
            let mut index = self.index.lock();
            match index.live(key, now_ms, &mut expired) {
                Some(e) if e.slot.version == version => {
                    self.forget_lower(key);
                    index.remove(key)
                }
                _ => None,
            }
        };
        self.note_expired(expired);
        removed.is_some()
    }

    pub fn ttl(&self, key: &[u8], now_ms: u64) -> Ttl {
        let mut expired = Vec::new();
        let ttl = match self.index.lock().live(key, now_ms, &mut expired) {
            None => Ttl::Missing,
            Some(e) => match e.expire_at_ms {
                None => Ttl::Persistent,
                Some(at) => Ttl::Ms(at.saturating_sub(now_ms)),
            },
        };
        self.note_expired(expired);
        ttl
    }

    /// Sets (or with `None` clears) the expiry of a live key. An expiry in
    /// the past deletes the key, as in Redis. Returns whether the key exists.
    pub fn set_expiry(&self, key: &[u8], at_ms: Option<u64>, now_ms: u64) -> bool {
        let mut expired = Vec::new();
        let mut removed = None;
        let found = {
            let mut index = self.index.lock();
            let live = index.live(key, now_ms, &mut expired).is_some();
            if live {
                // A lower copy carries the old expiry in its header: it
                // must not outlive (or cut short) the new one.
                self.forget_lower(key);
            }
            match index.live(key, now_ms, &mut expired) {
                None => false,
                Some(_) if at_ms.is_some_and(|at| at <= now_ms) => {
                    removed = index.remove(key);
                    true
                }
                Some(_) => {
                    index.set_expiry(key, at_ms);
                    true
                }
            }
        };
        self.note_expired(expired);
        drop(removed);
        found
    }

    /// Removes up to `max` expired keys; returns how many. Called
    /// periodically so that keys nobody reads still go away.
    pub fn expire_some(&self, now_ms: u64, max: usize) -> usize {
        let mut garbage = Vec::new();
        {
            let mut index = self.index.lock();
            while garbage.len() < max {
                let Some(gone) = index.pop_expired(now_ms) else {
                    break;
                };
                garbage.push(gone);
            }
        }
        let n = garbage.len();
        self.note_expired(garbage);
        n
    }

    fn note_expired(&self, expired: Vec<(Bytes, Entry)>) {
        if !expired.is_empty() {
            self.expired.fetch_add(expired.len() as u64, Relaxed);
            for (key, _) in &expired {
                self.note(TierEvent::Expired, key);
            }
        }
    }

    /// One SCAN step over every tier: visits up to `count` keys (more when
    /// several share a hash, so a cursor never splits them) starting at
    /// `cursor`, returns those `filter` accepts and the next cursor (0 when
    /// done). DRAM/GPU keys and the keys held only below DRAM share one
    /// order, so a full iteration returns every key present throughout,
    /// wherever it lives, and a key in two tiers once.
    pub fn scan(
        &self,
        cursor: u64,
        count: usize,
        now_ms: u64,
        mut filter: impl FnMut(&[u8]) -> bool,
    ) -> (u64, Vec<Bytes>) {
        let count = count.max(1);
        let index = self.index.lock();
        let mut mine = Vec::new();
        let next = index.scan_step(cursor, count, |h, k, expire_at_ms| {
            let live = expire_at_ms.is_none_or(|at| at > now_ms);
            if live && filter(k) {
                mine.push((h, Bytes::copy_from_slice(k)));
            }
        });
        let Some(lower) = self.lower.get() else {
            return (next, mine.into_iter().map(|(_, k)| k).collect());
        };
        let mut below = Vec::new();
        let next_below = lower.scan(cursor, count, now_ms, &mut |h, k| {
            // A key also in DRAM is listed (or, expired, not) from there.
            if !index.contains(k) {
                below.push((h, k.clone()));
            }
        });
        drop(index);
        // Resume where the shorter walk stopped; what either side saw past
        // that point comes again on the next call.
        let next = match (next, next_below) {
            (0, n) | (n, 0) => n,
            (a, b) => a.min(b),
        };
        let before = |h: u64| next == 0 || h < next;
        let mut out: Vec<Bytes> = mine
            .into_iter()
            .filter(|(h, _)| before(*h))
            .map(|(_, k)| k)
            .collect();
        out.extend(
            below
                .into_iter()
                .filter(|(h, k)| before(*h) && filter(k))
                .map(|(_, k)| k),
        );
        (next, out)
    }

    /// Number of keys in every tier, including expired ones not yet
    /// collected (as Redis' DBSIZE does).
    pub fn len(&self) -> u64 {
        let dram = self.index.lock().len() as u64;
        dram + self.lower.get().map_or(0, |l| l.len_only_below())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key. Values pinned by readers are freed when released.
    pub fn flush(&self, now_ms: u64) {
        let old = {
            let mut index = self.index.lock();
            if let Some(lower) = self.lower.get() {
                lower.clear(now_ms);
            }
            std::mem::take(&mut *index)
        };
        drop(old);
    }

    pub fn stats(&self) -> StoreStats {
        let (keys, expiring_keys, gpu_keys) = {
            let index = self.index.lock();
            (
                index.len() as u64,
                index.expiring() as u64,
                index.gpu_len() as u64,
            )
        };
        let gpu = match &self.shared.gpu {
            None => GpuStats::default(),
            Some(g) => GpuStats {
                capacity_bytes: g.device.len(),
                used_bytes: g.alloc.lock().used_bytes(),
                value_bytes: g.value_bytes.load(Relaxed),
                keys: gpu_keys,
                hits: self.gpu_hits.load(Relaxed),
                uploads: self.gpu_uploads.load(Relaxed),
                demotions: self.gpu_demotions.load(Relaxed),
                staged_reads: self.gpu_staged.load(Relaxed),
                full: self.gpu_full.load(Relaxed),
                errors: self.gpu_errors.load(Relaxed),
            },
        };
        let alloc = self.shared.alloc.lock();
        StoreStats {
            capacity_bytes: self.cfg.capacity_bytes,
            used_bytes: alloc.used_bytes(),
            reserved_bytes: alloc.reserved_bytes(),
            value_bytes: self.shared.value_bytes.load(Relaxed),
            keys,
            expiring_keys,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            evicted_bytes: self.evicted_bytes.load(Relaxed),
            expired: self.expired.load(Relaxed),
            gpu,
        }
    }
}
