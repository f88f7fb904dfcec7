//! Offset allocator for the DRAM arena: decides where each value lives.
//!
//! Small values (up to [`MAX_CLASS_BYTES`]) get a chunk of a size class,
//! carved from a [`SLAB_BYTES`] slab; larger values get a page-granular extent
//! of their own. Slabs are extents too, and a slab whose chunks are all free
//! goes straight back to the extent allocator, so memory never stays stuck in
//! a class that no longer needs it.
//!
//! It is pure bookkeeping on offsets: it must never touch arena memory, use
//! `unsafe`, read a clock, or allocate on the heap per operation on the
//! small-value path once warm (it runs on every SET).

use std::collections::{BTreeMap, BTreeSet};

/// Smallest chunk. Small enough that a tiny value (a counter, a flag, a
/// 16-byte id) costs little more than its length; values are never written
/// after commit, so neighbours sharing a cache line do not contend. The
/// per-chunk bookkeeping (a `u16` free-list entry and one bitmap bit) only
/// exists for freed chunks and per slab.
const MIN_CHUNK_BYTES: u64 = 16;

/// Largest size-class chunk. Above it a value gets its own extent, which
/// wastes at most one page (< 6.25% of 64 KiB) where the next class would
/// waste up to 25%. KV-cache blocks (64 KiB – 16 MiB) are mostly extents.
const MAX_CLASS_BYTES: u64 = 64 * 1024;

/// Each class is 5/4 of the previous one: at most 25% of a small chunk is
/// padding, with about 30 classes in all.
const CLASS_GROWTH_NUMERATOR: u64 = 5;
const CLASS_GROWTH_DENOMINATOR: u64 = 4;

/// Every chunk offset and size is a multiple of this, so values can be read
/// and written a word at a time.
const CHUNK_ALIGN_BYTES: u64 = 8;

/// Size of a slab. 1 MiB holds 16 chunks of the largest class (so the unused
/// tail of a slab is under 1/16 of it) and keeps slabs few enough that finding
/// the slab of a chunk is a short tree walk.
const SLAB_BYTES: u64 = 1024 * 1024;

/// Extent granularity: the OS page, so large values start on a page boundary
/// (what direct I/O to NVMe and memory registration want) and the free-extent
/// maps stay coarse.
const PAGE_BYTES: u64 = 4096;

const CLASS_COUNT: usize = class_count();

/// Chunk size of each class, ascending, from `MIN_CHUNK_BYTES` to
/// `MAX_CLASS_BYTES` inclusive.
const CLASS_BYTES: [u64; CLASS_COUNT] = class_table();

// A chunk's index inside its slab is kept as a `u16` to halve the free lists.
const _: () = assert!(SLAB_BYTES / MIN_CHUNK_BYTES <= 1 << 16);
const _: () = assert!(SLAB_BYTES.is_multiple_of(PAGE_BYTES) && MAX_CLASS_BYTES <= SLAB_BYTES);
const _: () = assert!(MIN_CHUNK_BYTES.is_multiple_of(CHUNK_ALIGN_BYTES));
const _: () = assert!(PAGE_BYTES.is_multiple_of(CHUNK_ALIGN_BYTES));

const fn next_class(bytes: u64) -> u64 {
    let grown = bytes * CLASS_GROWTH_NUMERATOR / CLASS_GROWTH_DENOMINATOR;
    let aligned = grown.next_multiple_of(CHUNK_ALIGN_BYTES);
    if aligned > MAX_CLASS_BYTES {
        MAX_CLASS_BYTES
    } else {
        aligned
    }
}

const fn class_count() -> usize {
    let mut count = 1;
    let mut bytes = MIN_CHUNK_BYTES;
    while bytes < MAX_CLASS_BYTES {
        bytes = next_class(bytes);
        count += 1;
    }
    count
}

const fn class_table() -> [u64; CLASS_COUNT] {
    let mut table = [0; CLASS_COUNT];
    let mut bytes = MIN_CHUNK_BYTES;
    let mut i = 0;
    while i < CLASS_COUNT {
        table[i] = bytes;
        bytes = next_class(bytes);
        i += 1;
    }
    table
}

/// Smallest class whose chunks hold `len` bytes; `len <= MAX_CLASS_BYTES`.
fn class_of(len: u64) -> usize {
    debug_assert!(len <= MAX_CLASS_BYTES);
    CLASS_BYTES.partition_point(|&bytes| bytes < len)
}

/// A piece of the arena handed out for one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Byte offset from the arena base; a multiple of 8.
    pub offset: u64,
    /// Bytes reserved for the value, at least the length asked for.
    pub size: u64,
}

/// Hands out non-overlapping chunks of a `capacity`-byte arena.
#[derive(Debug)]
pub struct SlabAllocator {
    /// Bytes managed: the capacity rounded down to a page.
    capacity: u64,
    /// Size of every slab: `SLAB_BYTES`, or the whole arena if it is smaller.
    slab_bytes: u64,
    /// Free space not in any slab or large chunk.
    extents: Extents,
    /// Slab records indexed by slab id. Records of returned slabs stay here
    /// for reuse, so their free lists keep their heap capacity.
    slabs: Vec<Slab>,
    /// Ids of records in `slabs` that back no slab right now.
    retired: Vec<u32>,
    /// Offset of each live slab → its id: finds the slab of a freed chunk.
    slab_at: BTreeMap<u64, u32>,
    /// Per class, ids of live slabs that have a free chunk.
    partial: [Vec<u32>; CLASS_COUNT],
    /// Live large chunks, offset → size: makes freeing one exact to check.
    large: BTreeMap<u64, u64>,
    /// Sum of the sizes of all chunks handed out and not yet freed.
    used_bytes: u64,
}

impl SlabAllocator {
    /// An allocator with all of `capacity` free. A tail under one page is
    /// never handed out, since extents are whole pages.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity - capacity % PAGE_BYTES;
        SlabAllocator {
            capacity,
            slab_bytes: SLAB_BYTES.min(capacity),
            extents: Extents::new(capacity),
            slabs: Vec::new(),
            retired: Vec::new(),
            slab_at: BTreeMap::new(),
            partial: std::array::from_fn(|_| Vec::new()),
            large: BTreeMap::new(),
            used_bytes: 0,
        }
    }

    /// Reserves room for a `len`-byte value (`len == 0` included), or `None`
    /// when it does not fit now: the caller evicts and retries.
    pub fn alloc(&mut self, len: u64) -> Option<Chunk> {
        if len <= MAX_CLASS_BYTES {
            self.alloc_small(class_of(len))
        } else {
            self.alloc_large(len)
        }
    }

    /// Gives back a chunk returned by [`SlabAllocator::alloc`]. Freeing a
    /// chunk that is not allocated (twice, or never) is a bug: it panics in
    /// debug builds and is ignored in release builds, leaving the allocator
    /// consistent.
    pub fn free(&mut self, chunk: Chunk) {
        let was_allocated = if chunk.size <= MAX_CLASS_BYTES {
            self.free_small(chunk)
        } else {
            self.free_large(chunk)
        };
        debug_assert!(was_allocated, "free of a chunk not allocated: {chunk:?}");
    }

    /// The chunk at `offset` that [`SlabAllocator::alloc`] handed out for
    /// `len` bytes: its size is a function of `len`, so holders of many
    /// chunks need only keep the offset.
    pub fn chunk_at(offset: u64, len: u64) -> Chunk {
        let size = if len <= MAX_CLASS_BYTES {
            CLASS_BYTES[class_of(len)]
        } else {
            len.next_multiple_of(PAGE_BYTES)
        };
        Chunk { offset, size }
    }

    /// Sum of the sizes of the chunks handed out and not freed.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes not free at the extent level: live large chunks plus whole
    /// slabs, partly used ones included. Never more than `capacity()`.
    pub fn reserved_bytes(&self) -> u64 {
        self.capacity - self.extents.free_bytes
    }

    /// Bytes this allocator manages: the arena capacity rounded down to a page.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Length of the largest free extent: the biggest large value that fits
    /// without evicting anything.
    pub fn largest_free_extent(&self) -> u64 {
        self.extents.largest()
    }

    fn alloc_small(&mut self, class: usize) -> Option<Chunk> {
        let id = match self.partial[class].last() {
            Some(&id) => id,
            None => self.open_slab(class)?,
        };
        let slab = &mut self.slabs[id as usize];
        let index = slab.take()?;
        let offset = slab.offset + u64::from(index) * CLASS_BYTES[class];
        if slab.is_full() {
            self.unlist_partial(id);
        }
        self.used_bytes += CLASS_BYTES[class];
        Some(Chunk {
            offset,
            size: CLASS_BYTES[class],
        })
    }

    /// Carves a new slab for `class` out of the extents and lists it as partial.
    fn open_slab(&mut self, class: usize) -> Option<u32> {
        let chunk_count = u32::try_from(self.slab_bytes / CLASS_BYTES[class]).ok()?;
        if chunk_count == 0 {
            return None;
        }
        let offset = self.extents.alloc(self.slab_bytes)?;
        let id = match self.retired.pop() {
            Some(id) => id,
            None => {
                let id = u32::try_from(self.slabs.len()).ok()?;
                self.slabs.push(Slab::default());
                id
            }
        };
        self.slabs[id as usize].reset(offset, class, chunk_count);
        self.slab_at.insert(offset, id);
        self.list_partial(id);
        Some(id)
    }

    fn free_small(&mut self, chunk: Chunk) -> bool {
        let Some((&slab_offset, &id)) = self.slab_at.range(..=chunk.offset).next_back() else {
            return false;
        };
        let slab = &mut self.slabs[id as usize];
        let size = CLASS_BYTES[slab.class];
        let delta = chunk.offset - slab_offset;
        if chunk.size != size || !delta.is_multiple_of(size) {
            return false;
        }
        let Ok(index) = u16::try_from(delta / size) else {
            return false;
        };
        let was_full = slab.is_full();
        if !slab.put(index) {
            return false;
        }
        self.used_bytes -= size;
        if slab.live == 0 {
            self.close_slab(id);
        } else if was_full {
            self.list_partial(id);
        }
        true
    }

    /// Returns an empty slab to the extents and keeps its record for reuse.
    fn close_slab(&mut self, id: u32) {
        self.unlist_partial(id);
        let offset = self.slabs[id as usize].offset;
        self.slab_at.remove(&offset);
        self.extents.free(offset, self.slab_bytes);
        self.retired.push(id);
    }

    fn list_partial(&mut self, id: u32) {
        let slab = &mut self.slabs[id as usize];
        let list = &mut self.partial[slab.class];
        debug_assert!(slab.partial_at.is_none());
        slab.partial_at = Some(list.len());
        list.push(id);
    }

    fn unlist_partial(&mut self, id: u32) {
        let slab = &mut self.slabs[id as usize];
        let Some(at) = slab.partial_at.take() else {
            return;
        };
        let list = &mut self.partial[slab.class];
        list.swap_remove(at);
        if let Some(&moved) = list.get(at) {
            self.slabs[moved as usize].partial_at = Some(at);
        }
    }

    fn alloc_large(&mut self, len: u64) -> Option<Chunk> {
        if len > self.capacity {
            return None;
        }
        let size = len.checked_next_multiple_of(PAGE_BYTES)?;
        let offset = self.extents.alloc(size)?;
        self.large.insert(offset, size);
        self.used_bytes += size;
        Some(Chunk { offset, size })
    }

    fn free_large(&mut self, chunk: Chunk) -> bool {
        if self.large.get(&chunk.offset) != Some(&chunk.size) {
            return false;
        }
        self.large.remove(&chunk.offset);
        self.extents.free(chunk.offset, chunk.size);
        self.used_bytes -= chunk.size;
        true
    }
}

/// Bookkeeping of one slab: which of its chunks are handed out.
#[derive(Debug, Default)]
struct Slab {
    offset: u64,
    class: usize,
    chunk_count: u32,
    /// Chunks at `bump..chunk_count` were never handed out since the slab
    /// opened; they are not on `free`, so opening a slab costs O(1).
    bump: u32,
    /// Chunks handed out and not freed.
    live: u32,
    /// Indices of freed chunks below `bump`, used as a stack.
    free: Vec<u16>,
    /// One bit per chunk, set while it is handed out: catches double frees.
    allocated: Vec<u64>,
    /// Position in the class's partial list, if listed there.
    partial_at: Option<usize>,
}

impl Slab {
    fn reset(&mut self, offset: u64, class: usize, chunk_count: u32) {
        self.offset = offset;
        self.class = class;
        self.chunk_count = chunk_count;
        self.bump = 0;
        self.live = 0;
        self.free.clear();
        self.allocated.clear();
        self.allocated.resize(chunk_count.div_ceil(64) as usize, 0);
        self.partial_at = None;
    }

    fn is_full(&self) -> bool {
        self.live == self.chunk_count
    }

    fn take(&mut self) -> Option<u16> {
        let index = match self.free.pop() {
            Some(index) => index,
            None if self.bump < self.chunk_count => {
                let index = u16::try_from(self.bump).ok()?;
                self.bump += 1;
                index
            }
            None => return None,
        };
        let (word, bit) = bit_of(index);
        debug_assert_eq!(self.allocated[word] & bit, 0);
        self.allocated[word] |= bit;
        self.live += 1;
        Some(index)
    }

    /// Marks chunk `index` free; false if it was not handed out.
    fn put(&mut self, index: u16) -> bool {
        if u32::from(index) >= self.bump {
            return false;
        }
        let (word, bit) = bit_of(index);
        if self.allocated[word] & bit == 0 {
            return false;
        }
        self.allocated[word] &= !bit;
        self.free.push(index);
        self.live -= 1;
        true
    }
}

fn bit_of(index: u16) -> (usize, u64) {
    (usize::from(index / 64), 1 << (index % 64))
}

/// Free page-granular extents, coalesced: found by offset to merge
/// neighbours, and by size for best fit.
#[derive(Debug)]
struct Extents {
    /// Offset → length of each free extent.
    by_offset: BTreeMap<u64, u64>,
    /// (length, offset) of each free extent: best fit is the first at or
    /// above the length wanted, lowest offset on ties.
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl Extents {
    fn new(capacity: u64) -> Self {
        let mut extents = Extents {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: capacity,
        };
        if capacity > 0 {
            extents.insert(0, capacity);
        }
        extents
    }

    /// Takes `len` bytes (whole pages) from the front of the best-fitting extent.
    fn alloc(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0 && len.is_multiple_of(PAGE_BYTES));
        let &(extent_len, offset) = self.by_size.range((len, 0)..).next()?;
        self.remove(offset, extent_len);
        if extent_len > len {
            self.insert(offset + len, extent_len - len);
        }
        self.free_bytes -= len;
        Some(offset)
    }

    /// Gives back `offset..offset + len`, merged with free neighbours.
    fn free(&mut self, offset: u64, len: u64) {
        let mut start = offset;
        let mut end = offset + len;
        if let Some((&prev, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(
                prev + prev_len <= offset,
                "freed extent overlaps a free one"
            );
            if prev + prev_len == offset {
                self.remove(prev, prev_len);
                start = prev;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&end) {
            self.remove(end, next_len);
            end += next_len;
        }
        self.insert(start, end - start);
        self.free_bytes += len;
    }

    fn largest(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    fn insert(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    impl SlabAllocator {
        /// Checks every invariant from scratch, in O(n).
        fn check(&self) {
            self.extents.check(self.capacity);
            let mut slab_used = 0;
            for (&offset, &id) in &self.slab_at {
                let slab = &self.slabs[id as usize];
                assert_eq!(slab.offset, offset);
                slab.check();
                assert_eq!(slab.partial_at.is_some(), !slab.is_full());
                slab_used += u64::from(slab.live) * CLASS_BYTES[slab.class];
            }
            for (class, list) in self.partial.iter().enumerate() {
                for (at, &id) in list.iter().enumerate() {
                    let slab = &self.slabs[id as usize];
                    assert_eq!((slab.class, slab.partial_at), (class, Some(at)));
                    assert_eq!(self.slab_at.get(&slab.offset), Some(&id));
                }
            }
            let large_bytes: u64 = self.large.values().sum();
            assert_eq!(self.used_bytes, slab_used + large_bytes);
            let slabs_bytes = self.slab_at.len() as u64 * self.slab_bytes;
            assert_eq!(
                self.extents.free_bytes + slabs_bytes + large_bytes,
                self.capacity
            );
            assert!(self.reserved_bytes() <= self.capacity);
        }
    }

    impl Slab {
        fn check(&self) {
            let set: u32 = self.allocated.iter().map(|w| w.count_ones()).sum();
            assert_eq!(set, self.live);
            assert_eq!(self.bump as usize - self.free.len(), self.live as usize);
            assert!(self.bump <= self.chunk_count);
        }
    }

    impl Extents {
        fn check(&self, capacity: u64) {
            assert_eq!(self.by_offset.len(), self.by_size.len());
            let mut end_of_previous = None;
            for (&offset, &len) in &self.by_offset {
                assert!(self.by_size.contains(&(len, offset)));
                assert!(len > 0 && offset % PAGE_BYTES == 0 && len % PAGE_BYTES == 0);
                assert!(offset + len <= capacity);
                if let Some(end) = end_of_previous {
                    assert!(end < offset, "free extents touch or overlap: not coalesced");
                }
                end_of_previous = Some(offset + len);
            }
            assert_eq!(self.by_offset.values().sum::<u64>(), self.free_bytes);
        }
    }

    fn assert_all_free(a: &SlabAllocator) {
        a.check();
        assert_eq!(a.used_bytes(), 0);
        assert_eq!(a.reserved_bytes(), 0);
        assert_eq!(a.largest_free_extent(), a.capacity());
    }

    /// Tiny deterministic PRNG so the model test needs no extra dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn class_table_is_ascending_aligned_and_grows_by_a_quarter() {
        assert_eq!(CLASS_BYTES[0], MIN_CHUNK_BYTES);
        assert_eq!(CLASS_BYTES[CLASS_COUNT - 1], MAX_CLASS_BYTES);
        for pair in CLASS_BYTES.windows(2) {
            assert!(pair[0] < pair[1]);
            assert_eq!(pair[1] % CHUNK_ALIGN_BYTES, 0);
            assert!(pair[1] <= pair[0] * 5 / 4 + CHUNK_ALIGN_BYTES);
        }
        const { assert!(CLASS_COUNT < 40) };
    }

    #[test]
    fn every_length_gets_the_smallest_fitting_size() {
        let mut a = SlabAllocator::new(4 * MIB);
        for len in 0..=2 * MAX_CLASS_BYTES + PAGE_BYTES {
            let chunk = a.alloc(len).unwrap();
            assert!(chunk.size >= len.max(1));
            assert_eq!(chunk.offset % CHUNK_ALIGN_BYTES, 0);
            assert!(chunk.offset + chunk.size <= a.capacity());
            if len <= MAX_CLASS_BYTES {
                let class = class_of(len);
                assert_eq!(chunk.size, CLASS_BYTES[class]);
                assert!(class == 0 || CLASS_BYTES[class - 1] < len);
            } else {
                assert_eq!(chunk.size, len.next_multiple_of(PAGE_BYTES));
                assert_eq!(chunk.offset % PAGE_BYTES, 0);
            }
            assert_eq!(a.used_bytes(), chunk.size);
            a.free(chunk);
            assert_eq!(a.reserved_bytes(), 0);
        }
        assert_all_free(&a);
    }

    #[test]
    fn zero_length_gets_a_minimum_chunk() {
        let mut a = SlabAllocator::new(MIB);
        let first = a.alloc(0).unwrap();
        let second = a.alloc(0).unwrap();
        assert_eq!(first.size, MIN_CHUNK_BYTES);
        assert_ne!(first.offset, second.offset);
        a.free(first);
        a.free(second);
        assert_all_free(&a);
    }

    #[test]
    fn a_slab_of_each_class_fills_exactly_then_opens_another() {
        for (class, &size) in CLASS_BYTES.iter().enumerate() {
            let mut a = SlabAllocator::new(2 * MIB);
            let per_slab = SLAB_BYTES / size;
            let chunks: Vec<Chunk> = (0..per_slab).map(|_| a.alloc(size).unwrap()).collect();
            let mut offsets: Vec<u64> = chunks.iter().map(|c| c.offset).collect();
            offsets.sort_unstable();
            let base = offsets[0];
            for (i, &offset) in offsets.iter().enumerate() {
                assert_eq!(offset, base + i as u64 * size, "class {class}");
            }
            assert_eq!(a.reserved_bytes(), SLAB_BYTES);
            let overflow = a.alloc(size).unwrap();
            assert_eq!(a.reserved_bytes(), 2 * SLAB_BYTES);
            assert!(a.alloc(size - 1).is_some_and(|c| c.size == size));
            assert!(overflow.offset >= base + SLAB_BYTES || overflow.offset < base);
            a.check();
        }
    }

    #[test]
    fn chunk_at_rebuilds_every_chunk_alloc_hands_out() {
        let mut a = SlabAllocator::new(64 * MIB);
        let lens = (0..2_000u64)
            .chain([MAX_CLASS_BYTES - 1, MAX_CLASS_BYTES, MAX_CLASS_BYTES + 1])
            .chain([PAGE_BYTES * 17, PAGE_BYTES * 17 + 1, 3 * MIB - 5]);
        for len in lens {
            let chunk = a.alloc(len).unwrap();
            assert_eq!(
                SlabAllocator::chunk_at(chunk.offset, len),
                chunk,
                "len {len}"
            );
            a.free(SlabAllocator::chunk_at(chunk.offset, len));
        }
        assert_all_free(&a);
    }

    #[test]
    fn an_emptied_slab_returns_to_the_extents() {
        let mut a = SlabAllocator::new(16 * MIB);
        // One slab per class that lengths below 300 B fall in.
        let small: Vec<Chunk> = (0..1000).map(|i| a.alloc(i % 300).unwrap()).collect();
        let classes: BTreeSet<usize> = (0..300).map(class_of).collect();
        assert!(classes.len() > 8, "{classes:?}");
        assert_eq!(a.reserved_bytes(), classes.len() as u64 * SLAB_BYTES);
        for chunk in small {
            a.free(chunk);
        }
        assert_all_free(&a);
        let whole = a.alloc(3 * MIB).unwrap();
        assert_eq!(
            whole,
            Chunk {
                offset: 0,
                size: 3 * MIB
            }
        );
        a.free(whole);
        assert_all_free(&a);
    }

    #[test]
    fn freed_small_chunks_are_reused_before_a_new_slab() {
        let mut a = SlabAllocator::new(2 * MIB);
        let kept = a.alloc(100).unwrap();
        let freed = a.alloc(100).unwrap();
        a.free(freed);
        assert_eq!(a.alloc(100).unwrap(), freed);
        assert_eq!(a.reserved_bytes(), SLAB_BYTES);
        a.free(kept);
    }

    #[test]
    fn extents_coalesce_with_both_neighbours() {
        let mut a = SlabAllocator::new(4 * MIB);
        let [x, y, z, w] = [(); 4].map(|()| a.alloc(MIB).unwrap());
        assert_eq!(a.alloc(1), None, "no room left for a slab");
        a.free(x);
        a.free(z);
        assert_eq!(a.largest_free_extent(), MIB);
        assert_eq!(a.alloc(2 * MIB), None);
        a.free(y);
        a.check();
        assert_eq!(a.largest_free_extent(), 3 * MIB);
        let big = a.alloc(3 * MIB).unwrap();
        assert_eq!(big.offset, 0);
        a.free(big);
        a.free(w);
        assert_all_free(&a);
    }

    #[test]
    fn best_fit_takes_the_smallest_hole_that_fits() {
        let mut a = SlabAllocator::new(16 * MIB);
        let sizes = [3 * MIB, MIB, MIB, MIB, 2 * MIB, MIB];
        let chunks: Vec<Chunk> = sizes.iter().map(|&s| a.alloc(s).unwrap()).collect();
        // Holes of 3 MiB, 2 MiB and the 7 MiB tail.
        a.free(chunks[0]);
        a.free(chunks[4]);
        let fit = a.alloc(2 * MIB - PAGE_BYTES).unwrap();
        assert_eq!(fit.offset, chunks[4].offset);
        a.check();
    }

    #[test]
    fn fragmented_space_refuses_what_no_single_hole_holds() {
        let mut a = SlabAllocator::new(8 * MIB);
        let chunks: Vec<Chunk> = (0..64).map(|_| a.alloc(128 * 1024).unwrap()).collect();
        assert_eq!(a.reserved_bytes(), a.capacity());
        for chunk in chunks.iter().step_by(2) {
            a.free(*chunk);
        }
        assert_eq!(a.reserved_bytes(), 4 * MIB);
        assert_eq!(a.largest_free_extent(), 128 * 1024);
        assert_eq!(a.alloc(128 * 1024 + 1), None);
        assert_eq!(a.alloc(1), None, "no hole can hold a slab");
        assert!(a.alloc(100 * 1024).is_some());
        // chunks[3] lies between the freed chunks[2] and chunks[4].
        a.free(chunks[3]);
        assert_eq!(a.largest_free_extent(), 3 * 128 * 1024);
        a.check();
    }

    #[test]
    fn lengths_beyond_capacity_are_refused_without_overflow() {
        let mut a = SlabAllocator::new(2 * MIB);
        for len in [2 * MIB + 1, u64::MAX - PAGE_BYTES + 2, u64::MAX] {
            assert_eq!(a.alloc(len), None);
        }
        let whole = a.alloc(2 * MIB).unwrap();
        assert_eq!(whole.size, 2 * MIB);
        a.free(whole);
        assert_all_free(&a);
    }

    #[test]
    fn capacity_is_rounded_down_to_a_page() {
        let mut a = SlabAllocator::new(3 * MIB + 1234);
        assert_eq!(a.capacity(), 3 * MIB);
        assert_eq!(a.alloc(3 * MIB + 1), None);
        let whole = a.alloc(3 * MIB).unwrap();
        a.free(whole);
        assert_all_free(&a);
    }

    #[test]
    fn arenas_smaller_than_a_slab_still_serve_small_values() {
        let mut a = SlabAllocator::new(5 * PAGE_BYTES + 7);
        assert_eq!(a.capacity(), 5 * PAGE_BYTES);
        let chunk = a.alloc(10).unwrap();
        assert_eq!(a.reserved_bytes(), 5 * PAGE_BYTES);
        assert_eq!(a.alloc(MAX_CLASS_BYTES), None, "class larger than the slab");
        a.free(chunk);
        assert_all_free(&a);

        let mut empty = SlabAllocator::new(PAGE_BYTES - 1);
        assert_eq!(empty.capacity(), 0);
        assert_eq!(empty.alloc(0), None);
        assert_eq!(empty.alloc(MAX_CLASS_BYTES + 1), None);
        assert_all_free(&empty);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not allocated")]
    fn double_free_of_a_small_chunk_panics_in_debug() {
        let mut a = SlabAllocator::new(2 * MIB);
        let _keep_slab_open = a.alloc(100).unwrap();
        let chunk = a.alloc(100).unwrap();
        a.free(chunk);
        a.free(chunk);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not allocated")]
    fn double_free_of_a_large_chunk_panics_in_debug() {
        let mut a = SlabAllocator::new(2 * MIB);
        let chunk = a.alloc(MIB).unwrap();
        a.free(chunk);
        a.free(chunk);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not allocated")]
    fn freeing_a_chunk_with_the_wrong_size_panics_in_debug() {
        let mut a = SlabAllocator::new(2 * MIB);
        let chunk = a.alloc(100).unwrap();
        a.free(Chunk { size: 64, ..chunk });
    }

    /// ~100k random allocs and frees against a model of live chunks; a full
    /// alloc stands for "evict something and retry", as the DRAM tier does.
    #[test]
    fn random_ops_match_a_model() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut a = SlabAllocator::new(64 * MIB + 12_345);
        let mut live: Vec<Chunk> = Vec::new();
        let mut by_offset: BTreeMap<u64, u64> = BTreeMap::new();
        let mut live_bytes = 0;
        for op in 0..100_000 {
            let free_one = !live.is_empty() && rng.below(100) < 45;
            if free_one {
                let chunk = live.swap_remove(rng.below(live.len() as u64) as usize);
                by_offset.remove(&chunk.offset);
                live_bytes -= chunk.size;
                a.free(chunk);
            } else {
                let len = random_len(&mut rng);
                match a.alloc(len) {
                    Some(chunk) => {
                        assert_fits(&a, &by_offset, chunk, len);
                        by_offset.insert(chunk.offset, chunk.size);
                        live_bytes += chunk.size;
                        live.push(chunk);
                    }
                    None if !live.is_empty() => {
                        let chunk = live.swap_remove(rng.below(live.len() as u64) as usize);
                        by_offset.remove(&chunk.offset);
                        live_bytes -= chunk.size;
                        a.free(chunk);
                    }
                    None => panic!("empty allocator refused {len} bytes"),
                }
            }
            assert_eq!(a.used_bytes(), live_bytes);
            assert!(a.used_bytes() <= a.reserved_bytes());
            assert!(a.reserved_bytes() <= a.capacity());
            if op % 5_000 == 0 {
                a.check();
            }
        }
        a.check();
        while !live.is_empty() {
            a.free(live.swap_remove(rng.below(live.len() as u64) as usize));
        }
        assert_all_free(&a);
    }

    /// Mostly small values, with KV-block-sized ones and a few huge ones.
    fn random_len(rng: &mut XorShift) -> u64 {
        match rng.below(100) {
            0..=69 => rng.below(2 * 1024),
            70..=89 => rng.below(MAX_CLASS_BYTES + 1),
            90..=98 => rng.below(2 * MIB),
            _ => rng.below(16 * MIB),
        }
    }

    fn assert_fits(a: &SlabAllocator, live: &BTreeMap<u64, u64>, chunk: Chunk, len: u64) {
        assert!(chunk.size >= len);
        assert_eq!(chunk.offset % CHUNK_ALIGN_BYTES, 0);
        assert!(chunk.offset + chunk.size <= a.capacity());
        if let Some((&prev, &prev_size)) = live.range(..=chunk.offset).next_back() {
            assert!(
                prev + prev_size <= chunk.offset,
                "{chunk:?} overlaps {prev}"
            );
        }
        if let Some((&next, _)) = live.range(chunk.offset + 1..).next() {
            assert!(
                chunk.offset + chunk.size <= next,
                "{chunk:?} overlaps {next}"
            );
        }
    }
}
