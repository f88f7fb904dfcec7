#!/usr/bin/env bash
# Runs one strata node on a fresh Debian machine with Rust.
#
# Installs the one build dependency the toolchain lacks (protoc, for the etcd
# client's protobufs) when it is missing, builds in release mode and starts a
# standalone node: RESP on 127.0.0.1:7379, /metrics and /health on
# 127.0.0.1:9379, data plane on 127.0.0.1:7380, a 1 GiB DRAM pool, no etcd.
# Arguments are passed to strata-server (try --help or --print-config).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing protobuf-compiler (needed to build the etcd client)" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq protobuf-compiler >/dev/null
fi
exec cargo run --release -p strata-server -- "$@"
