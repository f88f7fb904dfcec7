"""The Mooncake-compatible facade: Mooncake's calls and return codes, with
the missing-key trap fixed."""

from __future__ import annotations

import numpy as np
import pytest

from strata.mooncake import MooncakeDistributedStore


@pytest.fixture
def store(server):
    s = MooncakeDistributedStore()
    # The argument list SGLang's MooncakeStore passes, positionally.
    rc = s.setup("localhost", "P2PHANDSHAKE", 1 << 30, 16 << 20, "tcp", "", server.addr, None)
    assert rc == 0
    yield s
    assert s.close() == 0


def test_setup_failure_is_a_code():
    from servers import free_port

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{free_port()}")
    assert rc < 0
    assert s.put("k", b"v") == -600  # not set up


def test_plain_calls(store, key):
    assert store.put(key("a"), b"value") == 0
    assert store.get(key("a")) == b"value"
    assert store.get(key("none")) is None  # Mooncake returns b"" here
    assert store.is_exist(key("a")) == 1 and store.is_exist(key("none")) == 0
    assert store.batch_is_exist([key("a"), key("none")]) == [1, 0]
    assert store.get_size(key("a")) == 5 and store.get_size(key("none")) == -704
    assert store.put_batch([key("b"), key("c")], [b"1", b"22"]) == 0
    assert store.get_batch([key("b"), key("none"), key("c")]) == [b"1", None, b"22"]
    assert store.put(key("a"), b"new") == 0
    assert store.get(key("a")) == b"new"  # overwrites (Mooncake keeps the old value)
    assert store.remove(key("a")) == 0 and store.remove(key("a")) == -704


def test_zero_copy_calls(store, key):
    buf = np.zeros(8 << 20, dtype=np.uint8)
    ptr, size = buf.ctypes.data, 1 << 20
    assert store.register_buffer(ptr, buf.nbytes) == 0
    buf[:size] = np.arange(size, dtype=np.uint32).view(np.uint8)[:size]
    assert store.put_from(key("z"), ptr, size) == 0
    assert store.get_into(key("z"), ptr + size, size) == size
    assert np.array_equal(buf[:size], buf[size : 2 * size])
    assert store.get_into(key("none"), ptr, size) == -704
    assert store.get_into(key("z"), ptr, size - 1) == -10
    keys = [key(f"b{i}") for i in range(4)]
    ptrs = [ptr + i * 4096 for i in range(4)]
    assert store.batch_put_from(keys, ptrs, [4096] * 4) == [0] * 4
    dst = [ptr + (4 << 20) + i * 4096 for i in range(5)]
    assert store.batch_get_into(keys + [key("none")], dst, [4096] * 5) == [4096] * 4 + [-704]
    assert np.array_equal(buf[: 4 * 4096], buf[4 << 20 : (4 << 20) + 4 * 4096])
    # Bad input is a code, never a crash.
    assert store.put_from(key("x"), 0, 10) == -600
    assert store.get_into(key("z"), 0x1000, 10) == -600  # not registered
    assert store.unregister_buffer(ptr) == 0
    assert store.put_from(key("x"), ptr, 10) == -600
