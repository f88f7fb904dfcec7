//! The index of a store: key → entry, the LRU orders (one per pool) that
//! eviction walks, the expiry order, the SCAN order, and the tombstones of
//! deleted keys. Pure bookkeeping under the store's index lock: it never
//! touches memory pools or the lower tier.
//!
//! Laid out for memory, since a node holds tens of millions of keys: each
//! key has one [`Node`] in a slab, where its bytes are stored once (inline
//! up to [`INLINE_KEY_BYTES`]). The hash table holds only node numbers; the
//! LRU orders are doubly linked lists threaded through the nodes; the SCAN
//! and expiry orders are B-trees of 12-byte `(u64, node number)` pairs. A node keeps
//! its number for as long as its key is present, which is what lets the
//! orders name keys by number.

use std::collections::{BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use hashbrown::HashTable;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Builder};

use super::{SlotRef, Tier};

/// Tombstones kept at most; the oldest go first.
const MAX_TOMBSTONES: usize = 1_000_000;

/// Keys up to this long live inside their node; longer ones get one heap
/// allocation of exactly their length.
pub(super) const INLINE_KEY_BYTES: usize = 22;

/// "No node" in links and cursors.
const NIL: u32 = u32::MAX;

/// A node's `expire_at_ms` when the key has no TTL.
const NO_EXPIRY: u64 = u64::MAX;

/// What leaves the index with a key.
pub(super) struct Entry {
    pub(super) slot: SlotRef,
    pub(super) expire_at_ms: Option<u64>,
}

/// A present key's entry, borrowed.
#[derive(Clone, Copy)]
pub(super) struct EntryRef<'a> {
    pub(super) slot: &'a SlotRef,
    pub(super) expire_at_ms: Option<u64>,
}

/// Scan order: keys by this hash. Hashes are ≥ 1 and < 2^63 so that a
/// cursor is a positive integer in every client and 0 can mean
/// "start/done".
pub(crate) fn scan_hash(key: &[u8]) -> u64 {
    scan_of(xxh3_64(key))
}

fn scan_of(hash: u64) -> u64 {
    (hash >> 1).max(1)
}

/// A key's bytes, stored once.
enum StoredKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Heap(Box<[u8]>),
}

impl StoredKey {
    const EMPTY: StoredKey = StoredKey::Inline {
        len: 0,
        bytes: [0; INLINE_KEY_BYTES],
    };

    fn new(key: &[u8]) -> StoredKey {
        if key.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            StoredKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            StoredKey::Heap(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..*len as usize],
            StoredKey::Heap(b) => b,
        }
    }

    /// The key as `Bytes`; a long key's allocation is handed over, not
    /// copied.
    fn into_bytes(self) -> Bytes {
        match self {
            StoredKey::Inline { .. } => Bytes::copy_from_slice(self.as_slice()),
            StoredKey::Heap(b) => Bytes::from(b),
        }
    }
}

struct Node {
    key: StoredKey,
    /// `None` while the node is free (then `next` links the free list).
    slot: Option<SlotRef>,
    expire_at_ms: u64,
    /// Age in the LRU order: larger is more recent. Unique across both
    /// pools' orders, so a value moving between pools keeps its age.
    tick: u64,
    /// Neighbours in its pool's LRU list: `prev` older, `next` newer.
    prev: u32,
    next: u32,
}

impl Node {
    fn slot(&self) -> &SlotRef {
        self.slot.as_ref().expect("a linked node holds a value")
    }

    fn expire(&self) -> Option<u64> {
        (self.expire_at_ms != NO_EXPIRY).then_some(self.expire_at_ms)
    }
}

/// One pool's LRU order: a list through the nodes, oldest at `head`.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// `(rank, node)` ordered by rank then node, packed in 12 bytes rather than
/// a tuple's 16: a B-tree of them holds 10 M keys in 25% less memory.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ranked {
    high: u32,
    low: u32,
    id: u32,
}

impl Ranked {
    fn new(rank: u64, id: u32) -> Ranked {
        Ranked {
            high: (rank >> 32) as u32,
            low: rank as u32,
            id,
        }
    }

    fn get(&self) -> (u64, u32) {
        ((u64::from(self.high) << 32) | u64::from(self.low), self.id)
    }
}

/// Where an eviction walk resumes (see [`Index::oldest_unpinned`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct LruCursor(u32);

impl LruCursor {
    /// The oldest value.
    pub(super) const START: LruCursor = LruCursor(NIL - 1);
}

pub(super) struct Index {
    nodes: Vec<Node>,
    /// First free node, `NIL` if none.
    free: u32,
    /// Node numbers, hashed by their key (`xxh3_64`).
    table: HashTable<u32>,
    /// `(scan hash, node)`: a stable iteration order for SCAN. Keys never
    /// move while present, so a full scan returns every key that was there
    /// throughout.
    order: BTreeSet<Ranked>,
    dram: List,
    gpu: List,
    /// `(expire_at_ms, node)` of every key with a TTL.
    expiry: BTreeSet<Ranked>,
    tick: u64,
    /// Deleted keys → (version of the delete, when).
    pub(super) tombstones: HashMap<Bytes, u64, Xxh3Builder>,
    tombstone_order: VecDeque<(u64, Bytes)>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            nodes: Vec::new(),
            free: NIL,
            table: HashTable::new(),
            order: BTreeSet::new(),
            dram: List::default(),
            gpu: List::default(),
            expiry: BTreeSet::new(),
            tick: 0,
            tombstones: HashMap::default(),
            tombstone_order: VecDeque::new(),
        }
    }
}

impl Index {
    /// Keys present (expired ones not yet collected included).
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Keys with a TTL.
    pub(super) fn expiring(&self) -> usize {
        self.expiry.len()
    }

    /// Keys whose value is in the GPU pool.
    pub(super) fn gpu_len(&self) -> usize {
        self.gpu.len as usize
    }

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

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn find_hashed(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let nodes = &self.nodes;
        self.table
            .find(hash, |&id| nodes[id as usize].key.as_slice() == key)
            .copied()
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(xxh3_64(key), key)
    }

    fn entry_ref(&self, id: u32) -> EntryRef<'_> {
        let n = &self.nodes[id as usize];
        EntryRef {
            slot: n.slot(),
            expire_at_ms: n.expire(),
        }
    }

    /// The entry of `key`, expired or not.
    pub(super) fn get(&self, key: &[u8]) -> Option<EntryRef<'_>> {
        self.find(key).map(|id| self.entry_ref(id))
    }

    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.find(key).is_some()
    }

    /// Whether `key` holds exactly `slot` (not rewritten or moved since).
    pub(super) fn holds(&self, key: &[u8], slot: &SlotRef) -> bool {
        self.get(key).is_some_and(|e| SlotRef::ptr_eq(e.slot, slot))
    }

    pub(super) fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        self.remove_keyed(key).map(|(_, e)| e)
    }

    /// Like [`Index::remove`], also giving back the stored key.
    pub(super) fn remove_keyed(&mut self, key: &[u8]) -> Option<(Bytes, Entry)> {
        let hash = xxh3_64(key);
        let nodes = &self.nodes;
        let found = self
            .table
            .find_entry(hash, |&id| nodes[id as usize].key.as_slice() == key)
            .ok()?;
        let (id, _) = found.remove();
        Some(self.release(id, hash))
    }

    /// Unlinks node `id` (already out of the table) from every order and
    /// frees it.
    fn release(&mut self, id: u32, hash: u64) -> (Bytes, Entry) {
        let place = self.nodes[id as usize].slot().place;
        self.unlink(place, id);
        self.order.remove(&Ranked::new(scan_of(hash), id));
        let n = &mut self.nodes[id as usize];
        if n.expire_at_ms != NO_EXPIRY {
            self.expiry.remove(&Ranked::new(n.expire_at_ms, id));
        }
        let expire_at_ms = n.expire();
        let key = std::mem::replace(&mut n.key, StoredKey::EMPTY);
        let slot = n.slot.take().expect("a linked node holds a value");
        n.expire_at_ms = NO_EXPIRY;
        n.next = self.free;
        n.prev = NIL;
        self.free = id;
        (key.into_bytes(), Entry { slot, expire_at_ms })
    }

    /// Stores `slot` under `key` as its most recently used value; returns
    /// what it replaces.
    pub(super) fn insert(
        &mut self,
        key: &[u8],
        slot: SlotRef,
        expire_at_ms: Option<u64>,
    ) -> Option<Entry> {
        self.tombstones.remove(key);
        let hash = xxh3_64(key);
        let tick = self.next_tick();
        let place = slot.place;
        let expire = expire_at_ms.unwrap_or(NO_EXPIRY);
        if let Some(id) = self.find_hashed(hash, key) {
            // Same key, same node: the SCAN order stays as it is.
            let old_place = self.nodes[id as usize].slot().place;
            self.unlink(old_place, id);
            let n = &mut self.nodes[id as usize];
            let old = Entry {
                slot: n.slot.replace(slot).expect("a linked node holds a value"),
                expire_at_ms: n.expire(),
            };
            let old_expire = std::mem::replace(&mut n.expire_at_ms, expire);
            n.tick = tick;
            if old_expire != NO_EXPIRY {
                self.expiry.remove(&Ranked::new(old_expire, id));
            }
            if expire != NO_EXPIRY {
                self.expiry.insert(Ranked::new(expire, id));
            }
            self.push_newest(place, id);
            return Some(old);
        }
        let node = Node {
            key: StoredKey::new(key),
            slot: Some(slot),
            expire_at_ms: expire,
            tick,
            prev: NIL,
            next: NIL,
        };
        let id = if self.free != NIL {
            let id = self.free;
            self.free = self.nodes[id as usize].next;
            self.nodes[id as usize] = node;
            id
        } else {
            let id = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&id| id < NIL - 1)
                .expect("fewer than 2^32 - 2 keys in one store");
            self.nodes.push(node);
            id
        };
        let nodes = &self.nodes;
        self.table.insert_unique(hash, id, |&other| {
            xxh3_64(nodes[other as usize].key.as_slice())
        });
        self.order.insert(Ranked::new(scan_of(hash), id));
        if expire != NO_EXPIRY {
            self.expiry.insert(Ranked::new(expire, id));
        }
        self.push_newest(place, id);
        None
    }

    /// Live entry for `key`; removes it if it has expired.
    pub(super) fn live(
        &mut self,
        key: &[u8],
        now_ms: u64,
        expired: &mut Vec<(Bytes, Entry)>,
    ) -> Option<EntryRef<'_>> {
        let id = self.find(key)?;
        if self.nodes[id as usize]
            .expire()
            .is_some_and(|at| at <= now_ms)
        {
            expired.extend(self.remove_keyed(key));
            return None;
        }
        Some(self.entry_ref(id))
    }

    /// Sets (or clears) the TTL of a present key.
    pub(super) fn set_expiry(&mut self, key: &[u8], at_ms: Option<u64>) {
        let Some(id) = self.find(key) else {
            return;
        };
        let new = at_ms.unwrap_or(NO_EXPIRY);
        let old = std::mem::replace(&mut self.nodes[id as usize].expire_at_ms, new);
        if old != NO_EXPIRY {
            self.expiry.remove(&Ranked::new(old, id));
        }
        if new != NO_EXPIRY {
            self.expiry.insert(Ranked::new(new, id));
        }
    }

    /// Removes the key that expires first if it expired by `now_ms`.
    pub(super) fn pop_expired(&mut self, now_ms: u64) -> Option<(Bytes, Entry)> {
        let (at, id) = self.expiry.first()?.get();
        if at > now_ms {
            return None;
        }
        let hash = xxh3_64(self.nodes[id as usize].key.as_slice());
        self.table
            .find_entry(hash, |&other| other == id)
            .expect("an expiring node is in the table")
            .remove();
        Some(self.release(id, hash))
    }

    /// Keys from scan hash `cursor` on, in SCAN order, with their scan hash
    /// and TTL.
    pub(super) fn scan_from(
        &self,
        cursor: u64,
    ) -> impl Iterator<Item = (u64, &[u8], Option<u64>)> + '_ {
        self.order.range(Ranked::new(cursor, 0)..).map(|r| {
            let (h, id) = r.get();
            let n = &self.nodes[id as usize];
            (h, n.key.as_slice(), n.expire())
        })
    }

    /// Marks `key` most recently used. A key already among the most recent
    /// eighth of the order is left where it is: eviction takes from the
    /// other end, so moving it changes nothing but costs writes to three
    /// nodes on every read of a hot key.
    pub(super) fn touch(&mut self, key: &[u8]) {
        let Some(id) = self.find(key) else {
            return;
        };
        let recent = self.len() as u64 / RECENT_FRACTION;
        if self.tick - self.nodes[id as usize].tick < recent {
            return;
        }
        let tick = self.next_tick();
        let place = self.nodes[id as usize].slot().place;
        self.unlink(place, id);
        self.nodes[id as usize].tick = tick;
        self.push_newest(place, id);
    }

    /// Swaps the value of a present key for the same value in another pool
    /// (same version, expiry and age). Returns the old slot.
    pub(super) fn move_slot(&mut self, key: &[u8], slot: SlotRef) -> Option<SlotRef> {
        let id = self.find(key)?;
        let to = slot.place;
        let old = self.nodes[id as usize]
            .slot
            .replace(slot)
            .expect("a linked node holds a value");
        if old.place != to {
            self.unlink(old.place, id);
            self.insert_by_age(to, id);
        }
        Some(old)
    }

    /// The oldest key in `place`'s order, from `from` on, whose value nobody
    /// reads (an evictable one), looking past at most `MAX_PINNED_SKIPS`
    /// pinned; with the cursor to pass next time to go on past it. The
    /// cursor stays valid while the key returned is removed, and nothing
    /// else.
    pub(super) fn oldest_unpinned(
        &self,
        place: Tier,
        from: LruCursor,
    ) -> Option<(LruCursor, Bytes)> {
        let mut id = match from {
            LruCursor::START => self.list(place).head,
            LruCursor(id) => id,
        };
        let mut skipped = 0;
        while id != NIL && skipped <= MAX_PINNED_SKIPS {
            let n = &self.nodes[id as usize];
            if SlotRef::count(n.slot()) == 1 {
                return Some((LruCursor(n.next), Bytes::copy_from_slice(n.key.as_slice())));
            }
            skipped += 1;
            id = n.next;
        }
        None
    }

    /// Up to `max` of the oldest evictable keys in `place`, oldest first
    /// (looking past at most `MAX_PINNED_SKIPS` pinned values).
    pub(super) fn oldest_unpinned_keys(&self, place: Tier, max: usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut cursor = LruCursor::START;
        while out.len() < max {
            let Some((next, key)) = self.oldest_unpinned(place, cursor) else {
                break;
            };
            out.push(key);
            cursor = next;
        }
        out
    }

    fn list(&self, place: Tier) -> &List {
        match place {
            Tier::Gpu => &self.gpu,
            Tier::Dram => &self.dram,
        }
    }

    fn list_mut(&mut self, place: Tier) -> &mut List {
        match place {
            Tier::Gpu => &mut self.gpu,
            Tier::Dram => &mut self.dram,
        }
    }

    fn unlink(&mut self, place: Tier, id: u32) {
        let (prev, next) = {
            let n = &self.nodes[id as usize];
            (n.prev, n.next)
        };
        match prev {
            NIL => self.list_mut(place).head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.list_mut(place).tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
        let n = &mut self.nodes[id as usize];
        n.prev = NIL;
        n.next = NIL;
        self.list_mut(place).len -= 1;
    }

    /// Links `id` between `prev` and `next` (either `NIL` at an end).
    fn link_between(&mut self, place: Tier, id: u32, prev: u32, next: u32) {
        {
            let n = &mut self.nodes[id as usize];
            n.prev = prev;
            n.next = next;
        }
        match prev {
            NIL => self.list_mut(place).head = id,
            p => self.nodes[p as usize].next = id,
        }
        match next {
            NIL => self.list_mut(place).tail = id,
            n => self.nodes[n as usize].prev = id,
        }
        self.list_mut(place).len += 1;
    }

    fn push_newest(&mut self, place: Tier, id: u32) {
        let tail = self.list(place).tail;
        self.link_between(place, id, tail, NIL);
    }

    /// Links `id` where its tick belongs in `place`'s order. The walk is
    /// bounded (`MAX_AGE_WALK` steps from the nearer end); past that the
    /// value goes where the walk stopped, which only shifts when it is
    /// evicted.
    fn insert_by_age(&mut self, place: Tier, id: u32) {
        let tick = self.nodes[id as usize].tick;
        let List { head, tail, .. } = *self.list(place);
        if head == NIL {
            return self.link_between(place, id, NIL, NIL);
        }
        let (oldest, newest) = (
            self.nodes[head as usize].tick,
            self.nodes[tail as usize].tick,
        );
        if tick >= newest / 2 + oldest / 2 {
            // From the newest end back to the first older value.
            let mut at = tail;
            for _ in 0..MAX_AGE_WALK {
                if at == NIL || self.nodes[at as usize].tick < tick {
                    break;
                }
                at = self.nodes[at as usize].prev;
            }
            let next = match at {
                NIL => head,
                a => self.nodes[a as usize].next,
            };
            self.link_between(place, id, at, next);
        } else {
            // From the oldest end on to the first newer value.
            let mut at = head;
            for _ in 0..MAX_AGE_WALK {
                if at == NIL || self.nodes[at as usize].tick > tick {
                    break;
                }
                at = self.nodes[at as usize].next;
            }
            let prev = match at {
                NIL => tail,
                a => self.nodes[a as usize].prev,
            };
            self.link_between(place, id, prev, at);
        }
    }
}

/// See [`Index::touch`].
const RECENT_FRACTION: u64 = 8;

/// Eviction looks at most this many pinned values before giving up, so a
/// write cannot spin over a store full of leased values.
const MAX_PINNED_SKIPS: usize = 1024;

/// See [`Index::insert_by_age`].
const MAX_AGE_WALK: usize = 1024;

#[cfg(test)]
impl Index {
    /// Panics unless every order agrees with the table (tests only: walks
    /// everything).
    pub(super) fn check_invariants(&self) {
        let mut linked = 0;
        for place in [Tier::Dram, Tier::Gpu] {
            let list = self.list(place);
            let (mut at, mut prev, mut n, mut last_tick) = (list.head, NIL, 0u32, 0u64);
            while at != NIL {
                let node = &self.nodes[at as usize];
                assert_eq!(node.prev, prev, "back link");
                assert_eq!(node.slot().place, place, "node in its pool's list");
                assert!(node.tick > last_tick, "ticks ascend from the oldest");
                assert_eq!(
                    self.find(node.key.as_slice()),
                    Some(at),
                    "listed key is indexed"
                );
                last_tick = node.tick;
                prev = at;
                at = node.next;
                n += 1;
            }
            assert_eq!(list.tail, prev, "tail");
            assert_eq!(list.len, n, "list length");
            linked += n as usize;
        }
        assert_eq!(linked, self.table.len(), "every key in one list");
        assert_eq!(
            self.order.len(),
            self.table.len(),
            "every key in the scan order"
        );
        for (h, id) in self.order.iter().map(Ranked::get) {
            assert_eq!(scan_hash(self.nodes[id as usize].key.as_slice()), h);
        }
        let expiring = self
            .table
            .iter()
            .filter(|&&id| self.nodes[id as usize].expire_at_ms != NO_EXPIRY)
            .count();
        assert_eq!(expiring, self.expiry.len(), "expiry order");
        for (at, id) in self.expiry.iter().map(Ranked::get) {
            assert_eq!(self.nodes[id as usize].expire_at_ms, at);
        }
        let (mut free, mut at) = (0, self.free);
        while at != NIL {
            assert!(
                self.nodes[at as usize].slot.is_none(),
                "a free node is empty"
            );
            free += 1;
            at = self.nodes[at as usize].next;
        }
        assert_eq!(free + self.table.len(), self.nodes.len(), "no node lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_compact() {
        // The figure bench/index-memory.sh measures depends on it.
        assert!(std::mem::size_of::<StoredKey>() <= 24);
        assert!(std::mem::size_of::<Node>() <= 56);
    }

    #[test]
    fn ranked_sorts_as_its_pair() {
        let pairs = [
            (0, 0),
            (1, 5),
            (u64::from(u32::MAX), 1),
            (1 << 32, 0),
            (u64::MAX, 2),
        ];
        let mut ranked: Vec<Ranked> = pairs
            .iter()
            .rev()
            .map(|&(r, id)| Ranked::new(r, id))
            .collect();
        ranked.sort();
        assert_eq!(ranked.iter().map(Ranked::get).collect::<Vec<_>>(), pairs);
        assert_eq!(std::mem::size_of::<Ranked>(), 12);
    }

    #[test]
    fn keys_round_trip_inline_and_on_the_heap() {
        for len in [0, 1, INLINE_KEY_BYTES, INLINE_KEY_BYTES + 1, 300] {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let stored = StoredKey::new(&key);
            assert_eq!(stored.as_slice(), &key[..]);
            assert_eq!(
                matches!(stored, StoredKey::Inline { .. }),
                len <= INLINE_KEY_BYTES
            );
            assert_eq!(&stored.into_bytes()[..], &key[..]);
        }
    }
}
