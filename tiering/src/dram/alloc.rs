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

/// Smallest chunk: one cache line, so two values never share a line, and the
/// per-chunk bookkeeping (a `u16` free-list entry and one bitmap bit) stays
/// under 4% of the chunk.
const MIN_CHUNK_BYTES: u64 = 64;

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
const _: () = assert!(SLAB_BYTES % PAGE_BYTES == 0 && MAX_CLASS_BYTES <= SLAB_BYTES);
const _: () = assert!(MIN_CHUNK_BYTES % CHUNK_ALIGN_BYTES == 0);
const _: () = assert!(PAGE_BYTES % CHUNK_ALIGN_BYTES == 0);

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
        if chunk.size != size || delta % size != 0 {
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
        debug_assert!(len > 0 && len % PAGE_BYTES == 0);
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
