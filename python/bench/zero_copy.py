#!/usr/bin/env python3
"""strata's Python zero-copy path under the exact driver Mooncake's numbers
come from: bench/mooncake_bench.py's workload (put phase over all keys,
then random gets; every value filled and verified with strata-bench's
pattern; same JSON line schema), run against a strata node through
`strata.mooncake.MooncakeDistributedStore` (`upsert_from` / `get_into` on
registered mmap buffers with raw pointers), i.e. the facade over
`strata.Client` over the Rust client.

    python python/bench/zero_copy.py --addr 127.0.0.1:7379 --sizes 1MiB -c 1 --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mooncake_bench as mb  # noqa: E402  (the shared workload; imports no Mooncake)

from strata.mooncake import MooncakeDistributedStore  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--addr", default="127.0.0.1:7379")
    p.add_argument("--sizes", type=lambda s: [mb.parse_size(x) for x in s.split(",")], default=[1 << 20])
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--verify", type=lambda s: s.lower() not in ("0", "false", "no"), default=True)
    p.add_argument("--json")
    p.add_argument("--scenario")
    p.add_argument("--system", default="strata-python")
    args = p.parse_args()

    store = MooncakeDistributedStore()
    if store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", args.addr) != 0:
        raise SystemExit(f"cannot reach strata at {args.addr}")
    out = open(args.json, "a") if args.json else None
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
