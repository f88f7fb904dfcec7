//! The keyspace of one node: which key lives where, for how long, and what
//! to evict when memory runs short.
//!
//! Values live in the DRAM [`Arena`]; the index (key → slot) lives on the
//! heap beside it. A value is an `Arc<Slot>`: the index holds one reference
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
//! The store never reads a clock: callers pass `now_ms`, which keeps expiry
//! deterministic in tests. It never sees RESP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Builder};

use crate::dram::{Arena, Chunk, SlabAllocator};

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

/// Tombstones kept at most; the oldest go first.
const MAX_TOMBSTONES: usize = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    #[error("no space for {len} bytes: {used} of {capacity} bytes in use and nothing evictable")]
    NoSpace { len: u64, used: u64, capacity: u64 },
    #[error("cannot map the DRAM arena of {capacity} bytes: {reason}")]
    Arena { capacity: u64, reason: String },
}

/// Where a value lives. A value is served from DRAM only: one found in a
/// lower tier is promoted into DRAM before it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Dram,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
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
    pub checksum: u32,
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
    /// `value` is leaving DRAM; keep a copy if there is room.
    fn evicted(&self, key: &Bytes, value: &[u8], info: Evicted);
    /// `key` was written or deleted in DRAM: drop any lower copy and make
    /// any promotion of it in flight fail. Returns whether a copy was there.
    fn forget(&self, key: &[u8]) -> bool;
    /// Every key was deleted (`FLUSHALL`).
    fn clear(&self, now_ms: u64);
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
    /// CRC32C of the value bytes.
    pub checksum: u32,
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
}

/// A value's memory; freed when the last reference goes.
struct Slot {
    shared: Arc<Shared>,
    chunk: Chunk,
    len: u64,
    checksum: u32,
    created_ms: u64,
    epoch: u64,
    version: u64,
    /// Read back from the lower tier and unchanged since: the lower tier
    /// still holds these very bytes (unless it dropped them), so evicting
    /// the value needs no new write.
    clean: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.alloc.lock().free(self.chunk);
        self.shared.value_bytes.fetch_sub(self.len, Relaxed);
    }
}

/// What every slot needs to free itself: the arena and its allocator.
struct Shared {
    arena: Arena,
    alloc: Mutex<SlabAllocator>,
    value_bytes: AtomicU64,
}

/// A pinned, readable value. Holding it keeps the bytes valid and unchanged.
#[derive(Clone)]
pub struct Value {
    slot: Arc<Slot>,
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
        // SAFETY: the chunk is allocated for as long as this slot lives
        // (freed only in Slot::drop), was fully written before commit, and
        // no one writes to a committed chunk.
        unsafe {
            self.slot
                .shared
                .arena
                .slice(self.slot.chunk.offset, self.slot.len)
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

    pub fn checksum(&self) -> u32 {
        self.slot.checksum
    }

    /// Address of the first byte, for handing out descriptors.
    pub fn addr(&self) -> usize {
        self.slot.shared.arena.base_addr() + self.slot.chunk.offset as usize
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

struct Entry {
    slot: Arc<Slot>,
    /// Position in the LRU order.
    tick: u64,
    expire_at_ms: Option<u64>,
}

/// Scan order key: (hash, key). Hashes are ≥ 1 and < 2^63 so that a cursor
/// is a positive integer in every client and 0 can mean "start/done".
type ScanKey = (u64, Bytes);

fn scan_hash(key: &[u8]) -> u64 {
    (xxh3_64(key) >> 1).max(1)
}

#[derive(Default)]
struct Index {
    map: HashMap<Bytes, Entry, Xxh3Builder>,
    /// Stable iteration order for SCAN: keys never move while present, so a
    /// full scan returns every key that was there throughout.
    order: BTreeSet<ScanKey>,
    /// Least recently used first.
    lru: BTreeMap<u64, Bytes>,
    expiry: BTreeSet<(u64, Bytes)>,
    tick: u64,
    /// Deleted keys → (version of the delete, when).
    tombstones: HashMap<Bytes, u64, Xxh3Builder>,
    tombstone_order: std::collections::VecDeque<(u64, Bytes)>,
}

impl Index {
    fn bury(&mut self, key: &[u8], now_ms: u64, keep_ms: u64) {
        if keep_ms == 0 {
            return;
        }
        // Newer than any write this node accepted in the same millisecond.
        let version = (now_ms << 20) | 0xf_ffff;
        let key = Bytes::copy_from_slice(key);
        self.tombstones.insert(key.clone(), version);
        self.tombstone_order.push_back((now_ms, key));
        while let Some((at, k)) = self.tombstone_order.front() {
            if *at + keep_ms > now_ms && self.tombstone_order.len() <= MAX_TOMBSTONES {
                break;
            }
            let at = *at;
            let k = k.clone();
            self.tombstone_order.pop_front();
            // Only if not re-buried since.
            if self.tombstones.get(&k).is_some_and(|v| *v >> 20 <= at) {
                self.tombstones.remove(&k);
            }
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let (k, e) = self.map.remove_entry(key)?;
        self.order.remove(&(scan_hash(&k), k.clone()));
        self.lru.remove(&e.tick);
        if let Some(at) = e.expire_at_ms {
            self.expiry.remove(&(at, k));
        }
        Some(e)
    }

    fn insert(&mut self, key: Bytes, slot: Arc<Slot>, expire_at_ms: Option<u64>) -> Option<Entry> {
        self.tombstones.remove(&key);
        let old = self.remove(&key);
        let tick = self.next_tick();
        self.order.insert((scan_hash(&key), key.clone()));
        self.lru.insert(tick, key.clone());
        if let Some(at) = expire_at_ms {
            self.expiry.insert((at, key.clone()));
        }
        self.map.insert(
            key,
            Entry {
                slot,
                tick,
                expire_at_ms,
            },
        );
        old
    }

    /// Live entry for `key`; removes it if it has expired.
    fn live(&mut self, key: &[u8], now_ms: u64, expired: &mut Vec<Entry>) -> Option<&mut Entry> {
        let dead = match self.map.get(key) {
            None => return None,
            Some(e) => e.expire_at_ms.is_some_and(|at| at <= now_ms),
        };
        if dead {
            expired.extend(self.remove(key));
            return None;
        }
        self.map.get_mut(key)
    }

    /// Marks `key` most recently used. A key already among the most recent
    /// eighth of the order is left where it is: eviction takes from the
    /// other end, so moving it changes nothing but costs two tree updates
    /// on every read of a hot key.
    fn touch(&mut self, key: &[u8]) {
        let recent = self.map.len() as u64 / RECENT_FRACTION;
        let current = self.tick;
        if self.map.get(key).is_some_and(|e| current - e.tick < recent) {
            return;
        }
        let tick = self.next_tick();
        if let Some(e) = self.map.get_mut(key) {
            if let Some(k) = self.lru.remove(&e.tick) {
                self.lru.insert(tick, k);
            }
            e.tick = tick;
        }
    }
}

/// See [`Index::touch`].
const RECENT_FRACTION: u64 = 8;

/// Eviction looks at most this many pinned values before giving up, so a
/// write cannot spin over a store full of leased values.
const MAX_PINNED_SKIPS: usize = 1024;

/// One node's DRAM keyspace.
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
    /// The tier evictions go to, if any (attached once, after start).
    lower: OnceLock<Arc<dyn LowerTier>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("cfg", &self.cfg).finish()
    }
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Result<Store, StoreError> {
        let arena = Arena::new(cfg.capacity_bytes).map_err(|e| StoreError::Arena {
            capacity: cfg.capacity_bytes,
            reason: e.to_string(),
        })?;
        let watermark_bytes = (cfg.capacity_bytes as f64 * cfg.high_watermark) as u64;
        Ok(Store {
            shared: Arc::new(Shared {
                alloc: Mutex::new(SlabAllocator::new(cfg.capacity_bytes)),
                arena,
                value_bytes: AtomicU64::new(0),
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
            lower: OnceLock::new(),
        })
    }

    /// Sends evictions to `lower` from now on. Once per store; a second call
    /// returns `false` and changes nothing.
    pub fn attach_lower(&self, lower: Arc<dyn LowerTier>) -> bool {
        self.lower.set(lower).is_ok()
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
        let mut skipped = 0usize;
        let mut cursor = 0u64;
        loop {
            if let Some(chunk) = self.try_alloc(len) {
                return Ok(self.reservation(chunk, len));
            }
            // Oldest unpinned entry at or after `cursor`.
            let mut victim = None;
            for (tick, key) in index.lru.range(cursor..) {
                let pinned = index
                    .map
                    .get(key)
                    .is_some_and(|e| Arc::strong_count(&e.slot) > 1);
                if !pinned {
                    victim = Some((*tick, key.clone()));
                    break;
                }
                skipped += 1;
                if skipped > MAX_PINNED_SKIPS {
                    break;
                }
            }
            let Some((tick, key)) = victim else {
                let alloc = self.shared.alloc.lock();
                return Err(StoreError::NoSpace {
                    len,
                    used: alloc.reserved_bytes(),
                    capacity: self.cfg.capacity_bytes,
                });
            };
            cursor = tick;
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
        if let Some(lower) = self.lower.get() {
            let value = Value {
                slot: e.slot.clone(),
            };
            let info = Evicted {
                version: e.slot.version,
                expire_at_ms: e.expire_at_ms,
                created_ms: e.slot.created_ms,
                checksum: e.slot.checksum,
                clean: e.slot.clean,
            };
            lower.evicted(key, value.as_slice(), info);
        }
        // Dropping the last reference frees the chunk; the index lock is
        // held, which is the allowed order (index → alloc).
        drop(e);
    }

    /// Moves up to `max` of the least recently used unpinned values down
    /// to the lower tier (a graceful stop keeps DRAM's contents this way).
    /// Returns how many moved; 0 when nothing is left or there is no lower
    /// tier.
    pub fn demote_some(&self, max: usize) -> usize {
        if self.lower.get().is_none() {
            return 0;
        }
        let mut index = self.index.lock();
        let victims: Vec<Bytes> = index
            .lru
            .values()
            .filter(|k| {
                index
                    .map
                    .get(*k)
                    .is_some_and(|e| Arc::strong_count(&e.slot) == 1)
            })
            .take(max)
            .cloned()
            .collect();
        for key in &victims {
            if let Some(e) = index.remove(key) {
                self.evicted(key, e);
            }
        }
        victims.len()
    }

    /// Allocates if that keeps the arena under the watermark.
    fn try_alloc(&self, len: u64) -> Option<Chunk> {
        let mut alloc = self.shared.alloc.lock();
        if alloc.reserved_bytes().saturating_add(len) > self.watermark_bytes.max(len) {
            return None;
        }
        alloc.alloc(len)
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
            let old_expiry = index
                .live(&key, now_ms, &mut expired)
                .map(|e| e.expire_at_ms);
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
                (true, index.insert(key, slot, at).map(|e| e.slot))
            } else {
                (false, Some(slot))
            }
        };
        self.note_expired(expired);
        stored
    }

    /// Publishes several values at once (MSET): readers see all or none.
    pub fn commit_all(&self, items: Vec<(Bytes, Reservation)>, now_ms: u64) {
        let slots: Vec<(Bytes, Arc<Slot>)> = items
            .into_iter()
            .map(|(k, r)| (k, self.seal(r, now_ms)))
            .collect();
        let mut garbage = Vec::with_capacity(slots.len());
        {
            let mut index = self.index.lock();
            for (k, slot) in slots {
                self.forget_lower(&k);
                garbage.extend(index.insert(k, slot, None));
            }
        }
        drop(garbage);
    }

    fn seal(&self, res: Reservation, now_ms: u64) -> Arc<Slot> {
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
    ) -> Arc<Slot> {
        let checksum = crc32c::crc32c(res.as_mut_slice());
        let chunk = res.chunk.take().expect("reservation sealed twice");
        self.shared.value_bytes.fetch_add(res.len, Relaxed);
        let epoch = self.epoch.fetch_add(1, Relaxed) + 1;
        Arc::new(Slot {
            shared: self.shared.clone(),
            chunk,
            len: res.len,
            checksum,
            created_ms: now_ms,
            epoch,
            version: version.unwrap_or((now_ms << 20) | (epoch & 0xf_ffff)),
            clean,
        })
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
        let slot = self.seal_version(res, now_ms, Some(version), promoted.is_some());
        let mut expired = Vec::new();
        let (stored, _replaced_or_refused) = {
            let mut index = self.index.lock();
            let buried = index.tombstones.get(&key).is_some_and(|t| *t >= version);
            let newer = !buried
                && index
                    .live(&key, now_ms, &mut expired)
                    .is_none_or(|e| e.slot.version < version);
            let valid = match promoted {
                Some(still_valid) => newer && still_valid(),
                None => {
                    if newer {
                        self.forget_lower(&key);
                    }
                    newer
                }
            };
            if valid {
                (true, index.insert(key, slot, expire_at_ms).map(|e| e.slot))
            } else {
                (false, Some(slot))
            }
        };
        self.note_expired(expired);
        stored
    }

    /// The newest version this node knows for `key`: its live value's, or
    /// its delete's.
    pub fn version_of(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        let tomb = self.index.lock().tombstones.get(key).copied();
        let live = self.meta(key, now_ms).map(|m| m.version);
        live.max(tomb)
    }

    /// The value, pinned, and marks it recently used.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<Value> {
        let mut expired = Vec::new();
        let found = {
            let mut index = self.index.lock();
            let slot = index
                .live(key, now_ms, &mut expired)
                .map(|e| e.slot.clone());
            if slot.is_some() {
                index.touch(key);
            }
            slot
        };
        self.note_expired(expired);
        match found {
            Some(slot) => {
                self.hits.fetch_add(1, Relaxed);
                Some(Value { slot })
            }
            None => {
                self.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// The value, pinned, without counting a read or touching the LRU
    /// order (replication and repair read values nobody asked for).
    pub fn peek(&self, key: &[u8], now_ms: u64) -> Option<Value> {
        let mut expired = Vec::new();
        let slot = self
            .index
            .lock()
            .live(key, now_ms, &mut expired)
            .map(|e| (e.slot.clone(), e.expire_at_ms));
        self.note_expired(expired);
        slot.map(|(slot, _)| Value { slot })
    }

    /// Like [`Store::peek`], with the key's expiry.
    pub fn peek_with_expiry(&self, key: &[u8], now_ms: u64) -> Option<(Value, Option<u64>)> {
        let mut expired = Vec::new();
        let found = self.index.lock().live(key, now_ms, &mut expired).map(|e| {
            (
                Value {
                    slot: e.slot.clone(),
                },
                e.expire_at_ms,
            )
        });
        self.note_expired(expired);
        found
    }

    /// Like [`Store::get`] but reports only the facts, without pinning or
    /// counting a hit.
    pub fn meta(&self, key: &[u8], now_ms: u64) -> Option<Meta> {
        let mut expired = Vec::new();
        let meta = {
            let mut index = self.index.lock();
            index.live(key, now_ms, &mut expired).map(|e| Meta {
                len: e.slot.len,
                tier: Tier::Dram,
                created_ms: e.slot.created_ms,
                expire_at_ms: e.expire_at_ms,
                checksum: e.slot.checksum,
                epoch: e.slot.epoch,
                version: e.slot.version,
                addr: self.shared.arena.base_addr() + e.slot.chunk.offset as usize,
            })
        };
        self.note_expired(expired);
        meta
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
                Some(e) => {
                    let old = std::mem::replace(&mut e.expire_at_ms, at_ms);
                    if let Some((k, _)) = index.map.get_key_value(key) {
                        let k = k.clone();
                        if let Some(old) = old {
                            index.expiry.remove(&(old, k.clone()));
                        }
                        if let Some(at) = at_ms {
                            index.expiry.insert((at, k));
                        }
                    }
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
                let Some((at, k)) = index.expiry.first().cloned() else {
                    break;
                };
                if at > now_ms {
                    break;
                }
                garbage.extend(index.remove(&k));
            }
        }
        let n = garbage.len();
        self.note_expired(garbage);
        n
    }

    fn note_expired(&self, expired: Vec<Entry>) {
        if !expired.is_empty() {
            self.expired.fetch_add(expired.len() as u64, Relaxed);
        }
    }

    /// One SCAN step: visits up to `count` keys (more when several share a
    /// hash, so a cursor never splits them) starting at `cursor`, returns
    /// those `filter` accepts and the next cursor (0 when done).
    pub fn scan(
        &self,
        cursor: u64,
        count: usize,
        now_ms: u64,
        mut filter: impl FnMut(&[u8]) -> bool,
    ) -> (u64, Vec<Bytes>) {
        let index = self.index.lock();
        let mut out = Vec::new();
        let mut last_hash = None;
        for (visited, (h, k)) in index.order.range((cursor, Bytes::new())..).enumerate() {
            if visited >= count.max(1) && last_hash != Some(*h) {
                return (*h, out);
            }
            last_hash = Some(*h);
            let live = index
                .map
                .get(k)
                .is_some_and(|e| e.expire_at_ms.is_none_or(|at| at > now_ms));
            if live && filter(k) {
                out.push(k.clone());
            }
        }
        (0, out)
    }

    /// Number of keys, including expired ones not yet collected (as Redis'
    /// DBSIZE does).
    pub fn len(&self) -> u64 {
        self.index.lock().map.len() as u64
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
        let (keys, expiring_keys) = {
            let index = self.index.lock();
            (index.map.len() as u64, index.expiry.len() as u64)
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
        }
    }
}
