#!/usr/bin/env bash
# The engines' own code moving one prompt's KV through strata and the
# systems people use today, side by side on this machine, every byte checked:
#
# 1. LMCache's engine (store, then lookup + retrieve in a fresh process)
#    through strata (python/README.md's plugin config), LMCache's Redis
#    connector against Redis 7, and LMCache's Mooncake connector against
#    Mooncake Store. 256-token chunks.
# 2. SGLang's HiCacheController (backup, then prefetch in a fresh process)
#    through strata's HiCache adapter (zero copy), SGLang's own Mooncake
#    backend on strata's mooncake.store drop-in, and the same Mooncake
#    backend on Mooncake Store. 64-token pages.
#
# Mooncake runs as deployed: a master plus a holder process owning the
# memory (the engine processes contribute none, so what the first process
# stored outlives it). The cache is Llama-3-8B-shaped (32 layers x 8 KV
# heads x 128, bf16); a prompt is $TOKENS tokens (8192: 1 GiB of KV).
# Rounds alternate the systems with a new prompt each, so load drift hits
# all alike; the tables show medians.
#
# Setup (engines venv, release builds, packages) runs with network; the
# measurements run inside `unshare -n` (only `lo`) since Mooncake's
# listeners bind 0.0.0.0.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$CARGO_TARGET_DIR/engines-compare}
RESULTS=${RESULTS:-$OUT/results.jsonl}
TOKENS=${TOKENS:-8192}
ROUNDS=${ROUNDS:-3}
SYSTEMS=${SYSTEMS:-strata redis mooncake}
SGL_SYSTEMS=${SGL_SYSTEMS:-strata strata-dropin mooncake}
MCPKGS=${MCPKGS:-$CARGO_TARGET_DIR/engines-compare-mooncake}
COMPAT=${COMPAT:-$CARGO_TARGET_DIR/engines-compare-compat}
export OUT RESULTS TOKENS ROUNDS SYSTEMS SGL_SYSTEMS MCPKGS COMPAT
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
    rm -rf "$COMPAT" && "$ENGINES/bin/pip" install -q --no-deps --target "$COMPAT" \
        "$ROOT/python/mooncake-compat"
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
    --cpu-memory-pool-size 4GiB 2>"$OUT/strata.log" & PIDS+=($!)
RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
    >"$OUT/redis.log" 2>&1 & PIDS+=($!)
# A private network namespace: Mooncake's default master port is free here.
MP=50051; MMP=$(free_port)
MASTER=$(PYTHONPATH=$MCPKGS "$PY" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')/mooncake_master
"$MASTER" --rpc_address=127.0.0.1 --rpc_port="$MP" --metrics_host=127.0.0.1 --metrics_port="$MMP" \
    --enable_metric_reporting=false --enable_http_metadata_server=false >"$OUT/mooncake-master.log" 2>&1 & PIDS+=($!)
wait_port "$SP"; wait_port "$RP"; wait_port "$MP"
# The holder owns Mooncake's memory (4 GiB segment) and idles.
PYTHONPATH=$MCPKGS "$PY" -c "
import time
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 4 << 30, 16 << 20, 'tcp', '', '127.0.0.1:$MP') == 0
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
  local_buffer_size: 1073741824
YAML

flush() {  # empties every store for the next prompt, so none evicts mid-round
    redis-cli -p "$SP" FLUSHALL >/dev/null
    redis-cli -p "$RP" FLUSHALL >/dev/null
    PYTHONPATH=$MCPKGS "$PY" -c "
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', '127.0.0.1:$MP') == 0
s.remove_all(True)
s.close()" >>"$OUT/mooncake-flush.log" 2>&1
}

tag() {  # engine system: adds both to each JSON line
    ENGINE=$1 SYSTEM=$2 python3 -c '
import json, os, sys
for line in sys.stdin:
    r = json.loads(line); r["engine"] = os.environ["ENGINE"]; r["system"] = os.environ["SYSTEM"]; print(json.dumps(r))'
}

lmc() {  # system write|read seed
    local extra=()
    [[ $1 == mooncake ]] && extra=(env PYTHONPATH="$MCPKGS")
    local step
    if [[ $2 == write ]]; then step='[{"op":"store","prompt":{"seed":'$3',"tokens":'$TOKENS'}}]'
    else step='[{"op":"lookup","prompt":{"seed":'$3',"tokens":'$TOKENS'}},{"op":"retrieve","prompt":{"seed":'$3',"tokens":'$TOKENS'}}]'; fi
    "${extra[@]}" "$PY" "$DRIVER" "$OUT/$1.yaml" "$step" 2>>"$OUT/$1-driver.log" |
        sed -n 's/^RESULT //p' | tag "lmcache" "$1" >>"$RESULTS"
}

idx=0
rounds() {  # runner "systems": each round, each system writes a new prompt and reads it back
    for round in $(seq "$ROUNDS"); do
        for system in $2; do
            seed=$((round * 100 + idx)); idx=$((idx + 1))
            "$1" "$system" write "$seed"
            "$1" "$system" read "$seed"
            flush
        done
    done
}
rounds lmc "$SYSTEMS"

SGL_DRIVER=$ROOT/python/tests/engines/sglang_driver.py
PAGE=64
export STRATA_SGL_SHAPE=$PAGE,32,8,128,$TOKENS
sgl() {  # system write|read seed
    local pythonpath="" seeds="127.0.0.1:$SP" backend=mooncake
    case $1 in
        strata) backend=strata ;;
        strata-dropin) pythonpath=$COMPAT ;;
        mooncake) pythonpath=$MCPKGS; seeds="127.0.0.1:$MP" ;;
    esac
    local sc='[{"name":"'$1'","backend":"'$backend'","pool":"mha","layout":"page_first","path":"v1","model":"bench-'$3'","seed":'$3',"pages":'$((TOKENS / PAGE))',"timed":true}]'
    PYTHONPATH=$pythonpath "$PY" "$SGL_DRIVER" "$2" "$seeds" "$sc" 2>>"$OUT/sglang-$1-driver.log" |
        sed -n 's/^RESULT //p' | tag "sglang" "$1" >>"$RESULTS"
}
rounds sgl "$SGL_SYSTEMS"

python3 - "$RESULTS" "$TOKENS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tokens = int(sys.argv[2])

def ok(r):
    if r.get("error") or r.get("errors"):
        return False
    if r["engine"] == "lmcache":
        return {"store": r.get("remote_tokens") == tokens, "lookup": r.get("hit_tokens") == tokens,
                "retrieve": r.get("equal") and r.get("retrieved_tokens") == tokens}.get(r["op"], True)
    if "backed_up_tokens" in r:
        return r["backed_up_tokens"] == tokens
    return r.get("loaded_tokens") == tokens and r.get("pages_equal") == tokens // 64

bad = [r for r in rows if not ok(r)]

def table(engine, put_op, get_op, put_name, get_name, base):
    sel = [r for r in rows if r["engine"] == engine and "seconds" in r]
    systems = list(dict.fromkeys(r["system"] for r in sel))
    def med(system, pred, field):
        vals = [r[field] for r in sel if r["system"] == system and pred(r)]
        return statistics.median(vals) if vals else float("nan")
    print(f"{engine}: {put_name} / {get_name} of a {tokens}-token prompt (medians)")
    print(f"{'system':<14} | {put_name + ' s':>9} {'GB/s':>6} | {get_name + ' s':>10} {'GB/s':>6} | {get_name} time vs {base}")
    for s in systems:
        pt, gt = med(s, put_op, "seconds"), med(s, get_op, "seconds")
        pb, gb = med(s, put_op, "bytes"), med(s, get_op, "bytes")
        print(f"{s:<14} | {pt:>9.3f} {pb / pt / 1e9:>6.2f} | {gt:>10.3f} {gb / gt / 1e9:>6.2f} | {gt / med(base, get_op, 'seconds'):>5.2f}x")
    print()

table("lmcache", lambda r: r["op"] == "store", lambda r: r["op"] == "retrieve", "store", "retrieve", "strata")
table("sglang", lambda r: "backed_up_tokens" in r, lambda r: "loaded_tokens" in r, "backup", "prefetch", "strata")
rounds = max(sum(1 for r in rows if r.get("op") == "retrieve" and r["system"] == s) for s in {r["system"] for r in rows})
print(f"rounds: {rounds}; bad rows: {len(bad)}")
for r in bad[:5]:
    print("BAD", r)
sys.exit(1 if bad else 0)
PY
