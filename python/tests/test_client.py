"""strata.Client against a live strata-server: values, batches, zero copy,
and the exceptions bad input and failures raise."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import strata
from fakes import TensorLike
from servers import MAX_VALUE_BYTES


def test_put_get_and_missing_is_none(client, key):
    client.put(key("a"), b"hello")
    client.put(key("empty"), b"")
    assert client.get(key("a")) == b"hello"
    assert client.get(key("empty")) == b""
    assert client.get(key("missing")) is None
    assert client.exists(key("a")) and not client.exists(key("missing"))
    assert client.get_size(key("a")) == 5
    assert client.get_size(key("missing")) is None


def test_large_put_goes_zero_copy_and_round_trips(client, key):
    value = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    assert len(value) > client.config.inline_max_bytes
    client.put(key(), value)
    assert client.get(key()) == value


def test_overwrite_replaces_and_remove(client, key):
    client.put(key(), b"one")
    client.put(key(), b"two")
    assert client.get(key()) == b"two"
    assert client.remove(key()) is True
    assert client.remove(key()) is False
    assert client.get(key()) is None


def test_batches_report_per_key(client, key):
    keys = [key(str(i)) for i in range(5)]
    values = [bytes([i]) * (i * 10000) for i in range(5)]
    assert client.put_batch(keys, values) == [None] * 5
    got = client.get_batch(keys + [key("none")])
    assert got[:5] == values and got[5] is None
    assert client.exists_batch([keys[0], key("none")]) == [True, False]
    tensor = TensorLike(np.arange(8, dtype=np.int32))
    assert client.put_batch([key("t")], [tensor]) == [None]
    assert client.get(key("t")) == tensor.array.tobytes()
    assert client.prefix(keys) == 5
    assert client.prefix([keys[0], key("none"), keys[1]]) == 1


def test_zero_copy_buffers(client, key):
    src = np.arange(1 << 18, dtype=np.float32)
    client.put_from(key("np"), src)
    dst = np.zeros_like(src)
    assert client.get_into(key("np"), dst) == src.nbytes
    assert np.array_equal(src, dst)
    ba = bytearray(1000)
    client.put_from(key("prefix"), memoryview(b"abcdef"), 3)
    assert client.get(key("prefix")) == b"abc"
    n = client.get_into(key("prefix"), ba)
    assert n == 3 and ba[:3] == b"abc"


def test_registered_pointer_and_tensor(client, key):
    pool = np.zeros(1 << 20, dtype=np.uint8)
    pool[:4096] = 7
    ptr = pool.ctypes.data
    client.register_buffer(ptr, pool.nbytes)
    client.put_from(key(), ptr, 4096)
    assert client.get_into(key(), ptr + 8192, 4096) == 4096
    assert (pool[8192 : 8192 + 4096] == 7).all()
    assert client.unregister_buffer(ptr)
    with pytest.raises(strata.InvalidArgumentError, match="not inside a registered buffer"):
        client.put_from(key(), ptr, 4096)
    tensor = TensorLike(np.full(256, 3, dtype=np.int64))
    client.put_from(key("t"), tensor)
    out = TensorLike(np.zeros(256, dtype=np.int64))
    assert client.get_into(key("t"), out) == 2048
    assert (out.array == 3).all()
    # Device memory cannot be registered (calls stage it: test_staging.py).
    with pytest.raises(strata.InvalidArgumentError, match="cuda"):
        client.register_buffer(TensorLike(np.zeros(4), device="cuda"))


def test_pointer_checks_at_the_edges_of_a_registration(client, key):
    # The by-address path skips the general checks when the span is plainly
    # inside a registration; everything at or past its edges must still fail.
    pool = np.zeros(1 << 16, dtype=np.uint8)
    ptr = pool.ctypes.data
    client.register_buffer(ptr, pool.nbytes)
    try:
        client.put_from(key(), ptr + pool.nbytes - 100, 100)  # the last byte: fine
        for bad_ptr, size, match in [
            (ptr + pool.nbytes - 100, 101, "not inside a registered buffer"),
            (ptr - 1, 10, "not inside a registered buffer"),
            (ptr, 0, "size must be positive"),
            (ptr, -5, "size must be positive"),
            (ptr, True, "size must be an int"),
            (True, 10, "pointer must be an int"),
            (ptr, 10.0, "size must be an int"),
        ]:
            for call in (client.put_from, client.get_into):
                with pytest.raises(strata.InvalidArgumentError, match=match):
                    call(key(), bad_ptr, size)
    finally:
        client.unregister_buffer(ptr)


def test_batch_zero_copy_mixes_hits_and_misses(client, key):
    keys = [key(str(i)) for i in range(40)]
    blocks = [np.full(65536, i, dtype=np.uint8) for i in range(40)]
    assert client.batch_put_from(keys, blocks) == [None] * 40
    outs = [np.zeros(65536, dtype=np.uint8) for _ in range(41)]
    results = client.batch_get_into(keys + [key("none")], outs)
    assert results[:40] == [65536] * 40
    assert isinstance(results[40], strata.NotFoundError) and results[40].code == "NOTFOUND"
    assert all((o == i).all() for i, o in enumerate(outs[:40]))


def test_errors_carry_codes(client, key):
    with pytest.raises(strata.NotFoundError) as e:
        client.get_into(key("none"), bytearray(10))
    assert e.value.code == "NOTFOUND" and isinstance(e.value, KeyError)
    assert e.value.mooncake_code == -704
    client.put_from(key(), bytes(100))
    with pytest.raises(strata.TooLargeError) as e:
        client.get_into(key(), bytearray(99))
    assert e.value.code == "TOOLARGE"
    with pytest.raises(strata.TooLargeError):
        client.put(key("big"), bytes(MAX_VALUE_BYTES + 1))
    assert client.get(key("big")) is None


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, k: c.put(123, b"x"), "keys must be str or bytes"),
        (lambda c, k: c.get(None), "keys must be str or bytes"),
        (lambda c, k: c.put(k, 5), "a value must be bytes"),
        (lambda c, k: c.put_from(k, 0, 10), "invalid pointer"),
        (lambda c, k: c.get_into(k, 0x1000, 10), "not inside a registered buffer"),
        (lambda c, k: c.put_from(k, 12345), "a size is required"),
        (lambda c, k: c.get_into(k, bytes(10)), "writable"),
        (lambda c, k: c.get_into(k, bytearray(10), 11), "exceeds the buffer"),
        (lambda c, k: c.get_into(k, bytearray(10), 0), "size must be positive"),
        (lambda c, k: c.put_from(k, bytearray()), "size must be positive"),
        (lambda c, k: c.put_from(k, np.zeros((4, 4))[:, 1]), "contiguous"),
        (lambda c, k: c.put_from(k, "text"), "buffer"),
        (lambda c, k: c.batch_get_into([k, k], [bytearray(1)]), "2 keys for 1 buffers"),
        (lambda c, k: c.batch_put_from([k], [bytearray(1)], [1, 2]), "2 sizes for 1 buffers"),
        (lambda c, k: c.put(b"k" * 9000, b"x"), "exceeds the limit"),
        (lambda c, k: c.register_buffer(0, 10), "invalid pointer"),
        (lambda c, k: c.register_buffer(4096, -1), "size must be positive"),
    ],
)
def test_bad_input_raises_invalid_argument(client, key, call, match):
    with pytest.raises(strata.InvalidArgumentError, match=match) as e:
        call(client, key())
    assert e.value.code == "INVALID"
    assert isinstance(e.value, ValueError)


def test_closed_client_refuses_calls(server):
    c = strata.Client(server.addr)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(strata.InvalidArgumentError, match="closed"):
        c.get("k")


def test_unreachable_seed_is_an_io_error():
    from servers import free_port

    with pytest.raises(strata.IoError) as e:
        strata.Client(f"127.0.0.1:{free_port()}", timeout_ms=2000, failover_timeout_ms=500)
    assert e.value.code == "IO" and isinstance(e.value, OSError)


def test_config_forms(server):
    forms = (server.addr, [server.addr], {"seeds": server.addr, "threads": 1}, {"seeds": server.addr, "threads": 0})
    for cfg in forms:
        with strata.Client(cfg) as c:
            assert c.cluster_nodes() == [server.addr] or len(c.cluster_nodes()) == 1
    with pytest.raises(strata.InvalidArgumentError, match="unknown config keys"):
        strata.Client(server.addr, bogus=1)
    with pytest.raises(strata.InvalidArgumentError, match="threads must be in 0..=64"):
        strata.Client(server.addr, threads=65)
    with pytest.raises(strata.InvalidArgumentError, match="spin_us must be in 0..=1000"):
        strata.Client(server.addr, spin_us=1001)
    with pytest.raises(strata.InvalidArgumentError, match="stream_spin_us must be in 0..=1000"):
        strata.Client(server.addr, stream_spin_us=1001)
    with pytest.raises(strata.InvalidArgumentError, match="echo_spin_us must be in 0..=1000"):
        strata.Client(server.addr, echo_spin_us=1001)


@pytest.mark.parametrize("threads,spin_us", [(0, 0), (0, 200), (2, 0)])
def test_threads_share_a_client_with_the_gil_released(server, key, threads, spin_us):
    """With ``threads=0`` one caller drives the sockets and wakes the
    others (a spinning one too: it yields to the runtime every turn); with
    workers, they do."""
    client = strata.Client(server.addr, threads=threads, spin_us=spin_us)
    block = np.full(1 << 20, 9, dtype=np.uint8)
    errors = []

    def worker(i):
        try:
            out = np.zeros_like(block)
            for j in range(5):
                client.put_from(key(f"{i}-{j}"), block)
                assert client.get_into(key(f"{i}-{j}"), out) == block.nbytes
                assert (out == 9).all()
        except Exception as e:  # surfaced below
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    client.close()
    assert errors == []


def test_scan_lists_matching_keys_once(client, key):
    names = [key(f"scan{i}") for i in range(5)]
    for n in names:
        client.put(n, b"x")
    prefix = key("scan")[: -len("scan")]
    found = client.scan(prefix.replace("[", "\\[") + "scan*")
    assert sorted(found) == sorted(n.encode() for n in names)
    assert len(client.scan(prefix.replace("[", "\\[") + "scan*", 2)) == 2
    assert client.scan(key("nothing-here") + "*") == []


def test_cma_stats_count_this_clients_own_reads(client, key):
    before = client.cma_stats()
    block = np.full(1 << 20, 9, dtype=np.uint8)
    client.put_from(key("c"), block)
    out = np.zeros_like(block)
    assert client.get_into(key("c"), out) == 1 << 20
    after = client.cma_stats()
    # Same host, same user: the GET is this process's own copy.
    assert after["bytes"] - before["bytes"] >= 1 << 20, (before, after)
    assert after["errors"] == 0


def test_long_cma_reads_go_over_lanes(server, key):
    """A GET of 2 MiB or more is copied by `cma_lanes` threads: some pieces
    by the helper with the default 2, none with 1; bytes exact either way."""
    block = np.arange(6 << 20, dtype=np.uint32).astype(np.uint8)
    for lanes in (2, 1):
        with strata.Client(server.addr, cma_lanes=lanes) as c:
            c.put_from(key(f"lanes{lanes}"), block)
            out = np.zeros_like(block)
            for _ in range(10):
                out[:] = 0
                assert c.get_into(key(f"lanes{lanes}"), out) == block.nbytes
                assert np.array_equal(out, block)
            pieces = c.cma_stats()["lane_pieces"]
            assert (pieces > 0) if lanes == 2 else (pieces == 0), (lanes, pieces)
    with pytest.raises(strata.InvalidArgumentError, match="cma_lanes must be in 1..=16"):
        strata.Client(server.addr, cma_lanes=0)


def test_misaligned_cma_reads_are_counted(server, key):
    """A same-host GET into memory aligned differently from the node's
    arena (modulo 64 bytes) is counted in `misaligned`; an aligned one is
    not. Bytes are exact either way."""
    import mmap

    n = 256 << 10
    block = np.arange(n, dtype=np.uint32).astype(np.uint8)
    backing = mmap.mmap(-1, n + 4096)  # page-aligned
    with strata.Client(server.addr) as c:
        c.put_from(key("align"), block)
        for offset, counted in ((0, 0), (64, 0), (16, 1)):
            before = c.cma_stats()["misaligned"]
            out = np.frombuffer(backing, dtype=np.uint8, count=n, offset=offset)
            out[:] = 0
            assert c.get_into(key("align"), out) == n
            assert np.array_equal(out, block)
            assert c.cma_stats()["misaligned"] - before == counted, offset
