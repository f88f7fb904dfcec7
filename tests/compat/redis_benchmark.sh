#!/usr/bin/env bash
# Run redis-benchmark against $STRATA_HOST:$STRATA_PORT and fail unless every test
# completed without errors and reported a non-zero requests-per-second figure.
# Usage: STRATA_PORT=6379 tests/compat/redis_benchmark.sh
# Env: BENCH_TIMEOUT (seconds per run, default 300).
set -u -o pipefail
HOST=${STRATA_HOST:-127.0.0.1}
PORT=${STRATA_PORT:?STRATA_PORT is required}
LIMIT=${BENCH_TIMEOUT:-300}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fail=0

# redis-benchmark spins forever on a refused connection: check reachability first.
if ! out=$(timeout 10 redis-cli -h "$HOST" -p "$PORT" PING 2>&1) || [ "$out" != PONG ]; then
    echo "cannot reach server at $HOST:$PORT: $out" >&2; exit 2
fi

# run NAME "EXPECTED TESTS (|-separated)" redis-benchmark-args...
run() {
    local name=$1 tests=$2; shift 2
    local log=$TMP/$name.log rc
    echo "== $name: redis-benchmark -h $HOST -p $PORT $*"
    timeout "$LIMIT" redis-benchmark -h "$HOST" -p "$PORT" "$@" > "$log.raw" 2>&1; rc=$?
    tr '\r' '\n' < "$log.raw" | sed -e 's/^ *//' -e '/^$/d' > "$log"   # split progress updates
    grep -v ': rps=' "$log" | sed 's/^/   | /'
    local ok=1
    if [ $rc -eq 124 ]; then echo "FAIL: timed out after ${LIMIT}s"; ok=0
    elif [ $rc -ne 0 ]; then echo "FAIL: exit status $rc"; ok=0; fi
    if grep -nE 'Error|ERR|error|Could not connect|closed the connection' "$log" | sed 's/^/FAIL: error line: /' | grep .; then ok=0; fi
    grep -E '^WARNING' "$log" | sed 's/^/note: /'
    local t IFS='|'
    for t in $tests; do
        local rps
        rps=$(grep -F "$t: " "$log" | sed -nE 's/^.*: ([0-9.]+) requests per second.*$/\1/p' | tail -1)
        if [ -z "$rps" ]; then echo "FAIL: no result line for '$t'"; ok=0
        elif ! awk -v x="$rps" 'BEGIN { exit !(x > 0) }'; then echo "FAIL: '$t' reported $rps requests per second"; ok=0
        else echo "ok: $t $rps req/s"; fi
    done
    [ $ok = 1 ] || fail=1
}

run pipelined "SET|GET|MSET (10 keys)" -t set,get,mset -P 16 -c 50 -n 20000 -q
run large-1MiB "SET|GET" -t set,get -d 1048576 -n 200 -c 4 -q

if [ $fail = 0 ]; then echo "redis-benchmark: OK"; else echo "redis-benchmark: FAILED" >&2; exit 1; fi
