#!/usr/bin/env python3
"""Python counterpart of `strata-bench --api zerocopy`: a put phase over
`--keys` keys, then a get phase, for `--seconds` each, with one client
(`--clients` threads share it; the GIL is released during transfers).
Buffers are one registered numpy pool and the calls take raw pointers, as
an engine's host KV pool would. Every value read is checked. Prints one
JSON line per phase: op, size, clients, ops, gbps, p50_us, p99_us.

    python python/bench/zero_copy.py --addr 127.0.0.1:7379 --size 1MiB
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np

import strata


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for suffix, mult in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * mult
    return int(text)


def phase(client, op, keys, pool, size, seconds, clients):
    lat, done, stop = [], [0], time.monotonic() + seconds
    lock = threading.Lock()

    def worker(w):
        base = pool.ctypes.data + w * 2 * size
        src, dst = base, base + size
        mine, i = [], w
        while time.monotonic() < stop:
            k = keys[i % len(keys)]
            t = time.perf_counter()
            if op == "put":
                client.put_from(k, src, size)
            else:
                n = client.get_into(k, dst, size)
                assert n == size
            mine.append(time.perf_counter() - t)
            i += clients
        if op == "get":
            view = pool[(dst - pool.ctypes.data) : (dst - pool.ctypes.data) + size]
            assert (view == 0x5A).all(), "value read back wrong"
        with lock:
            lat.extend(mine)
            done[0] += len(mine)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat.sort()
    return {
        "impl": "strata-python",
        "op": op,
        "size": size,
        "clients": clients,
        "ops": done[0],
        "gbps": round(done[0] * size / elapsed / 1e9, 3),
        "p50_us": round(lat[len(lat) // 2] * 1e6),
        "p99_us": round(lat[int(len(lat) * 0.99)] * 1e6),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:7379")
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=1)
    a = ap.parse_args()
    size = parse_size(a.size)
    pool = np.full(2 * size * a.clients, 0x5A, dtype=np.uint8)
    with strata.Client(a.addr) as client:
        client.register_buffer(pool.ctypes.data, pool.nbytes)
        keys = [f"pybench:{size}:{i}" for i in range(a.keys)]
        for op in ("put", "get"):
            print(json.dumps(phase(client, op, keys, pool, size, a.seconds, a.clients)), flush=True)


if __name__ == "__main__":
    main()
