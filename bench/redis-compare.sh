#!/usr/bin/env bash
# Side-by-side redis-benchmark runs against strata-server and Debian's
# redis-server on this machine, interleaved (strata, redis, strata, redis...)
# so that background noise hits both alike. Prints requests/s per run and
# the strata/Redis ratio of the medians.
#
#   bench/redis-compare.sh [rounds]        (default 3 rounds)
#   PIN=0:1 bench/redis-compare.sh 3       (servers on CPU 0, redis-benchmark on CPU 1)
#
# Each run also prints the server's CPU time per request (user + system,
# from /proc), the figure that does not depend on how the scheduler shares
# the host's cores between the server and redis-benchmark. With PIN the
# server has one core to itself and req/s follows that cost.
#
# Needs: a release strata-server (built here if missing), redis-server and
# redis-benchmark (apt-get install redis-server redis-tools). Everything binds
# 127.0.0.1 on free ports and is stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
TARGET=${CARGO_TARGET_DIR:-target}
[ -x "$TARGET/release/strata-server" ] || cargo build --release -p strata-server
command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install redis-server" >&2; exit 2; }

# shellcheck source=bench/lib.sh
source bench/lib.sh
PIN=${PIN:-}
SRV=() CLI=()
if [[ -n $PIN ]]; then
    SRV=(taskset -c "${PIN%%:*}") CLI=(taskset -c "${PIN##*:}")
fi
SP=$(free_port); RP=$(free_port)
"${SRV[@]}" "$TARGET/release/strata-server" --port "$SP" --metrics-port 0 --data-port 0 --cpu-memory-pool-size 4GiB >/dev/null 2>&1 &
SPID=$!
"${SRV[@]}" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --protected-mode yes >/dev/null 2>&1 &
RPID=$!
trap 'kill $SPID $RPID 2>/dev/null; wait 2>/dev/null' EXIT
for p in "$SP" "$RP"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
done

# name|requests per run|redis-benchmark arguments (run once for SET, once for GET)
CASES=(
  "4KiB pipelined|400000|-P 16 -c 50 -d 4096"
  "1MiB single|3000|-P 1 -c 1 -d 1048576"
)
echo "machine: $(nproc) cores, $(uname -r), $(date -u +%F)${PIN:+, pinned server:client $PIN}"
TICK_US=$((1000000 / $(getconf CLK_TCK)))
# CPU time (user + system) of process $1 so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "redis: $(redis-server --version | awk '{print $3}')"
results=$(mktemp)
for r in $(seq "$ROUNDS"); do
  for c in "${CASES[@]}"; do
    IFS='|' read -r name n args <<< "$c"
    for sys in strata redis; do
      port=$SP pid=$SPID; [ $sys = redis ] && port=$RP pid=$RPID
      # One operation per run, so that the CPU time is that operation's.
      for op in set get; do
        before=$(cpu_ticks "$pid")
        # shellcheck disable=SC2086
        line=$("${CLI[@]}" redis-benchmark -p "$port" -t "$op" -n "$n" $args -q 2>/dev/null |
          tr '\r' '\n' | grep "requests per second" | tail -1)
        after=$(cpu_ticks "$pid")
        rps=$(echo "$line" | awk '{print $2}')
        us=$(awk -v t=$((after - before)) -v k="$TICK_US" -v n="$n" 'BEGIN {printf "%.2f", t * k / n}')
        op=${op^^}
        echo "$name|$op|$sys|$rps|$us" >> "$results"
        printf 'round %s %-14s %-4s %-6s %12s req/s %6s us CPU/req\n' "$r" "$name" "$op" "$sys" "$rps" "$us"
      done
    done
  done
done
echo
echo "medians over $ROUNDS rounds (CPU: the server's user + system time per request;"
echo "cpu ratio = Redis's / strata's, above 1 when strata spends less)"
python3 - "$results" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, op, sys_, rps, us = line.strip().split('|')
    rows[(name, op, sys_)].append(float(rps))
    cpu[(name, op, sys_)].append(float(us))
print(f"{'case':16} {'op':4} {'strata':>12} {'redis':>12} {'ratio':>6} {'strata us':>10} {'redis us':>9} {'cpu ratio':>9}")
for (name, op) in sorted({(n, o) for n, o, _ in rows}):
    s = statistics.median(rows[(name, op, 'strata')]); r = statistics.median(rows[(name, op, 'redis')])
    su = statistics.median(cpu[(name, op, 'strata')]); ru = statistics.median(cpu[(name, op, 'redis')])
    ratio = f"{ru/su:9.2f}" if su > 0 else f"{'-':>9}"
    print(f"{name:16} {op:4} {s:12.0f} {r:12.0f} {s/r:6.2f} {su:10.2f} {ru:9.2f} {ratio}")
PY
rm -f "$results"
