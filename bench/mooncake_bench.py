#!/usr/bin/env python3
"""Mooncake Store counterpart of strata-bench: the same workload (put phase
over all keys, then a get phase), the same value pattern and verification,
and the same JSON line schema, through Mooncake's zero-copy Python API
(`upsert_from` / `get_into` on registered buffers).

It starts its own `mooncake_master` and a "holder" process that owns the
store memory (`global_segment_size`), so every transfer crosses processes;
this process sets up with `global_segment_size=0`. Run it inside `unshare -n`
(Mooncake's listeners bind 0.0.0.0). Facts: /work/shared/peers/mooncake.md.
"""

import argparse
import ctypes
import json
import mmap
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np

MASK = (1 << 64) - 1
STEP = 0x9E3779B97F4A7C15
HEADER_BYTES = 16


def key_hash(key: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in key:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def seed(h: int, size: int, version: int) -> int:
    """Same mixing as bench/src/workload.rs."""
    rot = ((size << 32) | (size >> 32)) & MASK
    z = h ^ ((version * STEP) & MASK) ^ rot
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def expected_words(h: int, size: int, version: int) -> np.ndarray:
    n = (size - HEADER_BYTES) // 8
    return np.arange(n, dtype=np.uint64) * np.uint64(STEP) + np.uint64(seed(h, size, version))


def fill(view: np.ndarray, h: int, version: int) -> None:
    size = view.size
    assert size % 8 == 0, "sizes are multiples of 8 here"
    head = view[:HEADER_BYTES].view(np.uint64)
    head[0] = version
    head[1] = h
    view[HEADER_BYTES:].view(np.uint64)[:] = expected_words(h, size, version)


def check(view: np.ndarray, h: int) -> bool:
    head = view[:HEADER_BYTES].view(np.uint64)
    if int(head[1]) != h:
        return False
    return bool(np.array_equal(view[HEADER_BYTES:].view(np.uint64), expected_words(h, view.size, int(head[0]))))


def parse_size(s: str) -> int:
    s = s.strip().lower()
    for unit, mult in (("kib", 1 << 10), ("mib", 1 << 20), ("gib", 1 << 30), ("k", 1 << 10), ("m", 1 << 20)):
        if s.endswith(unit):
            return int(s[: -len(unit)]) * mult
    return int(s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def new_store(master: str, segment: int, local_buffer: int):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"mooncake setup failed: {rc}")
    return store


def holder(args) -> None:
    """Owns the store memory; idles until stdin closes."""
    store = new_store(args.master, args.segment, 16 << 20)
    print("READY", flush=True)
    sys.stdin.read()
    store.close()


class Buffer:
    """Page-aligned, registered memory with a numpy view."""

    def __init__(self, store, size: int):
        self.mm = mmap.mmap(-1, size)
        self.view = np.frombuffer(self.mm, dtype=np.uint8)
        self.view[:] = 0  # fault the pages in before timing
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.size = size
        rc = store.register_buffer(self.ptr, size)
        if rc != 0:
            raise RuntimeError(f"register_buffer failed: {rc}")


class Phase:
    def __init__(self, keys: int, duration: float, min_ops: int):
        self.lock = threading.Lock()
        self.next = 0
        self.min_ops = min_ops
        self.deadline = time.time() + duration
        self.failed = False

    def claim(self):
        with self.lock:
            n = self.next
            self.next += 1
        if n < self.min_ops:
            return n
        if self.failed or time.time() >= self.deadline:
            return None
        return n


def pct(sorted_us, q):
    if not sorted_us:
        return 0
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def run_phase(store, bufs, op, size, keys, hashes, versions, args):
    # Drivers that share this workload (python/bench/zero_copy.py) may
    # have no --batch.
    if getattr(args, "batch", 1) > 1:
        return run_batch_phase(store, bufs, op, size, keys, hashes, versions, args)
    min_ops = len(keys) if op == "put" else 0
    phase = Phase(len(keys), args.duration, min_ops)
    lat = [[] for _ in bufs]
    errs = [0 for _ in bufs]
    mism = [0 for _ in bufs]

    def worker(t):
        rng = np.random.default_rng(t + 1)
        src, dst = bufs[t]
        while True:
            n = phase.claim()
            if n is None:
                return
            k = n if (op == "put" and n < min_ops) else int(rng.integers(len(keys)))
            if op == "put":
                versions[k] += 1
                fill(src.view, hashes[k], versions[k])
                t0 = time.perf_counter_ns()
                rc = store.upsert_from(keys[k], src.ptr, size)
                us = (time.perf_counter_ns() - t0) // 1000
                if rc != 0:
                    errs[t] += 1
                    continue
            else:
                t0 = time.perf_counter_ns()
                got = store.get_into(keys[k], dst.ptr, size)
                us = (time.perf_counter_ns() - t0) // 1000
                if got != size:
                    errs[t] += 1
                    continue
                if args.verify and not check(dst.view, hashes[k]):
                    mism[t] += 1
                    phase.failed = True
                    print(f"mooncake_bench: MISMATCH on {keys[k]}", file=sys.stderr)
            lat[t].append(max(us, 1))

    return report(args, op, size, worker, lat, errs, mism, len(bufs), 1)


def run_batch_phase(store, bufs, op, size, keys, hashes, versions, args):
    """Like `run_phase`, but each operation moves `args.batch` distinct keys
    with one `batch_upsert_from` / `batch_get_into` (strata-bench's
    `--batch`: a put phase covers every key, latency is per batch,
    throughput counts values). Each worker's buffers hold `batch` values."""
    b = args.batch
    if b > len(keys):
        raise SystemExit(f"--batch {b} needs at least as many --keys")
    rounds = -(-len(keys) // b) if op == "put" else 0
    phase = Phase(len(keys), args.duration, rounds)
    lat = [[] for _ in bufs]
    errs = [0 for _ in bufs]
    mism = [0 for _ in bufs]
    # Keys a worker's batch holds are never in another's at the same time.
    key_lock = threading.Lock()

    def worker(t):
        rng = np.random.default_rng(t + 1)
        src, dst = bufs[t]
        src_ptrs = [src.ptr + i * size for i in range(b)]
        dst_ptrs = [dst.ptr + i * size for i in range(b)]
        while True:
            n = phase.claim()
            if n is None:
                return
            if op == "put" and n < rounds:
                ks = [(n * b + i) % len(keys) for i in range(b)]
            else:
                ks = [int(x) for x in rng.choice(len(keys), size=b, replace=False)]
            names = [keys[k] for k in ks]
            if op == "put":
                with key_lock:
                    for k in ks:
                        versions[k] += 1
                    vs = [versions[k] for k in ks]
                for i, k in enumerate(ks):
                    fill(src.view[i * size:(i + 1) * size], hashes[k], vs[i])
                t0 = time.perf_counter_ns()
                rcs = store.batch_upsert_from(names, src_ptrs, [size] * b)
                us = (time.perf_counter_ns() - t0) // 1000
                errs[t] += sum(1 for rc in rcs if rc != 0)
            else:
                t0 = time.perf_counter_ns()
                got = store.batch_get_into(names, dst_ptrs, [size] * b)
                us = (time.perf_counter_ns() - t0) // 1000
                errs[t] += sum(1 for g in got if g != size)
                if args.verify:
                    for i, k in enumerate(ks):
                        if got[i] == size and not check(dst.view[i * size:(i + 1) * size], hashes[k]):
                            mism[t] += 1
                            phase.failed = True
                            print(f"mooncake_bench: MISMATCH on {keys[k]}", file=sys.stderr)
            lat[t].append(max(us, 1))

    return report(args, op, size, worker, lat, errs, mism, len(bufs), b)


def report(args, op, size, worker, lat, errs, mism, workers, per_op):
    """Runs `worker` on `workers` threads and makes the JSON row; each op
    moved `per_op` values."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = max(time.perf_counter() - t0, 1e-9)
    all_us = sorted(x for l in lat for x in l)
    n = len(all_us) * per_op
    # As strata-bench: bytes over the time inside the calls, without the
    # driver's filling and checking between them.
    mean_us = sum(all_us) / len(all_us) if all_us else 0.0
    default_scenario = f"c{args.concurrency}" + (f"-b{per_op}" if per_op > 1 else "")
    return {
        "system": args.system,
        "scenario": args.scenario or default_scenario,
        "api": "zerocopy",
        "threads": args.concurrency,
        "procs": 1,
        "size": size,
        "op": op,
        "n": n,
        "secs": secs,
        "ops_s": n / secs,
        "GBps": n * size / secs / 1e9,
        "busy_GBps": args.concurrency * per_op * size / mean_us / 1e3 if mean_us else 0.0,
        "mean_us": mean_us,
        "p50_us": pct(all_us, 0.5),
        "p99_us": pct(all_us, 0.99),
        "p999_us": pct(all_us, 0.999),
        "errors": sum(errs),
        "mismatches": sum(mism),
    }


def server_cpus():
    """`preexec_fn` for the master and the holder: on the CPUs in
    $SERVER_CPUS (compare.sh's PIN), or where this process runs."""
    cpus = os.environ.get("SERVER_CPUS")
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def bench(args) -> int:
    import mooncake

    pkg = os.path.dirname(mooncake.__file__)
    rpc, metrics = free_port(), free_port()
    master = subprocess.Popen(
        [
            os.path.join(pkg, "mooncake_master"),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--enable_metric_reporting=false",
            "--enable_http_metadata_server=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=server_cpus(),
    )
    hold = None
    try:
        wait_port(rpc)
        addr = f"127.0.0.1:{rpc}"
        hold = subprocess.Popen(
            [sys.executable, __file__, "--role", "holder", "--master", addr, "--segment", str(args.segment)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=server_cpus(),
        )
        if hold.stdout.readline().strip() != "READY":
            raise RuntimeError("holder did not start")
        store = new_store(addr, 0, 64 << 20)
        out = open_json(args.json)
        ok = True
        print(f"{'system':<9} {'c':>3} {'size':>9} {'op':<4} {'n':>7} {'GB/s':>7} {'p50us':>7} {'p99us':>7} {'errors':>6}")
        for size in args.sizes:
            bufs = [(Buffer(store, size * args.batch), Buffer(store, size * args.batch)) for _ in range(args.concurrency)]
            keys = [f"bench:{size}:{i}" for i in range(args.keys)]
            hashes = [key_hash(k.encode()) for k in keys]
            versions = [0] * len(keys)
            for op in ("put", "get"):
                row = run_phase(store, bufs, op, size, keys, hashes, versions, args)
                print(
                    f"{row['system']:<9} {row['threads']:>3} {size:>9} {op:<4} {row['n']:>7} "
                    f"{row['GBps']:>7.3f} {row['p50_us']:>7} {row['p99_us']:>7} {row['errors'] + row['mismatches']:>6}"
                )
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                ok = ok and row["errors"] == 0 and row["mismatches"] == 0
                if row["mismatches"]:
                    return 1
            for k in keys:
                store.remove(k, True)
            for src, dst in bufs:
                store.unregister_buffer(src.ptr)
                store.unregister_buffer(dst.ptr)
        store.close()
        return 0 if ok else 1
    finally:
        if hold:
            hold.stdin.close()
            try:
                hold.wait(timeout=10)
            except subprocess.TimeoutExpired:
                hold.kill()
        master.kill()
        master.wait()


def open_json(path, echoed=False):
    """Where rows are appended: nothing without --json; "-" is stdout, as
    for strata-bench (nothing more where the caller already prints every
    row there, `echoed`); else the file, appended to."""
    if not path:
        return None
    if path == "-":
        return None if echoed else sys.stdout
    return open(path, "a")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--role", choices=["bench", "holder"], default="bench")
    p.add_argument("--master", default="")
    p.add_argument("--segment", type=int, default=2 << 30, help="holder's global_segment_size in bytes")
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default=[64 << 10, 1 << 20, 4 << 20])
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--verify", type=lambda s: s.lower() not in ("0", "false", "no"), default=True)
    p.add_argument("--batch", type=int, default=1, help="values per operation (batch_upsert_from / batch_get_into)")
    p.add_argument("--json", help="append one JSON object per phase to this file ('-': stdout, as strata-bench)")
    p.add_argument("--scenario")
    p.add_argument("--system", default="mooncake")
    args = p.parse_args()
    if args.role == "holder":
        holder(args)
        return 0
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
