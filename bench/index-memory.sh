#!/usr/bin/env bash
# Memory per key: RSS of strata-server and of Debian's redis-server before
# and after the same N pipelined `SET key value` (16-byte keys
# `key:000000000123`, 16-byte values), divided by N. The figure covers
# everything a key costs: index, metadata and the value's own storage (for
# strata the arena pages the values touched; for Redis its allocations).
#
#   bench/index-memory.sh [keys]        (default 1000000)
#
# STRATA_SERVER=path runs another strata-server binary (an older build, to
# compare).
#
# Needs: a release strata-server (built here if missing), python3;
# installs Debian's redis-server and redis-tools if missing. Everything
# binds 127.0.0.1 on free ports and is stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${1:-1000000}
TARGET=${CARGO_TARGET_DIR:-target}
BIN=${STRATA_SERVER:-$TARGET/release/strata-server}
[ -n "${STRATA_SERVER:-}" ] || [ -x "$BIN" ] || cargo build --release -p strata-server
# shellcheck source=bench/lib.sh
source bench/lib.sh
need_packages redis-server redis-tools
SP=$(free_port); RP=$(free_port)
# The arena is mapped lazily: only the pages values touch count in RSS.
"$BIN" --port "$SP" --metrics-port 0 --data-port 0 \
  --cpu-memory-pool-size 4GiB >/dev/null 2>&1 &
SPID=$!
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --protected-mode yes >/dev/null 2>&1 &
RPID=$!
trap 'kill $SPID $RPID 2>/dev/null; wait 2>/dev/null' EXIT
wait_port "$SP"; wait_port "$RP"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# The RESP stream of N SETs, written once and replayed into both servers.
STREAM=$(mktemp)
trap 'kill $SPID $RPID 2>/dev/null; wait 2>/dev/null; rm -f "$STREAM"' EXIT
python3 - "$KEYS" "$STREAM" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "wb", buffering=1 << 20) as f:
    for i in range(n):
        k = b"key:%012d" % i
        v = b"v%015d" % i
        f.write(b"*3\r\n$3\r\nSET\r\n$16\r\n%s\r\n$16\r\n%s\r\n" % (k, v))
PY

echo "machine: $(nproc) cores, $(uname -r), $(date -u +%F); redis $(redis-server --version | awk '{print $3}')"
echo "keys: $KEYS, 16-byte keys, 16-byte values"
declare -A PER
for sys in strata redis; do
  port=$SP; pid=$SPID
  [ $sys = redis ] && { port=$RP; pid=$RPID; }
  before=$(rss_kib "$pid")
  redis-cli -p "$port" --pipe < "$STREAM" | tail -1
  n=$(redis-cli -p "$port" dbsize)
  [ "$n" = "$KEYS" ] || { echo "$sys holds $n keys, expected $KEYS" >&2; exit 1; }
  sleep 1
  after=$(rss_kib "$pid")
  PER[$sys]=$(( (after - before) * 1024 / KEYS ))
  printf '%-6s RSS %8d KiB -> %8d KiB: %4d bytes per key\n' "$sys" "$before" "$after" "${PER[$sys]}"
done
python3 -c "import sys; print(f'strata/redis bytes per key: {int(sys.argv[1])/int(sys.argv[2]):.2f}')" "${PER[strata]}" "${PER[redis]}"
