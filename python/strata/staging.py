"""GPU memory over a host data plane: CUDA tensors staged through pinned
host memory.

The TCP and cross-memory-attach data planes move host memory only, and
engines hold their KV cache on the GPU. Rather than have every engine copy
to the CPU itself, the client stages: a pinned host buffer, allocated and
registered once per client, is split in two halves. A batch is cut into
groups that fit a half; while one group is being transferred (``MPUT`` or
the pipelined GETs), the device copy of the next runs on a CUDA stream into
the other half, so the copy of one group overlaps the transfer of the
previous. A single value goes through the same path as a batch of one (no
overlap to be had).

The device side sits behind :class:`Copier`: :class:`CudaCopier` uses the
CUDA runtime (``libcudart``, found next to PyTorch or on the loader path);
tests without a GPU drive the same staging logic with a copier over host
memory. Over RDMA with a GPUDirect-capable NIC the tensor could be
registered directly instead (not done yet: every data plane stages).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .errors import InvalidArgumentError, StrataError


class Copier:
    """Device copies the stager needs. Pointers are plain ints; copies are
    queued in order and complete by :meth:`wait`."""

    def alloc_host(self, size: int) -> Tuple[int, Any]:
        """``(ptr, owner)``: ``size`` bytes of pinned host memory, freed when
        ``owner`` is dropped."""
        raise NotImplementedError

    def to_host(self, dst: int, src: int, size: int) -> None:
        raise NotImplementedError

    def to_device(self, dst: int, src: int, size: int) -> None:
        raise NotImplementedError

    def mark(self) -> Any:
        """A point in the copy queue; :meth:`wait` blocks until it is done."""
        raise NotImplementedError

    def wait(self, mark: Any) -> None:
        raise NotImplementedError


def device_span(obj: Any) -> Optional[Tuple[int, int]]:
    """``(device ptr, nbytes)`` if ``obj`` is GPU memory (a CUDA torch tensor
    or anything with ``__cuda_array_interface__``), else ``None``. Refuses
    non-contiguous and read-only-for-get views with a clear error."""
    device = getattr(obj, "device", None)
    if hasattr(obj, "data_ptr") and getattr(device, "type", "cpu") == "cuda":
        if not obj.is_contiguous():
            raise InvalidArgumentError("CUDA tensor is not contiguous")
        return int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(cai["shape"])
    itemsize = int(cai["typestr"][2:])
    n = itemsize
    for d in shape:
        n *= int(d)
    strides = cai.get("strides")
    if strides is not None:
        want, expect = list(strides), []
        step = itemsize
        for d in reversed(shape):
            expect.insert(0, step)
            step *= int(d)
        if [int(s) for s in want] != expect and n > 0:
            raise InvalidArgumentError("__cuda_array_interface__ array is not C-contiguous")
    return int(cai["data"][0]), n


class CudaCopier(Copier):
    """The CUDA runtime through ctypes: ``cudaHostAlloc`` for the staging
    buffer, ``cudaMemcpyAsync`` on a stream of its own, events to wait."""

    _D2H, _H2D = 2, 1

    def __init__(self) -> None:
        self.rt = _load_cudart()
        self.stream = ctypes.c_void_p()
        self._check(self.rt.cudaStreamCreate(ctypes.byref(self.stream)), "cudaStreamCreate")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self.rt.cudaGetErrorString(rc)
            raise StrataError(f"{what} failed: CUDA error {rc} ({name.decode() if name else '?'})")

    def alloc_host(self, size: int) -> Tuple[int, Any]:
        ptr = ctypes.c_void_p()
        self._check(self.rt.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(size), 0), "cudaHostAlloc")
        rt = self.rt

        class Pinned:
            def __del__(self) -> None:
                rt.cudaFreeHost(ptr)

        return int(ptr.value), Pinned()

    def _copy(self, dst: int, src: int, size: int, kind: int) -> None:
        self._check(
            self.rt.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(size), kind, self.stream),
            "cudaMemcpyAsync",
        )

    def to_host(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self._D2H)

    def to_device(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self._H2D)

    def mark(self) -> Any:
        ev = ctypes.c_void_p()
        self._check(self.rt.cudaEventCreateWithFlags(ctypes.byref(ev), 2), "cudaEventCreate")  # disable timing
        self._check(self.rt.cudaEventRecord(ev, self.stream), "cudaEventRecord")
        return ev

    def wait(self, mark: Any) -> None:
        try:
            self._check(self.rt.cudaEventSynchronize(mark), "cudaEventSynchronize")
        finally:
            self.rt.cudaEventDestroy(mark)


def _load_cudart() -> ctypes.CDLL:
    names = []
    found = ctypes.util.find_library("cudart")
    if found:
        names.append(found)
    try:  # PyTorch's wheels carry the runtime in nvidia/cuda_runtime.
        import nvidia.cuda_runtime  # type: ignore

        for d in nvidia.cuda_runtime.__path__:
            names += sorted(glob.glob(os.path.join(d, "lib", "libcudart.so*")))
    except ImportError:
        pass
    names += ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"]
    errors = []
    for n in names:
        try:
            lib = ctypes.CDLL(n)
        except OSError as e:
            errors.append(str(e))
            continue
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise StrataError(
        "CUDA tensors need the CUDA runtime (libcudart) to stage through host memory; "
        f"none could be loaded ({'; '.join(errors[-2:]) or 'not found'})"
    )


class Stager:
    """The pinned staging buffer of one client and the batch pipeline over
    it. ``put`` / ``get`` take the client's host calls (batch put from
    host pointers, batch get into host pointers) so the data plane stays
    the client's."""

    def __init__(self, copier: Copier, registry: Any, half_bytes: int) -> None:
        if half_bytes <= 0:
            raise InvalidArgumentError("gpu_staging_bytes must be positive")
        self.copier = copier
        self.half = half_bytes
        self._lock = threading.Lock()
        self._ptr, self._owner = copier.alloc_host(2 * half_bytes)
        registry.add(self._ptr, 2 * half_bytes)
        # Figures for tests and benchmarks: groups moved, copies overlapped.
        self.groups = 0
        self.overlapped = 0

    def _groups(self, sizes: Sequence[int]) -> List[List[int]]:
        groups: List[List[int]] = []
        used = self.half
        for i, n in enumerate(sizes):
            if n > self.half:
                raise InvalidArgumentError(
                    f"a {n}-byte CUDA value does not fit the staging buffer "
                    f"(gpu_staging_bytes {2 * self.half}: each half holds one group)"
                )
            if used + n > self.half:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += n
        return groups

    def put(self, keys: Sequence[Any], spans: Sequence[Tuple[int, int]],
            put_host: Callable[[list, list, list], list]) -> list:
        """Stores each device span under its key; per key ``None`` or the
        error, like ``batch_put_from``."""
        with self._lock:
            out: list = [None] * len(keys)
            groups = self._groups([n for _, n in spans])
            ready = None  # (group, host ptrs, mark) copied or being copied
            for g_at, group in enumerate(groups + [None]):
                queued = None
                if group is not None:
                    base = self._ptr + (g_at % 2) * self.half
                    ptrs, off = [], 0
                    for i in group:
                        self.copier.to_host(base + off, spans[i][0], spans[i][1])
                        ptrs.append(base + off)
                        off += spans[i][1]
                    queued = (group, ptrs, self.copier.mark())
                if ready is not None:
                    if queued is not None:
                        self.overlapped += 1
                    self._put_group(ready, keys, spans, put_host, out)
                ready = queued
            return out

    def _put_group(self, ready, keys, spans, put_host, out) -> None:
        group, ptrs, mark = ready
        self.copier.wait(mark)
        res = put_host([keys[i] for i in group], ptrs, [spans[i][1] for i in group])
        for i, r in zip(group, res):
            out[i] = r
        self.groups += 1

    def get(self, keys: Sequence[Any], spans: Sequence[Tuple[int, int]],
            get_host: Callable[[list, list, list], list]) -> list:
        """Reads each key into its device span; per key the length or the
        error, like ``batch_get_into``."""
        with self._lock:
            out: list = [None] * len(keys)
            # Per half, the mark of its device copy still in flight.
            marks: List[Any] = [None, None]
            for g_at, group in enumerate(self._groups([n for _, n in spans])):
                half = g_at % 2
                if marks[half] is not None:
                    # That half's previous device copy must be done first.
                    self.copier.wait(marks[half])
                    marks[half] = None
                if marks[1 - half] is not None:
                    # The other half's device copy runs during this get.
                    self.overlapped += 1
                base = self._ptr + half * self.half
                ptrs, off = [], 0
                for i in group:
                    ptrs.append(base + off)
                    off += spans[i][1]
                res = get_host([keys[i] for i in group], ptrs, [spans[i][1] for i in group])
                for i, p, r in zip(group, ptrs, res):
                    out[i] = r
                    if isinstance(r, int):
                        self.copier.to_device(spans[i][0], p, r)
                marks[half] = self.copier.mark()
                self.groups += 1
            for m in marks:
                if m is not None:
                    self.copier.wait(m)
            return out
