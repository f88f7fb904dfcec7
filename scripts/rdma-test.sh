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
#   - python/tests/rdma/vm_sdk.py: the Python SDK (a wheel built with the
#     rdma feature) with protocol="rdma" against an rdma node, byte-exact
#     up to 4 MiB, and the error a TCP client gets from that node;
#   - ib_read_bw and strata's READ throughput over the same devices, and
#     prints their ratio (docs/BENCHMARKS.md, "RDMA READ on soft-RoCE vs
#     ib_read_bw", records it).
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
  UNIT=$1 E2E=$2 PYSDK=$4
  export STRATA_SERVER_BIN=$3
  export RUST_BACKTRACE=1
  step() { printf '\n== [vm] %s\n' "$*"; }
  step "rdma unit tests"
  # The spinner's tests time sleeps of a few ms, which an emulated guest
  # stretches past their windows; cargo test runs them on the host.
  "$UNIT" --test-threads=1 -q --skip spin::
  step "end to end over rxe0/rxe1"
  "$E2E" --include-ignored --test-threads=1 --skip helper_put_then_get_killed --skip read_throughput
  step "the Python SDK over rdma (python/tests/rdma/vm_sdk.py)"
  # The guest's packages are unpacked, not installed: Debian's python3
  # symlink comes from a maintainer script, so name the interpreter.
  PYTHONPATH="$PYSDK" "$(command -v python3 || command -v python3.11)" python/tests/rdma/vm_sdk.py
  listening() { i=0; until ss -Hltn "sport = :18515" | grep -q .; do i=$((i+1)); [ $i -lt 300 ] || return 1; sleep 0.1; done; }
  read_bw() {   # $1 = queue pairs; prints perftest's average MB/sec (MB = 2^20 B)
    local try bw
    for try in 1 2 3; do
      # perftest calibrates its clock against gettimeofday and can give up
      # under TCG on a loaded host ("Can't produce a report"): retry.
      ib_read_bw -d rxe1 -x "$SOFTROCE_GID1" -s 1048576 -n 32 -q "$1" > /tmp/bw-server.log 2>&1 & sp=$!
      listening || { kill $sp; return 1; }
      if ib_read_bw -d rxe0 -x "$SOFTROCE_GID0" -s 1048576 -n 32 -q "$1" 10.11.0.2 > /tmp/bw.log 2>&1; then
        wait $sp || true
        bw=$(awk '$1=="1048576" {print $4}' /tmp/bw.log | tail -1)
        if [ -n "$bw" ]; then sed -n '/#bytes/,/^-/p' /tmp/bw.log >&2; echo "$bw"; return 0; fi
      fi
      wait $sp || true; cat /tmp/bw.log >&2; echo "-- ib_read_bw failed (try $try)" >&2
    done
    return 1
  }
  # Three interleaved rounds (perftest, then strata) so host load drifting
  # during the run hits both alike; the ratio is of the medians.
  ROUNDS=""
  for round in 1 2 3; do
    step "round $round: ib_read_bw, 1 MiB messages, 1 queue pair, rxe0 reads from rxe1"
    bw=$(read_bw 1) || { echo "ib_read_bw produced no figure"; exit 1; }
    step "round $round: strata RDMA READ, 4 MiB reads (1 queue pair; then striped over 4)"
    "$E2E" --include-ignored --exact read_throughput --nocapture --test-threads=1 | tee /tmp/strata-bw.log
    one=$(sed -n 's/.*STRATA_READ_MBPS_1QP=\([0-9.]*\).*/\1/p' /tmp/strata-bw.log)
    many=$(sed -n 's/.*STRATA_READ_MBPS_STRIPED=\([0-9.]*\).*/\1/p' /tmp/strata-bw.log)
    [ -n "$one" ] && [ -n "$many" ] || { echo "no strata throughput figure"; exit 1; }
    ROUNDS="$ROUNDS $bw $one $many"
  done
  # perftest's MB is 2^20 bytes; strata's is 10^6.
  echo "$ROUNDS" | awk '
    function median(a, b, c) { return a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b)) }
    { k = 1e6 / 1048576
      for (r = 0; r < 3; r++) { bw[r] = $(3*r+1); one[r] = $(3*r+2) * k; many[r] = $(3*r+3) * k
        printf "round %d: ib_read_bw %.2f MiB/s, strata 1 QP %.2f MiB/s (%.2f), striped %.2f MiB/s (%.2f)\n",
          r + 1, bw[r], one[r], one[r] / bw[r], many[r], many[r] / bw[r] }
      b = median(bw[0], bw[1], bw[2]); o = median(one[0], one[1], one[2]); m = median(many[0], many[1], many[2])
      printf "\nRDMA_READ_RATIO medians: ib_read_bw=%.2f MiB/s strata_1qp=%.2f MiB/s ratio=%.2f strata_striped=%.2f MiB/s ratio=%.2f\n",
        b, o, o / b, m, m / b }'
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
# bindgen loads libclang itself (libclang.so or libclang-N.so): libclang-cpp,
# which some LLVM packages bring along, does not count.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null ||
  compgen -G '/usr/lib/*/libclang-[0-9]*.so*' >/dev/null || need+=(libclang-dev)
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
step "the Python SDK with --features rdma (unpacked into $CARGO_TARGET_DIR/py-rdma)"
MATURIN=${STRATA_MATURIN:-$ROOT/.venv/bin/maturin}
if [ ! -x "$MATURIN" ]; then
  python3 -m venv "$CARGO_TARGET_DIR/maturin-venv"
  "$CARGO_TARGET_DIR/maturin-venv/bin/pip" install -q --disable-pip-version-check 'maturin>=1.7,<2'
  MATURIN=$CARGO_TARGET_DIR/maturin-venv/bin/maturin
fi
rm -rf "$CARGO_TARGET_DIR/wheels-rdma" "$CARGO_TARGET_DIR/py-rdma"
"$MATURIN" build -q --profile dev -m python/Cargo.toml --features rdma -o "$CARGO_TARGET_DIR/wheels-rdma"
python3 -m zipfile -e "$(ls "$CARGO_TARGET_DIR"/wheels-rdma/strata_kv-*.whl)" "$CARGO_TARGET_DIR/py-rdma"
step "booting the soft-RoCE VM"
start=$(date +%s)
scripts/softroce-vm.sh -- scripts/rdma-test.sh --in-vm "$UNIT" "$E2E" "$CARGO_TARGET_DIR/debug/strata-server" \
  "$CARGO_TARGET_DIR/py-rdma"
echo "soft-RoCE VM step passed in $(( $(date +%s) - start )) s"
