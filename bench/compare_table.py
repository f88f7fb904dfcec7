#!/usr/bin/env python3
"""Prints the comparison tables from compare.sh's JSON lines: GB/s and p99
per (size, op, clients) for every system, one value per call and then in
batches; then strata's ratios to Mooncake and to iperf3 for 1 MiB GET and
PUT, and of its zero-copy batches to its inline pipelined ones and to
Mooncake's batch calls."""

import json
import sys

COLUMNS = [("strata", "zerocopy"), ("strata-cma", "zerocopy"), ("strata", "inline"), ("redis", "inline"),
           ("mooncake", "zerocopy")]


def human(size):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= n and size % n == 0:
            return f"{size // n}{unit}"
    return str(size)


def batch_of(row):
    """Values per call: the `-bN` suffix of the scenario, else 1."""
    _, _, b = row["scenario"].partition("-b")
    return int(b) if b.isdigit() else 1


def table(cells, keys, batch):
    head = f"{'size':>6} {'op':<4} {'c':>2} | " + " | ".join(f"{s + ' ' + a:>24}" for s, a in COLUMNS)
    print(head)
    print(f"{'':>15} | " + " | ".join(f"{'GB/s':>10} {'p99 us':>13}" for _ in COLUMNS))
    print("-" * len(head))
    for size, op, c in keys:
        parts = []
        for s, a in COLUMNS:
            r = cells.get((s, a, size, op, c, batch(size)))
            bad = r and (r["errors"] or r.get("mismatches"))
            parts.append(f"{r['GBps']:>10.3f} {r['p99_us']:>12}{'!' if bad else ' '}" if r else f"{'-':>10} {'-':>13}")
        print(f"{human(size):>6} {op:<4} {c:>2} | " + " | ".join(parts))


def ratios(cells, clients, title, system, size, batch, against, iperf):
    """One line per (op, clients) of `system`'s zero-copy GB/s at `size` and
    `batch` values per call, with its ratio to each (label, (system, api))
    of `against` and to iperf3."""
    print("\n" + title)
    for op in ("get", "put"):
        for c in clients:
            me = cells.get((system, "zerocopy", size, op, c, batch))
            if not me:
                continue
            line = f"  {op} c={c}: {me['GBps']:.3f} GB/s"
            for label, (s, a) in against:
                other = cells.get((s, a, size, op, c, batch))
                if other and other["GBps"]:
                    line += f", {label} {me['GBps'] / other['GBps']:.2f}x"
            if iperf:
                line += f", strata/iperf3 {me['GBps'] / iperf:.2f}"
            print(line)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    cells = {(r["system"], r["api"], r["size"], r["op"], r["threads"], batch_of(r)): r for r in rows}
    iperf = next((r["GBps"] for r in rows if r["system"] == "iperf3"), None)
    measured = [r for r in rows if r["system"] != "iperf3"]
    order = lambda k: (k[0], k[1] != "put", k[2])  # noqa: E731
    singles = sorted({(r["size"], r["op"], r["threads"]) for r in measured if batch_of(r) == 1}, key=order)
    batches = {r["size"]: batch_of(r) for r in measured if batch_of(r) > 1}
    batched = sorted({(r["size"], r["op"], r["threads"]) for r in measured if batch_of(r) > 1}, key=order)
    print("One value per call:")
    table(cells, singles, lambda size: 1)
    if batched:
        print("\nBatches (values per call: " + ", ".join(f"{n} x {human(s)}" for s, n in sorted(batches.items())) +
              "; GB/s counts values, p99 is per batch):")
        table(cells, batched, lambda size: batches[size])
    if iperf:
        print(f"\niperf3 single stream (loopback): {iperf:.3f} GB/s")
    clients = sorted({r["threads"] for r in measured})
    mib = 1 << 20
    ratios(cells, clients, "strata zero-copy, 1 MiB:", "strata", mib, 1,
           [("strata/mooncake", ("mooncake", "zerocopy"))], iperf)
    ratios(cells, clients, "strata over cross-memory attach (same host), 1 MiB:", "strata-cma", mib, 1,
           [("cma/tcp", ("strata", "zerocopy")), ("cma/mooncake", ("mooncake", "zerocopy"))], None)
    for size, n in sorted(batches.items()):
        ratios(cells, clients, f"strata zero-copy batches of {n} x {human(size)}:", "strata", size, n,
               [("/strata inline pipelined", ("strata", "inline")), ("/mooncake batch", ("mooncake", "zerocopy"))],
               None)
    failed = [r for r in rows if r["errors"] or r.get("mismatches")]
    if failed:
        print(f"\n{len(failed)} cell(s) had errors or mismatches (marked !)")


if __name__ == "__main__":
    main(sys.argv[1])
