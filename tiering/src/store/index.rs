//! The index of a store: key → entry, the LRU orders (one per pool) that
//! eviction walks, the expiry order, the SCAN order, and the tombstones of
//! deleted keys. Pure bookkeeping under the store's index lock: it never
//! touches memory pools or the lower tier.
//!
//! Laid out for memory, since a node holds tens of millions of keys: each
//! key has one 48-byte [`Node`] in a slab, where its bytes are stored once
//! (inline up to [`INLINE_KEY_BYTES`]); a node keeps its number for as long
//! as its key is present, so everything else names keys by number. The hash
//! table is a linear-hashing table of chains threaded through the nodes
//! ([`Buckets`]): four bytes per bucket, and it grows one bucket at a time,
//! so no write ever waits for the whole table to be rehashed. The LRU
//! orders are doubly linked lists through the nodes. SCAN walks the table
//! itself, in the order of its keys' scan hashes (see [`scan_hash`]), so it
//! needs no order of its own. Only keys with a TTL cost more: their
//! expiry sits in a map by node and in a B-tree of 12-byte
//! `(expiry, node)` pairs.

use std::collections::{BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Builder};

use super::{SlotRef, Tier};

/// Tombstones kept at most; the oldest go first.
const MAX_TOMBSTONES: usize = 1_000_000;

/// Keys up to this long live inside their node; longer ones get one heap
/// allocation of exactly their length.
pub(super) const INLINE_KEY_BYTES: usize = 22;

/// "No node" in links and cursors.
const NIL: u32 = u32::MAX;

/// The bits of [`Node::hash`] that hold the hash; the top one says
/// whether the key has a TTL.
const HASH_BITS: u32 = 0x7fff_ffff;
const HAS_TTL: u32 = 1 << 31;

/// The table grows by a bucket whenever keys outnumber buckets: chains
/// average at most one node.
const MAX_LOAD: usize = 1;

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

/// SCAN order: keys by this hash, the bit-reversed `xxh3_64` of the key,
/// shifted to 63 bits. Reversed, because the table's buckets take the low
/// bits of the hash: all keys of a bucket then share the leading bits of
/// their scan hash, a bucket is one contiguous range of the order, and
/// growing the table splits a range in two without moving anything out of
/// it. Hashes are ≥ 1 and < 2^63 so that a cursor is a positive integer in
/// every client and 0 can mean "start/done".
pub(crate) fn scan_hash(key: &[u8]) -> u64 {
    (xxh3_64(key).reverse_bits() >> 1).max(1)
}

/// Scan positions span 63 bits.
const SCAN_BITS: u32 = 63;

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
    /// The low 31 bits of the key's `xxh3_64` (the table's address of it,
    /// so that growing the table never reads a key), and [`HAS_TTL`].
    hash: u32,
    /// Next node in the same bucket.
    chain: u32,
    /// Neighbours in its pool's LRU list: `prev` older, `next` newer.
    prev: u32,
    next: u32,
}

impl Node {
    fn slot(&self) -> &SlotRef {
        self.slot.as_ref().expect("a linked node holds a value")
    }

    fn address(&self) -> u32 {
        self.hash & HASH_BITS
    }
}

/// The part of a key's hash that addresses it.
fn address_of(key: &[u8]) -> u32 {
    xxh3_64(key) as u32 & HASH_BITS
}

/// The heads of the table's chains, addressed by linear hashing: there are
/// `2^level + split` buckets; a key goes to bucket `hash mod 2^level`,
/// or `hash mod 2^(level+1)` where that bucket was already split.
struct Buckets {
    heads: Vec<u32>,
    level: u32,
    split: usize,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            heads: vec![NIL],
            level: 0,
            split: 0,
        }
    }
}

/// The low `bits` bits of `x`, reversed.
fn reverse_low(x: u64, bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        x.reverse_bits() >> (64 - bits)
    }
}

impl Buckets {
    fn of(&self, hash: u32) -> usize {
        let h = u64::from(hash);
        let b = (h & ((1 << self.level) - 1)) as usize;
        if b < self.split {
            (h & ((1 << (self.level + 1)) - 1)) as usize
        } else {
            b
        }
    }

    /// The bucket holding scan position `pos`, and that bucket's range of
    /// the scan order: `(bucket, first position, first position after it,
    /// 0 if none)`.
    fn locate(&self, pos: u64) -> (usize, u64, u64) {
        let mut bits = self.level;
        let mut prefix = pos >> (SCAN_BITS - bits);
        let mut bucket = reverse_low(prefix, bits) as usize;
        if bucket < self.split {
            bits += 1;
            prefix = pos >> (SCAN_BITS - bits);
            bucket = reverse_low(prefix, bits) as usize;
        }
        let width = SCAN_BITS - bits;
        let end = if prefix + 1 == 1 << bits {
            0
        } else {
            (prefix + 1) << width
        };
        (bucket, prefix << width, end)
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
/// a tuple's 16.
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

/// A present key's node, as a lookup found it. Valid only until the index
/// next changes: it saves a second lookup of the same key within one
/// critical section.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Found(u32);

/// Where an eviction walk resumes (see [`Index::oldest_unpinned`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct LruCursor(u32);

impl LruCursor {
    /// The oldest value.
    pub(super) const START: LruCursor = LruCursor(NIL - 1);
}

#[derive(Default)]
pub(super) struct Index {
    nodes: Vec<Node>,
    /// First free node, `NIL` if none.
    free: Option<u32>,
    buckets: Buckets,
    len: usize,
    dram: List,
    gpu: List,
    /// Node → expiry (Unix ms) of every key with a TTL...
    ttl: HashMap<u32, u64, Xxh3Builder>,
    /// ...and the same as `(expire_at_ms, node)`, soonest first.
    expiry: BTreeSet<Ranked>,
    /// Deleted keys → (version of the delete, when).
    pub(super) tombstones: HashMap<Bytes, u64, Xxh3Builder>,
    tombstone_order: VecDeque<(u64, Bytes)>,
}

impl Index {
    /// Keys present (expired ones not yet collected included).
    pub(super) fn len(&self) -> usize {
        self.len
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

    fn find_hashed(&self, hash: u32, key: &[u8]) -> Option<u32> {
        let mut at = self.buckets.heads[self.buckets.of(hash)];
        while at != NIL {
            let n = &self.nodes[at as usize];
            if n.address() == hash && n.key.as_slice() == key {
                return Some(at);
            }
            at = n.chain;
        }
        None
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(address_of(key), key)
    }

    fn entry_ref(&self, id: u32) -> EntryRef<'_> {
        let n = &self.nodes[id as usize];
        EntryRef {
            slot: n.slot(),
            expire_at_ms: self.expire_of(id),
        }
    }

    fn expire_of(&self, id: u32) -> Option<u64> {
        if self.nodes[id as usize].hash & HAS_TTL == 0 {
            return None;
        }
        self.ttl.get(&id).copied()
    }

    /// Sets (or with `None` clears) node `id`'s TTL in every view of it.
    fn set_ttl(&mut self, id: u32, at_ms: Option<u64>) {
        if let Some(old) = self.ttl.remove(&id) {
            self.expiry.remove(&Ranked::new(old, id));
        }
        let n = &mut self.nodes[id as usize];
        n.hash &= HASH_BITS;
        if let Some(at) = at_ms {
            n.hash |= HAS_TTL;
            self.ttl.insert(id, at);
            self.expiry.insert(Ranked::new(at, id));
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
        let id = self.find(key)?;
        Some(self.release(id))
    }

    /// Takes node `id` out of the table and every order, and frees it.
    fn release(&mut self, id: u32) -> (Bytes, Entry) {
        self.unchain(id);
        let place = self.nodes[id as usize].slot().place;
        self.unlink(place, id);
        let expire_at_ms = self.expire_of(id);
        self.set_ttl(id, None);
        let n = &mut self.nodes[id as usize];
        let key = std::mem::replace(&mut n.key, StoredKey::EMPTY);
        let slot = n.slot.take().expect("a linked node holds a value");
        n.next = self.free.unwrap_or(NIL);
        self.free = Some(id);
        self.len -= 1;
        (key.into_bytes(), Entry { slot, expire_at_ms })
    }

    /// Removes node `id` from its bucket's chain.
    fn unchain(&mut self, id: u32) {
        let (bucket, after) = {
            let n = &self.nodes[id as usize];
            (self.buckets.of(n.address()), n.chain)
        };
        let mut at = self.buckets.heads[bucket];
        if at == id {
            self.buckets.heads[bucket] = after;
            return;
        }
        while at != NIL {
            let next = self.nodes[at as usize].chain;
            if next == id {
                self.nodes[at as usize].chain = after;
                return;
            }
            at = next;
        }
        unreachable!("node {id} is not in its bucket");
    }

    /// Splits the next bucket in line: its keys whose next hash bit is set
    /// move to a new bucket at the end.
    fn grow(&mut self) {
        let Buckets {
            level,
            split,
            ref mut heads,
        } = self.buckets;
        if level == 30 {
            // 2^30 buckets use every address bit but the one that would
            // split them; chains grow longer past a billion keys.
            return;
        }
        let (mut stay, mut moved) = (NIL, NIL);
        let mut at = heads[split];
        while at != NIL {
            let n = &mut self.nodes[at as usize];
            let next = n.chain;
            let chain = if (n.address() >> level) & 1 == 1 {
                &mut moved
            } else {
                &mut stay
            };
            n.chain = *chain;
            *chain = at;
            at = next;
        }
        heads[split] = stay;
        heads.push(moved);
        self.buckets.split += 1;
        if self.buckets.split == 1 << level {
            self.buckets.level += 1;
            self.buckets.split = 0;
        }
    }

    /// Stores `slot` under `key` as its most recently used value; returns
    /// what it replaces.
    pub(super) fn insert(
        &mut self,
        key: &[u8],
        slot: SlotRef,
        expire_at_ms: Option<u64>,
    ) -> Option<Entry> {
        let found = self.find(key).map(Found);
        self.insert_found(key, found, slot, expire_at_ms)
    }

    /// [`Index::insert`] for a key just looked up (`found`: what
    /// [`Index::live_found`] returned, with nothing changed since), so a
    /// write costs one lookup, not two.
    pub(super) fn insert_found(
        &mut self,
        key: &[u8],
        found: Option<Found>,
        slot: SlotRef,
        expire_at_ms: Option<u64>,
    ) -> Option<Entry> {
        debug_assert_eq!(found.map(|f| f.0), self.find(key), "a stale lookup");
        self.tombstones.remove(key);
        let hash = address_of(key);
        let place = slot.place;
        if let Some(Found(id)) = found {
            // Same key, same node: its place in the table stays.
            let old_place = self.nodes[id as usize].slot().place;
            self.unlink(old_place, id);
            let old = Entry {
                slot: self.nodes[id as usize]
                    .slot
                    .replace(slot)
                    .expect("a linked node holds a value"),
                expire_at_ms: self.expire_of(id),
            };
            if old.expire_at_ms != expire_at_ms {
                self.set_ttl(id, expire_at_ms);
            }
            self.push_newest(place, id);
            return Some(old);
        }
        let bucket = self.buckets.of(hash);
        let node = Node {
            key: StoredKey::new(key),
            slot: Some(slot),
            hash,
            chain: self.buckets.heads[bucket],
            prev: NIL,
            next: NIL,
        };
        let id = match self.free {
            Some(id) => {
                let next = self.nodes[id as usize].next;
                self.free = (next != NIL).then_some(next);
                self.nodes[id as usize] = node;
                id
            }
            None => {
                let id = u32::try_from(self.nodes.len())
                    .ok()
                    .filter(|&id| id < NIL - 1)
                    .expect("fewer than 2^32 - 2 keys in one store");
                self.nodes.push(node);
                id
            }
        };
        self.buckets.heads[bucket] = id;
        self.len += 1;
        if expire_at_ms.is_some() {
            self.set_ttl(id, expire_at_ms);
        }
        self.push_newest(place, id);
        if self.len > self.buckets.heads.len() * MAX_LOAD {
            self.grow();
        }
        None
    }

    /// Live entry for `key`; removes it if it has expired.
    pub(super) fn live(
        &mut self,
        key: &[u8],
        now_ms: u64,
        expired: &mut Vec<(Bytes, Entry)>,
    ) -> Option<EntryRef<'_>> {
        let found = self.live_found(key, now_ms, expired)?;
        Some(self.entry(found))
    }

    /// Like [`Index::live`], as a handle for [`Index::entry`],
    /// [`Index::touch_found`] and [`Index::insert_found`].
    pub(super) fn live_found(
        &mut self,
        key: &[u8],
        now_ms: u64,
        expired: &mut Vec<(Bytes, Entry)>,
    ) -> Option<Found> {
        let id = self.find(key)?;
        if self.expire_of(id).is_some_and(|at| at <= now_ms) {
            expired.push(self.release(id));
            return None;
        }
        Some(Found(id))
    }

    pub(super) fn entry(&self, found: Found) -> EntryRef<'_> {
        self.entry_ref(found.0)
    }

    /// Sets (or clears) the TTL of a present key.
    pub(super) fn set_expiry(&mut self, key: &[u8], at_ms: Option<u64>) {
        let Some(id) = self.find(key) else {
            return;
        };
        self.set_ttl(id, at_ms);
    }

    /// Removes the key that expires first if it expired by `now_ms`.
    pub(super) fn pop_expired(&mut self, now_ms: u64) -> Option<(Bytes, Entry)> {
        let (at, id) = self.expiry.first()?.get();
        if at > now_ms {
            return None;
        }
        Some(self.release(id))
    }

    /// One SCAN step: visits the keys from scan position `cursor` on, whole
    /// buckets at a time, until at least `count` were visited; hands each
    /// to `visit` with its scan hash and TTL, and returns the position to
    /// resume from (0 when done). Every key present throughout a full walk
    /// is visited exactly once, however the table grows meanwhile: a
    /// bucket only ever splits into two halves of its own range.
    pub(super) fn scan_step(
        &self,
        cursor: u64,
        count: usize,
        mut visit: impl FnMut(u64, &[u8], Option<u64>),
    ) -> u64 {
        if cursor >> SCAN_BITS != 0 {
            return 0; // past the end of the order
        }
        let mut pos = cursor;
        let mut visited = 0;
        loop {
            let (bucket, _, end) = self.buckets.locate(pos);
            let mut at = self.buckets.heads[bucket];
            while at != NIL {
                let n = &self.nodes[at as usize];
                let key = n.key.as_slice();
                let h = scan_hash(key);
                // A cursor from the lower tier's walk may fall inside a
                // bucket: what comes before it was listed already.
                if h >= pos {
                    visit(h, key, self.expire_of(at));
                    visited += 1;
                }
                at = n.chain;
            }
            pos = end;
            if pos == 0 || visited >= count {
                return pos;
            }
        }
    }

    /// Marks a key just looked up as its pool's most recently used.
    pub(super) fn touch_found(&mut self, Found(id): Found) {
        let place = self.nodes[id as usize].slot().place;
        if self.list(place).tail != id {
            self.unlink(place, id);
            self.push_newest(place, id);
        }
    }

    /// Swaps the value of a present key for the same value in another pool
    /// (same version and expiry). Returns the old slot. A value changing
    /// pools becomes its new pool's most recently used: moves go up for
    /// fresh writes and down for the GPU's oldest, which is still newer
    /// than what DRAM already held.
    pub(super) fn move_slot(&mut self, key: &[u8], slot: SlotRef) -> Option<SlotRef> {
        let id = self.find(key)?;
        let to = slot.place;
        let old = self.nodes[id as usize]
            .slot
            .replace(slot)
            .expect("a linked node holds a value");
        if old.place != to {
            self.unlink(old.place, id);
            self.push_newest(to, id);
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
    /// (looking past at most `MAX_PINNED_SKIPS` pinned values each).
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

    fn push_newest(&mut self, place: Tier, id: u32) {
        let tail = self.list(place).tail;
        {
            let n = &mut self.nodes[id as usize];
            n.prev = tail;
            n.next = NIL;
        }
        match tail {
            NIL => self.list_mut(place).head = id,
            t => self.nodes[t as usize].next = id,
        }
        let list = self.list_mut(place);
        list.tail = id;
        list.len += 1;
    }
}

/// Eviction looks at most this many pinned values before giving up, so a
/// write cannot spin over a store full of leased values.
const MAX_PINNED_SKIPS: usize = 1024;

#[cfg(test)]
impl Index {
    /// Panics unless the table, the lists and the expiry order agree
    /// (tests only: walks everything).
    pub(super) fn check_invariants(&self) {
        let mut linked = 0;
        for place in [Tier::Dram, Tier::Gpu] {
            let list = self.list(place);
            let (mut at, mut prev, mut n) = (list.head, NIL, 0u32);
            while at != NIL {
                let node = &self.nodes[at as usize];
                assert_eq!(node.prev, prev, "back link");
                assert_eq!(node.slot().place, place, "node in its pool's list");
                let key = node.key.as_slice();
                assert_eq!(self.find(key), Some(at), "listed key is indexed");
                assert_eq!(node.address(), address_of(key), "hash");
                prev = at;
                at = node.next;
                n += 1;
            }
            assert_eq!(list.tail, prev, "tail");
            assert_eq!(list.len, n, "list length");
            linked += n as usize;
        }
        assert_eq!(linked, self.len, "every key in one list");
        let b = &self.buckets;
        assert_eq!(b.heads.len(), (1 << b.level) + b.split, "bucket count");
        let mut chained = 0;
        for (i, &head) in b.heads.iter().enumerate() {
            let mut at = head;
            while at != NIL {
                assert_eq!(
                    b.of(self.nodes[at as usize].address()),
                    i,
                    "node in its bucket"
                );
                chained += 1;
                at = self.nodes[at as usize].chain;
            }
        }
        assert_eq!(chained, self.len, "every key in one chain");
        let flagged = self
            .nodes
            .iter()
            .filter(|n| n.slot.is_some() && n.hash & HAS_TTL != 0)
            .count();
        assert_eq!(flagged, self.ttl.len(), "TTL flags");
        assert_eq!(flagged, self.expiry.len(), "expiry order");
        for (at, id) in self.expiry.iter().map(Ranked::get) {
            assert_eq!(self.expire_of(id), Some(at));
        }
        let (mut free, mut at) = (0, self.free.unwrap_or(NIL));
        while at != NIL {
            assert!(
                self.nodes[at as usize].slot.is_none(),
                "a free node is empty"
            );
            free += 1;
            at = self.nodes[at as usize].next;
        }
        assert_eq!(free + self.len, self.nodes.len(), "no node lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_compact() {
        // The figure bench/index-memory.sh measures depends on it.
        assert!(std::mem::size_of::<StoredKey>() <= 24);
        assert!(std::mem::size_of::<Node>() <= 48);
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

    /// At every size the table passes through, the buckets' scan ranges
    /// tile the whole order in bucket-walk order, and every hash's bucket
    /// is the one whose range holds its scan position.
    #[test]
    fn buckets_tile_the_scan_order_at_every_size() {
        let mut b = Buckets::default();
        for _ in 0..300 {
            let mut pos = 0;
            let mut seen = vec![false; b.heads.len()];
            loop {
                let (bucket, start, end) = b.locate(pos);
                assert_eq!(start, pos, "ranges are contiguous");
                assert!(!seen[bucket], "bucket {bucket} visited once");
                seen[bucket] = true;
                if end == 0 {
                    break;
                }
                assert!(end > start);
                pos = end;
            }
            assert!(seen.iter().all(|&s| s), "every bucket visited");
            for h in [0u64, 1, 0xdead_beef_1234_5678, u64::MAX, 1 << 40, 77] {
                let scan = (h.reverse_bits() >> 1).max(1);
                assert_eq!(b.locate(scan).0, b.of(h as u32), "hash {h:x}");
            }
            // Grow by one bucket, as the index does.
            if b.split + 1 == 1 << b.level {
                b.level += 1;
                b.split = 0;
            } else {
                b.split += 1;
            }
            b.heads.push(NIL);
        }
    }
}
