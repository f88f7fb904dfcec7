//! GPU tier: one device-memory allocation per node that the store carves
//! with the same offset allocator as the DRAM arena.
//!
//! Device memory is not addressable by the CPU, so the store only ever
//! touches it through [`DeviceMemory`]: an upload (host → device) when a
//! value is placed on the GPU, a download (device → host) when it is read
//! into DRAM or evicted down to DRAM. The host side of every copy is the
//! DRAM arena, which is page-locked with the driver once at start
//! ([`DeviceMemory::pin_host`]) so copies run at DMA speed and need no
//! bounce buffer of their own.
//!
//! The CUDA implementation ([`open`], feature `cuda`) loads libcuda at run
//! time: a binary built with the feature starts on a machine without a GPU,
//! and asking such a machine for a GPU pool fails with a message saying
//! what is missing, never a panic.

use std::sync::Arc;

/// Why the GPU tier could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("this strata-server was built without CUDA support; rebuild with `--features cuda` to use gpu_memory_pool_size")]
    NotBuilt,
    #[error("no CUDA driver: libcuda.so could not be loaded (no GPU here, or the NVIDIA driver is not installed); set gpu_memory_pool_size to 0")]
    NoDriver,
    #[error("CUDA {call} failed: {detail}")]
    Cuda { call: &'static str, detail: String },
    #[error("copy of {len} bytes at offset {offset} is outside the {size}-byte GPU pool")]
    OutOfRange { offset: u64, len: u64, size: u64 },
}

/// A fixed range of device memory and the copies in and out of it.
///
/// Implementations are synchronous: when a call returns, the bytes have
/// arrived. They must be callable from any thread.
#[allow(clippy::len_without_is_empty)] // a pool is never empty: 0 means no tier
pub trait DeviceMemory: Send + Sync {
    /// Bytes in the pool.
    fn len(&self) -> u64;
    /// What INFO and the logs say about the device ("GPU 0 (NVIDIA H200)").
    fn describe(&self) -> String;
    /// Copies `src` to the pool at `offset`.
    fn upload(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError>;
    /// Copies the pool at `offset` into `dst`.
    fn download(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError>;
    /// Page-locks `[addr, addr + len)` of host memory for the lifetime of
    /// the device, so copies from and to it are direct DMA. Best effort:
    /// copies work (slower) without it.
    fn pin_host(&self, addr: usize, len: u64) -> Result<(), DeviceError>;
}

/// Checks a copy against the pool's size.
pub fn check_range(offset: u64, len: usize, size: u64) -> Result<(), DeviceError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            offset,
            len: len as u64,
            size,
        }),
    }
}

/// Allocates `len` bytes on GPU `ordinal` (CUDA).
#[cfg(not(feature = "cuda"))]
pub fn open(_ordinal: usize, _len: u64) -> Result<Arc<dyn DeviceMemory>, DeviceError> {
    Err(DeviceError::NotBuilt)
}

/// Allocates `len` bytes on GPU `ordinal` (CUDA).
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize, len: u64) -> Result<Arc<dyn DeviceMemory>, DeviceError> {
    Ok(Arc::new(cuda::CudaPool::alloc(ordinal, len)?))
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use cudarc::driver::sys;
    use cudarc::driver::CudaContext;
    use parking_lot::Mutex;

    use super::{check_range, DeviceError, DeviceMemory};

    /// One `cuMemAlloc` allocation, freed on drop.
    pub struct CudaPool {
        ctx: Arc<CudaContext>,
        ordinal: usize,
        name: String,
        ptr: sys::CUdeviceptr,
        len: u64,
        /// Host ranges registered with `pin_host`, unregistered on drop.
        pinned: Mutex<Vec<usize>>,
    }

    impl CudaPool {
        pub fn alloc(ordinal: usize, len: u64) -> Result<CudaPool, DeviceError> {
            // SAFETY: only probes whether the library can be loaded.
            if !unsafe { sys::is_culib_present() } {
                // CudaContext::new would panic inside the loader.
                return Err(DeviceError::NoDriver);
            }
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| cuda("cuInit/cuDevicePrimaryCtxRetain", e))?;
            ctx.bind_to_thread()
                .map_err(|e| cuda("cuCtxSetCurrent", e))?;
            let name = ctx.name().unwrap_or_else(|_| "unknown".into());
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: the context is current; both outputs are written.
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
                .result()
                .map_err(|e| cuda("cuMemGetInfo", e))?;
            if len > free as u64 {
                return Err(DeviceError::Cuda {
                    call: "cuMemAlloc",
                    detail: format!(
                        "gpu_memory_pool_size is {len} bytes but GPU {ordinal} ({name}) has {free} of {total} bytes free"
                    ),
                });
            }
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the context is current on this thread; `ptr` is
            // written by the call.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, len as usize) }
                .result()
                .map_err(|e| cuda("cuMemAlloc", e))?;
            Ok(CudaPool {
                ctx,
                ordinal,
                name,
                ptr,
                len,
                pinned: Mutex::new(Vec::new()),
            })
        }

        fn bind(&self) -> Result<(), DeviceError> {
            self.ctx
                .bind_to_thread()
                .map_err(|e| cuda("cuCtxSetCurrent", e))
        }
    }

    impl DeviceMemory for CudaPool {
        fn len(&self) -> u64 {
            self.len
        }

        fn describe(&self) -> String {
            format!("GPU {} ({})", self.ordinal, self.name)
        }

        fn upload(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
            check_range(offset, src.len(), self.len)?;
            self.bind()?;
            // SAFETY: the range lies inside our allocation (checked) and
            // `src` is valid for its length. The copy is synchronous.
            unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset, src.as_ptr().cast(), src.len()) }
                .result()
                .map_err(|e| cuda("cuMemcpyHtoD", e))
        }

        fn download(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
            check_range(offset, dst.len(), self.len)?;
            self.bind()?;
            // SAFETY: as in `upload`, with `dst` valid for writes.
            unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset, dst.len()) }
                .result()
                .map_err(|e| cuda("cuMemcpyDtoH", e))
        }

        fn pin_host(&self, addr: usize, len: u64) -> Result<(), DeviceError> {
            self.bind()?;
            // SAFETY: the caller owns [addr, addr + len) for the lifetime of
            // this pool (the store drops the pool before its arena); the
            // driver only locks the pages.
            unsafe {
                sys::cuMemHostRegister_v2(
                    addr as *mut std::ffi::c_void,
                    len as usize,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            }
            .result()
            .map_err(|e| cuda("cuMemHostRegister", e))?;
            self.pinned.lock().push(addr);
            Ok(())
        }
    }

    impl Drop for CudaPool {
        fn drop(&mut self) {
            if self.ctx.bind_to_thread().is_err() {
                return;
            }
            for addr in self.pinned.lock().drain(..) {
                // SAFETY: registered in `pin_host`, still mapped (the store
                // drops this pool before its arena).
                let _ = unsafe { sys::cuMemHostUnregister(addr as *mut std::ffi::c_void) };
            }
            // SAFETY: allocated in `alloc`; the store's slots hold the pool
            // alive, so no value refers to it any more.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }

    fn cuda(call: &'static str, e: cudarc::driver::DriverError) -> DeviceError {
        DeviceError::Cuda {
            call,
            detail: e.to_string(),
        }
    }
}

#[cfg(test)]
pub(crate) mod host {
    //! Host memory standing in for device memory, for the store's unit tests
    //! on machines without a GPU; its purpose is injecting copy faults. The
    //! CUDA path is checked by `bench/gpu-check.sh` on a GPU machine.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    use parking_lot::Mutex;

    use super::{check_range, DeviceError, DeviceMemory};

    pub struct HostDevice {
        bytes: Mutex<Vec<u8>>,
        pub fail_uploads: AtomicBool,
        pub fail_downloads: AtomicBool,
        pub uploads: AtomicU64,
        pub downloads: AtomicU64,
    }

    impl HostDevice {
        pub fn new(len: u64) -> HostDevice {
            HostDevice {
                bytes: Mutex::new(vec![0; len as usize]),
                fail_uploads: AtomicBool::new(false),
                fail_downloads: AtomicBool::new(false),
                uploads: AtomicU64::new(0),
                downloads: AtomicU64::new(0),
            }
        }

        fn fault(call: &'static str) -> DeviceError {
            DeviceError::Cuda {
                call,
                detail: "injected fault".into(),
            }
        }
    }

    impl DeviceMemory for HostDevice {
        fn len(&self) -> u64 {
            self.bytes.lock().len() as u64
        }
        fn describe(&self) -> String {
            "host memory (test)".into()
        }
        fn upload(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
            let mut bytes = self.bytes.lock();
            check_range(offset, src.len(), bytes.len() as u64)?;
            if self.fail_uploads.load(Relaxed) {
                return Err(Self::fault("upload"));
            }
            self.uploads.fetch_add(1, Relaxed);
            bytes[offset as usize..offset as usize + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn download(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
            let bytes = self.bytes.lock();
            check_range(offset, dst.len(), bytes.len() as u64)?;
            if self.fail_downloads.load(Relaxed) {
                return Err(Self::fault("download"));
            }
            self.downloads.fetch_add(1, Relaxed);
            dst.copy_from_slice(&bytes[offset as usize..offset as usize + dst.len()]);
            Ok(())
        }
        fn pin_host(&self, _addr: usize, _len: u64) -> Result<(), DeviceError> {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_gpu_says_why() {
        match open(0, 1 << 20) {
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("CUDA") || text.contains("GPU"),
                    "unclear: {text}"
                );
            }
            Ok(dev) => {
                // A GPU machine: the pool round-trips bytes.
                let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
                dev.upload(4096, &data).expect("upload");
                let mut back = vec![0u8; data.len()];
                dev.download(4096, &mut back).expect("download");
                assert_eq!(back, data);
                assert!(dev.upload(dev.len() - 1, &data).is_err());
            }
        }
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(1, 10, 10).is_err());
        assert!(check_range(u64::MAX, 2, 10).is_err());
    }
}
