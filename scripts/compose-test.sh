#!/usr/bin/env bash
# End-to-end test of docker-compose.yml in cluster mode: build the images,
# start etcd + 3 nodes + Prometheus, wait until every node sees ring_nodes:3,
# run the bench service (verified; its exit status counts), run PREFIX lookups
# on every node, check that Prometheus has all three scrape targets up and
# returns the key and PREFIX block hit rates, and that every PromQL expression
# of docker/grafana/strata-dashboard.json returns data (scripts/dashboard-check.py
# prints any that does not), write KEYS keys with known values through the
# cluster (redis-cli -c on the compose network, following -MOVED to the
# nodes' announced addresses), drive it from the host (redis-cli -c and the
# Python SDK, inline and zero-copy values, at those addresses), docker kill one node, wait until the survivors see ring_nodes:2,
# check that every acknowledged key reads back exactly through the survivors,
# and always tear everything down (down -v). Host ports: the compose defaults,
# or the first free set 100, 200, ... above them (Prometheus 19090 included).
#
# Usage: scripts/compose-test.sh [--no-build] [images.sh args...]
# Env:   COMPOSE="docker-compose" | "docker compose" (default: v2 if present)
#        COMPOSE_PROJECT_NAME (default strata-compose-test), KEYS (default 500)
#        STRATA_BENCH_BIN (strata-bench to put in the image; images.sh)
#        STRATA_BENCH_TOOL (auto | strata-bench | redis-cli; the bench service)
#        STRATA_COMPOSE_NET (the compose subnet's first three octets)
#        STRATA_COMPOSE_PYTHON (a Python with the strata SDK; default .venv's)
# Bounded: every step has its own timeout; < 5 min once strata-base exists.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD=1
IMAGE_ARGS=()
for arg in "$@"; do
    case "$arg" in
        --no-build) BUILD=0 ;;
        *) IMAGE_ARGS+=("$arg") ;;
    esac
done

if [ -z "${COMPOSE:-}" ]; then
    if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE="docker-compose"; fi
fi
read -ra COMPOSE_CMD <<<"$COMPOSE" # "docker compose" is two words
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-strata-compose-test}
KEYS=${KEYS:-500}
NODES=(node1 node2 node3)
# Host ports: the compose defaults (17381-3, 19381-3, 19090) when free, else
# the first free set among +100, +200, ... (other tests on this host may hold them).
port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
declare -A RESP_PORT METRICS_PORT
for off in 0 100 200 300 400 500 600 700 800 900; do
    ok=1
    port_free $((19090 + off)) || ok=0
    for n in 1 2 3; do
        port_free $((17380 + off + n)) && port_free $((19380 + off + n)) || ok=0
    done
    [ "$ok" = 1 ] && break
done
[ "$ok" = 1 ] || { echo "compose-test: no free host ports near 17381/19381/19090"; exit 2; }
PROM_PORT=$((19090 + off))
export STRATA_PROMETHEUS_PORT=$PROM_PORT
PROM=http://127.0.0.1:$PROM_PORT
DASHBOARD=docker/grafana/strata-dashboard.json
for n in 1 2 3; do
    RESP_PORT[node$n]=$((17380 + off + n)); METRICS_PORT[node$n]=$((19380 + off + n))
    export "STRATA_NODE${n}_PORT=${RESP_PORT[node$n]}" "STRATA_NODE${n}_METRICS_PORT=${METRICS_PORT[node$n]}"
done
declare -A POOL=([node1]=268435456 [node2]=402653184 [node3]=536870912)
# The nodes' fixed addresses on the compose network (docker-compose.yml),
# which they announce and this host reaches directly.
NET=${STRATA_COMPOSE_NET:-172.30.213}
declare -A ADDR=([node1]=$NET.11 [node2]=$NET.12 [node3]=$NET.13)
PY=${STRATA_COMPOSE_PYTHON:-$ROOT/.venv/bin/python}
VICTIM=node2

T_START=$SECONDS
FAILS=0
RESULTS=()
log() { printf '[compose-test %3ds] %s\n' "$((SECONDS - T_START))" "$*"; }
pass() { RESULTS+=("PASS $*"); log "PASS $*"; }
fail() { RESULTS+=("FAIL $*"); log "FAIL $*"; FAILS=$((FAILS + 1)); }
compose() { timeout 180 "${COMPOSE_CMD[@]}" "$@"; }
cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

UP=0
WORK=$(mktemp -d /tmp/strata-compose-test.XXXXXX)
cleanup() {
    local rc=$?
    rm -rf "$WORK"
    if [ "$UP" = 1 ]; then
        if [ "$FAILS" -gt 0 ] || [ "$rc" -ne 0 ]; then
            log "logs (last 20 lines per service):"
            timeout 30 "${COMPOSE_CMD[@]}" logs --no-color --tail=20 2>&1 | sed 's/^/    /' || true
        fi
        log "$COMPOSE down -v"
        timeout 120 "${COMPOSE_CMD[@]}" down -v --remove-orphans >/dev/null 2>&1 || log "down -v failed"
    fi
    echo
    echo "== compose-test summary ($COMPOSE, ${KEYS} keys, victim $VICTIM) =="
    printf '  %s\n' "${RESULTS[@]}"
    echo "  total ${SECONDS}s; $FAILS failure(s); exit status $(( rc == 0 && FAILS > 0 ? 1 : rc ))"
    if [ "$rc" -eq 0 ] && [ "$FAILS" -gt 0 ]; then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
trap 'RESULTS+=("FAIL aborted: line $LINENO: $BASH_COMMAND"); FAILS=$((FAILS + 1))' ERR

command -v redis-cli >/dev/null || { echo "compose-test: needs redis-cli on the host (apt-get install redis-tools)"; exit 2; }
command -v python3 >/dev/null || { echo "compose-test: needs python3 on the host (Prometheus answers and the dashboard are JSON)"; exit 2; }

# 1. images ---------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
    t=$SECONDS
    timeout 1800 scripts/images.sh "${IMAGE_ARGS[@]}"
    RESULTS+=("INFO images built in $((SECONDS - t))s")
fi

# 2. up -------------------------------------------------------------------------
t=$SECONDS
UP=1
timeout 120 "${COMPOSE_CMD[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
log "host ports: RESP ${RESP_PORT[node1]}-${RESP_PORT[node3]}, metrics ${METRICS_PORT[node1]}-${METRICS_PORT[node3]}, Prometheus $PROM_PORT"
upout=$(compose up -d 2>&1) || { echo "$upout" | grep -v "^Creating\|^Starting" | tail -n 15; fail "$COMPOSE up -d"; exit 1; }
declare -A CID
for s in etcd prometheus "${NODES[@]}"; do CID[$s]=$(compose ps -q "$s"); done
log "up -d returned after $((SECONDS - t))s"

# 3. health (bounded) -----------------------------------------------------------
deadline=$((SECONDS + 60))
while :; do
    unhealthy=()
    for s in etcd prometheus "${NODES[@]}"; do
        h=$(docker inspect -f '{{if ne .State.Status "running"}}{{.State.Status}}(exit {{.State.ExitCode}}){{else if .State.Health}}{{.State.Health.Status}}{{else}}running{{end}}' "${CID[$s]}" 2>/dev/null || echo gone)
        [ "$h" = healthy ] || unhealthy+=("$s=$h")
    done
    [ ${#unhealthy[@]} -eq 0 ] && break
    if [ $SECONDS -ge $deadline ] || grep -q 'exit\|gone' <<<"${unhealthy[*]}"; then
        fail "all healthy within 60s: ${unhealthy[*]}"
        exit 1
    fi
    sleep 1
done
pass "etcd + 3 nodes + prometheus healthy $((SECONDS - t))s after up"

# What the entrypoint decided (one line about the protocol).
proto_line=$(docker logs "${CID[node1]}" 2>&1 | grep -m1 -E 'soft-RoCE|protocol' || true)
RESULTS+=("INFO node1 entrypoint: ${proto_line:-<no protocol line>}")

# etcd answers inside the compose network.
if docker exec "${CID[etcd]}" etcdctl --endpoints=http://etcd:2379 put /strata/compose-test ok >/dev/null 2>&1 &&
    [ "$(docker exec "${CID[etcd]}" etcdctl --endpoints=http://etcd:2379 get --print-value-only /strata/compose-test)" = ok ]; then
    pass "etcd put/get at etcd:2379"
else
    fail "etcd put/get at etcd:2379"
fi

# Nodes reach each other by name (bind 0.0.0.0 inside the container).
if [ "$(docker exec "${CID[node3]}" redis-cli -h node1 -p 7379 ping 2>&1)" = PONG ]; then
    pass "node3 -> node1:7379 PING over the compose network"
else
    fail "node3 -> node1:7379 PING over the compose network"
fi

# Each node got its own pool size, and /metrics is on the loopback port.
for s in "${NODES[@]}"; do
    metrics=$(curl -fsS -m 5 "http://127.0.0.1:${METRICS_PORT[$s]}/metrics" || true)
    cap=$(awk '/^strata_tier_capacity_bytes\{tier="dram"\}/ {print $2; exit}' <<<"$metrics")
    if [ "${cap%.*}" = "${POOL[$s]}" ]; then
        pass "$s /metrics on 127.0.0.1:${METRICS_PORT[$s]}: dram capacity $cap"
    else
        fail "$s dram capacity ${cap:-?} (want ${POOL[$s]})"
    fi
done

# 4. the ring: every node sees all three (bounded) ------------------------------
# ring_nodes / etcd_healthy from /health (INFO has no cluster section yet),
# repair figures from /metrics. Arguments: node name, field.
info_of() {
    case "$2" in
        ring_nodes | etcd_healthy)
            curl -fsS -m 3 "http://127.0.0.1:${METRICS_PORT[$1]}/health" 2>/dev/null | sed -n "s/.*\"$2\":\([a-z0-9]*\).*/\1/p" ;;
        *) curl -fsS -m 3 "http://127.0.0.1:${METRICS_PORT[$1]}/metrics" 2>/dev/null | awk -v m="strata_$2_total" '$1 == m { print $2 }' ;;
    esac
}
wait_ring() { # wait_ring WANT SECONDS NODE... ; prints the seconds it took
    local want=$1 limit=$2 t0 n ok
    t0=$(date +%s%N)
    shift 2
    while :; do
        ok=1
        for n in "$@"; do [ "$(info_of "$n" ring_nodes)" = "$want" ] || ok=0; done
        [ "$ok" = 1 ] && break
        [ $(( ($(date +%s%N) - t0) / 1000000000 )) -ge "$limit" ] && return 1
        sleep 0.2
    done
    awk -v ns=$(( $(date +%s%N) - t0 )) 'BEGIN { printf "%.1f", ns / 1e9 }'
}
t=$SECONDS
if took=$(wait_ring 3 60 "${NODES[@]}"); then
    pass "ring_nodes:3 on node1..3 ${took}s after healthy ($((SECONDS - T_START))s since start)"
else
    states=""
    for s in "${NODES[@]}"; do states+=" $s=$(info_of "$s" ring_nodes)/etcd_healthy=$(info_of "$s" etcd_healthy)"; done
    fail "ring_nodes:3 on every node within 60s:$states"
    exit 1
fi
for s in "${NODES[@]}"; do
    health=$(curl -fsS -m 5 "http://127.0.0.1:${METRICS_PORT[$s]}/health" || true)
    if ! grep -q '"mode":"cluster"' <<<"$health" || ! grep -q '"etcd_healthy":true' <<<"$health" ||
        ! grep -q '"ring_nodes":3' <<<"$health"; then
        fail "$s /health: $health"
    fi
done
records=$(docker exec "${CID[etcd]}" etcdctl --endpoints=http://etcd:2379 get --prefix --keys-only /strata/ 2>&1 | grep -c /nodes/ || true)
nodes_line=$(cli "${RESP_PORT[node1]}" CLUSTER NODES 2>&1 | awk '{ print $2 }' | sort | paste -sd ' ' - || true)
if [ "$records" = 3 ] && grep -q "${ADDR[node1]}:7379.*${ADDR[node2]}:7379.*${ADDR[node3]}:7379" <<<"$nodes_line"; then
    pass "etcd holds 3 node records; CLUSTER NODES: $nodes_line"
else
    fail "etcd node records: $records (want 3); CLUSTER NODES: $nodes_line"
fi
# A key node1 does not own is redirected to another node's announced address.
moved=""
for i in $(seq 1 50); do
    r=$(cli "${RESP_PORT[node1]}" GET "probe:$i" 2>&1 || true)
    case "$r" in *MOVED*) moved=$r; break ;; esac
done
if grep -Eq "MOVED [0-9]+ (${ADDR[node2]}|${ADDR[node3]}):7379" <<<"$moved"; then
    pass "node1 redirects keys it does not own: $moved"
else
    fail "no -MOVED to ${ADDR[node2]}/${ADDR[node3]} from node1 for probe:1..50 (last reply: ${r:-?})"
fi

# 5. bench service (verified; exit status checked) -----------------------------
t=$SECONDS
benchout=$WORK/bench.out
if timeout 300 "${COMPOSE_CMD[@]}" --profile bench run --rm -T bench >"$benchout" 2>&1; then
    pass "bench service exited 0 in $((SECONDS - t))s: $(grep -E 'PASS|strata-bench' "$benchout" | tail -n 1)"
else
    rc=$?
    sed 's/^/    /' "$benchout" | tail -n 25
    fail "bench service exit status $rc after $((SECONDS - t))s"
fi
grep -E '^bench: (SET|GET|strata-bench)' "$benchout" | while read -r l; do echo "INFO $l"; done >"$WORK/bench.info" || true
mapfile -t lines <"$WORK/bench.info"
RESULTS+=("${lines[@]}")
# The bench container has its own pid namespace: its client must have stayed
# on the network data plane (no connection proven for cross-memory attach).
cma_ok=1 cma=""
for s in "${NODES[@]}"; do
    v=$(info_of "$s" cma_sessions)
    cma+=" $s=${v:-?}"
    [ "$v" = 0 ] || cma_ok=0
done
if [ "$cma_ok" = 1 ]; then
    pass "containers fall back from cross-memory attach: strata_cma_sessions_total$cma"
else
    fail "a client in another container used cross-memory attach (or no metric): strata_cma_sessions_total$cma"
fi

# 5b. Prometheus and the Grafana dashboard ----------------------------------
# prom EXPR: the first result's value of an instant query (empty if none).
prom() {
    curl -fsS -m 5 "$PROM/api/v1/query" --data-urlencode "query=$1" 2>/dev/null |
        python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true
}
# Scrape targets, one "instance=health" (and the last error) per target.
targets() {
    curl -fsS -m 5 "$PROM/api/v1/targets" 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    err = t.get("lastError") or ""
    print(t["labels"]["instance"] + "=" + t["health"] + ("(" + err + ")" if err else ""))' 2>/dev/null | sort | paste -sd ' ' - || true
}
t=$SECONDS
want_targets="node1:9379=up node2:9379=up node3:9379=up"
until [ "$(targets)" = "$want_targets" ]; do
    [ $((SECONDS - t)) -ge 30 ] && break
    sleep 0.5
done
got_targets=$(targets)
if [ "$got_targets" = "$want_targets" ]; then
    pass "prometheus (127.0.0.1:$PROM_PORT) scrape targets all up: $got_targets ($((SECONDS - t))s)"
else
    fail "prometheus scrape targets not all up within 30s: ${got_targets:-<no answer from $PROM/api/v1/targets>}"
fi
# PREFIX lookups on every node, on keys it owns (found by probing hash tags):
# SET blocks 1 and 2 of a chain, ask for 1..3, expect a run of 2; then GET
# blocks 1 and 3 (a hit and a miss; the bench's reads are all hits).
prefix_ok=0 prefix_bad=""
for s in "${NODES[@]}"; do
    owned=0
    for i in $(seq 1 200); do
        tag="{pf:$s:$i}"
        [[ "$(cli "${RESP_PORT[$s]}" PREFIX "$tag:1" 2>&1)" =~ ^[0-9]+$ ]] || continue
        cli "${RESP_PORT[$s]}" SET "$tag:1" b1 >/dev/null
        cli "${RESP_PORT[$s]}" SET "$tag:2" b2 >/dev/null
        r=$(cli "${RESP_PORT[$s]}" PREFIX "$tag:1" "$tag:2" "$tag:3" 2>&1 || true)
        if [ "$r" = 2 ]; then prefix_ok=$((prefix_ok + 1)); else prefix_bad+=" $s:PREFIX $tag:1..3=$r"; fi
        cli "${RESP_PORT[$s]}" GET "$tag:1" >/dev/null
        cli "${RESP_PORT[$s]}" GET "$tag:3" >/dev/null
        owned=$((owned + 1))
        [ "$owned" = 3 ] && break
    done
    [ "$owned" = 3 ] || prefix_bad+=" $s:owns $owned of 200 probed tags"
done
if [ -z "$prefix_bad" ]; then
    pass "PREFIX on every node: $prefix_ok lookups of 3 blocks found runs of 2"
else
    fail "PREFIX lookups ($prefix_ok good):$prefix_bad"
fi
# Hit rates over the run, once Prometheus has scraped every node after the
# lookups above (the newest sample of each target's up is later).
t=$SECONDS t_lookups=$(date +%s)
until [ -n "$(prom "min(timestamp(up{job=\"strata\"})) > $t_lookups")" ]; do
    [ $((SECONDS - t)) -ge 20 ] && break
    sleep 0.5
done
hit_q='sum(increase(strata_hits_total[5m])) / (sum(increase(strata_hits_total[5m])) + sum(increase(strata_misses_total[5m])))'
prefix_q='sum(increase(strata_prefix_blocks_found_total[5m])) / sum(increase(strata_prefix_blocks_requested_total[5m]))'
for q in "key hit rate|$hit_q" "PREFIX block hit rate|$prefix_q"; do
    name=${q%%|*} expr=${q#*|}
    v=$(prom "$expr")
    if awk -v v="$v" 'BEGIN { exit !(v != "" && v != "NaN" && v + 0 > 0 && v + 0 <= 1) }'; then
        pass "prometheus $name over the run: $v"
    else
        fail "prometheus $name: ${v:-no series} from: $expr"
    fi
done
# The dashboard parses and every expression in it returns data.
if python3 scripts/dashboard-check.py --interval 30s "$PROM" "$DASHBOARD" >"$WORK/dashboard.out" 2>&1; then
    pass "$DASHBOARD: $(tail -n 1 "$WORK/dashboard.out")"
else
    fail "$DASHBOARD: $(tail -n 1 "$WORK/dashboard.out")"
fi
while read -r l; do
    case "$l" in
        FAIL*) fail "${l#FAIL }" ;;
        PASS*) RESULTS+=("INFO ${l#PASS }") ;;
    esac
done <"$WORK/dashboard.out"

# 6. known values through the cluster (redis-cli -c on the compose network) ---
# The client runs in node1's container and follows -MOVED to the other nodes'
# addresses on the compose network. node1 is never the victim.
CLIENT=node1
value() { printf 'v:%05d:%s' "$1" "$(printf '%0*d' $((64 + $1 % 200)) "$1")"; }
for i in $(seq 1 "$KEYS"); do
    echo "SET ct:$i $(value "$i")" >>"$WORK/set.cmds"
    echo "GET ct:$i" >>"$WORK/get.cmds"
    value "$i" >>"$WORK/want"
    echo >>"$WORK/want"
done
cluster_cli() { # cluster_cli ENTRY_NODE < commands; one reply line per command
    # (redis-cli -c also prints "-> Redirected to slot ..." when it follows -MOVED)
    timeout 60 docker exec -i "${CID[$CLIENT]}" redis-cli -c -h "$1" -p 7379 | grep -v '^-> Redirected to slot '
}
t0=$(date +%s%N)
cluster_cli node1 <"$WORK/set.cmds" >"$WORK/set.out" 2>&1 || true
t1=$(date +%s%N)
# Acknowledged = the line for that SET is OK.
paste -d '\t' "$WORK/want" "$WORK/set.out" | awk -F '\t' '$2 == "OK" { print NR }' >"$WORK/acked"
ACKED=$(wc -l <"$WORK/acked")
read_check() { # read_check ENTRY_NODE -> how many acked keys read back equal
    cluster_cli "$1" <"$WORK/get.cmds" >"$WORK/got.$1" 2>&1 || true
    paste -d '\t' "$WORK/want" "$WORK/got.$1" |
        awk -F '\t' 'NR == FNR { ok[$1] = 1; next } (FNR in ok) && $1 == $2 { n++ } END { print n + 0 }' "$WORK/acked" -
}
equal=$(read_check node3)
t2=$(date +%s%N)
if [ "$ACKED" = "$KEYS" ] && [ "$equal" = "$KEYS" ]; then
    pass "$KEYS SET via redis-cli -c acked ($(( (t1 - t0) / 1000000 )) ms), all read back equal via node3 ($(( (t2 - t1) / 1000000 )) ms)"
else
    fail "acked $ACKED/$KEYS; read back equal $equal/$ACKED; first non-OK: $(grep -vx OK "$WORK/set.out" | head -n 2 | paste -sd '|' -)"
fi
per_node=""
for s in "${NODES[@]}"; do
    per_node+=" $s=$(cli "${RESP_PORT[$s]}" DBSIZE 2>/dev/null || echo ?)"
    per_node+="/pushes=$(info_of "$s" replica_pushes)/push_errors=$(info_of "$s" replica_push_errors)"
done
RESULTS+=("INFO before the kill, DBSIZE (owner + replica copies; want ~2x) / replica pushes / errors:$per_node")

# 6b. from the host, as a user on this machine would -----------------------------
# redis-cli -c follows -MOVED to the announced addresses; the Python SDK
# learns the slot map from one seed and writes values inline and (8 MiB,
# above inline_put_max) by the nodes pulling them from its data plane, then
# reads them back zero-copy.
host_moves=$(for i in $(seq 1 20); do echo "SET host:$i h$i"; echo "GET host:$i"; done |
    timeout 30 redis-cli -c -h "${ADDR[node1]}" -p 7379 2>&1 | grep -v '^-> Redirected' | paste -sd ' ' - || true)
want_moves=$(for i in $(seq 1 20); do printf 'OK h%s ' "$i"; done)
if [ "$host_moves " = "$want_moves" ]; then
    pass "from the host: 20 SET/GET via redis-cli -c -h ${ADDR[node1]} (following -MOVED)"
else
    fail "from the host: redis-cli -c -h ${ADDR[node1]}: ${host_moves:0:200}"
fi
if sdk_out=$(timeout 120 "$PY" - "${ADDR[node1]}:7379" <<'PYEOF' 2>&1
import sys
import numpy as np
import strata

c = strata.Client(sys.argv[1])
sizes = {"small": 4 << 10, "large": 8 << 20}
values = {k: np.random.default_rng(len(k)).integers(0, 256, n, dtype=np.uint8) for k, n in sizes.items()}
for k, v in values.items():
    c.put_from(f"sdk:{k}", v)
for k, v in values.items():
    out = np.zeros_like(v)
    assert c.get_into(f"sdk:{k}", out) == v.size, k
    assert np.array_equal(out, v), k
print("ok", {k: v.size for k, v in values.items()})
PYEOF
); then
    pass "from the host: Python SDK put_from/get_into 4 KiB and 8 MiB, byte-exact (${sdk_out##*$'\n'})"
else
    fail "from the host: Python SDK ($PY): $(tail -c 600 <<<"$sdk_out")"
fi
# The README's one-liner, as written.
readme_out=$(timeout 60 "$PY" -c 'import strata; c = strata.Client("'"${ADDR[node1]}"':7379"); c.put(b"k", b"v" * (8 << 20)); print(len(c.get(b"k")))' 2>&1 || true)
if [ "$readme_out" = 8388608 ]; then
    pass "from the host: the README's Python line reads back 8 MiB"
else
    fail "from the host: the README's Python line: $(tail -c 300 <<<"$readme_out")"
fi

# 7. kill one node; the survivors must serve every acknowledged key ----------
t_kill=$(date +%s%N)
docker kill "${CID[$VICTIM]}" >/dev/null
state=$(docker inspect -f '{{.State.Status}}' "${CID[$VICTIM]}")
if [ "$state" != running ] && ! cli "${RESP_PORT[$VICTIM]}" ping >/dev/null 2>&1; then
    pass "docker kill $VICTIM: container $state, 127.0.0.1:${RESP_PORT[$VICTIM]} refuses"
else
    fail "docker kill $VICTIM: container still $state / answering"
fi
SURVIVORS=()
for s in "${NODES[@]}"; do [ "$s" = "$VICTIM" ] || SURVIVORS+=("$s"); done
if took=$(wait_ring 2 30 "${SURVIVORS[@]}"); then
    pass "survivors ${SURVIVORS[*]} report ring_nodes:2 ${took}s after the kill (node_ttl_s 3)"
else
    fail "survivors did not reach ring_nodes:2 within 30s after the kill"
fi
FAILOVER_S=${took:-?}
# Every acknowledged key, exact value, through each survivor. Bounded retry so
# the figures say how long the hand-off took if the first pass misses any.
first=""
deadline=$((SECONDS + 20))
while :; do
    all=1
    counts=""
    for s in "${SURVIVORS[@]}"; do
        n=$(read_check "$s")
        counts+=" via $s $n/$ACKED"
        [ "$n" = "$ACKED" ] || all=0
    done
    [ -n "$first" ] || first=$counts
    [ "$all" = 1 ] && break
    [ $SECONDS -ge $deadline ] && break
    sleep 0.5
done
readable_s=$(awk -v ns=$(( $(date +%s%N) - t_kill )) 'BEGIN { printf "%.1f", ns / 1e9 }')
if [ "$all" = 1 ] && [ "$counts" = "$first" ]; then
    pass "after the kill every acked key reads back exactly:$counts (${readable_s}s after the kill)"
elif [ "$all" = 1 ]; then
    fail "acked keys missing right after ring_nodes:2 (first pass:$first); all readable ${readable_s}s after the kill"
else
    fail "acked keys lost after the kill:$counts (first pass:$first); example: $(paste -d '\t' "$WORK/want" "$WORK/got.${SURVIVORS[0]}" | awk -F '\t' '$1 != $2 { print "want " substr($1, 1, 12) "... got " substr($2, 1, 40); exit }')"
fi
# Still writable through the cluster.
after=$(seq 1 50 | awk '{ print "SET ct:after-kill:" $1 " x" $1 }' | cluster_cli node3 2>&1 | grep -cx OK || true)
if [ "$after" = 50 ]; then
    pass "after the kill the cluster accepts writes (50/50 SET via redis-cli -c)"
else
    fail "after the kill only $after/50 SET acknowledged"
fi
for s in "${SURVIVORS[@]}"; do
    RESULTS+=("INFO $s after the kill: ring_nodes=$(info_of "$s" ring_nodes) repair_runs=$(info_of "$s" repair_runs) repair_pushes=$(info_of "$s" repair_pushes) DBSIZE=$(cli "${RESP_PORT[$s]}" DBSIZE 2>/dev/null || echo ?)")
done
if [ "$all" = 1 ]; then readable="all acked keys readable ${readable_s}s after the kill"; else readable="NOT all acked keys readable ($counts) ${readable_s}s after the kill"; fi
RESULTS+=("INFO figures: $KEYS keys written, $ACKED acked; ring_nodes 3->2 in ${FAILOVER_S}s after docker kill; $readable")
