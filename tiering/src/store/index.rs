//! The index of a store: key → entry, the LRU orders (one per pool) that
//! eviction walks, the expiry order, the SCAN order, and the tombstones of
//! deleted keys. Pure bookkeeping under the store's index lock: it never
//! touches memory pools or the lower tier.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Builder};

use super::{Slot, Tier};

/// Tombstones kept at most; the oldest go first.
const MAX_TOMBSTONES: usize = 1_000_000;

pub(super) struct Entry {
    pub(super) slot: Arc<Slot>,
    /// Position in the LRU order.
    pub(super) tick: u64,
    pub(super) expire_at_ms: Option<u64>,
}

/// Scan order key: (hash, key). Hashes are ≥ 1 and < 2^63 so that a cursor
/// is a positive integer in every client and 0 can mean "start/done".
pub(super) type ScanKey = (u64, Bytes);

pub(crate) fn scan_hash(key: &[u8]) -> u64 {
    (xxh3_64(key) >> 1).max(1)
}

#[derive(Default)]
pub(super) struct Index {
    pub(super) map: HashMap<Bytes, Entry, Xxh3Builder>,
    /// Stable iteration order for SCAN: keys never move while present, so a
    /// full scan returns every key that was there throughout.
    pub(super) order: BTreeSet<ScanKey>,
    /// DRAM values, least recently used first.
    pub(super) lru: BTreeMap<u64, Bytes>,
    /// GPU values, least recently used first. Ticks are unique across both
    /// orders, so a value moving between tiers keeps its age.
    pub(super) gpu_lru: BTreeMap<u64, Bytes>,
    pub(super) expiry: BTreeSet<(u64, Bytes)>,
    pub(super) tick: u64,
    /// Deleted keys → (version of the delete, when).
    pub(super) tombstones: HashMap<Bytes, u64, Xxh3Builder>,
    pub(super) tombstone_order: std::collections::VecDeque<(u64, Bytes)>,
}

impl Index {
    pub(super) fn bury(&mut self, key: &[u8], now_ms: u64, keep_ms: u64) {
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

    pub(super) fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    pub(super) fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        self.remove_keyed(key).map(|(_, e)| e)
    }

    /// Like [`Index::remove`], also giving back the stored key.
    pub(super) fn remove_keyed(&mut self, key: &[u8]) -> Option<(Bytes, Entry)> {
        let (k, e) = self.map.remove_entry(key)?;
        self.order.remove(&(scan_hash(&k), k.clone()));
        self.lru_of(e.slot.place).remove(&e.tick);
        if let Some(at) = e.expire_at_ms {
            self.expiry.remove(&(at, k.clone()));
        }
        Some((k, e))
    }

    pub(super) fn insert(
        &mut self,
        key: Bytes,
        slot: Arc<Slot>,
        expire_at_ms: Option<u64>,
    ) -> Option<Entry> {
        self.tombstones.remove(&key);
        let old = self.remove(&key);
        let tick = self.next_tick();
        self.order.insert((scan_hash(&key), key.clone()));
        self.lru_of(slot.place).insert(tick, key.clone());
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
    pub(super) fn live(
        &mut self,
        key: &[u8],
        now_ms: u64,
        expired: &mut Vec<(Bytes, Entry)>,
    ) -> Option<&mut Entry> {
        let dead = match self.map.get(key) {
            None => return None,
            Some(e) => e.expire_at_ms.is_some_and(|at| at <= now_ms),
        };
        if dead {
            expired.extend(self.remove_keyed(key));
            return None;
        }
        self.map.get_mut(key)
    }

    /// Marks `key` most recently used. A key already among the most recent
    /// eighth of the order is left where it is: eviction takes from the
    /// other end, so moving it changes nothing but costs two tree updates
    /// on every read of a hot key.
    pub(super) fn touch(&mut self, key: &[u8]) {
        let recent = self.map.len() as u64 / RECENT_FRACTION;
        let current = self.tick;
        if self.map.get(key).is_some_and(|e| current - e.tick < recent) {
            return;
        }
        let tick = self.next_tick();
        if let Some(e) = self.map.get_mut(key) {
            let lru = match e.slot.place {
                Tier::Gpu => &mut self.gpu_lru,
                Tier::Dram => &mut self.lru,
            };
            if let Some(k) = lru.remove(&e.tick) {
                lru.insert(tick, k);
            }
            e.tick = tick;
        }
    }

    pub(super) fn lru_of(&mut self, place: Tier) -> &mut BTreeMap<u64, Bytes> {
        match place {
            Tier::Gpu => &mut self.gpu_lru,
            Tier::Dram => &mut self.lru,
        }
    }

    /// Swaps the value of a present key for the same value in another pool
    /// (same version, expiry and age). Returns the old slot.
    pub(super) fn move_slot(&mut self, key: &Bytes, slot: Arc<Slot>) -> Option<Arc<Slot>> {
        let e = self.map.get_mut(key)?;
        let (tick, from, to) = (e.tick, e.slot.place, slot.place);
        let old = std::mem::replace(&mut e.slot, slot);
        if let Some(k) = self.lru_of(from).remove(&tick) {
            self.lru_of(to).insert(tick, k);
        }
        Some(old)
    }

    /// Oldest key in `lru` at or after tick `from` whose value nobody reads
    /// (an evictable one), looking past at most `MAX_PINNED_SKIPS` pinned.
    pub(super) fn oldest_unpinned(&self, place: Tier, from: u64) -> Option<(u64, Bytes)> {
        let lru = match place {
            Tier::Gpu => &self.gpu_lru,
            Tier::Dram => &self.lru,
        };
        for (skipped, (tick, key)) in lru.range(from..).enumerate() {
            if skipped > MAX_PINNED_SKIPS {
                break;
            }
            let pinned = self
                .map
                .get(key)
                .is_some_and(|e| Arc::strong_count(&e.slot) > 1);
            if !pinned {
                return Some((*tick, key.clone()));
            }
        }
        None
    }
}

/// See [`Index::touch`].
const RECENT_FRACTION: u64 = 8;

/// Eviction looks at most this many pinned values before giving up, so a
/// write cannot spin over a store full of leased values.
const MAX_PINNED_SKIPS: usize = 1024;
