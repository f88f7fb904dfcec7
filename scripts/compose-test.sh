#!/usr/bin/env bash
# End-to-end test of docker-compose.yml: build the images, start etcd + 3
# nodes, write 200 keys into each node through the published loopback ports,
# read them back, kill one node, check the survivors keep serving every key
# they acknowledged, and always tear everything down (down -v).
#
# Usage: scripts/compose-test.sh [--no-build] [images.sh args...]
# Env:   COMPOSE="docker-compose" | "docker compose" (default: v2 if present)
#        COMPOSE_PROJECT_NAME (default strata-compose-test), KEYS (default 200)
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
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-strata-compose-test}
KEYS=${KEYS:-200}
NODES=(node1 node2 node3)
declare -A RESP_PORT=([node1]=17381 [node2]=17382 [node3]=17383)
declare -A METRICS_PORT=([node1]=19381 [node2]=19382 [node3]=19383)
declare -A POOL=([node1]=268435456 [node2]=402653184 [node3]=536870912)
VICTIM=node2

T_START=$SECONDS
FAILS=0
RESULTS=()
log() { printf '[compose-test %3ds] %s\n' "$((SECONDS - T_START))" "$*"; }
pass() { RESULTS+=("PASS $*"); log "PASS $*"; }
fail() { RESULTS+=("FAIL $*"); log "FAIL $*"; FAILS=$((FAILS + 1)); }
compose() { timeout 180 $COMPOSE "$@"; }
cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

UP=0
cleanup() {
    local rc=$?
    if [ "$UP" = 1 ]; then
        if [ "$FAILS" -gt 0 ] || [ "$rc" -ne 0 ]; then
            log "logs (last 20 lines per service):"
            timeout 30 $COMPOSE logs --no-color --tail=20 2>&1 | sed 's/^/    /' || true
        fi
        log "$COMPOSE down -v"
        timeout 120 $COMPOSE down -v --remove-orphans >/dev/null 2>&1 || log "down -v failed"
    fi
    echo
    echo "== compose-test summary ($COMPOSE, ${KEYS} keys/node) =="
    printf '  %s\n' "${RESULTS[@]}"
    echo "  total ${SECONDS}s; $FAILS failure(s)"
    if [ "$rc" -eq 0 ] && [ "$FAILS" -gt 0 ]; then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

command -v redis-cli >/dev/null || { echo "compose-test: needs redis-cli on the host (apt-get install redis-tools)"; exit 2; }

# 1. images ---------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
    t=$SECONDS
    timeout 1800 scripts/images.sh "${IMAGE_ARGS[@]}"
    RESULTS+=("INFO images built in $((SECONDS - t))s")
fi

# 2. up -------------------------------------------------------------------------
t=$SECONDS
UP=1
timeout 120 $COMPOSE down -v --remove-orphans >/dev/null 2>&1 || true
compose up -d >/dev/null 2>&1 || { fail "$COMPOSE up -d"; exit 1; }
declare -A CID
for s in etcd "${NODES[@]}"; do CID[$s]=$(compose ps -q "$s"); done
log "up -d returned after $((SECONDS - t))s"

# 3. health (bounded) -----------------------------------------------------------
deadline=$((SECONDS + 60))
while :; do
    unhealthy=()
    for s in etcd "${NODES[@]}"; do
        h=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "${CID[$s]}" 2>/dev/null || echo gone)
        [ "$h" = healthy ] || unhealthy+=("$s=$h")
    done
    [ ${#unhealthy[@]} -eq 0 ] && break
    if [ $SECONDS -ge $deadline ]; then fail "health within 60s: ${unhealthy[*]}"; exit 1; fi
    sleep 1
done
pass "etcd + 3 nodes healthy $((SECONDS - t))s after up"

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
    cap=$(curl -fsS "http://127.0.0.1:${METRICS_PORT[$s]}/metrics" | awk '/^strata_tier_capacity_bytes/ {print $2; exit}')
    if [ "${cap%.*}" = "${POOL[$s]}" ]; then
        pass "$s /metrics on 127.0.0.1:${METRICS_PORT[$s]}: dram capacity $cap"
    else
        fail "$s dram capacity ${cap:-?} (want ${POOL[$s]})"
    fi
done

# 4. workload ------------------------------------------------------------------
value() { printf 'v:%s:%04d:%s' "$1" "$2" "$(printf '%0128d' "$2")"; }
resp_set() { # RESP for SET key value, for redis-cli --pipe
    printf '*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n' "${#1}" "$1" "${#2}" "$2"
}
declare -A ACKED
for s in "${NODES[@]}"; do
    expected=$(mktemp)
    input=$(mktemp)
    for i in $(seq 1 "$KEYS"); do
        resp_set "ct:$s:$i" "$(value "$s" "$i")" >>"$input"
        value "$s" "$i" >>"$expected"
        echo >>"$expected"
    done
    t0=$(date +%s%N)
    out=$(timeout 30 redis-cli -h 127.0.0.1 -p "${RESP_PORT[$s]}" --pipe <"$input" 2>&1 || true)
    t1=$(date +%s%N)
    errors=$(sed -n 's/.*errors: \([0-9]*\), replies: \([0-9]*\).*/\1/p' <<<"$out")
    replies=$(sed -n 's/.*errors: \([0-9]*\), replies: \([0-9]*\).*/\2/p' <<<"$out")
    ACKED[$s]=$(( ${replies:-0} - ${errors:-0} ))
    keys=()
    for i in $(seq 1 "$KEYS"); do keys+=("ct:$s:$i"); done
    got=$(mktemp)
    cli "${RESP_PORT[$s]}" MGET "${keys[@]}" >"$got" 2>&1 || true
    t2=$(date +%s%N)
    if [ "${ACKED[$s]}" = "$KEYS" ] && cmp -s "$expected" "$got"; then
        pass "$s: $KEYS SET acked ($(( (t1 - t0) / 1000000 )) ms pipelined), all $KEYS read back equal ($(( (t2 - t1) / 1000000 )) ms MGET)"
    else
        fail "$s: acked ${ACKED[$s]}/$KEYS; read back $(grep -cxFf "$expected" "$got" || true)/$KEYS equal"
    fi
    rm -f "$expected" "$input" "$got"
done

# Throughput through the published port (small, bounded).
for s in "${NODES[@]}"; do
    rps=$(timeout 60 redis-benchmark -h 127.0.0.1 -p "${RESP_PORT[$s]}" -t set,get -n 20000 -c 16 -P 8 -d 128 -r 10000 -q 2>/dev/null |
        tr '\r' '\n' | grep -E '^(SET|GET):' | sed 's/ requests per second.*//; s/: */=/' | tr '\n' ' ' || true)
    RESULTS+=("INFO $s redis-benchmark (-n 20000 -c 16 -P 8 -d 128) req/s: ${rps:-n/a}")
done

# 5. kill one node -------------------------------------------------------------
t=$SECONDS
docker kill "${CID[$VICTIM]}" >/dev/null
state=$(docker inspect -f '{{.State.Status}}' "${CID[$VICTIM]}")
if [ "$state" != running ] && ! cli "${RESP_PORT[$VICTIM]}" ping >/dev/null 2>&1; then
    pass "docker kill $VICTIM: container $state, 127.0.0.1:${RESP_PORT[$VICTIM]} refuses"
else
    fail "docker kill $VICTIM: container still $state / answering"
fi
sleep 1
for s in "${NODES[@]}"; do
    [ "$s" = "$VICTIM" ] && continue
    ok=0
    for i in $(seq 1 "$KEYS"); do
        [ "$(cli "${RESP_PORT[$s]}" GET "ct:$s:$i")" = "$(value "$s" "$i")" ] && ok=$((ok + 1))
    done
    health=$(curl -fsS -m 5 "http://127.0.0.1:${METRICS_PORT[$s]}/health" 2>&1 || echo "health failed")
    if [ "$ok" = "${ACKED[$s]}" ] && [ "$(cli "${RESP_PORT[$s]}" ping)" = PONG ] && grep -q '"ok"' <<<"$health"; then
        pass "after kill, $s serves: $ok/${ACKED[$s]} acked keys readable (single GETs), /health ok"
    else
        fail "after kill, $s: $ok/${ACKED[$s]} acked keys readable; health: $health"
    fi
    # Still writable.
    if [ "$(cli "${RESP_PORT[$s]}" SET "ct:$s:after-kill" x)" = OK ]; then
        pass "after kill, $s accepts writes"
    else
        fail "after kill, $s refuses writes"
    fi
done
RESULTS+=("INFO survivor checks took $((SECONDS - t))s")
