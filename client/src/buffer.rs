//! Registered memory a node may read from (PUT) and the client reads into
//! (GET).
//!
//! A [`Buffer`] is either owned (page-aligned, allocated by the client) or
//! foreign (registered by [`crate::Client::register_raw`], e.g. a torch
//! tensor). Either way it is registered with the client's transport for as
//! long as it lives, and its memory is never freed while the data plane may
//! still be sending from it.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use strata_rdma::Region;

use crate::{Error, Result};

/// Alignment of owned buffers: a page, so DMA-capable transports can
/// register them as they are and values never straddle a page needlessly.
pub const PAGE_BYTES: usize = 4096;

/// Who frees the memory behind a buffer.
enum Memory {
    /// Allocated here with this layout; freed once no read of it is served.
    Owned(Layout),
    /// Belongs to the caller of `register_raw`; never freed here.
    Foreign,
}

/// Registered memory. Owned buffers start zeroed.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    memory: Memory,
    /// `None` only during drop.
    region: Option<Region>,
}

// SAFETY: a Buffer is a uniquely owned byte range (like `Box<[u8]>`); the
// raw pointer is what makes the compiler unsure. Shared access only reads.
unsafe impl Send for Buffer {}
// SAFETY: `&Buffer` only gives read access to the bytes.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Allocates `len` zeroed, page-aligned bytes and lets `register`
    /// register them.
    pub(crate) fn alloc(
        len: usize,
        register: impl FnOnce(u64, u64) -> Result<Region>,
    ) -> Result<Self> {
        if len == 0 {
            return Err(Error::Invalid("buffer length must be positive"));
        }
        let layout = Layout::from_size_align(len, PAGE_BYTES)
            .map_err(|_| Error::Invalid("buffer length overflows"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or(Error::NoSpace("client allocation failed".into()))?;
        match register(ptr.as_ptr() as u64, len as u64) {
            Ok(region) => Ok(Self {
                ptr,
                len,
                memory: Memory::Owned(layout),
                region: Some(region),
            }),
            Err(e) => {
                // SAFETY: allocated just above with `layout`, never shared.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    /// Wraps memory the caller owns, registered as `region`.
    pub(crate) fn foreign(ptr: NonNull<u8>, len: usize, region: Region) -> Self {
        Self {
            ptr,
            len,
            memory: Memory::Foreign,
            region: Some(region),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty buffers cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes while `self` lives. The
        // data plane only reads it, and only while a `&self` borrow is held
        // by a put.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` proves no put or get of this
        // buffer is in progress in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn region(&self) -> &Region {
        self.region.as_ref().expect("region is only taken in drop")
    }

    /// Deregisters and waits until no read of the memory is being served;
    /// after this, foreign memory may be freed by its owner.
    pub async fn close(mut self) {
        if let Some(region) = self.region.take() {
            region.close().await;
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let Memory::Owned(layout) = self.memory else {
            // Foreign memory: deregistering is all we may do.
            drop(self.region.take());
            return;
        };
        let ptr = SendPtr(self.ptr);
        let free = move || {
            let p = ptr;
            // SAFETY: allocated in `alloc` with `layout`; the region is
            // closed, so no data-plane read touches it anymore.
            unsafe { alloc::dealloc(p.0.as_ptr(), layout) }
        };
        match self.region.take() {
            // A peer may be reading the buffer right now (a put cancelled
            // by a dropped future): freed when that read ends, on whichever
            // thread ends it; never blocks here.
            Some(region) => region.close_then(free),
            None => free(),
        }
    }
}

/// Moves a pointer into the closure that frees it.
struct SendPtr(NonNull<u8>);
// SAFETY: the pointee is owned by that closure alone once the buffer is gone.
unsafe impl Send for SendPtr {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("region", &self.region)
            .finish()
    }
}
