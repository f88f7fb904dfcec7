#!/bin/bash
# strata-cluster-bench: the compose `bench` service. Waits for the ring, then
# runs a verified workload against the cluster and exits non-zero on any
# error or wrong value.
#
#   STRATA_BENCH_TOOL=strata-bench, or auto with strata-bench in the image:
#       strata-bench --addr $STRATA_BENCH_ADDR $STRATA_BENCH_ARGS (verification
#       is on by default). It routes by the cluster's slot map and follows
#       -MOVED. Default: zero-copy PUT/GET (the data plane on 0.0.0.0 with
#       this container's address in its descriptors, so the nodes can pull
#       PUT payloads from it), then inline SET/GET.
#   otherwise (no strata-bench, or STRATA_BENCH_TOOL=redis-cli):
#       writes STRATA_BENCH_KEYS keys of STRATA_BENCH_VALUE_SIZE bytes with
#       known values through `redis-cli -c` (follows -MOVED), entering the
#       cluster at every node in turn, then reads every key back and compares.
#
# Env: STRATA_BENCH_NODES (default node1:7379,node2:7379,node3:7379),
#      STRATA_BENCH_RING (ring_nodes to wait for; default: number of nodes),
#      STRATA_BENCH_KEYS (1000), STRATA_BENCH_VALUE_SIZE (1024),
#      STRATA_BENCH_TOOL (auto), STRATA_BENCH_ADDR (all nodes, as seeds), STRATA_BENCH_ARGS.
set -euo pipefail

IFS=, read -ra NODES <<<"${STRATA_BENCH_NODES:-node1:7379,node2:7379,node3:7379}"
RING=${STRATA_BENCH_RING:-${#NODES[@]}}
KEYS=${STRATA_BENCH_KEYS:-1000}
SIZE=${STRATA_BENCH_VALUE_SIZE:-1024}
TOOL=${STRATA_BENCH_TOOL:-auto}
log() { echo "bench: $*"; }
ms() { date +%s%3N; }
cli() { timeout 10 redis-cli -h "${1%:*}" -p "${1##*:}" "${@:2}"; }
# CLUSTER INFO's cluster_known_nodes is the ring this node sees (a standalone
# node: itself; its metadata_server is empty).
ring_of() { cli "$1" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }
standalone() { [ -z "$(cli "$1" CONFIG GET metadata_server 2>/dev/null | sed -n 2p)" ]; }

# 1. the ring: every node sees $RING nodes (bounded; a standalone node: itself)
deadline=$((SECONDS + ${STRATA_BENCH_WAIT_S:-60}))
for n in "${NODES[@]}"; do
    want=$RING
    if standalone "$n"; then want=1; fi
    until [ "$(ring_of "$n")" = "$want" ]; do
        if [ $SECONDS -ge $deadline ]; then
            log "$n: ring of $(ring_of "$n") node(s) after ${STRATA_BENCH_WAIT_S:-60}s (want $want)"; exit 1
        fi
        sleep 0.5
    done
done
log "ring complete on ${NODES[*]} ($want node(s) each)"

# 2. strata-bench --------------------------------------------------------------
have_bench=0
command -v strata-bench >/dev/null && have_bench=1
if [ "$TOOL" != redis-cli ] && [ "$have_bench" = 1 ]; then
    addr=${STRATA_BENCH_ADDR:-$(IFS=,; echo "${NODES[*]}")}
    if [ -n "${STRATA_BENCH_ARGS:-}" ]; then
        # shellcheck disable=SC2086 # STRATA_BENCH_ARGS is a list of flags
        set -- $STRATA_BENCH_ARGS
        log "strata-bench --addr $addr $*"
        exec strata-bench --addr "$addr" "$@"
    fi
    # Zero-copy: the nodes pull PUT payloads from this container's data
    # plane, so it listens on 0.0.0.0 and names this container's address.
    me=$(hostname -i | awk '{print $1}')
    # A count per phase: with phases only (`--ops put,get`) a put phase makes
    # its one pass over the keys and a get phase makes none, verifying nothing.
    zc=(--api zerocopy --data-bind 0.0.0.0:0 --data-advertise "$me" --sizes 4KiB,1MiB --keys 64 --phases put,get --ops 128 --verify true)
    log "strata-bench --addr $addr ${zc[*]}"
    strata-bench --addr "$addr" "${zc[@]}"
    inline=(--api inline --sizes 4KiB,64KiB --keys 64 --phases put,get --ops 128 --verify true)
    log "strata-bench --addr $addr ${inline[*]}"
    exec strata-bench --addr "$addr" "${inline[@]}"
elif [ "$TOOL" = strata-bench ]; then
    log "STRATA_BENCH_TOOL=strata-bench but strata-bench is not in this image (cargo build --release -p strata-bench, rerun scripts/images.sh)"
    exit 1
fi

# 3. redis-cli -c workload -----------------------------------------------------
why=" (STRATA_BENCH_TOOL=$TOOL)"
[ "$TOOL" = auto ] && [ "$have_bench" = 0 ] && why=" (no strata-bench in this image)"
log "redis-cli -c workload: $KEYS keys x $SIZE bytes, entering at ${NODES[*]}$why"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One reply line per command (redis-cli -c also prints "-> Redirected ..." lines).
rcli() { timeout 120 redis-cli -c -h "${1%:*}" -p "${1##*:}" | grep -v '^-> Redirected to slot '; }
pad=$(head -c "$SIZE" /dev/zero | tr '\0' 'x')
value() { local v="v:$1:"; v="$v${pad:${#v}}"; printf '%s' "${v:0:$SIZE}"; }
# One command file and one expectation file per entry node (key i -> node i % n).
for ((i = 0; i < KEYS; i++)); do
    e=$((i % ${#NODES[@]}))
    v=$(value "$i")
    echo "SET bench:redis-cli:$i $v" >>"$work/set.$e"
    echo "GET bench:redis-cli:$i" >>"$work/get.$e"
    echo "$v" >>"$work/want.$e"
done
t0=$(ms)
for e in "${!NODES[@]}"; do
    [ -s "$work/set.$e" ] || continue
    n=${NODES[$e]}
    rcli "$n" <"$work/set.$e" >"$work/setout.$e" 2>&1 &
done
wait
t1=$(ms)
acked=$(cat "$work"/setout.* | grep -cx OK || true)
for e in "${!NODES[@]}"; do
    [ -s "$work/get.$e" ] || continue
    n=${NODES[$e]}
    rcli "$n" <"$work/get.$e" >"$work/got.$e" 2>&1 &
done
wait
t2=$(ms)
equal=0
for e in "${!NODES[@]}"; do
    [ -s "$work/want.$e" ] || continue
    k=$(paste -d '\t' "$work/want.$e" "$work/got.$e" | awk -F '\t' '$1 == $2 { n++ } END { print n + 0 }')
    equal=$((equal + k))
done
rate() { awk -v n="$1" -v ms="$2" 'BEGIN { printf "%.0f", (ms > 0 ? n * 1000 / ms : 0) }'; }
log "SET: $acked/$KEYS acked in $((t1 - t0)) ms ($(rate "$KEYS" $((t1 - t0))) ops/s)"
log "GET: $equal/$KEYS equal in $((t2 - t1)) ms ($(rate "$KEYS" $((t2 - t1))) ops/s)"
if [ "$acked" != "$KEYS" ] || [ "$equal" != "$KEYS" ]; then
    log "FAILED; first replies that were not OK:"
    cat "$work"/setout.* | grep -vx OK | head -5 | sed 's/^/    /' || true
    exit 1
fi
# Leave the store as it was.
printf 'DEL bench:redis-cli:%d\n' $(seq 0 $((KEYS - 1))) | rcli "${NODES[0]}" >/dev/null 2>&1 || true
log "PASS: $KEYS keys written and read back verified through redis-cli -c"
