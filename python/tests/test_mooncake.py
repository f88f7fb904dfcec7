"""The Mooncake-compatible facade: Mooncake's calls and return codes, with
the missing-key trap fixed."""

from __future__ import annotations

import ctypes
import json
import re

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
    assert store.get_into(key("z"), ptr, size - 1) == -600  # destination too small, as Mooncake
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


def test_setup_forms(server, tmp_path, monkeypatch):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_address": server.addr, "protocol": "tcp"}) == 0
    assert s.get_hostname() == "127.0.0.1" and s.health_check() == 0
    s.close()
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                               "global_segment_size": 3355443200, "local_buffer_size": 1073741824,
                               "protocol": "tcp", "device_name": "", "master_server_address": server.addr}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(cfg))
    s = MooncakeDistributedStore()
    assert s.setup() == 0 and s.put("cfg-file-key", b"v") == 0
    s.close()
    # vLLM's keyword form.
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", server.addr, tenant_id="t") == 0
    s.close()


def test_parts_buffers_and_removal(store, key):
    assert store.put_parts(key("p"), b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get(key("p")) == b"abcdef"
    assert store.upsert(key("p"), b"new") == 0
    h = store.get_buffer(key("p"))
    assert bytes(h) == b"new" and h.size() == 3 and h.ptr() != 0
    assert store.get_buffer(key("none")) is None
    got = store.batch_get_buffer([key("p"), key("none")])
    assert bytes(got[0]) == b"new" and got[1] is None
    assert store.batch_remove([key("p"), key("none")]) == [0, -704]
    names = [key(f"rx{i}") for i in range(3)] + [key("keep")]
    for n in names:
        assert store.put(n, b"x") == 0
    assert store.remove_by_regex(re.escape(key("rx")) + r"\d$") == 3
    assert store.batch_is_exist(names) == [0, 0, 0, 1]
    assert store.remove_by_regex("(") == -600
    desc = store.batch_get_replica_desc([key("keep"), key("none")])
    assert list(desc) == [key("keep")] and desc[key("keep")][0]["status"] == "COMPLETE"


def test_multi_buffers_gather_and_scatter(store, key):
    ptr = store.alloc_from_mem_pool(1 << 20)
    assert ptr != 0
    view = (ctypes.c_ubyte * (1 << 20)).from_address(ptr)
    arr = np.frombuffer(view, dtype=np.uint8)
    arr[:] = np.arange(1 << 20, dtype=np.uint32).astype(np.uint8)
    keys = [key("m0"), key("m1")]
    parts = [[ptr, ptr + 4096, ptr + 8192], [ptr + 65536]]
    sizes = [[100, 200, 300], [1000]]
    assert store.batch_put_from_multi_buffers(keys, parts, sizes) == [0, 0]
    assert store.get_size(keys[0]) == 600
    expect0 = np.concatenate([arr[0:100], arr[4096:4296], arr[8192:8492]]).tobytes()
    assert store.get(keys[0]) == expect0
    dst = [[ptr + (1 << 19), ptr + (1 << 19) + 1000], [ptr + (3 << 18)]]
    assert store.batch_get_into_multi_buffers(keys, dst, [[300, 300], [1000]]) == [600, 1000]
    base = 1 << 19
    assert arr[base:base + 300].tobytes() + arr[base + 1000:base + 1300].tobytes() == expect0
    assert arr[3 << 18:(3 << 18) + 1000].tobytes() == arr[65536:66536].tobytes()
    # A part outside every registered buffer is refused, not read.
    assert store.batch_put_from_multi_buffers([key("bad")], [[0x1000]], [[10]]) == [-600]
    assert store.batch_get_into_multi_buffers([key("none")], [[ptr]], [[10]]) == [-704]


def test_remove_all_and_the_drop_in_conventions():
    from servers import Server

    node = Server(pool="64MiB")
    try:
        import importlib.util
        import sys
        from pathlib import Path

        compat = Path(__file__).resolve().parents[1] / "mooncake-compat"
        sys.path.insert(0, str(compat))
        try:
            store_mod = importlib.import_module("mooncake.store")
        finally:
            sys.path.remove(str(compat))
        s = store_mod.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", node.addr) == 0
        assert s.get("missing") == b""  # Mooncake's convention in the drop-in
        assert s.get_batch(["missing"]) == [b""]
        for i in range(5):
            assert s.put(f"k{i}", b"v") == 0
        assert s.remove_all(True) == 5 and s.is_exist("k0") == 0
        assert isinstance(store_mod.ReplicateConfig().replica_num, int)
        s.close()
    finally:
        node.stop()
