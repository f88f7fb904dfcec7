"""CUDA tensors over the host data plane: the staging pipeline of
``strata.staging`` against a real node, with the device copies done by a
copier over host memory (there is no GPU here; bench/gpu-check.sh runs the
same calls with CUDA tensors on a GPU machine). The copier queues its
copies and runs them only at ``wait``, as a stream would: a stager that
read the staging buffer before waiting would see stale bytes and fail."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import strata
from strata.errors import InvalidArgumentError, NotFoundError, StrataError
from strata.staging import Copier, Stager, device_span

MIB = 1 << 20


class QueuedHostCopier(Copier):
    def __init__(self) -> None:
        self.queue = []
        self.done = 0
        self.host = []

    def alloc_host(self, size):
        buf = np.zeros(size, dtype=np.uint8)
        self.host.append(buf)
        return int(buf.ctypes.data), buf

    def to_host(self, dst, src, size):
        self.queue.append((dst, src, size))

    def to_device(self, dst, src, size):
        self.queue.append((dst, src, size))

    def mark(self):
        return len(self.queue)

    def wait(self, mark):
        while self.done < mark:
            dst, src, size = self.queue[self.done]
            ctypes.memmove(dst, src, size)
            self.done += 1


class FakeDevice:
    """Host memory posing as a CUDA array (``__cuda_array_interface__``)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.__cuda_array_interface__ = {
            "shape": data.shape, "typestr": data.dtype.str, "strides": None,
            "data": (int(data.ctypes.data), False), "version": 3,
        }


def staged_client(server, half=4 * MIB):
    c = strata.Client(server.addr)
    c._stager = Stager(QueuedHostCopier(), c._registry, half)
    return c


def blocks(n, seed):
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(64 * 1024, 3 * MIB, n)]
    return [rng.integers(0, 256, s, dtype=np.uint8) for s in sizes]


def test_a_batch_of_device_buffers_round_trips_in_overlapped_groups(server, key):
    c = staged_client(server)
    try:
        vals = blocks(12, 1)
        keys = [key(f"b{i}") for i in range(12)]
        assert c.batch_put_from(keys, [FakeDevice(v) for v in vals]) == [None] * 12
        st = c._stager
        assert st.groups >= 4 and st.overlapped >= 3, (st.groups, st.overlapped)
        # Stored bytes are the device bytes (read back over the host path).
        for k, v in zip(keys, vals):
            assert c.get(k) == v.tobytes()
        outs = [FakeDevice(np.zeros(v.size, dtype=np.uint8)) for v in vals]
        got = c.batch_get_into(keys, outs)
        assert got == [v.size for v in vals]
        for o, v in zip(outs, vals):
            assert np.array_equal(o.data, v)
        assert st.copier.done == len(st.copier.queue), "every device copy completed"
    finally:
        c.close()


def test_single_device_put_and_get_and_errors_in_place(server, key):
    c = staged_client(server)
    try:
        v = np.arange(MIB, dtype=np.uint8)
        c.put_from(key("one"), FakeDevice(v))
        out = FakeDevice(np.zeros(MIB, dtype=np.uint8))
        assert c.get_into(key("one"), out) == MIB
        assert np.array_equal(out.data, v)
        # put() and put_batch() take device buffers too.
        c.put(key("two"), FakeDevice(v[:1000]))
        assert c.put_batch([key("three")], [FakeDevice(v[:5000])]) == [None]
        assert c.get(key("two")) == v[:1000].tobytes()
        assert c.get(key("three")) == v[:5000].tobytes()
        # A missing key fails alone; a host buffer in the same batch works.
        host = np.zeros(MIB, dtype=np.uint8)
        res = c.batch_get_into([key("nope"), key("one"), key("one")],
                               [FakeDevice(np.zeros(10, dtype=np.uint8)), out, host])
        assert isinstance(res[0], NotFoundError) and res[1:] == [MIB, MIB]
        assert np.array_equal(host, v)
        with pytest.raises(NotFoundError):
            c.get_into(key("nope"), out)
        with pytest.raises(InvalidArgumentError, match="staging buffer"):
            c.put_from(key("big"), FakeDevice(np.zeros(5 * MIB, dtype=np.uint8)))
        with pytest.raises(InvalidArgumentError, match="outside"):
            c.put_from(key("x"), FakeDevice(v[:10]), 11)
    finally:
        c.close()


def test_non_contiguous_device_arrays_are_refused():
    a = FakeDevice(np.zeros((4, 4), dtype=np.uint8))
    a.__cuda_array_interface__["strides"] = (1, 4)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        device_span(a)
    b = FakeDevice(np.zeros((4, 4), dtype=np.uint16))
    b.__cuda_array_interface__["strides"] = (8, 2)
    assert device_span(b)[1] == 32


def test_without_a_cuda_runtime_the_error_says_so(server, key):
    try:
        ctypes.CDLL("libcudart.so")
        pytest.skip("a CUDA runtime is installed here")
    except OSError:
        pass
    c = strata.Client(server.addr)
    try:
        with pytest.raises(StrataError, match="libcudart"):
            c.put_from(key("k"), FakeDevice(np.zeros(10, dtype=np.uint8)))
    finally:
        c.close()


def test_torch_shaped_cuda_tensors_are_staged_too(server, key):
    from fakes import TensorLike
    c = staged_client(server)
    try:
        src = TensorLike(np.arange(300_000, dtype=np.int32), device="cuda")
        c.put_from(key("t"), src)
        out = TensorLike(np.zeros(300_000, dtype=np.int32), device="cuda")
        assert c.get_into(key("t"), out) == 1_200_000
        assert np.array_equal(out.array, src.array)
        assert c._stager.groups == 2
    finally:
        c.close()
