#!/usr/bin/env bash
# Side-by-side comparison on this machine, in one go ($ROUNDS rounds of
# about 5 minutes each):
# strata zero-copy over TCP and over cross-memory attach (the same-host
# data plane), strata inline, Redis 7 (inline), Mooncake Store
# (zero-copy, cross-process) and iperf3 (one loopback TCP stream, the
# ceiling), plus a bare process_vm_readv loop and memcpy (the ceiling of
# the same-host path); sizes 64 KiB, 1 MiB, 4 MiB one value per call, and
# batches the way engines move KV cache ($BATCHES: 32 x 64 KiB, 32 x
# 256 KiB, 8 x 1 MiB, 4 x 4 MiB per call: strata MPUT and pipelined GETs,
# strata and Redis pipelined SET/GET, Mooncake's batch_upsert_from and
# batch_get_into); 1 and 4 clients; then bytes per key of the index next
# to Redis (bench/index-memory.sh, $INDEX_KEYS keys). Every value read is
# verified. JSON lines go to $RESULTS (each row tagged with its round),
# tables to stdout: each cell the median of its rounds, so that one slow
# second on a shared machine does not decide a ratio.
#
# A round runs every system once, in the same order, each strata round on
# a fresh node; the rounds interleave, so drift of the machine over the
# run lands on every system alike.
#
# Setup (packages, Mooncake venv, release build) runs first, with network;
# the measurements then run inside `unshare -n` (only `lo`), because
# Mooncake's listeners bind 0.0.0.0.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$CARGO_TARGET_DIR/compare}
RESULTS=${RESULTS:-$OUT/results.jsonl}
VENV=${VENV:-$CARGO_TARGET_DIR/mooncake-venv}
SIZES=${SIZES:-64KiB,1MiB,4MiB}
CLIENTS=${CLIENTS:-"1 4"}
DURATION=${DURATION:-1}   # seconds per phase
ROUNDS=${ROUNDS:-3}       # interleaved rounds; cells are medians
KEYS=${KEYS:-64}
BATCHES=${BATCHES:-"64KiB:32 256KiB:32 1MiB:8 4MiB:4"}   # size:values per call
INDEX_KEYS=${INDEX_KEYS:-1000000}                       # 0: skip the index figure
# SPIN_US=N (1-1000) adds a column "strata-spin": zero-copy over TCP on a
# node with `busy_poll_us` N and a client with `spin_us` N (both off by
# default; OPERATIONS.md), so the opt-in polling is measured in the same
# rounds as everything else. 0 (default): no such column.
SPIN_US=${SPIN_US:-0}
# PIN=S:C runs every server (strata node, Redis, Mooncake's master and
# holder, iperf3 -s) on CPU S and every client on CPU C, the same for all
# systems: on a 2-vCPU VM the scheduler otherwise puts client and server
# on one CPU now and then, which shows as long tails
# (docs/bench-notes/compare-runs.md).
PIN=${PIN:-}
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

if [[ "${1:-}" != --inner ]]; then
    need_packages redis-server redis-tools iperf3 libibverbs1 libnuma1 libcurl4
    mooncake_venv "$VENV"
    (cd "$ROOT" && cargo build --release -q -p strata-server -p strata-bench &&
        cargo build --release -q -p strata-rdma --example cma_loop &&
        cargo build --release -q -p strata-bench --example pingpong)
    mkdir -p "$OUT"
    : >"$RESULTS"
    : >"$OUT/probe.jsonl"
    echo "load before: $(uptime)" >&2
    exec unshare -n -- "$0" --inner
fi

ip link set lo up
BIN=$CARGO_TARGET_DIR/release
SRV=() CLI=()
if [[ -n $PIN ]]; then
    SRV=(taskset -c "${PIN%%:*}") CLI=(taskset -c "${PIN##*:}")
    export SERVER_CPUS=${PIN%%:*}   # mooncake_bench.py's master and holder
fi
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# With PIN: how long one cache line takes from the server's CPU to the
# client's and back, before each client run (bench/examples/pingpong.rs),
# so that a round run while the host had put the two vCPUs in different
# L3 domains (every loopback transfer slower, docs/bench-notes/l3-domains.md)
# can be told from the others. One JSON line per sample in $PROBES.
PROBES=$OUT/probe.jsonl
probe() { # system
    [[ -n $PIN ]] || return 0
    local ns
    ns=$("$BIN/examples/pingpong" "${PIN%%:*}" "${PIN##*:}") || return 0
    echo "{\"system\": \"$1\", \"round\": ${ROUND:-1}, \"ns\": $ns}" >>"$PROBES"
}

bench() { # system api addr target [strata-bench flags...]
    local system=$1 api=$2 addr=$3 target=$4 b size n
    shift 4
    for c in $CLIENTS; do
        probe "$system"
        "${CLI[@]}" "$BIN/strata-bench" --target "$target" --addr "$addr" --api "$api" --system "$system" --sizes "$SIZES" \
            --keys "$KEYS" -c "$c" --duration "$DURATION" --json "$RESULTS" "$@" 2>>"$OUT/bench.log"
        for b in $BATCHES; do
            size=${b%%:*} n=${b##*:}
            probe "$system"
            "${CLI[@]}" "$BIN/strata-bench" --target "$target" --addr "$addr" --api "$api" --system "$system" --sizes "$size" \
                --keys "$((n * 4))" --batch "$n" -c "$c" --duration "$DURATION" --json "$RESULTS" "$@" 2>>"$OUT/bench.log"
        done
    done
}

# compare.sh's JSON row for an iperf3 client's JSON report.
iperf3_row() {
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["end"]["sum_received"]
print(json.dumps({"system": "iperf3", "scenario": "c1", "api": "tcp", "threads": 1, "procs": 1,
                  "size": 0, "op": "stream", "n": 1, "secs": r["seconds"], "ops_s": 0,
                  "GBps": r["bits_per_second"] / 8e9, "busy_GBps": r["bits_per_second"] / 8e9, "p50_us": 0, "p99_us": 0, "p999_us": 0,
                  "errors": 0, "mismatches": 0}))
PY
}

IPERF_CC=()
case $(cat /proc/sys/net/ipv4/tcp_congestion_control) in
    bbr*) IPERF_CC=(-C cubic) ;;
esac
echo "iperf3 under ${IPERF_CC[*]:-the host default congestion control}" >&2

one_round() {
    # strata
    SP=$(free_port); DP=$(free_port); MP=$(free_port)
    # Prefaulted (OPERATIONS.md, "Memory"), as Mooncake's segment is
    # allocated up front: so the first column does not pay the kernel's
    # first touch of the arena for the two after it.
    "${SRV[@]}" "$BIN/strata-server" --bind 127.0.0.1 --port "$SP" --data-port "$DP" --metrics-port "$MP" \
        --cpu-memory-prefault true 2>"$OUT/strata.log" &
    PIDS+=($!)
    wait_port "$SP"
    wait_log "$OUT/strata.log" "DRAM arena prefaulted"
    bench strata zerocopy "127.0.0.1:$SP" strata --cma false
    bench strata-cma zerocopy "127.0.0.1:$SP" strata --cma true
    bench strata inline "127.0.0.1:$SP" strata
    kill "${PIDS[-1]}"

    if [[ $SPIN_US != 0 ]]; then
        SP=$(free_port); DP=$(free_port); MP=$(free_port)
        "${SRV[@]}" "$BIN/strata-server" --bind 127.0.0.1 --port "$SP" --data-port "$DP" --metrics-port "$MP" \
            --cpu-memory-prefault true --busy-poll-us "$SPIN_US" 2>"$OUT/strata-spin.log" &
        PIDS+=($!)
        wait_port "$SP"
        wait_log "$OUT/strata-spin.log" "DRAM arena prefaulted"
        bench strata-spin zerocopy "127.0.0.1:$SP" strata --cma false --spin-us "$SPIN_US"
        kill "${PIDS[-1]}"
    fi

    # Redis 7, inline SET/GET through the same client
    RP=$(free_port)
    "${SRV[@]}" redis-server --bind 127.0.0.1 --port "$RP" --save '' --appendonly no --daemonize no \
        --proto-max-bulk-len 64mb >"$OUT/redis.log" 2>&1 &
    PIDS+=($!)
    wait_port "$RP"
    bench redis inline "127.0.0.1:$RP" redis
    kill "${PIDS[-1]}"

    # Mooncake Store: master + holder + bench, all started by the script.
    # A Mooncake call that fails is counted in its row (marked ! in the table);
    # it does not stop the comparison.
    mooncake() {
        probe mooncake
        "${CLI[@]}" "$VENV/bin/python" "$ROOT/bench/mooncake_bench.py" --json "$RESULTS" --duration "$DURATION" "$@" \
            2>>"$OUT/mooncake.log" || echo "mooncake_bench $*: some operations failed (see the table)" >&2
    }
    for c in $CLIENTS; do
        mooncake --sizes "$SIZES" --keys "$KEYS" -c "$c"
        for b in $BATCHES; do
            mooncake --sizes "${b%%:*}" --keys "$((${b##*:} * 4))" --batch "${b##*:}" -c "$c"
        done
    done

    # iperf3: one loopback stream, the ceiling for any TCP data plane,
    # under the congestion control strata's own sockets use (its
    # `tcp_congestion: auto`: CUBIC in place of a host default of BBR), so
    # that the ratio compares like with like. Redis and Mooncake keep the
    # host's, as they would for a user.
    IP=$(free_port)
    "${SRV[@]}" iperf3 -s -B 127.0.0.1 -p "$IP" >"$OUT/iperf3-server.log" 2>&1 &
    PIDS+=($!)
    wait_port "$IP"
    probe iperf3
    "${CLI[@]}" iperf3 -c 127.0.0.1 -p "$IP" -t 3 -J "${IPERF_CC[@]}" >"$OUT/iperf3.json"
    kill "${PIDS[-1]}"
    iperf3_row "$OUT/iperf3.json" >>"$RESULTS"
}

for r in $(seq "$ROUNDS"); do
    echo "round $r of $ROUNDS: $(uptime)" >&2
    : >"$OUT/round.jsonl"
    ROUND=$r RESULTS=$OUT/round.jsonl one_round
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        row = json.loads(line); row["round"] = int(sys.argv[2]); print(json.dumps(row))
' "$OUT/round.jsonl" "$r" >>"$RESULTS"
done

python3 "$ROOT/bench/compare_table.py" "$RESULTS" "$PROBES"
echo
echo "same-host ceiling (bench: rdma/examples/cma_loop.rs, one reader process):"
"$BIN/examples/cma_loop" "$DURATION"
if [[ $INDEX_KEYS != 0 ]]; then
    echo
    echo "index memory, $INDEX_KEYS keys (bench/index-memory.sh):"
    STRATA_SERVER="$BIN/strata-server" "$ROOT/bench/index-memory.sh" "$INDEX_KEYS"
fi
