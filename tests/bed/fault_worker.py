"""One client of the fault runs (tests/bed/faults.py), on an engine host of
the bed: writes and reads its own keys through the Python SDK until told to
stop, and records every operation — its start and end on the machine's
monotonic clock (shared by every namespace of the bed), what it wrote or
read, and how it ended — one JSON line each, for the checker.

    python fault_worker.py SEEDS NAME KEYS LOG STOP_FILE

Each key has one writer (this process), whose values carry an increasing
sequence number: ``NAME:key:seq`` padded to a few KiB. Reads also go to the
other worker's keys (``--peer NAME``), so a reader on one host checks
writes acknowledged on the other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import strata

VALUE_BYTES = 4096
# The client gives up on one request after this long and on one operation
# (retries across nodes included) after FAILOVER_MS: a fault must not hold
# a worker for longer than the runs measure.
TIMEOUT_MS = 1000
FAILOVER_MS = 3000


def value_of(name: str, key: int, seq: int) -> bytes:
    head = f"{name}:{key}:{seq}:".encode()
    return head + b"." * (VALUE_BYTES - len(head))


def parse(value: bytes | None):
    """(writer, key, seq) of a value, or None for a miss."""
    if value is None:
        return None
    writer, key, seq, _ = value.split(b":", 3)
    return writer.decode(), int(key), int(seq)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seeds")
    ap.add_argument("name")
    ap.add_argument("keys", type=int)
    ap.add_argument("log")
    ap.add_argument("stop_file")
    ap.add_argument("--peer", default="")
    a = ap.parse_args()
    client = strata.Client(seeds=[a.seeds], timeout_ms=TIMEOUT_MS, failover_timeout_ms=FAILOVER_MS)
    seq = [0] * a.keys
    rng = random.Random(os.getpid())
    with open(a.log, "w", buffering=1) as log:
        def record(**op) -> None:
            log.write(json.dumps(op) + "\n")

        while not os.path.exists(a.stop_file):
            reading = rng.random() < 0.4
            owner = a.peer if (reading and a.peer and rng.random() < 0.5) else a.name
            k = rng.randrange(a.keys)
            key = f"fault:{owner}:{k}"
            t0 = time.monotonic()
            try:
                if reading:
                    got = parse(client.get(key))
                    record(op="read", key=key, got=got and got[2], t0=t0, t1=time.monotonic(), ok=True)
                else:
                    seq[k] += 1
                    client.put(key, value_of(a.name, k, seq[k]))
                    record(op="write", key=key, seq=seq[k], t0=t0, t1=time.monotonic(), ok=True)
            except strata.StrataError as e:
                fields = dict(key=key, t0=t0, t1=time.monotonic(), ok=False, error=f"{type(e).__name__}: {e}"[:200])
                if reading:
                    record(op="read", **fields)
                else:
                    record(op="write", seq=seq[k], **fields)
        # The final read of every own key, after the faults healed.
        for k in range(a.keys):
            key = f"fault:{a.name}:{k}"
            t0 = time.monotonic()
            got = None
            for _ in range(50):
                try:
                    got = parse(client.get(key))
                    break
                except strata.StrataError:
                    time.sleep(0.1)
            record(op="final", key=key, got=got and got[2], t0=t0, t1=time.monotonic(), ok=True)
    client.close()


if __name__ == "__main__":
    main()
