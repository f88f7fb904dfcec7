#!/usr/bin/env bash
# The KV-event publisher's cost: one node's SET throughput with
# `kv_events_endpoint` off and on (a subscriber draining the stream, as a
# router would), in interleaved rounds on fresh nodes. The keys are in the
# vLLM connector's format, so every SET is a `BlockStored` event.
#
#   bench/kv-events.sh [rounds] [requests] [value_bytes]   (defaults 3, 400000, 4096)
#
# Prints each round's requests per second and on/off, and with the
# publisher on what the node published and dropped and what the router got. Needs a
# release build (made here if missing) and redis-benchmark (redis-tools).
# Everything binds 127.0.0.1 on free ports and is stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
N=${2:-400000}
SIZE=${3:-4096}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build -q --release -p strata-server --bin strata-server --example kv_events_drain
BIN=$TARGET/release/strata-server
DRAIN=$TARGET/release/examples/kv_events_drain
# shellcheck source=bench/lib.sh
source bench/lib.sh
need_packages redis-tools

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
# 52 fixed hex digits and redis-benchmark's 12-digit random number make the
# 64-digit block digest of `vllm:{model}:{rank}:{geometry}:{hash}:{layer}`.
KEY="vllm:bench:tp0of1:bfloat16.8x128:$(printf 'a%.0s' $(seq 52))__rand_int__:layer.0"
VALUE=$(head -c "$SIZE" /dev/zero | tr '\0' 'v')

# One round: a fresh node (with the publisher when $1 is "on"), the load,
# then the node's requests per second on stdout.
round() {
  local port events log rps
  port=$(free_port); events=$(free_port); log=$(mktemp)
  local args=(--port "$port" --metrics-port 0 --data-port 0 --cpu-memory-pool-size 4GiB)
  local drain=""
  if [ "$1" = on ]; then
    # The router binds, the node connects (OPERATIONS.md, "KV events").
    "$DRAIN" "tcp://127.0.0.1:$events" 3 >"$log.drain" 2>&1 &
    drain=$!; PIDS+=("$drain")
    wait_log "$log.drain" listening
    args+=(--kv-events-endpoint "tcp://127.0.0.1:$events")
  fi
  "$BIN" "${args[@]}" >"$log" 2>&1 &
  local node=$!; PIDS+=("$node")
  wait_port "$port"
  # A first write, then time for the node to connect to the router (both
  # rounds alike).
  redis-cli -p "$port" SET "${KEY/__rand_int__/000000000000}" v >/dev/null
  sleep 1
  rps=$(redis-benchmark -p "$port" -n "$N" -r 100000000 -c 50 -P 16 -q \
          SET "$KEY" "$VALUE" | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
  if [ -n "$drain" ]; then
    wait "$drain" || true
    echo "  on: $(redis-cli -p "$port" INFO stats | tr -d '\r' | grep -E '^kv_events_(stored|dropped)' | tr '\n' ' ')$(tail -1 "$log.drain")" >&2
  fi
  kill "$node"; wait "$node" 2>/dev/null || true
  rm -f "$log" "$log.drain"
  echo "$rps"
}

echo "machine: $(nproc) cores, $(uname -r), $(date -u +%F); $N SETs of $SIZE bytes, -c 50 -P 16"
for r in $(seq "$ROUNDS"); do
  off=$(round off); on=$(round on)
  awk -v r="$r" -v off="$off" -v on="$on" \
    'BEGIN { printf "round %d: off %.0f/s, on %.0f/s, on/off %.3f\n", r, off, on, on / off }'
done
