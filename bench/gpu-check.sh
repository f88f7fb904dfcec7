#!/usr/bin/env bash
# gpu-check.sh - the GPU tier (gpu_memory_pool_size) on a machine with an
# NVIDIA GPU. Not part of scripts/test.sh: CI has no GPU.
#
#   bench/gpu-check.sh              build (needs Rust, protoc) and run here
#   bench/gpu-check.sh build [DIR]  build release binaries with `--features
#                                   cuda` into DIR (default .gpu-bin); no
#                                   CUDA is needed to build (libcuda is
#                                   loaded at run time)
#   bench/gpu-check.sh run [DIR]    run the checks with the binaries in DIR,
#                                   on a GPU machine that has no Rust (carry
#                                   DIR there; only bash and coreutils are
#                                   needed)
#
# The checks, each of which fails the script:
# 1. The store's GPU tier tests (tiering/src/gpu_tests.rs) on GPU 0:
#    placement, moves down to DRAM, exact accounting, concurrent readers
#    and writers, every value byte-checked.
# 2. Copy speed: the tier's uploads (writes) and downloads (reads into
#    DRAM) next to plain pinned cuMemcpy of the same size
#    (tiering/examples/gpu_tier_bench.rs), for 64 KiB, 1 MiB and 16 MiB
#    values; then twice the pool, every value checked.
# 3. The server: strata-server with a GPU pool smaller than the data set,
#    strata-bench PUTs and GETs through it (zero-copy and inline, every
#    value checked), and INFO tiers showing uploads, staged reads, moves
#    down and no copy errors.
# 4. The Python SDK with CUDA tensors (python/bench/gpu_staging.py), when
#    the build made a wheel and the run machine's python3 has torch with
#    CUDA: batches of 1 MiB and 16 MiB put from and read back into CUDA
#    tensors (staged through pinned memory), compared on the GPU, GB/s next
#    to tensor.cpu() + a host put.
#
# Settings: GPU_POOL (server, default 2GiB), BENCH_POOL (copy speed,
# default 4GiB), PORT (7579).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-all}
DIR=${2:-$ROOT/.gpu-bin}
GPU_POOL=${GPU_POOL:-2GiB}
BENCH_POOL=${BENCH_POOL:-4GiB}
PORT=${PORT:-7579}

build() {
  command -v protoc >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null
  }
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  local rel=$CARGO_TARGET_DIR/release
  cargo build --release -p strata-server --features cuda -p strata-bench
  cargo build --release -p strata-tiering --features cuda --example gpu_tier_bench
  # The tiering unit tests as one binary (its path is printed by cargo).
  local tests
  tests=$(cargo test --release -p strata-tiering --features cuda --lib --no-run 2>&1 |
    sed -n 's/.*Executable.*(\(.*\)).*/\1/p' | tail -1)
  [ -x "$tests" ] || { echo "gpu-check: cannot find the tiering test binary"; exit 1; }
  mkdir -p "$DIR"
  cp "$rel/strata-server" "$rel/strata-bench" "$rel/examples/gpu_tier_bench" "$DIR/"
  cp "$tests" "$DIR/tiering-tests"
  strip "$DIR"/* 2>/dev/null || true
  # The Python SDK wheel for step 4 (pure abi3: any python3 >= 3.9 there).
  local venv=$CARGO_TARGET_DIR/gpu-check-venv
  if { [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q 'maturin>=1.7,<2'; }; } &&
    "$venv/bin/maturin" build -q --release -m python/Cargo.toml -o "$DIR"; then
    cp python/bench/gpu_staging.py "$DIR/"
  else
    echo "gpu-check: no wheel (maturin failed); step 4 will be skipped"
  fi
  du -sh "$DIR"
}

# One RESP command over bash's /dev/tcp (no redis-cli on GPU machines);
# prints the reply as it arrives for a second.
resp() {
  exec 3<>"/dev/tcp/127.0.0.1/$PORT"
  printf '%s\r\n' "$*" >&3
  timeout 1 cat <&3 | tr -d '\r' || true
  exec 3<&- 3>&-
}

field() { awk -F: -v k="$1" '$1==k {print $2}'; }

run() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "warning: nvidia-smi not found"
  echo "== 1. store tests on GPU 0"
  STRATA_TEST_GPU=1 "$DIR/tiering-tests" gpu --test-threads 4

  echo "== 2. copy speed, tier vs pinned cuMemcpy"
  for size in 64KiB 1MiB 16MiB; do
    "$DIR/gpu_tier_bench" "$size" "$BENCH_POOL"
  done

  echo "== 3. strata-server with a $GPU_POOL GPU pool"
  local log
  log=$(mktemp /tmp/strata-gpu-check.XXXXXX)
  "$DIR/strata-server" --port "$PORT" --metrics-port 0 --data-port 0 \
    --cpu-memory-pool-size 4GiB --gpu-memory-pool-size "$GPU_POOL" \
    --ssd-pool-size 0 >"$log" 2>&1 &
  # Global, not local: the EXIT trap may run after this function's scope.
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true; wait $SERVER_PID 2>/dev/null || true' EXIT
  for _ in $(seq 300); do
    resp PING 2>/dev/null | grep -q PONG && break
    kill -0 $SERVER_PID 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.1
  done
  grep -m1 "GPU tier ready" "$log" || { cat "$log"; exit 1; }
  # 3 GiB of 1 MiB values: more than the GPU pool, so some move down.
  "$DIR/strata-bench" --addr "127.0.0.1:$PORT" --api zerocopy --sizes 1MiB --keys 3072 \
    --phases put,get --ops 6144 -c 4 --keep
  "$DIR/strata-bench" --addr "127.0.0.1:$PORT" --api inline --sizes 256KiB --keys 512 \
    --phases put,get --ops 2048 -c 2
  local info
  info=$(resp INFO tiers)
  echo "$info" | grep -E '^(gpu_|dram_keys|dram_value_bytes)'
  local uploads staged demoted errors
  uploads=$(echo "$info" | field gpu_uploads)
  staged=$(echo "$info" | field gpu_staged_reads)
  demoted=$(echo "$info" | field gpu_demotions)
  errors=$(echo "$info" | field gpu_errors)
  if [ "${uploads:-0}" -gt 0 ] && [ "${staged:-0}" -gt 0 ] && [ "${demoted:-0}" -gt 0 ] &&
    [ "${errors:-1}" = 0 ]; then
    echo "server: $uploads uploads, $staged staged reads, $demoted moved down, 0 errors: OK"
  else
    echo "server: FAILED (uploads=$uploads staged=$staged demoted=$demoted errors=$errors)"
    cat "$log"
    exit 1
  fi
  echo "== 4. the Python SDK with CUDA tensors"
  local wheel
  wheel=$(ls "$DIR"/strata_kv-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    # torch comes from the machine's python (no network there): a venv that
    # sees its packages, with the wheel alone on top.
    python3 -m venv --system-site-packages /tmp/strata-gpu-venv
    /tmp/strata-gpu-venv/bin/pip install -q --no-deps --no-index "$wheel"
    /tmp/strata-gpu-venv/bin/python "$DIR/gpu_staging.py" "127.0.0.1:$PORT"
  else
    echo "skipped: no wheel in $DIR or no torch with CUDA"
  fi
  kill $SERVER_PID
  wait $SERVER_PID 2>/dev/null || true
  trap - EXIT
  echo "gpu-check: OK"
}

case $MODE in
  build) build ;;
  run) run ;;
  all) build && run ;;
  *) echo "usage: $0 [build|run] [DIR]"; exit 2 ;;
esac
