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
read -ra COMPOSE_CMD <<<"$COMPOSE" # "docker compose" is two words
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-strata-compose-test}
KEYS=${KEYS:-200}
NODES=(node1 node2 node3)
# Host ports: the compose defaults (17381-3, 19381-3) when free, else the first
# free set among +100, +200, ... (other tests on this host may hold them).
port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
declare -A RESP_PORT METRICS_PORT
for off in 0 100 200 300 400 500 600 700 800 900; do
    ok=1
    for n in 1 2 3; do
        port_free $((17380 + off + n)) && port_free $((19380 + off + n)) || ok=0
    done
    [ "$ok" = 1 ] && break
done
[ "$ok" = 1 ] || { echo "compose-test: no free host ports near 17381/19381"; exit 2; }
for n in 1 2 3; do
    RESP_PORT[node$n]=$((17380 + off + n)); METRICS_PORT[node$n]=$((19380 + off + n))
    export "STRATA_NODE${n}_PORT=${RESP_PORT[node$n]}" "STRATA_NODE${n}_METRICS_PORT=${METRICS_PORT[node$n]}"
done
declare -A POOL=([node1]=268435456 [node2]=402653184 [node3]=536870912)
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
    echo "== compose-test summary ($COMPOSE, ${KEYS} keys/node) =="
    printf '  %s\n' "${RESULTS[@]}"
    echo "  total ${SECONDS}s; $FAILS failure(s); exit status $(( rc == 0 && FAILS > 0 ? 1 : rc ))"
    if [ "$rc" -eq 0 ] && [ "$FAILS" -gt 0 ]; then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
trap 'RESULTS+=("FAIL aborted: line $LINENO: $BASH_COMMAND"); FAILS=$((FAILS + 1))' ERR

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
timeout 120 "${COMPOSE_CMD[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
log "host ports: RESP ${RESP_PORT[node1]}-${RESP_PORT[node3]}, metrics ${METRICS_PORT[node1]}-${METRICS_PORT[node3]}"
upout=$(compose up -d 2>&1) || { echo "$upout" | grep -v "^Creating\|^Starting" | tail -n 15; fail "$COMPOSE up -d"; exit 1; }
declare -A CID
for s in etcd "${NODES[@]}"; do CID[$s]=$(compose ps -q "$s"); done
log "up -d returned after $((SECONDS - t))s"

# 3. health (bounded) -----------------------------------------------------------
deadline=$((SECONDS + 60))
while :; do
    unhealthy=()
    for s in etcd "${NODES[@]}"; do
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
    metrics=$(curl -fsS -m 5 "http://127.0.0.1:${METRICS_PORT[$s]}/metrics" || true)
    cap=$(awk '/^strata_tier_capacity_bytes/ {print $2; exit}' <<<"$metrics")
    if [ "${cap%.*}" = "${POOL[$s]}" ]; then
        pass "$s /metrics on 127.0.0.1:${METRICS_PORT[$s]}: dram capacity $cap"
    else
        fail "$s dram capacity ${cap:-?} (want ${POOL[$s]})"
    fi
done

# 4. workload ------------------------------------------------------------------
value() { printf 'v:%s:%04d:%s' "$1" "$2" "$(printf '%0128d' "$2")"; }
resp_set() { # RESP for SET key value, for redis-cli --pipe
    # shellcheck disable=SC2016 # RESP's $ is literal
    printf '*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n' "${#1}" "$1" "${#2}" "$2"
}
same_lines() { # how many lines of stdin equal the same line of file $1
    paste -d '\t' "$1" - | awk -F '\t' '$1 == $2 && $1 != "" { n++ } END { print n + 0 }'
}
declare -A ACKED
for s in "${NODES[@]}"; do
    expected=$WORK/$s.expected
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
        fail "$s: acked ${ACKED[$s]}/$KEYS; read back $(same_lines "$expected" <"$got")/$KEYS equal"
    fi
    rm -f "$input" "$got"
done

# Throughput through the published port (small, bounded).
for s in "${NODES[@]}"; do
    rps=$(timeout 60 redis-benchmark -h 127.0.0.1 -p "${RESP_PORT[$s]}" -t set,get -n 20000 -c 16 -P 8 -d 128 -r 10000 -q 2>/dev/null |
        tr '\r' '\n' | grep -E '^(SET|GET): [0-9.]+ requests per second' |
        sed -E 's/^(SET|GET): ([0-9.]+) requests per second(, p50=([0-9.]+) msec)?.*/\1 \2 (p50 \4 ms)/' | paste -sd ';' - || true)
    RESULTS+=("INFO $s redis-benchmark -n 20000 -c 16 -P 8 -d 128, req/s: ${rps:-n/a}")
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
    keys=()
    for i in $(seq 1 "$KEYS"); do keys+=("ct:$s:$i"); done
    got=$(cli "${RESP_PORT[$s]}" MGET "${keys[@]}" 2>&1 || true)
    ok=$(same_lines "$WORK/$s.expected" <<<"$got")
    health=$(curl -fsS -m 5 "http://127.0.0.1:${METRICS_PORT[$s]}/health" 2>&1 || echo "health failed")
    if [ "$ok" = "${ACKED[$s]}" ] && [ "$(cli "${RESP_PORT[$s]}" ping)" = PONG ] && grep -q '"ok"' <<<"$health"; then
        pass "after kill, $s serves: $ok/${ACKED[$s]} acked keys read back equal, /health ok"
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
