//! A value's memory and the reference that keeps it alive.
//!
//! Every stored key holds one [`Slot`]: where its bytes are, how long they
//! are, their epoch and version. A slot is shared (the index
//! holds one reference, every reader another) and its chunk is freed when
//! the last reference goes, so a value deleted or overwritten while it is
//! read is never reused under the reader's feet.
//!
//! A slot is a key's largest cost after the key itself, so it is not a
//! heap allocation of its own: slots live in 48-byte cells carved from
//! 2 MiB pages ([`Cells`]), with no allocator header and no per-slot
//! pointer to the pools it is freed into. A page starts with the address
//! of its store's [`Shared`]; a cell finds it by rounding its own address
//! down to the page. Each live cell holds one strong count of that
//! `Shared`, so the pools (and the pages themselves) outlive every
//! reference, even one a reader keeps after the store is gone.
//!
//! Lock order: a cell's lock ([`Shared::cells`]) is a leaf. Freeing a slot
//! takes its pool's allocator lock, releases it, then takes the cells'
//! lock; nothing is locked while holding it.

use std::alloc::{self, Layout};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::dram::{Arena, Chunk, SlabAllocator};
use crate::gpu::DeviceMemory;

use super::Tier;

/// What a value is, beyond its bytes. What can be derived is not stored:
/// the chunk's size follows from `len`, the creation time from `version`,
/// the checksum from the bytes (summed when asked, [`super::Store::meta_summed`]).
pub(super) struct Slot {
    /// Start of the value in its pool (see [`Slot::chunk`]).
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) epoch: u64,
    pub(super) version: u64,
    /// Which pool the value is in.
    pub(super) place: Tier,
    /// Counted in its pool's `value_bytes` (a staged copy is not).
    pub(super) counted: bool,
    /// Read back from the lower tier and unchanged since: the lower tier
    /// still holds these very bytes (unless it dropped them), so evicting
    /// the value needs no new write.
    pub(super) clean: bool,
}

impl Slot {
    /// The chunk the value occupies (as its pool's allocator handed it out
    /// for `len` bytes).
    pub(super) fn chunk(&self) -> Chunk {
        SlabAllocator::chunk_at(self.offset, self.len)
    }

    /// When the write was accepted, on the node that accepted it: the
    /// millisecond part of the version. Copies on other nodes and values
    /// read back from the lower tier keep it.
    pub(super) fn created_ms(&self) -> u64 {
        self.version >> 20
    }
}

/// What every slot needs to free itself: the pools, their allocators, and
/// the pages the slots live in.
pub(super) struct Shared {
    /// Declared before the arena so that it is dropped first: the device
    /// unpins the arena before it is unmapped.
    pub(super) gpu: Option<GpuPool>,
    pub(super) arena: Arena,
    pub(super) alloc: Mutex<SlabAllocator>,
    pub(super) value_bytes: AtomicU64,
    pub(super) cells: Mutex<Cells>,
}

/// The GPU tier: device memory carved by the same allocator as the arena.
pub(super) struct GpuPool {
    pub(super) device: Arc<dyn DeviceMemory>,
    pub(super) alloc: Mutex<SlabAllocator>,
    pub(super) value_bytes: AtomicU64,
    pub(super) watermark_bytes: u64,
}

impl Shared {
    /// Gives a dead slot's chunk back to its pool.
    fn release(&self, slot: &Slot) {
        let (alloc, value_bytes) = match (slot.place, &self.gpu) {
            (Tier::Gpu, Some(gpu)) => (&gpu.alloc, &gpu.value_bytes),
            _ => (&self.alloc, &self.value_bytes),
        };
        alloc.lock().free(slot.chunk());
        if slot.counted {
            value_bytes.fetch_sub(slot.len, Ordering::Relaxed);
        }
    }
}

/// One slot and its reference count; while free, its first bytes hold
/// the next free cell.
struct Cell {
    count: AtomicU32,
    slot: MaybeUninit<Slot>,
}

const CELL_BYTES: usize = size_of::<Cell>();
const _: () = assert!(CELL_BYTES == 48, "a key's slot is 48 bytes");

/// Pages are aligned to their size, so a cell finds its page's header by
/// masking its address. Large, so that even 100 M keys take few mappings
/// (2,300 pages).
const PAGE_BYTES: usize = 2 << 20;

/// The header: the address of the store's `Shared`.
const HEADER_BYTES: usize = size_of::<*const Shared>();
const CELLS_PER_PAGE: usize = (PAGE_BYTES - HEADER_BYTES) / CELL_BYTES;
const _: () = assert!(HEADER_BYTES.is_multiple_of(align_of::<Cell>()));

/// A reference count this high means a leak of references somewhere:
/// stop rather than wrap.
const MAX_COUNT: u32 = i32::MAX as u32;

/// A fresh page aligned to its size, mapped directly: an aligned heap
/// allocation leaves a gap before each page whose allocator headers cost
/// resident memory (6 bytes a key at 64 KiB pages), and the pages live as
/// long as the store anyway. Only the memory cells touch is resident.
fn map_page() -> NonNull<u8> {
    let mapped = 2 * PAGE_BYTES;
    // SAFETY: a fresh private anonymous mapping with no address hint: it
    // aliases nothing. Checked just below.
    let at = unsafe {
        libc::mmap(
            ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        // As a failed `Box::new` would: the process cannot go on.
        alloc::handle_alloc_error(
            Layout::from_size_align(PAGE_BYTES, PAGE_BYTES).expect("a power of two"),
        );
    }
    let start = at as usize;
    let page = start.next_multiple_of(PAGE_BYTES);
    let head = page - start;
    // SAFETY: both pieces lie inside the mapping just made and outside the
    // page kept; unmapping them leaves exactly [page, page + PAGE_BYTES).
    unsafe {
        if head > 0 {
            libc::munmap(at, head);
        }
        libc::munmap(
            (page + PAGE_BYTES) as *mut libc::c_void,
            mapped - head - PAGE_BYTES,
        );
    }
    NonNull::new(page as *mut u8).expect("mmap never maps page 0 without a hint")
}

/// The slab that slots live in. Pages are taken as needed and kept until
/// the store's `Shared` goes (freed cells are reused first), like the
/// index's node slab.
pub(super) struct Cells {
    pages: Vec<NonNull<u8>>,
    /// Cells handed out from the newest page so far.
    used_in_last: usize,
    /// Freed cells, linked through their first bytes.
    free: Option<NonNull<Cell>>,
    live: usize,
}

// SAFETY: the pages are plain memory owned by this slab; it is only ever
// used behind `Shared::cells`' mutex.
unsafe impl Send for Cells {}

impl Cells {
    pub(super) fn new() -> Cells {
        Cells {
            pages: Vec::new(),
            used_in_last: CELLS_PER_PAGE,
            free: None,
            live: 0,
        }
    }

    /// Slots alive now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.live
    }

    /// An unused cell in a page whose header names `shared`.
    fn take(&mut self, shared: *const Shared) -> NonNull<Cell> {
        self.live += 1;
        if let Some(cell) = self.free {
            // SAFETY: a free cell's first bytes hold the next free cell
            // (written by `put`), and nobody else holds a free cell.
            self.free = unsafe { cell.as_ptr().cast::<Option<NonNull<Cell>>>().read() };
            return cell;
        }
        if self.used_in_last == CELLS_PER_PAGE {
            let page = map_page();
            // SAFETY: the page is ours and at least a header long.
            unsafe { page.as_ptr().cast::<*const Shared>().write(shared) };
            self.pages.push(page);
            self.used_in_last = 0;
        }
        let page = *self.pages.last().expect("a page was just ensured");
        let at = HEADER_BYTES + self.used_in_last * CELL_BYTES;
        self.used_in_last += 1;
        // SAFETY: `at + CELL_BYTES <= PAGE_BYTES` (CELLS_PER_PAGE), so
        // the cell lies inside the page.
        unsafe { NonNull::new_unchecked(page.as_ptr().add(at).cast::<Cell>()) }
    }

    /// Takes back a cell whose slot was moved out.
    fn put(&mut self, cell: NonNull<Cell>) {
        self.live -= 1;
        // SAFETY: the cell is dead (its last reference is gone), so its
        // bytes are ours to reuse as the free list's link.
        unsafe {
            cell.as_ptr()
                .cast::<Option<NonNull<Cell>>>()
                .write(self.free)
        };
        self.free = Some(cell);
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        // Every live cell holds a count of the `Shared` this slab is in,
        // so none is left when it drops.
        debug_assert_eq!(self.live, 0, "slots outlived their store");
        for page in self.pages.drain(..) {
            // SAFETY: mapped by `map_page`, and no cell in it is live.
            unsafe { libc::munmap(page.as_ptr().cast(), PAGE_BYTES) };
        }
    }
}

/// A shared reference to a slot: what the index and every reader hold.
/// Eight bytes, like an `Arc`, and `Option<SlotRef>` is too.
pub(super) struct SlotRef(NonNull<Cell>);

// SAFETY: a slot is plain data never written after it is made, its count
// is atomic, and `Shared` is shared between threads by design.
unsafe impl Send for SlotRef {}
// SAFETY: as for `Send`: `&SlotRef` only reads the slot and counts.
unsafe impl Sync for SlotRef {}

impl SlotRef {
    /// A new slot in `shared`'s cells, with one reference.
    pub(super) fn new(shared: &Arc<Shared>, slot: Slot) -> SlotRef {
        let cell = shared.cells.lock().take(Arc::as_ptr(shared));
        // SAFETY: `take` handed this cell to us alone.
        unsafe {
            cell.as_ptr().write(Cell {
                count: AtomicU32::new(1),
                slot: MaybeUninit::new(slot),
            })
        };
        // The cell's count of `Shared`, given back in `drop_slow`.
        let _ = Arc::into_raw(Arc::clone(shared));
        SlotRef(cell)
    }

    /// The same value over another chunk: moved between pools (`counted`
    /// in its new pool), or a reader's private copy (not counted, and not
    /// `clean`: evicting it is never asked).
    pub(super) fn copy_at(&self, place: Tier, chunk: Chunk, counted: bool) -> SlotRef {
        let shared = ManuallyDrop::new(
            // SAFETY: the pointer came from `Arc::into_raw` (in `new`) and
            // this cell's count keeps it alive; `ManuallyDrop` leaves that
            // count where it is.
            unsafe { Arc::from_raw(self.shared_ptr()) },
        );
        SlotRef::new(
            &shared,
            Slot {
                offset: chunk.offset,
                len: self.len,
                epoch: self.epoch,
                version: self.version,
                place,
                counted,
                clean: self.clean && counted,
            },
        )
    }

    /// The pools this slot's bytes are in.
    pub(super) fn shared(&self) -> &Shared {
        // SAFETY: a live cell holds a count of its `Shared`.
        unsafe { &*self.shared_ptr() }
    }

    fn shared_ptr(&self) -> *const Shared {
        let page = (self.0.as_ptr() as usize) & !(PAGE_BYTES - 1);
        // SAFETY: every cell lies in a page aligned to PAGE_BYTES whose
        // first bytes are the header written in `Cells::take`.
        unsafe { (page as *const *const Shared).read() }
    }

    fn cell(&self) -> &Cell {
        // SAFETY: the cell is live while this reference exists.
        unsafe { self.0.as_ref() }
    }

    pub(super) fn ptr_eq(a: &SlotRef, b: &SlotRef) -> bool {
        a.0 == b.0
    }

    /// References to this slot now (1: only the caller's, i.e. unpinned
    /// when the caller is the index).
    pub(super) fn count(this: &SlotRef) -> usize {
        this.cell().count.load(Ordering::Acquire) as usize
    }

    /// The last reference went: free the chunk, then the cell, then the
    /// cell's count of `Shared` (which may free the page this cell is in,
    /// so it comes last).
    #[cold]
    unsafe fn drop_slow(&mut self) {
        let shared = self.shared_ptr();
        // SAFETY: the last reference is going; nobody reads the slot again.
        let slot = unsafe { ptr::read(self.cell().slot.as_ptr()) };
        // SAFETY: the cell still holds its count of `Shared`.
        let pools = unsafe { &*shared };
        pools.release(&slot);
        pools.cells.lock().put(self.0);
        // SAFETY: the count this cell took in `new`.
        drop(unsafe { Arc::from_raw(shared) });
    }
}

impl Deref for SlotRef {
    type Target = Slot;

    fn deref(&self) -> &Slot {
        // SAFETY: a live cell's slot is initialised (written in `new`) and
        // never written again while referenced.
        unsafe { self.cell().slot.assume_init_ref() }
    }
}

impl Clone for SlotRef {
    fn clone(&self) -> SlotRef {
        // Relaxed, as `Arc`: the new reference comes from an existing
        // one, which already orders every access to the slot.
        let old = self.cell().count.fetch_add(1, Ordering::Relaxed);
        if old > MAX_COUNT {
            std::process::abort();
        }
        SlotRef(self.0)
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        // Release/acquire, as `Arc`: every use of the slot through any
        // reference happens before it is freed.
        if self.cell().count.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: this was the last reference.
        unsafe { self.drop_slow() }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    const ARENA_BYTES: u64 = 64 << 20;

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            gpu: None,
            arena: Arena::new(ARENA_BYTES).expect("arena"),
            alloc: Mutex::new(SlabAllocator::new(ARENA_BYTES)),
            value_bytes: AtomicU64::new(0),
            cells: Mutex::new(Cells::new()),
        })
    }

    /// A counted 16-byte value whose fields all derive from `i`.
    fn slot(shared: &Arc<Shared>, i: u64) -> SlotRef {
        let chunk = shared.alloc.lock().alloc(16).expect("room");
        shared.value_bytes.fetch_add(16, Relaxed);
        SlotRef::new(
            shared,
            Slot {
                offset: chunk.offset,
                len: 16,
                epoch: i,
                version: i << 20,
                place: Tier::Dram,
                counted: true,
                clean: i.is_multiple_of(2),
            },
        )
    }

    fn pages(shared: &Shared) -> usize {
        shared.cells.lock().pages.len()
    }

    #[test]
    fn slots_across_pages_keep_their_fields_and_free_everything() {
        let shared = shared();
        let n = CELLS_PER_PAGE as u64 * 3 + 7;
        let slots: Vec<SlotRef> = (0..n).map(|i| slot(&shared, i)).collect();
        assert_eq!(pages(&shared), 4);
        assert_eq!(shared.cells.lock().live(), n as usize);
        for (i, s) in slots.iter().enumerate() {
            let i = i as u64;
            assert_eq!((s.epoch, s.version, s.len), (i, i << 20, 16));
            assert_eq!(s.clean, i.is_multiple_of(2));
            assert!(
                std::ptr::eq(s.shared(), &*shared),
                "cell {i} finds its store"
            );
            assert_eq!(SlotRef::count(s), 1);
        }
        drop(slots);
        assert_eq!(shared.cells.lock().live(), 0);
        assert_eq!(shared.alloc.lock().reserved_bytes(), 0, "every chunk freed");
        assert_eq!(shared.value_bytes.load(Relaxed), 0);
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "every cell's count given back"
        );
        // Freed cells are reused before any new page.
        let again: Vec<SlotRef> = (0..n).map(|i| slot(&shared, i)).collect();
        assert_eq!(pages(&shared), 4);
        drop(again);
    }

    #[test]
    fn a_reference_outlives_its_store() {
        let shared = shared();
        let weak = Arc::downgrade(&shared);
        let a = slot(&shared, 1);
        let b = a.clone();
        assert_eq!(SlotRef::count(&a), 2);
        drop(shared);
        assert!(weak.upgrade().is_some(), "a live slot keeps its pools");
        drop(a);
        assert_eq!(SlotRef::count(&b), 1);
        assert_eq!(b.shared().alloc.lock().used_bytes(), 16);
        drop(b);
        assert!(
            weak.upgrade().is_none(),
            "the last slot frees the pools and pages"
        );
    }

    #[test]
    fn copies_are_new_slots_in_the_same_pools() {
        let shared = shared();
        let a = slot(&shared, 5);
        let chunk = shared.alloc.lock().alloc(16).expect("room");
        let copy = a.copy_at(Tier::Dram, chunk, false);
        assert!(!SlotRef::ptr_eq(&a, &copy));
        assert_eq!((copy.epoch, copy.version), (a.epoch, a.version));
        assert!(!copy.clean && !copy.counted);
        assert_eq!(Arc::strong_count(&shared), 3);
        drop(copy);
        // Not counted: value_bytes keeps only `a`.
        assert_eq!(shared.value_bytes.load(Relaxed), 16);
        drop(a);
        assert_eq!(shared.value_bytes.load(Relaxed), 0);
        assert_eq!(shared.alloc.lock().reserved_bytes(), 0);
    }

    #[test]
    fn references_cloned_and_dropped_on_many_threads() {
        let shared = shared();
        let slots: Vec<SlotRef> = (0..256).map(|i| slot(&shared, i)).collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let slots = &slots;
                s.spawn(move || {
                    for round in 0..200 {
                        let held: Vec<SlotRef> =
                            slots.iter().skip((t + round) % 7).cloned().collect();
                        for (h, i) in held.iter().zip(((t + round) % 7) as u64..) {
                            assert_eq!(h.epoch, i);
                        }
                    }
                });
            }
        });
        assert!(slots.iter().all(|s| SlotRef::count(s) == 1));
        // Dropped on other threads, the last references still free.
        let (a, b) = slots.split_at(128);
        let (a, b) = (a.to_vec(), b.to_vec());
        drop(slots);
        std::thread::scope(|s| {
            s.spawn(move || drop(a));
            s.spawn(move || drop(b));
        });
        assert_eq!(shared.cells.lock().live(), 0);
        assert_eq!(shared.alloc.lock().reserved_bytes(), 0);
    }
}
