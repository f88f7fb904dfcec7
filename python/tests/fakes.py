"""Stand-ins for engine objects the adapters receive, shaped like the real
ones (attribute and method names from SGLang and LMCache), backed by numpy
memory so the bytes really move."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np


class Device:
    def __init__(self, kind: str = "cpu") -> None:
        self.type = kind

    def __str__(self) -> str:
        return self.type


class TensorLike:
    """The slice of ``torch.Tensor`` strata uses: ``data_ptr()``,
    ``numel()``, ``element_size()``, ``is_contiguous()``, ``device``."""

    def __init__(self, array: np.ndarray, device: str = "cpu") -> None:
        self.array = array
        self.device = Device(device)

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def numel(self) -> int:
        return self.array.size

    def element_size(self) -> int:
        return self.array.itemsize

    def is_contiguous(self) -> bool:
        return self.array.flags.c_contiguous


@dataclass
class StorageConfig:
    """Fields of SGLang's ``HiCacheStorageConfig`` the backend reads."""

    tp_rank: int = 0
    tp_size: int = 1
    is_mla_model: bool = False
    is_page_first_layout: bool = True
    model_name: Optional[str] = "org/model"
    extra_config: Optional[dict] = None


class HostPool:
    """SGLang's MHA host pool in ``page_first`` layout: per page one K and
    one V region, ``get_page_buffer_meta(indices)`` -> (ptrs, sizes) with
    K then V for each page."""

    def __init__(self, pages: int, page_size: int, token_bytes: int, mla: bool = False) -> None:
        self.page_size = page_size
        self.parts = 1 if mla else 2
        self.part_bytes = page_size * token_bytes
        self.buf = np.zeros((pages, self.parts, self.part_bytes), dtype=np.uint8)
        self.kv_buffer = TensorLike(self.buf)

    def get_page_buffer_meta(self, host_indices: Any):
        idx = np.asarray(host_indices)
        ptrs, sizes = [], []
        for first in idx[:: self.page_size]:
            page = int(first) // self.page_size
            for part in range(self.parts):
                ptrs.append(self.buf[page, part].ctypes.data)
                sizes.append(self.part_bytes)
        return ptrs, sizes

    def indices(self, pages) -> np.ndarray:
        return np.concatenate(
            [np.arange(p * self.page_size, (p + 1) * self.page_size) for p in pages]
        ).astype(np.int64)


class MemoryObj:
    """LMCache ``MemoryObj``: ``byte_array``, ``get_shape()``, ``get_dtype()``,
    ``get_memory_format()``."""

    def __init__(self, shape, dtype: str = "torch.bfloat16", fmt: int = 1) -> None:
        self.shape = list(shape)
        self.dtype = dtype
        self.fmt = fmt
        self.data = np.zeros(int(np.prod(shape)) * 2, dtype=np.uint8)

    @property
    def byte_array(self) -> memoryview:
        return memoryview(self.data)

    def get_shape(self):
        return self.shape

    def get_dtype(self):
        return self.dtype

    def get_memory_format(self):
        return self.fmt


class LocalCPUBackend:
    """LMCache ``LocalCPUBackend.allocate(shape, dtype, fmt)``."""

    def __init__(self) -> None:
        self.allocations = 0

    def allocate(self, shape, dtype, fmt):
        self.allocations += 1
        return MemoryObj(shape, dtype, fmt)


@dataclass
class CacheEngineKey:
    """LMCache ``CacheEngineKey``: ``to_string()``."""

    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: str = "bfloat16"

    def to_string(self) -> str:
        return f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}@{self.dtype}"
