#!/usr/bin/env python3
"""strata's Python zero-copy path under the exact driver Mooncake's numbers
come from: bench/mooncake_bench.py's workload (put phase over all keys,
then random gets; every value filled and verified with strata-bench's
pattern; same JSON line schema), run against a strata node through
`strata.mooncake.MooncakeDistributedStore` (`upsert_from` / `get_into` on
registered mmap buffers with raw pointers), i.e. the facade over
`strata.Client` over the Rust client.

    python python/bench/zero_copy.py --addr 127.0.0.1:7379 --sizes 1MiB -c 1 --json out.jsonl

`--raw` measures the SDK path alone: `strata.Client` with raw pointers in
a tight loop, one client per thread (as strata-bench gives each task its
own), values filled once before the phase and one value verified after
it (with `--batch N`, N values per `batch_put_from` / `batch_get_into`
call, latency per call), so the GB/s carry none of the driver's numpy
fill/verify work (which costs a Python process several hundred
microseconds per 1 MiB). `--procs P` runs that in P processes at once
(each with `-c` threads and clients, phases started together), the way
engines run one process per GPU rank; the row sums their values and
merges their latencies.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mooncake_bench as mb  # noqa: E402  (the shared workload; imports no Mooncake)

import strata  # noqa: E402
from strata.mooncake import MooncakeDistributedStore  # noqa: E402


def raw_phase(clients, op, size, keys, pools, args, first_proc=True) -> dict:
    """`op` on `keys` for `--duration` (puts: every key once first, by the
    first thread of the first process), one thread per pool, each with its
    own client (as strata-bench's tasks); latency of each call, GB/s over
    the phase's wall time. The row's `_lat` holds the sorted latencies."""
    lat = [[] for _ in pools]
    deadline = time.monotonic() + args.duration

    def worker(t):
        src, dst = pools[t]
        client = clients[t]
        batch = args.batch
        src_ptrs = [src.ptr + i * size for i in range(batch)]
        dst_ptrs = [dst.ptr + i * size for i in range(batch)]
        sizes = [size] * batch
        rng = random.Random(t)
        n = 0
        while True:
            first_pass = op == "put" and first_proc and t == 0 and n * batch < len(keys)
            if not first_pass and time.monotonic() >= deadline:
                return
            if batch > 1:
                first = n * batch if first_pass else rng.randrange(len(keys) - batch + 1)
                ks = [keys[(first + i) % len(keys)] for i in range(batch)]
                t0 = time.perf_counter_ns()
                if op == "put":
                    bad = [e for e in client.batch_put_from(ks, src_ptrs, sizes) if e is not None]
                else:
                    bad = [r for r in client.batch_get_into(ks, dst_ptrs, sizes) if r != size]
                if bad:
                    raise SystemExit(f"batch {op} failed: {bad[0]!r}")
                lat[t].append(max((time.perf_counter_ns() - t0) // 1000, 1))
                n += 1
                continue
            k = n if first_pass else rng.randrange(len(keys))
            t0 = time.perf_counter_ns()
            if op == "put":
                client.put_from(keys[k], src.ptr, size)
            elif client.get_into(keys[k], dst.ptr, size) != size:
                raise SystemExit(f"short read of {keys[k]}")
            lat[t].append(max((time.perf_counter_ns() - t0) // 1000, 1))
            n += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(pools))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.perf_counter() - start
    all_us = sorted(x for l in lat for x in l)
    n = len(all_us) * args.batch  # values moved; latency is per call
    return {
        "system": args.system + "-raw", "scenario": f"c{len(pools)}" + (f"-b{args.batch}" if args.batch > 1 else ""), "api": "zerocopy",
        "batch": args.batch, "threads": len(pools), "procs": 1, "size": size, "op": op, "n": n, "secs": secs,
        "ops_s": n / secs, "GBps": n * size / secs / 1e9, "p50_us": mb.pct(all_us, 0.5),
        "p99_us": mb.pct(all_us, 0.99), "p999_us": mb.pct(all_us, 0.999), "errors": 0, "mismatches": 0,
        "_lat": all_us,
    }


def merge_rows(rows: list[dict]) -> dict:
    """One row for the same phase run in several processes at once: values
    summed over the longest process's wall time, latencies merged."""
    all_us = sorted(x for r in rows for x in r["_lat"])
    n = sum(r["n"] for r in rows)
    secs = max(r["secs"] for r in rows)
    row = dict(rows[0])
    threads = sum(r["threads"] for r in rows)
    row.update({
        "scenario": f"p{len(rows)}c{rows[0]['threads']}" + (f"-b{row['batch']}" if row["batch"] > 1 else ""),
        "threads": threads, "procs": len(rows), "n": n, "secs": secs, "ops_s": n / secs,
        "GBps": n * row["size"] / secs / 1e9, "p50_us": mb.pct(all_us, 0.5),
        "p99_us": mb.pct(all_us, 0.99), "p999_us": mb.pct(all_us, 0.999), "_lat": all_us,
    })
    return row


class _Pool:
    """One registered, page-aligned buffer of `size` bytes with a numpy view
    (a `mb.Buffer` lookalike). Page-aligned as strata-bench's buffers and
    torch's (64-byte) allocations are: `np.zeros` memory starts 16 bytes
    into a page, and a same-host read into memory whose alignment differs
    from the value's by 16 bytes runs far slower (the kernel's copy;
    docs/bench-notes/cross-memory-attach.md, python/README.md)."""

    def __init__(self, client, size):
        import numpy as np

        self.mm = mmap.mmap(-1, size)
        self.view = np.frombuffer(self.mm, dtype=np.uint8)
        self.view[:] = 0  # fault the pages in before timing
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        client.register_buffer(self.ptr, size)


def emit(row: dict, out) -> None:
    row = {k: v for k, v in row.items() if k != "_lat"}
    print(json.dumps(row), flush=True)
    if out:
        out.write(json.dumps(row) + "\n")
        out.flush()


def raw(args) -> int:
    out = mb.open_json(args.json, echoed=True)
    if args.procs <= 1:
        raw_proc(args, 0, None, lambda row: emit(row, out))
        return 0
    # fork, before any client exists in the parent: each child builds its
    # own clients (and runtimes) after the fork.
    ctx = mp.get_context("fork")
    barrier, rows = ctx.Barrier(args.procs), ctx.Queue()
    procs = [ctx.Process(target=_raw_child, args=(args, i, barrier, rows)) for i in range(args.procs)]
    for pr in procs:
        pr.start()
    try:
        for _ in args.sizes:
            for _ in ("put", "get"):
                got = [rows.get(timeout=args.duration + 120) for _ in procs]
                if any(r is None for r in got):
                    raise SystemExit("a benchmark process failed (its error is above)")
                emit(merge_rows(got), out)
    finally:
        for pr in procs:
            pr.join(timeout=30)
            if pr.is_alive():
                pr.kill()
    return 0 if all(pr.exitcode == 0 for pr in procs) else 1


def _raw_child(args, index, barrier, rows) -> None:
    try:
        raw_proc(args, index, barrier, rows.put)
    except BaseException:
        rows.put(None)
        barrier.abort()
        raise


def raw_proc(args, index, barrier, report) -> None:
    """The `--raw` run of one process: `report(row)` for each phase; with
    a `barrier`, every phase starts when all processes are ready."""
    clients = [strata.Client(args.addr, cma=args.cma, threads=args.threads, spin_us=args.spin_us) for _ in range(args.concurrency)]
    client = clients[0]
    try:
        for size in args.sizes:
            pools = [(_Pool(c, size * args.batch), _Pool(c, size * args.batch)) for c in clients]
            keys = [f"pyraw:{size}:{i}" for i in range(args.keys)]
            # Every key gets the same value (key 0's pattern), filled once.
            h0 = mb.key_hash(keys[0].encode())
            for src, _ in pools:
                for i in range(args.batch):
                    mb.fill(src.view[i * size:(i + 1) * size], h0, 1)
            for op in ("put", "get"):
                if barrier is not None:
                    barrier.wait()
                report(raw_phase(clients, op, size, keys, pools, args, first_proc=index == 0))
            dst = pools[0][1]
            if client.get_into(keys[0], dst.ptr, size) != size or not mb.check(dst.view[:size], h0):
                raise SystemExit(f"MISMATCH on {keys[0]}")
    finally:
        for c in clients:
            c.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--addr", default="127.0.0.1:7379")
    p.add_argument("--sizes", type=lambda s: [mb.parse_size(x) for x in s.split(",")], default=[1 << 20])
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--verify", type=lambda s: s.lower() not in ("0", "false", "no"), default=True)
    p.add_argument("--json", help="also append each row to this file ('-': stdout only, where every row goes anyway)")
    p.add_argument("--scenario")
    p.add_argument("--system", default="strata-python")
    p.add_argument("--threads", type=int, default=0, help="the client's runtime threads (0: the callers drive it)")
    p.add_argument("--spin-us", type=int, default=0, help="the client's spin_us (threads=0: poll this long before sleeping)")
    p.add_argument("--batch", type=int, default=1, help="with --raw: values per call (batch_put_from / batch_get_into)")
    p.add_argument("--raw", action="store_true", help="the SDK path alone (see the module doc)")
    p.add_argument("--procs", type=int, default=1, help="with --raw: processes, each with -c threads (one per GPU rank)")
    p.add_argument("--cma", type=lambda s: s.lower() not in ("0", "false", "no"), default=True,
                   help="with --raw: cross-memory attach with a node on this host (false: TCP)")
    args = p.parse_args()
    if args.raw:
        return raw(args)

    store = MooncakeDistributedStore()
    if store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", args.addr) != 0:
        raise SystemExit(f"cannot reach strata at {args.addr}")
    out = mb.open_json(args.json, echoed=True)
    ok = True
    for size in args.sizes:
        bufs = [(mb.Buffer(store, size), mb.Buffer(store, size)) for _ in range(args.concurrency)]
        keys = [f"pybench:{size}:{i}" for i in range(args.keys)]
        hashes = [mb.key_hash(k.encode()) for k in keys]
        versions = [0] * len(keys)
        for op in ("put", "get"):
            row = mb.run_phase(store, bufs, op, size, keys, hashes, versions, args)
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
            ok = ok and row["errors"] == 0 and row["mismatches"] == 0
        for k in keys:
            store.remove(k)
    store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
