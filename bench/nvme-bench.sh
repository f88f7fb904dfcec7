#!/usr/bin/env bash
# GETs served from the NVMe tier, next to what the device gives fio.
#
# Starts one release node with a small DRAM pool over an NVMe tier in
# $DIR (default: a new directory under /var/tmp, a real disk on Debian),
# writes a working set RATIO times DRAM with strata-bench, reads it back
# with uniformly random keys (so ~(1 - 1/RATIO) of GETs promote from NVMe),
# then measures fio's random 1 MiB O_DIRECT read bandwidth in the same
# directory. Prints both and their ratio; appends strata-bench JSON to
# $OUT.
#
#   bench/nvme-bench.sh                      psync engine
#   SSD_ENGINE=io_uring bench/nvme-bench.sh
#
# Settings: DRAM (256MiB), RATIO (4), SIZE (1MiB), CONC (4), SECS (20),
# SSD_ENGINE (psync), DIR, OUT (target/nvme-bench.json).
set -euo pipefail
cd "$(dirname "$0")/.."
DRAM=${DRAM:-256MiB}
RATIO=${RATIO:-4}
SIZE=${SIZE:-1MiB}
CONC=${CONC:-4}
SECS=${SECS:-20}
SSD_ENGINE=${SSD_ENGINE:-psync}
OUT=${OUT:-target/nvme-bench.json}
DIR=${DIR:-$(mktemp -d /var/tmp/strata-nvme-bench.XXXXXX)}
PORT=${PORT:-7479}

command -v fio >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null; }
cargo build --release -q -p strata-server -p strata-bench
BIN=${CARGO_TARGET_DIR:-target}/release

to_bytes() { numfmt --from=iec-i "${1%B}"; }
dram_bytes=$(to_bytes "$DRAM")
size_bytes=$(to_bytes "$SIZE")
keys=$(( dram_bytes * RATIO / size_bytes ))
pool=$(( dram_bytes * RATIO * 2 ))

"$BIN/strata-server" --port "$PORT" --metrics-port 0 --data-port 0 \
  --cpu-memory-pool-size "$DRAM" --ssd-path "$DIR" --ssd-pool-size "$pool" \
  --ssd-engine "$SSD_ENGINE" >"$DIR.log" 2>&1 &
PID=$!
trap 'rm -rf "$DIR" "$DIR.log" "$DIR.fio"; kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done

echo "== strata: $keys keys of $SIZE = ${RATIO}x DRAM ($DRAM), engine $SSD_ENGINE, $CONC clients"
"$BIN/strata-bench" --addr "127.0.0.1:$PORT" --api zerocopy --sizes "$SIZE" --keys "$keys" \
  --phases put --ops put -c "$CONC" --keep --scenario "nvme-${SSD_ENGINE}" --json "$OUT"
# Let the spill queue drain so the read phase measures reads only.
for _ in $(seq 300); do
  q=$(redis-cli -p "$PORT" info tiers | tr -d '\r' | awk -F: '/^nvme_spill_queued:/{print $2}')
  [ "$q" = 0 ] && break; sleep 0.1
done
before=$(redis-cli -p "$PORT" info tiers | tr -d '\r' | awk -F: '/^nvme_promoted:/{print $2}')
"$BIN/strata-bench" --addr "127.0.0.1:$PORT" --api zerocopy --sizes "$SIZE" --keys "$keys" \
  --phases get --duration "$SECS" -c "$CONC" --keep --scenario "nvme-${SSD_ENGINE}" --json "$OUT"
redis-cli -p "$PORT" info tiers | tr -d '\r' | grep -E '^(nvme_promoted|nvme_spilled|nvme_read_errors|nvme_spill_dropped|dram_keys):'
after=$(redis-cli -p "$PORT" info tiers | tr -d '\r' | awk -F: '/^nvme_promoted:/{print $2}')
echo "promotions during the GET phase: $(( after - before ))"
kill $PID; wait $PID 2>/dev/null || true

echo "== fio: random $SIZE O_DIRECT reads, $CONC jobs, in $DIR"
fio --name=nvme-read --directory="$DIR" --rw=randread --bs="$size_bytes" --direct=1 \
  --size=256M --numjobs="$CONC" --ioengine=psync --time_based --runtime="$SECS" \
  --group_reporting --output-format=terse --terse-version=3 >"$DIR.fio"
# terse v3: field 7 = read bandwidth in KiB/s.
fio_kib=$(cut -d';' -f7 "$DIR.fio")
echo "fio read: $(awk -v k="$fio_kib" 'BEGIN{printf "%.3f GB/s", k*1024/1e9}')"
strata=$(tail -n 1 "$OUT" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["GBps"], "GB/s, p99", r["p99_us"], "us")')
echo "strata GET (from NVMe ~$(( 100 - 100 / RATIO ))%): $strata"; strata=${strata%% *}
awk -v s="$strata" -v k="$fio_kib" 'BEGIN{printf "ratio strata/fio: %.2f\n", s/(k*1024/1e9)}'
rm -f "$DIR.fio"
