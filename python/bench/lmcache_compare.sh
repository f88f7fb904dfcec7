#!/usr/bin/env bash
# LMCache's own engine storing and retrieving one prompt's KV through three
# remote backends, side by side on this machine: strata (the plugin config
# of python/README.md), LMCache's Redis connector against Redis 7, and
# LMCache's Mooncake connector against Mooncake Store (master + a holder
# process owning the memory, as a deployment runs it). The workload is a
# Llama-3-8B-shaped cache (32 layers x 8 KV heads x 128, bf16) in 256-token
# chunks; a prompt of $TOKENS tokens (8192: 1 GiB of KV) is stored by one
# process and retrieved by a fresh one (its local CPU tier empty, so every
# chunk crosses the backend), and every retrieved tensor is compared with
# what was stored. Rounds alternate the systems and use a new prompt each,
# so load drift hits all alike; the table shows medians.
#
# Setup (engines venv, release builds, packages) runs with network; the
# measurements run inside `unshare -n` (only `lo`) since Mooncake's
# listeners bind 0.0.0.0.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$CARGO_TARGET_DIR/lmcache-compare}
RESULTS=${RESULTS:-$OUT/results.jsonl}
TOKENS=${TOKENS:-8192}
ROUNDS=${ROUNDS:-3}
SYSTEMS=${SYSTEMS:-strata redis mooncake}
MCPKGS=${MCPKGS:-$CARGO_TARGET_DIR/lmcache-compare-mooncake}
export OUT RESULTS TOKENS ROUNDS SYSTEMS MCPKGS
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

if [[ "${1:-}" != --inner ]]; then
    need_packages redis-server libibverbs1 libnuma1 libcurl4 libnl-3-200 libnl-route-3-200
    ENGINES=$(bash "$ROOT/scripts/engine-venv.sh")
    (cd "$ROOT" && cargo build --release -q -p strata-server)
    "$ENGINES/bin/pip" install -q --disable-pip-version-check maturin >/dev/null
    rm -rf "$OUT/wheel" && "$ENGINES/bin/maturin" build -q --release -m "$ROOT/python/Cargo.toml" -o "$OUT/wheel"
    "$ENGINES/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$OUT"/wheel/*.whl
    # Mooncake's client beside the engines venv, not in it (the venv is shared).
    [[ -d $MCPKGS/mooncake ]] || "$ENGINES/bin/pip" install -q --no-deps --target "$MCPKGS" \
        mooncake-transfer-engine-non-cuda==0.3.13.post1
    mkdir -p "$OUT"
    : >"$RESULTS"
    echo "load before: $(uptime)" >&2
    ENGINES=$ENGINES exec unshare -n -- "$0" --inner
fi

ip link set lo up
PY=$ENGINES/bin/python
DRIVER=$ROOT/python/tests/engines/lmcache_driver.py
export STRATA_LMC_SHAPE=32,8,128 PYTHONHASHSEED=0 PATH="$ENGINES/bin:$PATH"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT

SP=$(free_port)
"$CARGO_TARGET_DIR/release/strata-server" --port "$SP" --data-port 0 --metrics-port 0 \
    --cpu-memory-pool-size 6GiB 2>"$OUT/strata.log" & PIDS+=($!)
RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
    >"$OUT/redis.log" 2>&1 & PIDS+=($!)
MP=$(free_port); MMP=$(free_port)
MASTER=$(PYTHONPATH=$MCPKGS "$PY" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')/mooncake_master
"$MASTER" --rpc_address=127.0.0.1 --rpc_port="$MP" --metrics_host=127.0.0.1 --metrics_port="$MMP" \
    --enable_metric_reporting=false --enable_http_metadata_server=false >"$OUT/mooncake-master.log" 2>&1 & PIDS+=($!)
wait_port "$SP"; wait_port "$RP"; wait_port "$MP"
# The holder owns Mooncake's memory (6 GiB segment) and idles.
PYTHONPATH=$MCPKGS "$PY" -c "
import time
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 6 << 30, 16 << 20, 'tcp', '', '127.0.0.1:$MP') == 0
print('holder ready', flush=True)
time.sleep(10**6)" >"$OUT/mooncake-holder.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q 'holder ready' "$OUT/mooncake-holder.log" && break; sleep 0.1; done

base="chunk_size: 256
local_cpu: true
max_local_cpu_size: 3
remote_serde: naive"
cat >"$OUT/strata.yaml" <<YAML
$base
remote_storage_plugins: ["strata"]
extra_config:
  remote_storage_plugin.strata.module_path: strata.adapters.lmcache
  remote_storage_plugin.strata.class_name: StrataConnectorAdapter
  remote_storage_plugin.strata.seeds: "127.0.0.1:$SP"
YAML
cat >"$OUT/redis.yaml" <<YAML
$base
remote_url: "redis://127.0.0.1:$RP"
extra_config:
  save_chunk_meta: false
YAML
cat >"$OUT/mooncake.yaml" <<YAML
$base
remote_url: "mooncakestore://127.0.0.1:$MP/"
extra_config:
  save_chunk_meta: false
  local_hostname: "127.0.0.1"
  metadata_server: "P2PHANDSHAKE"
  master_server_address: "127.0.0.1:$MP"
  protocol: "tcp"
  device_name: ""
  global_segment_size: 0
  local_buffer_size: 2147483648
YAML

run() {  # system role seed
    local extra=()
    [[ $1 == mooncake ]] && extra=(env PYTHONPATH="$MCPKGS")
    local step
    if [[ $2 == store ]]; then step='[{"op":"store","prompt":{"seed":'$3',"tokens":'$TOKENS'}}]'
    else step='[{"op":"lookup","prompt":{"seed":'$3',"tokens":'$TOKENS'}},{"op":"retrieve","prompt":{"seed":'$3',"tokens":'$TOKENS'}}]'; fi
    "${extra[@]}" "$PY" "$DRIVER" "$OUT/$1.yaml" "$step" 2>>"$OUT/$1-driver.log" |
        sed -n 's/^RESULT //p' | SYSTEM=$1 python3 -c '
import json, os, sys
for line in sys.stdin:
    r = json.loads(line); r["system"] = os.environ["SYSTEM"]; print(json.dumps(r))' >>"$RESULTS"
}

idx=0
for round in $(seq "$ROUNDS"); do
    for system in $SYSTEMS; do
        seed=$((round * 100 + idx)); idx=$((idx + 1))
        run "$system" store "$seed"
        run "$system" read "$seed"
    done
done

python3 - "$RESULTS" "$TOKENS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tokens = int(sys.argv[2])
systems = list(dict.fromkeys(r["system"] for r in rows))
def med(system, op, field):
    vals = [r[field] for r in rows if r["system"] == system and r["op"] == op and field in r]
    return statistics.median(vals) if vals else float("nan")
bad = [r for r in rows if r.get("error") or r.get("errors") or (r["op"] == "retrieve" and not (r["equal"] and r["retrieved_tokens"] == tokens))
       or (r["op"] == "store" and r["remote_tokens"] != tokens) or (r["op"] == "lookup" and r["hit_tokens"] != tokens)]
print(f"{'system':<10} | {'store s':>8} {'GB/s':>6} | {'retrieve s':>10} {'GB/s':>6} | retrieve vs strata")
for s in systems:
    st, rt = med(s, "store", "seconds"), med(s, "retrieve", "seconds")
    b = med(s, "retrieve", "bytes")
    print(f"{s:<10} | {st:>8.3f} {b / st / 1e9:>6.2f} | {rt:>10.3f} {b / rt / 1e9:>6.2f} | {rt / med('strata', 'retrieve', 'seconds'):>6.2f}x slower")
print(f"rounds: {max(sum(1 for r in rows if r['system'] == s and r['op'] == 'retrieve') for s in systems)}; bad rows: {len(bad)}")
for r in bad[:5]:
    print("BAD", r)
sys.exit(1 if bad else 0)
PY
