#!/usr/bin/env bash
# The Python zero-copy path next to the Rust client and Mooncake, same
# machine, same workload (put phase, then random gets; every value
# verified): strata-bench --api zerocopy (Rust), python/bench/zero_copy.py
# (strata's Python SDK, release build, through the Mooncake facade with
# registered buffers) and bench/mooncake_bench.py (Mooncake Store's Python
# put_from/get_into). Rust and Python alternate for $ROUNDS rounds and the
# table shows each one's median, so load drifts hit both alike.
#
# Setup (packages, venvs, release builds) runs first, with network; the
# measurements run inside `unshare -n` (only `lo`), because Mooncake's
# listeners bind 0.0.0.0. Facts about Mooncake: /work/shared/peers/mooncake.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$CARGO_TARGET_DIR/pycompare}
RESULTS=${RESULTS:-$OUT/results.jsonl}
PYVENV=${PYVENV:-$CARGO_TARGET_DIR/pybench-venv}
MCVENV=${MCVENV:-$CARGO_TARGET_DIR/mooncake-venv}
SIZES=${SIZES:-1MiB}
CLIENTS=${CLIENTS:-1}
DURATION=${DURATION:-2}   # seconds per phase
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-64}
CMA=${CMA:-true}          # SDK path: false keeps Rust and Python on the TCP data plane
export OUT RESULTS PYVENV MCVENV SIZES CLIENTS DURATION ROUNDS KEYS CMA
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

if [[ "${1:-}" != --inner ]]; then
    need_packages libibverbs1 libnuma1 libcurl4
    mooncake_venv "$MCVENV"
    [[ -x $PYVENV/bin/python ]] || python3 -m venv "$PYVENV"
    "$PYVENV/bin/pip" install -q --disable-pip-version-check numpy "$ROOT/python"   # the documented install (release)
    (cd "$ROOT" && cargo build --release -q -p strata-server -p strata-bench)
    mkdir -p "$OUT"
    : >"$RESULTS"
    echo "load before: $(uptime)" >&2
    exec unshare -n -- "$0" --inner
fi

ip link set lo up
BIN=$CARGO_TARGET_DIR/release

SP=$(free_port); DP=$(free_port); MP=$(free_port)
# Prefaulted, so that the first run (Rust's) does not pay the arena's
# first touch for the others (docs/bench-notes/prefault.md).
"$BIN/strata-server" --bind 127.0.0.1 --port "$SP" --data-port "$DP" --metrics-port "$MP" \
    --cpu-memory-prefault true 2>"$OUT/strata.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_port "$SP"
wait_log "$OUT/strata.log" "DRAM arena prefaulted"

for round in $(seq "$ROUNDS"); do
    for c in $CLIENTS; do
        "$BIN/strata-bench" --target strata --addr "127.0.0.1:$SP" --api zerocopy --system strata \
            --sizes "$SIZES" --keys "$KEYS" -c "$c" --duration "$DURATION" --json "$RESULTS" \
            2>>"$OUT/bench.log" >/dev/null
        "$PYVENV/bin/python" "$ROOT/python/bench/zero_copy.py" --addr "127.0.0.1:$SP" --sizes "$SIZES" \
            --keys "$KEYS" -c "$c" --duration "$DURATION" --json "$RESULTS" >/dev/null
        # The SDK path alone: no per-read verification on either side.
        "$BIN/strata-bench" --target strata --addr "127.0.0.1:$SP" --api zerocopy --system strata-noverify \
            --verify false --cma "$CMA" --sizes "$SIZES" --keys "$KEYS" -c "$c" --duration "$DURATION" \
            --json "$RESULTS" 2>>"$OUT/bench.log" >/dev/null
        "$PYVENV/bin/python" "$ROOT/python/bench/zero_copy.py" --raw --cma "$CMA" --addr "127.0.0.1:$SP" \
            --sizes "$SIZES" --keys "$KEYS" -c "$c" --duration "$DURATION" --json "$RESULTS" >/dev/null
    done
done
for c in $CLIENTS; do
    "$MCVENV/bin/python" "$ROOT/bench/mooncake_bench.py" --sizes "$SIZES" --keys "$KEYS" -c "$c" \
        --duration "$DURATION" --json "$RESULTS" 2>>"$OUT/mooncake.log" >/dev/null
done

python3 - "$RESULTS" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = [r for r in rows if r["errors"] or r["mismatches"]]
cells = {}
for r in rows:
    cells.setdefault((r["size"], r["op"], r["threads"], r["system"]), []).append(r)
keys = sorted({k[:3] for k in cells}, key=lambda k: (k[0], k[1] != "put", k[2]))

def med(key, system, field):
    rs = cells.get(key + (system,))
    return statistics.median(r[field] for r in rs) if rs else float("nan")

def table(title, columns, ratio):
    print(title)
    print(f"{'size':>8} {'op':<4} {'c':>2} | " + " | ".join(f"{name:>14} {'p50us':>6}" for name, _ in columns)
          + f" | {ratio[0]:>9}")
    for k in keys:
        cols = " | ".join(f"{med(k, s, 'GBps'):>14.3f} {med(k, s, 'p50_us'):>6.0f}" for _, s in columns)
        print(f"{k[0]:>8} {k[1]:<4} {k[2]:>2} | {cols} | {med(k, ratio[1], 'GBps') / med(k, ratio[2], 'GBps'):>9.2f}")
    print()

table("Shared workload (fill + verify every value), GB/s:",
      [("Rust", "strata"), ("Python", "strata-python"), ("Mooncake", "mooncake")],
      ("Py/Rust", "strata-python", "strata"))
table(f"SDK path alone (no per-read verification; cma {os.environ['CMA']}), GB/s:",
      [("Rust", "strata-noverify"), ("Python", "strata-python-raw")],
      ("Py/Rust", "strata-python-raw", "strata-noverify"))
print(f"rounds per cell: {max(len(v) for v in cells.values())}; cells with errors: {len(bad)}")
sys.exit(1 if bad else 0)
PY
