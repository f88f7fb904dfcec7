//! GPU memory as RDMA regions (GPUDirect RDMA through dma-buf).
//!
//! [`GpuMemory`] allocates device memory with the CUDA driver API and
//! exports it as a dma-buf; [`super::VerbsTransport::register_gpu`]
//! registers that dma-buf with the NIC, so peers READ straight from GPU
//! memory and our READs land straight in it, with no bounce through host
//! memory. libcuda is loaded at run time: without a GPU or driver every call
//! fails with a message saying so, it never panics.
//!
//! Needs a NIC whose driver imports dma-bufs (mlx5; soft-RoCE does not) and
//! an NVIDIA driver that exports them (open kernel modules, CUDA ≥ 11.7).
//! `bench/gpu-rdma-check.sh` checks the whole path on such a machine.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;

/// Why GPU memory could not be had.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver: libcuda.so could not be loaded (no GPU here, or the NVIDIA driver is not installed)")]
    NoDriver,
    #[error("CUDA {call} failed: {detail}")]
    Cuda { call: &'static str, detail: String },
    #[error("GPU buffer of {0} bytes: must be a positive multiple of the host page size")]
    BadLength(u64),
}

/// Device memory exported as a dma-buf. Freed on drop (after any region
/// registered from it, which holds an `Arc` to it).
pub struct GpuMemory {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: u64,
    dmabuf: OwnedFd,
}

impl GpuMemory {
    /// Allocates `len` bytes on GPU `ordinal` and exports them as a dma-buf.
    pub fn alloc(ordinal: usize, len: u64) -> Result<Arc<GpuMemory>, GpuError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            // CudaContext::new would panic inside the loader.
            return Err(GpuError::NoDriver);
        }
        let page = page_size();
        if len == 0 || !len.is_multiple_of(page) {
            return Err(GpuError::BadLength(len));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda("cuInit/cuCtxRetain", e))?;
        ctx.bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current on this thread; `ptr` is written
        // by the call.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, len as usize) }
            .result()
            .map_err(|e| cuda("cuMemAlloc", e))?;
        let mut fd: libc::c_int = -1;
        // SAFETY: [ptr, ptr + len) is one allocation made above; `fd` is
        // written by the call. The range must be page aligned: checked by
        // the driver, which fails cleanly otherwise.
        let exported = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut libc::c_int).cast(),
                ptr,
                len as usize,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        }
        .result();
        if let Err(e) = exported {
            // SAFETY: `ptr` was allocated above and nothing else uses it.
            let _ = unsafe { sys::cuMemFree_v2(ptr) };
            return Err(cuda("cuMemGetHandleForAddressRange(DMA_BUF_FD)", e));
        }
        // SAFETY: the driver handed us a fresh fd that nothing else owns.
        let dmabuf = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Arc::new(GpuMemory {
            ctx,
            ptr,
            len,
            dmabuf,
        }))
    }

    /// Device address of the first byte (also the NIC's I/O address for it).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: empty buffers cannot be allocated.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn dmabuf(&self) -> &OwnedFd {
        &self.dmabuf
    }

    /// Copies `src` into the buffer at `offset` (synchronous).
    pub fn upload(&self, offset: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check(offset, src.len())?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        // SAFETY: the range was checked to lie inside our allocation and
        // `src` is valid for its length.
        unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset, src.as_ptr().cast(), src.len()) }
            .result()
            .map_err(|e| cuda("cuMemcpyHtoD", e))
    }

    /// Copies the buffer at `offset` into `dst` (synchronous).
    pub fn download(&self, offset: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(offset, dst.len())?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        // SAFETY: as in `upload`, with `dst` valid for writes.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset, dst.len()) }
            .result()
            .map_err(|e| cuda("cuMemcpyDtoH", e))
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), GpuError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(GpuError::Cuda {
                call: "copy",
                detail: "range outside the GPU buffer".into(),
            }),
        }
    }
}

impl Drop for GpuMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated in `alloc`; every region registered from it
            // holds an Arc to `self`, so none is left.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

fn cuda(call: &'static str, e: cudarc::driver::DriverError) -> GpuError {
    GpuError::Cuda {
        call,
        detail: e.to_string(),
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a GPU the error says so (and nothing panics);
    /// on one with a GPU, a page-sized buffer allocates and round-trips.
    #[test]
    fn alloc_fails_clearly_without_a_gpu() {
        let page = page_size();
        match GpuMemory::alloc(0, page) {
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("CUDA") || text.contains("GPU"),
                    "unclear: {text}"
                );
            }
            Ok(mem) => {
                let data: Vec<u8> = (0..page).map(|i| i as u8).collect();
                mem.upload(0, &data).expect("upload");
                let mut back = vec![0u8; page as usize];
                mem.download(0, &mut back).expect("download");
                assert_eq!(back, data);
            }
        }
        assert!(matches!(
            GpuMemory::alloc(0, page + 1),
            Err(GpuError::NoDriver | GpuError::BadLength(_))
        ));
    }
}
