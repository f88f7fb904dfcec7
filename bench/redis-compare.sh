#!/usr/bin/env bash
# Side-by-side redis-benchmark runs against strata-server and Debian's
# redis-server on this machine, interleaved (strata, redis, strata, redis...)
# so that background noise hits both alike. Prints requests/s per run and
# the strata/Redis ratio of the medians.
#
#   bench/redis-compare.sh [rounds]        (default 3 rounds)
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
SP=$(free_port); RP=$(free_port)
"$TARGET/release/strata-server" --port "$SP" --metrics-port 0 --data-port 0 --cpu-memory-pool-size 4GiB >/dev/null 2>&1 &
SPID=$!
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --protected-mode yes >/dev/null 2>&1 &
RPID=$!
trap 'kill $SPID $RPID 2>/dev/null; wait 2>/dev/null' EXIT
for p in "$SP" "$RP"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
done

# name|redis-benchmark arguments
CASES=(
  "4KiB pipelined|-t set,get -P 16 -c 50 -d 4096 -n 400000"
  "1MiB single|-t set,get -P 1 -c 1 -d 1048576 -n 3000"
)
echo "machine: $(nproc) cores, $(uname -r), $(date -u +%F)"
echo "redis: $(redis-server --version | awk '{print $3}')"
results=$(mktemp)
for r in $(seq "$ROUNDS"); do
  for c in "${CASES[@]}"; do
    name=${c%%|*}; args=${c#*|}
    for sys in strata redis; do
      port=$SP; [ $sys = redis ] && port=$RP
      # shellcheck disable=SC2086
      redis-benchmark -p "$port" $args -q 2>/dev/null | tr '\r' '\n' | grep "requests per second" |
        while read -r line; do
          op=${line%%:*}; rps=$(echo "$line" | awk '{print $2}')
          echo "$name|$op|$sys|$rps" >> "$results"
          printf 'round %s %-14s %-4s %-6s %12s req/s\n' "$r" "$name" "$op" "$sys" "$rps"
        done
    done
  done
done
echo
echo "median requests/s over $ROUNDS rounds"
python3 - "$results" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, op, sys_, rps = line.strip().split('|')
    rows[(name, op, sys_)].append(float(rps))
print(f"{'case':16} {'op':4} {'strata':>12} {'redis':>12} {'ratio':>6}")
for (name, op) in sorted({(n, o) for n, o, _ in rows}):
    s = statistics.median(rows[(name, op, 'strata')]); r = statistics.median(rows[(name, op, 'redis')])
    print(f"{name:16} {op:4} {s:12.0f} {r:12.0f} {s/r:6.2f}")
PY
rm -f "$results"
