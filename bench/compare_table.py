#!/usr/bin/env python3
"""Prints the comparison table from compare.sh's JSON lines: GB/s and p99
per (size, op, clients) for every system, then strata's ratios to
Mooncake and to iperf3 for 1 MiB GET and PUT."""

import json
import sys

COLUMNS = [("strata", "zerocopy"), ("strata-cma", "zerocopy"), ("strata", "inline"), ("redis", "inline"),
           ("mooncake", "zerocopy")]


def human(size):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= n and size % n == 0:
            return f"{size // n}{unit}"
    return str(size)


def ratios(cells, clients, title, system, against, iperf):
    """One line per 1 MiB (op, clients) of `system`'s zero-copy GB/s, with
    its ratio to each (label, (system, api)) of `against` and to iperf3."""
    print("\n" + title)
    for op in ("get", "put"):
        for c in clients:
            me = cells.get((system, "zerocopy", 1 << 20, op, c))
            if not me:
                continue
            line = f"  {op} c={c}: {me['GBps']:.3f} GB/s"
            for label, (s, a) in against:
                other = cells.get((s, a, 1 << 20, op, c))
                if other and other["GBps"]:
                    line += f", {label} {me['GBps'] / other['GBps']:.2f}x"
            if iperf:
                line += f", strata/iperf3 {me['GBps'] / iperf:.2f}"
            print(line)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    cells = {(r["system"], r["api"], r["size"], r["op"], r["threads"]): r for r in rows}
    iperf = next((r["GBps"] for r in rows if r["system"] == "iperf3"), None)
    keys = sorted({(r["size"], r["op"], r["threads"]) for r in rows if r["system"] != "iperf3"},
                  key=lambda k: (k[0], k[1] != "put", k[2]))
    head = f"{'size':>6} {'op':<4} {'c':>2} | " + " | ".join(f"{s + ' ' + a:>24}" for s, a in COLUMNS)
    print(head)
    print(f"{'':>15} | " + " | ".join(f"{'GB/s':>10} {'p99 us':>13}" for _ in COLUMNS))
    print("-" * len(head))
    for size, op, c in keys:
        parts = []
        for s, a in COLUMNS:
            r = cells.get((s, a, size, op, c))
            bad = r and (r["errors"] or r.get("mismatches"))
            parts.append(f"{r['GBps']:>10.3f} {r['p99_us']:>12}{'!' if bad else ' '}" if r else f"{'-':>10} {'-':>13}")
        print(f"{human(size):>6} {op:<4} {c:>2} | " + " | ".join(parts))
    if iperf:
        print(f"\niperf3 single stream (loopback): {iperf:.3f} GB/s")
    clients = sorted({k[2] for k in keys})
    ratios(cells, clients, "strata zero-copy, 1 MiB:", "strata",
           [("strata/mooncake", ("mooncake", "zerocopy"))], iperf)
    ratios(cells, clients, "strata over cross-memory attach (same host), 1 MiB:", "strata-cma",
           [("cma/tcp", ("strata", "zerocopy")), ("cma/mooncake", ("mooncake", "zerocopy"))], None)
    failed = [r for r in rows if r["errors"] or r.get("mismatches")]
    if failed:
        print(f"\n{len(failed)} cell(s) had errors or mismatches (marked !)")


if __name__ == "__main__":
    main(sys.argv[1])
