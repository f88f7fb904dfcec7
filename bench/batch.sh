#!/usr/bin/env bash
# Batched transfers, the way engines move KV cache: strata zero-copy
# batches (put_many / get_many: MPUT and pipelined GETs, one data-plane
# round trip per connection) next to strata inline pipelined SET/GET and
# the same sizes one value at a time, against one local release node.
# Every value read is checked. Prints GB/s per case and the zero-copy /
# inline ratio.
#
#   bench/batch.sh [seconds per phase]      (default 3)
#   CMA=true bench/batch.sh                 (zero-copy by cross-memory attach)
#
# Needs a release build (made here if missing). Binds 127.0.0.1 only and
# stops what it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
TARGET=${CARGO_TARGET_DIR:-target}
[ -x "$TARGET/release/strata-server" ] && [ -x "$TARGET/release/strata-bench" ] ||
  cargo build --release -p strata-server -p strata-bench
# shellcheck source=bench/lib.sh
source bench/lib.sh
PORT=$(free_port)
"$TARGET/release/strata-server" --port "$PORT" --data-port 0 --metrics-port 0 \
  --cpu-memory-pool-size 4GiB >/dev/null 2>&1 &
SPID=$!
OUT=$(mktemp)
trap 'kill $SPID 2>/dev/null; wait 2>/dev/null; rm -f "$OUT"' EXIT
wait_port "$PORT"
run() {
  # Zero-copy over the TCP data plane unless CMA=true (the same-host path).
  "$TARGET/release/strata-bench" --addr "127.0.0.1:$PORT" --duration "$SECS" --json "$OUT" \
    --cma "${CMA:-false}" "$@" >/dev/null
}
for c in 1 4; do
  for api in zerocopy inline; do
    run --api $api -c $c --sizes 64KiB --keys 256 --batch 32
    run --api $api -c $c --sizes 256KiB --keys 128 --batch 32
    run --api $api -c $c --sizes 1MiB --keys 64 --batch 8
    run --api $api -c $c --sizes 4MiB --keys 32 --batch 4
    run --api $api -c $c --sizes 64KiB,1MiB,4MiB --keys 32
  done
done
python3 - "$OUT" <<'PY'
import json, sys
t = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    batch = r["scenario"].split("-b")[1] if "-b" in r["scenario"] else "1"
    t[(r["api"], r["threads"], batch, r["size"], r["op"])] = r["GBps"]
print(f"{'c':>2} {'batch':>10} {'op':4} {'zero-copy':>9} {'inline':>7} {'ratio':>6}   {'one at a time: zero-copy':>24} {'inline':>7}")
for c in (1, 4):
    for size, b in ((64 << 10, "32"), (256 << 10, "32"), (1 << 20, "8"), (4 << 20, "4")):
        for op in ("put", "get"):
            z, i = t[("zerocopy", c, b, size, op)], t[("inline", c, b, size, op)]
            z1, i1 = t.get(("zerocopy", c, "1", size, op)), t.get(("inline", c, "1", size, op))
            one = f"{z1:>24.2f} {i1:>7.2f}" if z1 is not None else f"{'':>24} {'':>7}"
            name = f"{b} x {size >> 10} KiB"
            print(f"{c:>2} {name:>10} {op:4} {z:>9.2f} {i:>7.2f} {z / i:>6.2f}   {one}")
PY
