#!/usr/bin/env bash
# gpu-rdma-check.sh - check GPUDirect RDMA (dma-buf) on a machine with an
# NVIDIA GPU and an RDMA NIC. Not part of scripts/test.sh: the CI machines
# have neither (and soft-RoCE cannot import dma-bufs).
#
#   bench/gpu-rdma-check.sh [NIC]     NIC defaults to the first RDMA device
#
# Needs: the NVIDIA driver with dma-buf export (open kernel modules, CUDA
# driver >= 11.7; `nvidia-smi -q | grep -i "Addressing Mode"` is not enough,
# the check below is the real test), rdma-core (libibverbs1 +
# ibverbs-providers), cmake and libclang-dev to build, `ulimit -l unlimited`.
#
# What it does: builds strata-rdma with `--features cuda`, runs the unit test
# that allocates GPU memory and round-trips it (it fails with "no CUDA
# driver" on a machine without a GPU), then rdma/tests/gpu_dmabuf.rs: 16 MiB
# RDMA READ out of GPU memory and into GPU memory through one NIC, content
# checked, GB/s printed.
set -euo pipefail
cd "$(dirname "$0")/.."
NIC=${1:-$(ls /sys/class/infiniband 2>/dev/null | head -1)}
[ -n "$NIC" ] || { echo "no RDMA device in /sys/class/infiniband"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "warning: nvidia-smi not found"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/cuda}
ulimit -l unlimited 2>/dev/null || echo "warning: cannot raise the locked-memory limit"
cargo test -p strata-rdma --features cuda --lib gpu -- --nocapture
STRATA_GPU_RDMA_DEVICE=$NIC cargo test -p strata-rdma --features cuda --test gpu_dmabuf \
  -- --include-ignored --nocapture
echo "GPUDirect RDMA via dma-buf on $NIC: OK"
