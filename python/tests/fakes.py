"""A tensor-shaped object (``data_ptr``, ``element_size``, ``device``) over
numpy memory, so the SDK's tensor path is tested without torch. The engine
adapters are tested through the real engines (python/tests/engines/)."""

from __future__ import annotations

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
