#!/usr/bin/env bash
# The data plane across hosts: one strata node on the network bed's node1
# host and strata-bench on its prefill host (scripts/netbed.sh: network
# namespaces on a private bridge over veth, each with its own address and
# pid namespace, so nothing goes by cross-memory attach), next to iperf3
# between the same two hosts (one TCP stream, the ceiling). Zero-copy GET
# and PUT of 1 MiB (sent with the command) and 8 MiB (above
# inline_put_max: the node pulls it from the client's data plane), 1 and 4
# clients, $ROUNDS interleaved rounds; each cell is the median of its
# rounds. JSON lines to $RESULTS, a table to stdout.
#
#   sudo bench/bed.sh        (root: network namespaces; builds --release)
#
# Env: ROUNDS (3), DURATION (seconds per phase, 3), SIZES (1MiB,8MiB),
# CLIENTS ("1 4"), RESULTS ($CARGO_TARGET_DIR/bed/results.jsonl).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
SIZES=${SIZES:-1MiB,8MiB}
CLIENTS=${CLIENTS:-"1 4"}
OUT=$CARGO_TARGET_DIR/bed
RESULTS=${RESULTS:-$OUT/results.jsonl}
BED=$ROOT/scripts/netbed.sh
REL=$CARGO_TARGET_DIR/release

[ "$(id -u)" -eq 0 ] || { echo "bench/bed.sh: needs root (network namespaces)" >&2; exit 2; }
command -v iperf3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
(cd "$ROOT" && cargo build --release -q -p strata-server -p strata-bench)
mkdir -p "$OUT"
: >"$RESULTS"
WORK=$(mktemp -d /var/tmp/strata-bed-bench.XXXXXX)
cleanup() { "$BED" down || true; rm -rf "$WORK"; }
trap cleanup EXIT
"$BED" up
NODE=$("$BED" ip node1)

start_node() {
  TMPDIR=$WORK "$BED" exec node1 "$REL/strata-server" --bind 0.0.0.0 --advertise-host "$NODE" \
    --cpu-memory-pool-size 1GiB --metrics-port 0 >"$WORK/node.log" 2>&1 &
  NODE_PID=$!
  for _ in $(seq 1 100); do
    "$BED" exec prefill redis-cli -h "$NODE" -p 7379 ping 2>/dev/null | grep -q PONG && return
    sleep 0.1
  done
  cat "$WORK/node.log"; exit 1
}

# The node itself, not its namespace wrapper (which would wait for it).
stop_node() {
  kill $(ip netns pids "${NETBED_PREFIX:-sbed-}node1") 2>/dev/null || true
  wait "$NODE_PID" 2>/dev/null || true
}
# iperf3 under the congestion control strata's sockets use where the host
# default is BBR (tcp_congestion auto: CUBIC), as bench/compare.sh does.
IPERF_CC=()
case "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" in bbr*) IPERF_CC=(-C cubic) ;; esac

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round"
  "$BED" exec node1 iperf3 -s -1 >/dev/null 2>&1 &
  sleep 0.5
  "$BED" exec prefill iperf3 -c "$NODE" -t "$DURATION" -J "${IPERF_CC[@]}" >"$WORK/iperf.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"system":"iperf3","round":int(sys.argv[2]),"GBps":d["end"]["sum_received"]["bits_per_second"]/8e9}))' \
    "$WORK/iperf.json" "$round" >>"$RESULTS"
  start_node
  for c in $CLIENTS; do
    "$BED" exec prefill "$REL/strata-bench" --addr "$NODE:7379" --api zerocopy --sizes "$SIZES" \
      -c "$c" --duration "$DURATION" --json "$WORK/bench.jsonl" >/dev/null
  done
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l); d["round"] = int(sys.argv[2]); print(json.dumps(d))' "$WORK/bench.jsonl" "$round" >>"$RESULTS"
  : >"$WORK/bench.jsonl"
  stop_node
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
iperf = statistics.median(r["GBps"] for r in rows if r["system"] == "iperf3")
print(f"\niperf3, one stream prefill -> node1: {iperf:.2f} GB/s (median of rounds)\n")
print(f"{'size':>8} {'op':>4} {'c':>2} {'GB/s':>6} {'/iperf3':>8} {'p50 us':>7} {'p99 us':>7} {'errors':>6}")
cells = {}
for r in rows:
    if r["system"] == "strata":
        cells.setdefault((r["size"], r["op"], r["threads"]), []).append(r)
for (size, op, c), rs in sorted(cells.items()):
    gbps = statistics.median(r["GBps"] for r in rs)
    p50 = statistics.median(r["p50_us"] for r in rs)
    p99 = statistics.median(r["p99_us"] for r in rs)
    errors = sum(r["errors"] + r.get("mismatches", 0) for r in rs)
    print(f"{size >> 20:>5}MiB {op:>4} {c:>2} {gbps:>6.2f} {gbps / iperf:>8.2f} {p50:>7.0f} {p99:>7.0f} {errors:>6}")
EOF
