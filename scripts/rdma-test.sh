#!/usr/bin/env bash
# rdma-test.sh - the RDMA (verbs) tests, for real, on soft-RoCE.
#
# On the host: installs what the `rdma` feature needs to build (cmake,
# libclang-dev: sideway's sys crate builds a libibverbs loader with
# bindgen), builds strata-server and the RDMA test binary with
# `--features rdma`, then boots ONE soft-RoCE VM (scripts/softroce-vm.sh) and
# inside it runs:
#   - the transport unit tests (handshake codec, data-plane selection);
#   - client/tests/rdma_softroce.rs: two strata-server processes with
#     protocol rdma on rxe0 and rxe1, the SDK on the other device: PUT/GET of
#     4 KiB .. 4 MiB with content checks, wrong rkey, out-of-range read,
#     kill -9 of the PUT source mid-transfer, kill -9 of a node mid-GET;
#   - ib_read_bw and strata's READ throughput over the same devices, and
#     prints their ratio (docs/BENCHMARKS.md records it).
# Exits non-zero if anything fails, the VM included: it never skips.
#
# Settings: STRATA_RDMA_TARGET_DIR (target/rdma), STRATA_RDMA_BENCH_BYTES
# (bytes strata reads for the throughput figure, 32 MiB), and those of
# scripts/softroce-vm.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)

if [ "${1:-}" = --in-vm ]; then
  # ------------------------------------------------------------ inside the VM
  shift
  UNIT=$1 E2E=$2
  export STRATA_SERVER_BIN=$3
  export RUST_BACKTRACE=1
  step() { printf '\n== [vm] %s\n' "$*"; }
  step "rdma unit tests"
  "$UNIT" --test-threads=1 -q
  step "end to end over rxe0/rxe1"
  "$E2E" --include-ignored --test-threads=1 --skip helper_put_then_get_killed --skip read_throughput
  step "ib_read_bw (1 MiB messages), server rxe1, client rxe0"
  listening() { i=0; until ss -Hltn "sport = :18515" | grep -q .; do i=$((i+1)); [ $i -lt 300 ] || return 1; sleep 0.1; done; }
  BW=""
  for try in 1 2 3; do
    # perftest calibrates its clock against gettimeofday and can give up
    # under TCG on a loaded host ("Can't produce a report"): retry.
    ib_read_bw -d rxe1 -x "$SOFTROCE_GID1" -s 1048576 -n 32 > /tmp/bw-server.log 2>&1 & sp=$!
    listening
    if ib_read_bw -d rxe0 -x "$SOFTROCE_GID0" -s 1048576 -n 32 10.11.0.2 > /tmp/bw.log 2>&1; then
      wait $sp || true
      cat /tmp/bw.log
      BW=$(awk '$1=="1048576" {print $4}' /tmp/bw.log | tail -1)
      [ -n "$BW" ] && break
    fi
    wait $sp || true; cat /tmp/bw.log; echo "-- ib_read_bw failed (try $try)"
  done
  [ -n "$BW" ] || { echo "ib_read_bw produced no figure"; exit 1; }
  step "strata RDMA READ throughput (4 MiB reads, 1 MiB slices)"
  "$E2E" --include-ignored --exact read_throughput --nocapture --test-threads=1 | tee /tmp/strata-bw.log
  MBPS=$(sed -n 's/.*STRATA_READ_MBPS=\([0-9.]*\).*/\1/p' /tmp/strata-bw.log)
  [ -n "$MBPS" ] || { echo "no strata throughput figure"; exit 1; }
  # perftest's MB is 2^20 bytes; ours is 10^6.
  awk -v s="$MBPS" -v b="$BW" 'BEGIN {
    mib = s * 1e6 / 1048576
    printf "\nRDMA_READ_RATIO strata=%.2f MiB/s ib_read_bw=%.2f MiB/s ratio=%.2f\n", mib, b, mib / b }'
  exit 0
fi

# ------------------------------------------------------------------ on the host
step() { printf '\n== %s\n' "$*"; }
export CARGO_TARGET_DIR=${STRATA_RDMA_TARGET_DIR:-$ROOT/target/rdma}
case "$(cd "$(dirname "$CARGO_TARGET_DIR")" && pwd -P)/" in
  "$ROOT"/*) ;;
  *) echo "STRATA_RDMA_TARGET_DIR must lie inside the repository (the VM sees only it)"; exit 2;;
esac
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  step "installing ${need[*]} (to build the rdma feature)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends --no-remove "${need[@]}" >/dev/null
fi
step "cargo clippy --features rdma -D warnings"
cargo clippy -q -p strata-rdma -p strata-server -p strata-client --all-targets --features \
  strata-rdma/rdma,strata-server/rdma,strata-client/rdma -- -D warnings
step "building with --features rdma (into $CARGO_TARGET_DIR)"
cargo build -q -p strata-server --features rdma
test_bin() {   # $1.. = cargo test selection; prints the executable
  cargo test -q "$@" --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
UNIT=$(test_bin -p strata-rdma --features rdma --lib)
E2E=$(test_bin -p strata-client --features rdma --test rdma_softroce)
[ -x "$UNIT" ] && [ -x "$E2E" ] || { echo "test binaries not built"; exit 1; }
step "booting the soft-RoCE VM"
start=$(date +%s)
scripts/softroce-vm.sh -- scripts/rdma-test.sh --in-vm "$UNIT" "$E2E" "$CARGO_TARGET_DIR/debug/strata-server"
echo "soft-RoCE VM step passed in $(( $(date +%s) - start )) s"
