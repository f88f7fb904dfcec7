"""Faults of a real network on the bed, with a Jepsen-style checker.

The documented three-node cluster (docs/OPERATIONS.md "Cluster", replica
2) runs on the bed (scripts/netbed.sh); two clients (tests/bed/fault_worker.py)
on the prefill and decode hosts write and read their keys through the
Python SDK the whole time, recording every operation. Meanwhile one node at
a time is hit, then healed:

- ``cut``: cut off from etcd and the other nodes, still reachable by the
  clients (which keep sending it writes and reads);
- ``isolate``: cut off from every host;
- ``loss``: a fifth of its packets dropped, both ways;
- ``kill``: ``kill -9``, then started again with the same command;
- ``peers``: cut off from the other nodes only (etcd and the clients still
  reach it): the others remove it, and it must stay out of the ring until
  healed instead of joining and being removed again (``rejoined`` in the
  report: joins during the fault, 0 expected).

(Cuts and loss are iptables rules inside the node's namespace; `tc netem`
needs the sch_netem module, which this kernel may lack, so there is no
delay fault.)

Then every key is read once more and the history is checked: no
acknowledged write lost (the final value is at least the last acknowledged
one), no stale read (a read never returns a value older than a write
acknowledged before the read began), no value that was never written, no
miss of a key with an acknowledged write. The run prints, per fault, the
longest time a key could not be written (from the first failed write to
the end of the next acknowledged one) and fails on any violation.

    python tests/bed/faults.py [--rounds N] [--keep DIR]   (root; STRATA_SERVER_BIN, the SDK importable)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))

from bedcluster import BED, NODES, BedCluster, bed_ip, without_strata_settings  # noqa: E402

KEYS = 48
SETTLE_S = 4.0
FAULT_S = 5.0
FAULTS = ("cut", "isolate", "loss", "kill", "peers")
WORKERS = {"prefill": "decode", "decode": "prefill"}


def ns(host: str) -> str:
    return f"{os.environ.get('NETBED_PREFIX', 'sbed-')}{host}"


def iptables(host: str, *rules: list) -> None:
    for rule in rules:
        subprocess.run(["ip", "netns", "exec", ns(host), "iptables", *rule], check=True)


def cut(host: str, keep: list) -> None:
    """Drops everything between `host` and the bed except `keep`'s addresses."""
    rules = []
    for addr in keep:
        rules += [["-A", "INPUT", "-s", addr, "-j", "ACCEPT"], ["-A", "OUTPUT", "-d", addr, "-j", "ACCEPT"]]
    rules += [["-A", "INPUT", "-i", "eth0", "-j", "DROP"], ["-A", "OUTPUT", "-o", "eth0", "-j", "DROP"]]
    iptables(host, *rules)


def heal(host: str) -> None:
    iptables(host, ["-F", "INPUT"], ["-F", "OUTPUT"])


def inject(bed: BedCluster, fault: str, node: str) -> None:
    clients = [bed_ip(h) for h in WORKERS]
    if fault == "cut":
        cut(node, clients)
    elif fault == "isolate":
        cut(node, [])
    elif fault == "loss":
        iptables(node, ["-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random",
                        "--probability", "0.2", "-j", "DROP"],
                 ["-A", "OUTPUT", "-o", "eth0", "-m", "statistic", "--mode", "random",
                  "--probability", "0.2", "-j", "DROP"])
    elif fault == "kill":
        bed.kill(node)
    elif fault == "peers":
        cut(node, clients + [bed_ip("etcd")])


def recover(bed: BedCluster, fault: str, node: str) -> None:
    if fault == "kill":
        bed.restart(node)
    else:
        heal(node)


def eth0_name_check(node: str) -> None:
    links = subprocess.check_output(["ip", "netns", "exec", ns(node), "ip", "-o", "link"], text=True)
    if " eth0" not in links and "eth0@" not in links:
        raise SystemExit(f"faults: {ns(node)} has no eth0 (links: {links})")


def load(path: Path) -> list:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def check(ops: list, faults: list) -> dict:
    """The history's violations and, per fault, the longest write outage."""
    writes = defaultdict(list)
    for o in ops:
        if o["op"] == "write":
            writes[o["key"]].append(o)
    acked = {k: sorted((w for w in ws if w["ok"]), key=lambda w: w["t1"]) for k, ws in writes.items()}
    attempted = {k: {w["seq"] for w in ws} for k, ws in writes.items()}
    stale, phantom, missing, lost = [], [], [], []
    for o in ops:
        if o["op"] not in ("read", "final") or not o["ok"]:
            continue
        key, got = o["key"], o["got"]
        before = [w["seq"] for w in acked.get(key, []) if w["t1"] < o["t0"]]
        newest = max(before, default=0)
        if got is not None and got not in attempted.get(key, set()):
            phantom.append(o)
        elif got is None and newest:
            (lost if o["op"] == "final" else missing).append((o, newest))
        elif got is not None and got < newest:
            # Say whether the value read came from a write the client was
            # told failed: one that reached a node late (a retransmit after
            # a partition healed) reads like this.
            source = next((w for w in writes[key] if w["seq"] == got), {})
            late = {"its_write_ok": source.get("ok"), "its_write_error": source.get("error")}
            (lost if o["op"] == "final" else stale).append((o, newest, late))
    outages = []
    for f in faults:
        worst = 0.0
        for key, ws in writes.items():
            ws = sorted(ws, key=lambda w: w["t0"])
            down_since = None
            for w in ws:
                if w["t0"] < f["start"] - 1 or w["t0"] > f["end"] + SETTLE_S:
                    continue
                if w["ok"]:
                    # The SDK retries on other nodes: a write that waited
                    # for the failover was unavailable as long.
                    worst = max(worst, w["t1"] - w["t0"])
                if not w["ok"] and down_since is None:
                    down_since = w["t0"]
                elif w["ok"] and down_since is not None:
                    worst = max(worst, w["t1"] - down_since)
                    down_since = None
        outages.append({**f, "longest_write_outage_s": round(worst, 3)})
    return {"stale": stale, "phantom": phantom, "missing": missing, "lost": lost, "outages": outages,
            "acked_writes": sum(len(a) for a in acked.values()),
            "failed_writes": sum(1 for ws in writes.values() for w in ws if not w["ok"]),
            "reads": sum(1 for o in ops if o["op"] == "read" and o["ok"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", default="", help="copy the run's operations and node logs here")
    a = ap.parse_args()
    py = os.environ.get("STRATA_TEST_PYTHON", sys.executable)
    worker = Path(__file__).with_name("fault_worker.py")
    bed = BedCluster()
    workers = []
    try:
        for n in NODES:
            eth0_name_check(n)
        work = Path(bed.work.name)
        stop = work / "stop"
        env = without_strata_settings(os.environ)
        for host, peer in WORKERS.items():
            workers.append(subprocess.Popen(
                [str(BED), "exec", host, py, str(worker), bed.seeds, host, str(KEYS),
                 str(work / f"ops-{host}.jsonl"), str(stop), "--peer", peer], env=env))
        time.sleep(SETTLE_S)
        faults = []
        for r in range(a.rounds):
            for i, fault in enumerate(FAULTS):
                node = NODES[(r * len(FAULTS) + i) % len(NODES)]
                start, wall = time.monotonic(), time.time()
                joins = joined(work, node)
                inject(bed, fault, node)
                print(f"faults: {fault} {node}", flush=True)
                time.sleep(FAULT_S)
                end = time.monotonic()
                rejoined = joined(work, node) - joins
                recover(bed, fault, node)
                faults.append({"fault": fault, "node": node, "start": start, "end": end, "wall": wall,
                               "rejoined": rejoined})
                bed.wait_ring(3)
                time.sleep(SETTLE_S)
        bed.wait_replicated()
        stop.touch()
        for w in workers:
            if w.wait(timeout=120) != 0:
                raise SystemExit(f"faults: a worker failed ({w.args[3]})")
        ops = [o for host in WORKERS for o in load(work / f"ops-{host}.jsonl")]
        result = check(ops, faults)
        result["events"] = events(work)
        result["faults"] = faults
        if a.keep or any(result[k] for k in ("lost", "stale", "phantom", "missing")):
            keep = Path(a.keep or "/var/tmp/strata-faults-failed")
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(work, keep, ignore=shutil.ignore_patterns("strata-nvme-*", "etcd"))
            result["kept"] = str(keep)
        for o in result["outages"]:
            o["takeover_s"] = takeover_s(work, o)
    except BaseException:
        print(bed.logs(), file=sys.stderr)
        raise
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        bed.stop()
    report(result)


MARKERS = ("removed an unreachable member", "a member left", "record was deleted",
           "copies may be stale", "etcd unreachable", "joined the cluster")


def events(work: Path) -> list:
    """The membership events in the nodes' logs, for the report."""
    out = []
    for log in sorted(work.glob("node*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(m in line for m in MARKERS):
                out.append(f"{log.stem}: {line[line.find('Z') + 1:].strip()[:160]}")
    return out


def joined(work: Path, node: str) -> int:
    """How often ``node`` has joined the ring so far, by its log."""
    return (work / f"{node}.log").read_text(errors="replace").count("joined the cluster")


def log_time(line: str) -> float:
    """The Unix time of a node log line (tracing's RFC 3339 UTC stamp)."""
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.timezone.utc).timestamp() if m else 0.0


def takeover_s(work: Path, fault: dict):
    """Seconds from the fault until every other node ran a ring without the
    faulted one (None: it was never dropped)."""
    gone = f"{os.environ.get('NETBED_PREFIX', 'sbed-')}{fault['node']}"
    worst = 0.0
    for n in NODES:
        if n == fault["node"]:
            continue
        text = (work / f"{n}.log").read_text(errors="replace")
        times = [log_time(l) for l in text.splitlines() if "ring changed" in l and gone not in l]
        after = [t for t in times if t > fault["wall"]]
        if not after or after[0] > fault["wall"] + FAULT_S:
            return None
        worst = max(worst, after[0] - fault["wall"])
    return round(worst, 3)


def report(result: dict) -> None:
    for e in result["events"]:
        print(f"faults: event {e}")
    print(f"faults: {result['acked_writes']} writes acknowledged, {result['failed_writes']} failed "
          f"or unacknowledged, {result['reads']} reads")
    for o in result["outages"]:
        took = "not dropped" if o["takeover_s"] is None else f"dropped from every ring after {o['takeover_s']:.3f} s"
        print(f"faults: {o['fault']:8s} {o['node']}: {took}; longest write outage seen by a client "
              f"{o['longest_write_outage_s']:.3f} s; joined the ring {o['rejoined']} times during it")
    bad = {k: result[k] for k in ("lost", "stale", "phantom", "missing") if result[k]}
    flapped = [(o["fault"], o["node"], o["rejoined"]) for o in result["outages"]
               if o["fault"] == "peers" and o["rejoined"]]
    if flapped:
        bad["rejoined while cut off from its peers"] = flapped
    for kind, items in bad.items():
        print(f"faults: FAIL: {len(items)} {kind}: {items[:5]}", file=sys.stderr)
    if bad:
        print(f"faults: the run's operations and node logs are in {result.get('kept', '(not kept: --keep DIR)')}; faults: "
              f"{[(f['fault'], f['node'], round(f['start'], 3), round(f['end'], 3)) for f in result['faults']]}",
              file=sys.stderr)
    print("faults: lost 0, stale 0, phantom 0, missing 0" if not bad else "faults: FAILED")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
