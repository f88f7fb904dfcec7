#!/usr/bin/env python3
"""Prints the comparison tables from compare.sh's JSON lines: GB/s and p99
per (size, op, clients) for every system, one value per call and then in
batches; then strata's ratios to Mooncake and to iperf3 for 1 MiB GET and
PUT, and of its zero-copy batches to its inline pipelined ones and to
Mooncake's batch calls.

With several rounds (compare.sh's `ROUNDS`; each row's "round"), a cell is
the median of its rounds (GB/s and p99 each), a ratio is the ratio of two
medians, and the range of that ratio over the rounds follows it in
brackets, so that a noisy round shows as a spread instead of deciding the
figure."""

import json
import statistics
import sys

SPIN = ("strata-spin", "zerocopy")
COLUMNS = [("strata", "zerocopy"), ("strata-cma", "zerocopy"), SPIN, ("strata", "inline"), ("redis", "inline"),
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
    # The polling column only where the run measured it (SPIN_US).
    columns = [c for c in COLUMNS if c != SPIN or any(k[:2] == SPIN for k in cells)]
    head = f"{'size':>6} {'op':<4} {'c':>2} | " + " | ".join(f"{s + ' ' + a:>24}" for s, a in columns)
    print(head)
    print(f"{'':>15} | " + " | ".join(f"{'GB/s':>10} {'p99 us':>13}" for _ in columns))
    print("-" * len(head))
    for size, op, c in keys:
        parts = []
        for s, a in columns:
            r = cells.get((s, a, size, op, c, batch(size)))
            bad = r and (r["errors"] or r.get("mismatches"))
            parts.append(f"{r['GBps']:>10.3f} {r['p99_us']:>12}{'!' if bad else ' '}" if r else f"{'-':>10} {'-':>13}")
        print(f"{human(size):>6} {op:<4} {c:>2} | " + " | ".join(parts))


def median_row(rows):
    """One row for a cell measured in several rounds: the median GB/s and
    p99, the errors of all rounds, and each round's GB/s by round."""
    out = dict(rows[0])
    out["GBps"] = statistics.median(r["GBps"] for r in rows)
    out["p99_us"] = int(statistics.median(r["p99_us"] for r in rows))
    out["errors"] = sum(r["errors"] for r in rows)
    out["mismatches"] = sum(r.get("mismatches", 0) for r in rows)
    out["by_round"] = {r.get("round", 1): r["GBps"] for r in rows}
    # Rows from before the field existed, and iperf3's, count as busy all along.
    busy = {r.get("round", 1): r.get("busy_GBps", r["GBps"]) for r in rows}
    out["busy_GBps"] = statistics.median(busy.values())
    out["busy_by_round"] = busy
    return out


def ratio(me, other, busy=False):
    """`me`/`other` of two median rows, with the range over the rounds both
    ran in when there are several: '0.85x [0.71-0.93]'. `busy`: of the
    GB/s inside the calls (without the bench's filling and checking of
    values between them), for a ceiling that does no such work."""
    field, rounds = ("busy_GBps", "busy_by_round") if busy else ("GBps", "by_round")
    text = f"{me[field] / other[field]:.2f}x"
    per = [me[rounds][r] / other[rounds][r]
           for r in me[rounds] if other[rounds].get(r)]
    if len(per) > 1:
        text += f" [{min(per):.2f}-{max(per):.2f}]"
    return text


def ratios(cells, clients, title, system, size, batch, against, iperf):
    """One line per (op, clients) of `system`'s zero-copy GB/s at `size` and
    `batch` values per call, with its ratio to each (label, (system, api))
    of `against` and to iperf3 (`iperf`: its median row)."""
    print("\n" + title)
    for op in ("get", "put"):
        for c in clients:
            me = cells.get((system, "zerocopy", size, op, c, batch))
            if not me:
                continue
            line = f"  {op} c={c}: {me['GBps']:.3f} GB/s (busy {me['busy_GBps']:.3f})"
            for label, (s, a) in against:
                other = cells.get((s, a, size, op, c, batch))
                if other and other["GBps"]:
                    line += f", {label} {ratio(me, other)}"
            if iperf:
                line += f", strata/iperf3 {ratio(me, iperf)} (busy {ratio(me, iperf, busy=True)})"
            print(line)


def split_levels(values):
    """The cut between a low and a high level of round trips: the higher
    value at the widest ratio between neighbours in sorted order, when that
    ratio is 2 or more (else None: one level)."""
    vs = sorted(set(values))
    jumps = [(b / a, b) for a, b in zip(vs, vs[1:]) if a > 0]
    if not jumps:
        return None
    ratio, cut = max(jumps)
    return cut if ratio >= 2 else None


def probes(path):
    """The probe table: per round and system, how many of the samples taken
    before that system's client runs were at the high level."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        return
    ns = [r["ns"] for r in rows]
    cut = split_levels(ns)
    systems = list(dict.fromkeys(r["system"] for r in rows))
    print("\nCache-line round trip between the pinned CPUs (bench/examples/pingpong.rs), sampled before each client "
          "run:", end=" ")
    if cut is None:
        print(f"one level, {min(ns)}-{max(ns)} ns.")
        return
    low = [n for n in ns if n < cut]
    high = [n for n in ns if n >= cut]
    print(f"low {min(low)}-{max(low)} ns, high {min(high)}-{max(high)} ns (vCPUs in different L3 domains, "
          "docs/bench-notes/l3-domains.md). Samples at the high level / samples, per round and system:")
    print(f"{'round':>6} | " + " | ".join(f"{s:>10}" for s in systems) + " | all")
    for rnd in sorted({r["round"] for r in rows}):
        mine = [r for r in rows if r["round"] == rnd]
        cells = []
        for s in systems:
            got = [r["ns"] for r in mine if r["system"] == s]
            cells.append(f"{sum(n >= cut for n in got):>4} / {len(got):<3}" if got else f"{'-':>10}")
        print(f"{rnd:>6} | " + " | ".join(cells) + f" | {sum(r['ns'] >= cut for r in mine)} / {len(mine)}")


def main(path, probe_path=None):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    grouped = {}
    for r in rows:
        grouped.setdefault((r["system"], r["api"], r["size"], r["op"], r["threads"], batch_of(r)), []).append(r)
    cells = {k: median_row(v) for k, v in grouped.items()}
    iperf_rows = [r for r in rows if r["system"] == "iperf3"]
    iperf = median_row(iperf_rows) if iperf_rows else None
    rounds = sorted({r.get("round", 1) for r in rows})
    measured = [r for r in rows if r["system"] != "iperf3"]
    order = lambda k: (k[0], k[1] != "put", k[2])  # noqa: E731
    singles = sorted({(r["size"], r["op"], r["threads"]) for r in measured if batch_of(r) == 1}, key=order)
    batches = {r["size"]: batch_of(r) for r in measured if batch_of(r) > 1}
    batched = sorted({(r["size"], r["op"], r["threads"]) for r in measured if batch_of(r) > 1}, key=order)
    if len(rounds) > 1:
        print(f"Medians of {len(rounds)} rounds; ratios are of medians, [the range over the rounds].\n")
    print("One value per call:")
    table(cells, singles, lambda size: 1)
    if batched:
        print("\nBatches (values per call: " + ", ".join(f"{n} x {human(s)}" for s, n in sorted(batches.items())) +
              "; GB/s counts values, p99 is per batch):")
        table(cells, batched, lambda size: batches[size])
    if iperf:
        spread = sorted(iperf["by_round"].values())
        print(f"\niperf3 single stream (loopback): {iperf['GBps']:.3f} GB/s" +
              (f" [{spread[0]:.3f}-{spread[-1]:.3f}]" if len(spread) > 1 else ""))
    clients = sorted({r["threads"] for r in measured})
    mib = 1 << 20
    ratios(cells, clients, "strata zero-copy, 1 MiB:", "strata", mib, 1,
           [("strata/mooncake", ("mooncake", "zerocopy"))], iperf)
    ratios(cells, clients, "strata zero-copy with busy_poll_us and spin_us (SPIN_US), 1 MiB:", "strata-spin", mib, 1,
           [("/strata", ("strata", "zerocopy")), ("strata/mooncake", ("mooncake", "zerocopy"))], iperf)
    ratios(cells, clients, "strata over cross-memory attach (same host), 1 MiB:", "strata-cma", mib, 1,
           [("cma/tcp", ("strata", "zerocopy")), ("cma/mooncake", ("mooncake", "zerocopy"))], None)
    for size, n in sorted(batches.items()):
        ratios(cells, clients, f"strata zero-copy batches of {n} x {human(size)}:", "strata", size, n,
               [("/strata inline pipelined", ("strata", "inline")), ("/mooncake batch", ("mooncake", "zerocopy"))],
               None)
    failed = [r for r in rows if r["errors"] or r.get("mismatches")]
    if failed:
        print(f"\n{len(failed)} cell-round(s) had errors or mismatches (marked !)")
    if probe_path:
        probes(probe_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
