//! What a zero-copy call reads from or writes into: a raw address (checked
//! by the Python layer against registered buffers, or a tensor's
//! `data_ptr()` whose owner the caller holds) or a Python buffer
//! (bytearray, memoryview, numpy array) held for the duration of the call.

use std::ffi::{c_char, c_int, c_void};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString};

use crate::errors::invalid;

/// Longest key accepted, in bytes: keys are block hashes and names, and a
/// bound keeps one bad argument from becoming a huge request.
pub const KEY_BYTES_MAX: usize = 8192;

/// A key as bytes: `bytes` as is, `str` as UTF-8; anything else is refused.
pub fn key_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let key = if let Ok(b) = obj.downcast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else if let Ok(s) = obj.downcast::<PyString>() {
        s.extract::<String>()?.into_bytes()
    } else {
        let kind = obj.get_type().name()?;
        return Err(invalid(format!("keys must be str or bytes, not {kind}")));
    };
    if key.len() > KEY_BYTES_MAX {
        return Err(invalid(format!(
            "key of {} bytes exceeds the limit of {KEY_BYTES_MAX}",
            key.len()
        )));
    }
    Ok(key)
}

pub fn keys_bytes(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Vec<u8>>> {
    objs.iter().map(key_bytes).collect()
}

/// Plain address and length, free to cross into the GIL-less section.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub addr: u64,
    pub len: usize,
}

impl Span {
    pub fn ptr(self) -> *mut u8 {
        self.addr as usize as *mut u8
    }
}

/// A target and, for Python buffers, the export that keeps its memory
/// valid (and a bytearray unresizable) until the call returns.
pub struct Target {
    pub span: Span,
    _hold: Option<Export>,
}

impl Target {
    /// `obj` is an address (`int`, then `size` is required) or a
    /// C-contiguous byte buffer (`size`, if given, takes a prefix of it).
    /// `writable`: the call writes into it (get_into).
    pub fn extract(obj: &Bound<'_, PyAny>, size: Option<usize>, writable: bool) -> PyResult<Self> {
        if obj.is_instance_of::<PyInt>() {
            let addr: u64 = obj
                .extract()
                .map_err(|_| invalid("a pointer must be a non-negative int below 2**64"))?;
            let len = size.ok_or_else(|| invalid("a size is required with a pointer"))?;
            return Self::checked(addr, len, None);
        }
        let buf = Export::get(obj, writable)?;
        let whole = buf.len();
        let len = match size {
            Some(s) if s > whole => {
                return Err(invalid(format!(
                    "size {s} exceeds the buffer's {whole} bytes"
                )))
            }
            Some(s) => s,
            None => whole,
        };
        let addr = buf.addr();
        Self::checked(addr, len, Some(buf))
    }

    fn checked(addr: u64, len: usize, hold: Option<Export>) -> PyResult<Self> {
        if addr == 0 {
            return Err(invalid("null pointer"));
        }
        if len == 0 {
            return Err(invalid("size must be positive"));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(invalid("pointer + size wraps the address space"));
        }
        Ok(Self {
            span: Span { addr, len },
            _hold: hold,
        })
    }
}

/// Targets of a batch: one per key; `sizes`, when given, one per target.
pub fn targets(
    objs: &[Bound<'_, PyAny>],
    sizes: Option<Vec<usize>>,
    writable: bool,
) -> PyResult<Vec<Target>> {
    if let Some(s) = &sizes {
        if s.len() != objs.len() {
            return Err(invalid(format!(
                "{} sizes for {} buffers",
                s.len(),
                objs.len()
            )));
        }
    }
    objs.iter()
        .enumerate()
        .map(|(i, o)| Target::extract(o, sizes.as_ref().map(|s| s[i]), writable))
        .collect()
}

/// CPython's `Py_buffer`, as laid out since 3.3.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

/// A simple request: C-contiguous bytes, no format or shape.
const PYBUF_SIMPLE: c_int = 0;
const PYBUF_WRITABLE: c_int = 1;

// The buffer protocol joined the stable ABI only in 3.11, so PyO3's
// `PyBuffer` is missing from an abi3-py39 build. These two functions and
// `Py_buffer` are exported, unchanged, by every CPython since 3.3;
// declaring them here lets one abi3 wheel serve 3.9 and later.
extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// A live buffer export of a Python object (released on drop). While it
/// lives, the exporter keeps the memory where it is (a bytearray refuses
/// to resize, a numpy array's data stays put).
pub struct Export(Box<RawBuffer>);

// SAFETY: the export is plain data about memory owned by a Python object
// the export keeps alive; it is released with the GIL held (see Drop).
unsafe impl Send for Export {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for Export {}

impl Export {
    /// A simple (C-contiguous, byte) export of `obj`, writable if asked.
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = if writable {
            PYBUF_SIMPLE | PYBUF_WRITABLE
        } else {
            PYBUF_SIMPLE
        };
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`)
        // and `raw` a properly sized, zeroed Py_buffer.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, flags) };
        if rc != 0 {
            let why = PyErr::take(obj.py())
                .map(|e| e.to_string())
                .unwrap_or_default();
            let need = if writable {
                "a writable, C-contiguous buffer"
            } else {
                "a C-contiguous buffer"
            };
            return Err(invalid(format!(
                "expected a pointer (int), a tensor, or {need} \
                 (bytes, bytearray, memoryview, numpy array): {why}"
            )));
        }
        Ok(Self(raw))
    }

    fn addr(&self) -> u64 {
        self.0.buf as usize as u64
    }

    fn len(&self) -> usize {
        usize::try_from(self.0.len).unwrap_or(0)
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: filled by a successful PyObject_GetBuffer and released
            // exactly once, with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.0) }
        });
    }
}
