"""Turns what callers pass as zero-copy targets into what the native layer
takes, and keeps the table of registered buffers.

A target is one of:

* a Python buffer (``bytes`` for puts; ``bytearray``, ``memoryview``, numpy
  array for both): passed through; the native layer holds a buffer export
  for the duration of the call, so the memory cannot move or vanish;
* a torch tensor (anything with ``data_ptr()``): must be on the CPU and
  contiguous; its ``data_ptr()`` is used while the caller holds the tensor;
* an ``int`` address with a size: must lie inside a buffer registered with
  ``register_buffer`` (the caller's promise that the memory is valid),
  which turns a wild pointer into an exception instead of a crash.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence, Tuple

from .errors import InvalidArgumentError

# Most buffers one client registers: registrations are scanned linearly.
REGISTERED_MAX = 4096


def _is_tensor(obj: Any) -> bool:
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size")


def tensor_span(tensor: Any, size: Optional[int]) -> Tuple[int, int]:
    """``(data_ptr, size)`` of a CPU, contiguous tensor."""
    device = getattr(tensor, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise InvalidArgumentError(
            f"tensor is on {device}: it cannot be registered or addressed by pointer; "
            "pass the CUDA tensor itself to put/put_from/get_into/batch calls (staged through pinned host memory)"
        )
    if not tensor.is_contiguous():
        raise InvalidArgumentError("tensor is not contiguous")
    nbytes = int(tensor.numel()) * int(tensor.element_size())
    if size is None:
        size = nbytes
    _check_size(size)
    if size > nbytes:
        raise InvalidArgumentError(f"size {size} exceeds the tensor's {nbytes} bytes")
    return int(tensor.data_ptr()), size


def _check_size(size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidArgumentError(f"size must be an int, not {type(size).__name__}")
    if size <= 0:
        raise InvalidArgumentError(f"size must be positive, got {size}")


class Registry:
    """Address ranges registered by the caller (``register_buffer``)."""

    # `check` runs on every zero-copy call by pointer, so it takes no lock
    # and copies nothing: `_spans` is a tuple of `(start, end)` that `add`
    # and `remove` replace whole under the lock (one attribute store, which
    # a reader sees entirely or not at all). The lock, list copy and helper
    # calls it replaced were a visible part of a polled small call
    # (docs/bench-notes/sdk-per-call-costs.md).

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: Tuple[Tuple[int, int], ...] = ()

    def add(self, ptr: int, size: int) -> None:
        _check_ptr(ptr)
        _check_size(size)
        span = (ptr, ptr + size)
        with self._lock:
            if span in self._spans:
                return
            if len(self._spans) >= REGISTERED_MAX:
                raise InvalidArgumentError(f"more than {REGISTERED_MAX} registered buffers")
            self._spans = self._spans + (span,)

    def remove(self, ptr: int) -> bool:
        with self._lock:
            kept = tuple(s for s in self._spans if s[0] != ptr)
            removed = len(kept) != len(self._spans)
            self._spans = kept
            return removed

    def check(self, ptr: int, size: int) -> None:
        """Raises unless ``[ptr, ptr + size)`` lies in one registered span."""
        # `type(...) is int` also turns away bool; anything else (int
        # subclasses included) takes the checks below, with their errors.
        if type(ptr) is int and type(size) is int and size > 0:
            end = ptr + size
            for start, stop in self._spans:
                if start <= ptr and end <= stop:
                    return
        _check_ptr(ptr)
        _check_size(size)
        end = ptr + size
        for start, stop in self._spans:
            if start <= ptr and end <= stop:
                return
        raise InvalidArgumentError(
            f"[{ptr:#x}, +{size}) is not inside a registered buffer; call "
            "register_buffer(ptr, size) first, or pass the buffer/tensor itself"
        )


def _check_ptr(ptr: Any) -> None:
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise InvalidArgumentError(f"a pointer must be an int, not {type(ptr).__name__}")
    if ptr <= 0 or ptr >= 1 << 64:
        raise InvalidArgumentError(f"invalid pointer {ptr:#x}")


def resolve(registry: Registry, target: Any, size: Optional[int]) -> Tuple[Any, Optional[int]]:
    """What to hand the native layer for one target (see module doc)."""
    if type(target) is int and size is not None:
        registry.check(target, size)
        return target, size
    if isinstance(target, bool):
        raise InvalidArgumentError("a pointer must be an int, not bool")
    if isinstance(target, int):
        if size is None:
            raise InvalidArgumentError("a size is required with a pointer")
        registry.check(target, size)
        return target, size
    if _is_tensor(target):
        return tensor_span(target, size)
    if size is not None:
        _check_size(size)
    return target, size


def resolve_all(
    registry: Registry, keys: Sequence[Any], targets: Sequence[Any], sizes: Optional[Sequence[int]]
) -> Tuple[list, list, Optional[list]]:
    keys = list(keys)
    targets = list(targets)
    if len(keys) != len(targets):
        raise InvalidArgumentError(f"{len(keys)} keys for {len(targets)} buffers")
    if sizes is not None:
        sizes = list(sizes)
        if len(sizes) != len(targets):
            raise InvalidArgumentError(f"{len(sizes)} sizes for {len(targets)} buffers")
    out_targets, out_sizes = [], []
    for i, t in enumerate(targets):
        t, s = resolve(registry, t, None if sizes is None else sizes[i])
        out_targets.append(t)
        out_sizes.append(s)
    if all(s is None for s in out_sizes):
        return keys, out_targets, None
    # The native layer takes one size per target: a buffer's own length
    # where none was given.
    filled = [s if s is not None else _nbytes(t) for t, s in zip(out_targets, out_sizes)]
    return keys, out_targets, filled


def _nbytes(buffer: Any) -> int:
    try:
        return memoryview(buffer).nbytes
    except TypeError:
        raise InvalidArgumentError(
            f"expected a pointer (int), a tensor, or a buffer, not {type(buffer).__name__}"
        ) from None
