//! The DRAM tier's arena: one anonymous memory mapping, made once when the
//! node starts and unmapped when it stops.
//!
//! Its base address never changes for its lifetime: the server registers the
//! whole arena with the transport as one memory region and peers read values
//! in place. The arena never decides placement (that is
//! [`SlabAllocator`](super::SlabAllocator)'s job) and never remaps, grows or
//! frees part of itself.

use std::io;
use std::ptr::NonNull;

/// Granularity of the mapping. Anonymous mappings are made of whole pages;
/// rounding up here means `munmap` gets exactly the length `mmap` got.
const PAGE_BYTES: u64 = 4096;

/// A fixed, pre-allocated region of DRAM that values live in.
#[derive(Debug)]
pub struct Arena {
    /// First byte of the mapping; never null, never moves.
    base: NonNull<u8>,
    /// Bytes callers may use: the capacity asked for.
    len: u64,
    /// Bytes actually mapped: `len` rounded up to a page, what `munmap` needs.
    mapped_bytes: usize,
}

// SAFETY: the arena owns its mapping outright and the pointer is only its base
// address; a mapping is not tied to the thread that made it, so ownership may
// move to another thread.
unsafe impl Send for Arena {}

// SAFETY: `&Arena` exposes bytes only through the unsafe `slice`/`slice_mut`,
// whose callers guarantee that concurrently borrowed ranges are either all
// shared or disjoint: the `SlabAllocator` gives every chunk exactly one owner.
// The memory is plain bytes with no interior state of the arena's own.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `capacity` bytes (rounded up to a page) of zeroed anonymous memory.
    ///
    /// `MAP_NORESERVE` so a large arena does not fail on start under strict
    /// overcommit accounting before it is touched; pages are faulted in as
    /// values are written.
    pub fn new(capacity: u64) -> io::Result<Arena> {
        let mapped_bytes = capacity
            .checked_next_multiple_of(PAGE_BYTES)
            .and_then(|bytes| usize::try_from(bytes).ok())
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("arena capacity of {capacity} bytes is zero or too large to map"),
                )
            })?;
        // SAFETY: a fresh private anonymous mapping with no address hint and
        // no file: it aliases nothing. The result is checked just below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(base) = NonNull::new(ptr.cast::<u8>()) else {
            // Linux never maps page 0 for a hint-less mmap, but a null base
            // would make every slice undefined behaviour, so refuse it.
            // SAFETY: `ptr` and `mapped_bytes` are exactly what mmap mapped.
            unsafe { libc::munmap(ptr, mapped_bytes) };
            return Err(io::Error::other("mmap returned a null address"));
        };
        advise_huge_pages(base, mapped_bytes);
        Ok(Arena {
            base,
            len: capacity,
            mapped_bytes,
        })
    }

    /// Address of the first byte, for registering the arena with a transport.
    pub fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Usable bytes: the capacity given to [`Arena::new`].
    #[allow(clippy::len_without_is_empty)] // an arena is never empty: `new` refuses 0
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Borrows `len` bytes at `offset`.
    ///
    /// # Safety
    ///
    /// `offset..offset + len` must lie inside `0..self.len()`, and no byte of
    /// it may be mutably borrowed (through [`Arena::slice_mut`]) while the
    /// returned slice is alive.
    pub unsafe fn slice(&self, offset: u64, len: u64) -> &[u8] {
        debug_assert!(
            self.contains(offset, len),
            "slice {offset}+{len} outside arena of {} bytes",
            self.len
        );
        // SAFETY: the caller guarantees the range is inside the mapping (so
        // both values fit in usize, as the mapping length does) and that no
        // mutable borrow overlaps it. The mapping is readable, zero-filled at
        // creation so always initialised, and lives as long as `&self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset as usize), len as usize) }
    }

    /// Mutably borrows `len` bytes at `offset`.
    ///
    /// # Safety
    ///
    /// `offset..offset + len` must lie inside `0..self.len()`, and no other
    /// borrow (shared or mutable) of any byte of it may be alive while the
    /// returned slice is: the caller must own the chunk it writes.
    #[allow(clippy::mut_from_ref)] // exclusivity is per chunk, guaranteed by the caller
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        debug_assert!(
            self.contains(offset, len),
            "slice_mut {offset}+{len} outside arena of {} bytes",
            self.len
        );
        // SAFETY: the caller guarantees the range is inside the mapping and
        // that nothing else borrows it; the mapping is writable and lives as
        // long as `&self`.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset as usize), len as usize)
        }
    }

    /// Faults in every page of `offset..offset + len` (widened to whole
    /// pages) as writable, without reading or writing a byte of it
    /// (`MADV_POPULATE_WRITE`, Linux 5.14 and later). Pages already present
    /// and their contents are left as they are, so this may run while
    /// values in the range are written and read: it takes no borrow.
    ///
    /// Why: a fresh arena is mapped lazily, and the first write to each
    /// (huge) page pays the kernel's fault and zeroing (on a VM also the
    /// host backing it; docs/bench-notes/prefault.md), which a node would
    /// otherwise charge to its first writes.
    pub fn populate(&self, offset: u64, len: u64) -> io::Result<()> {
        let (start, end) = self.pages_of(offset, len)?;
        if end <= start {
            return Ok(());
        }
        populate_write(
            // SAFETY: `start` lies inside the mapping (checked above).
            unsafe { self.base.as_ptr().add(start as usize) },
            (end - start) as usize,
        )
    }

    /// Bytes of `offset..offset + len` (whole pages) resident in memory
    /// now (`mincore`): what a prefault has reached, for tests and logs.
    pub fn resident_bytes(&self, offset: u64, len: u64) -> io::Result<u64> {
        let (start, end) = self.pages_of(offset, len)?;
        let pages = ((end.saturating_sub(start)) / PAGE_BYTES) as usize;
        if pages == 0 {
            return Ok(0);
        }
        let mut flags = vec![0u8; pages];
        // SAFETY: the range is inside the mapping (checked above) and
        // page-aligned; `flags` has one byte per page of it. mincore only
        // reports residency and changes nothing.
        let rc = unsafe {
            libc::mincore(
                self.base.as_ptr().add(start as usize).cast(),
                (end - start) as usize,
                flags.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(flags.iter().filter(|&&f| f & 1 != 0).count() as u64 * PAGE_BYTES)
    }

    /// `offset..offset + len` widened to whole pages of the mapping, or an
    /// error if it leaves the arena.
    fn pages_of(&self, offset: u64, len: u64) -> io::Result<(u64, u64)> {
        if !self.contains(offset, len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{offset}+{len} lies outside the arena of {} bytes",
                    self.len
                ),
            ));
        }
        let start = offset - offset % PAGE_BYTES;
        let end = (offset + len)
            .next_multiple_of(PAGE_BYTES)
            .min(self.mapped_bytes as u64);
        Ok((start, end))
    }

    fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base` and `mapped_bytes` are exactly the mapping made in
        // `new`, and no slice outlives it because every slice borrows `self`.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped_bytes) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

#[cfg(target_os = "linux")]
fn populate_write(start: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller passes a page-aligned range inside a live private
    // anonymous mapping; MADV_POPULATE_WRITE only faults pages in (as a
    // write would, without writing), it never changes their contents.
    let rc = unsafe { libc::madvise(start.cast(), len, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EINVAL) => io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no MADV_POPULATE_WRITE (needs Linux 5.14 or later)",
        ),
        Some(libc::ENOMEM) | Some(libc::EFAULT) => io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("the kernel could not fault the pages in ({e})"),
        ),
        _ => e,
    })
}

#[cfg(not(target_os = "linux"))]
fn populate_write(_start: *mut u8, _len: usize) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "prefaulting needs Linux",
    ))
}

/// Asks for transparent huge pages: fewer TLB misses when values are copied or
/// read by the NIC. Best effort: THP may be disabled or unsupported, and the
/// arena works the same without it.
#[cfg(target_os = "linux")]
fn advise_huge_pages(base: NonNull<u8>, mapped_bytes: usize) {
    // SAFETY: the range is exactly the mapping just made; MADV_HUGEPAGE only
    // changes how the kernel backs it, never its contents.
    unsafe { libc::madvise(base.as_ptr().cast(), mapped_bytes, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_base: NonNull<u8>, _mapped_bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_zero_and_unmappable_capacities() {
        assert_eq!(
            Arena::new(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            Arena::new(u64::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn len_is_the_capacity_asked_for_and_base_is_page_aligned() {
        let arena = Arena::new(5000).unwrap();
        assert_eq!(arena.len(), 5000);
        assert_eq!(arena.base_addr() % PAGE_BYTES as usize, 0);
    }

    #[test]
    fn starts_zeroed_and_reads_back_what_was_written() {
        let arena = Arena::new(3 * PAGE_BYTES).unwrap();
        // SAFETY: in bounds, and no other borrow is alive.
        let zeroed = unsafe { arena.slice(0, arena.len()) }
            .iter()
            .all(|&b| b == 0);
        assert!(zeroed);
        // SAFETY: in bounds, and no other borrow is alive.
        unsafe { arena.slice_mut(PAGE_BYTES - 2, 4) }.copy_from_slice(b"kvkv");
        // SAFETY: in bounds; the mutable borrow above has ended.
        assert_eq!(unsafe { arena.slice(PAGE_BYTES - 3, 6) }, b"\0kvkv\0");
        // SAFETY: an empty slice at the very end is in bounds.
        assert!(unsafe { arena.slice(arena.len(), 0) }.is_empty());
    }

    #[test]
    fn base_address_is_stable_across_moves() {
        let arena = Arena::new(PAGE_BYTES).unwrap();
        let base = arena.base_addr();
        let moved = std::thread::spawn(move || arena).join().unwrap();
        assert_eq!(moved.base_addr(), base);
    }

    #[test]
    fn populate_faults_pages_in_and_keeps_their_bytes() {
        let arena = Arena::new(64 * PAGE_BYTES).unwrap();
        // SAFETY: in bounds, and no other borrow is alive.
        unsafe { arena.slice_mut(5 * PAGE_BYTES + 7, 5) }.copy_from_slice(b"value");
        let before = arena.resident_bytes(0, arena.len()).unwrap();
        assert!(
            before < 64 * PAGE_BYTES,
            "a fresh mapping is not all resident"
        );
        arena.populate(PAGE_BYTES + 1, 10 * PAGE_BYTES).unwrap();
        // Widened to whole pages: pages 1 ..= 11.
        assert_eq!(
            arena.resident_bytes(PAGE_BYTES, 11 * PAGE_BYTES).unwrap(),
            11 * PAGE_BYTES
        );
        arena.populate(0, arena.len()).unwrap();
        assert_eq!(
            arena.resident_bytes(0, arena.len()).unwrap(),
            64 * PAGE_BYTES
        );
        // SAFETY: in bounds; the mutable borrow above has ended.
        assert_eq!(unsafe { arena.slice(5 * PAGE_BYTES + 6, 7) }, b"\0value\0");
        // SAFETY: in bounds, and no mutable borrow is alive.
        let first_page = unsafe { arena.slice(0, PAGE_BYTES) };
        assert!(first_page.iter().all(|&b| b == 0));
    }

    #[test]
    fn populate_refuses_ranges_outside_the_arena() {
        let arena = Arena::new(4 * PAGE_BYTES).unwrap();
        for (offset, len) in [(0, 4 * PAGE_BYTES + 1), (4 * PAGE_BYTES, 1), (u64::MAX, 2)] {
            assert_eq!(
                arena.populate(offset, len).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            assert!(arena.resident_bytes(offset, len).is_err());
        }
        arena.populate(arena.len(), 0).unwrap();
    }

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Arena>();
    }
}
