#!/usr/bin/env bash
# Build strata's container images locally, with no container registry:
#
#   strata-base:bookworm  Debian bookworm minbase made by debootstrap, with
#                         etcd, rdma-core, iproute2, curl, redis-tools.
#                         Reused when it exists (pass --rebuild to remake it).
#   strata-node:dev       strata-base + the host-built release strata-server
#                         (and strata-bench when it has been built) + docker/entrypoint.sh
#                         + docker/bench.sh (as strata-cluster-bench, the compose bench).
#
# The binaries are built on the host (`cargo build --release -p strata-server`)
# into ${CARGO_TARGET_DIR:-target}; nothing is compiled inside docker.
#
# Usage: scripts/images.sh [--rebuild] [--no-cargo]
#   --rebuild   remake strata-base even if the image exists
#   --no-cargo  do not run cargo; use the binary already in the target dir
# Env: STRATA_BASE_IMAGE, STRATA_NODE_IMAGE, DEBIAN_MIRROR,
#      STRATA_PROFILE (release, the default, or debug: the test script uses
#      the debug build it already has, so CI compiles the workspace once),
#      STRATA_BENCH_BIN (default ${CARGO_TARGET_DIR:-target}/<profile>/strata-bench).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BASE_IMAGE=${STRATA_BASE_IMAGE:-strata-base:bookworm}
NODE_IMAGE=${STRATA_NODE_IMAGE:-strata-node:dev}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
PROFILE=${STRATA_PROFILE:-release}
case "$PROFILE" in release) PROFILE_FLAG=(--release) ;; debug) PROFILE_FLAG=() ;;
  *) echo "STRATA_PROFILE must be release or debug" >&2; exit 2 ;; esac
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
# etcd-client provides etcdctl (the etcd healthcheck); the rest is the brief's list.
BASE_PACKAGES=etcd-server,etcd-client,rdma-core,ibverbs-providers,iproute2,ca-certificates,curl,redis-tools

REBUILD=0
CARGO=1
for arg in "$@"; do
    case "$arg" in
        --rebuild) REBUILD=1 ;;
        --no-cargo) CARGO=0 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "images.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

log() { printf '[images %s] %s\n' "$(date +%T)" "$*"; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

build_base() {
    if [ "$REBUILD" = 0 ] && have_image "$BASE_IMAGE"; then
        log "$BASE_IMAGE exists; not rebuilding (use --rebuild)"
        return
    fi
    if ! command -v debootstrap >/dev/null; then
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    fi
    local dir
    dir=$(mktemp -d /var/tmp/strata-base.XXXXXX)
    # The rootfs holds device nodes and root-owned files: always remove it.
    trap 'rm -rf --one-file-system "$dir"' EXIT
    log "debootstrap --variant=minbase bookworm ($MIRROR) into $dir (a few minutes)"
    local t0=$SECONDS
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$dir" "$MIRROR" \
        >"$dir.log" 2>&1 || { tail -30 "$dir.log" >&2; log "debootstrap failed (log: $dir.log)"; exit 1; }
    rm -f "$dir.log"
    log "debootstrap done in $((SECONDS - t0))s"
    # Slim it: no package cache, no apt lists, no docs.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/locale/* \
        "$dir"/var/log/*.log "$dir"/var/log/apt/*
    # A container gets its own resolv.conf/hosts; do not bake the host's in.
    : >"$dir/etc/resolv.conf"
    echo "strata" >"$dir/etc/hostname"
    tar --numeric-owner -C "$dir" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        -m "debootstrap --variant=minbase bookworm + $BASE_PACKAGES" \
        - "$BASE_IMAGE" >/dev/null
    rm -rf --one-file-system "$dir"
    trap - EXIT
    log "$BASE_IMAGE imported ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

build_node() {
    if [ "$CARGO" = 1 ]; then
        log "cargo build ${PROFILE_FLAG[*]} -p strata-server -p strata-bench (target dir $TARGET_DIR)"
        cargo build "${PROFILE_FLAG[@]}" -p strata-server -p strata-bench
    fi
    local server="$TARGET_DIR/$PROFILE/strata-server"
    local bench=${STRATA_BENCH_BIN:-$TARGET_DIR/$PROFILE/strata-bench}
    [ -x "$server" ] || { log "no $server; build it first"; exit 1; }

    local ctx
    ctx=$(mktemp -d /tmp/strata-node-ctx.XXXXXX)
    trap 'rm -rf "$ctx"' EXIT
    mkdir -p "$ctx/bin"
    cp "$server" "$ctx/bin/"
    if [ -x "$bench" ]; then
        cp "$bench" "$ctx/bin/"
        log "including strata-bench ($bench)"
    else
        log "no $bench (built on branch client); node image without strata-bench"
    fi
    cp docker/entrypoint.sh "$ctx/entrypoint.sh"
    cp docker/bench.sh "$ctx/bench.sh"
    local old
    old=$(docker image inspect -f '{{.Id}}' "$NODE_IMAGE" 2>/dev/null || true)
    # The legacy builder is fine here (FROM a local image, no registry); keep
    # its output for failures only.
    docker build -f docker/Dockerfile.node \
        --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --label org.opencontainers.image.revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        -t "$NODE_IMAGE" "$ctx" >"$ctx.log" 2>&1 || { cat "$ctx.log" >&2; rm -f "$ctx.log"; log "docker build failed"; exit 1; }
    rm -f "$ctx.log"
    # Drop the image this one replaced, unless a container still uses it.
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$NODE_IMAGE")" ]; then
        docker rmi "$old" >/dev/null 2>&1 || true
    fi
    rm -rf "$ctx"
    trap - EXIT
    log "$NODE_IMAGE built from $server"
}

build_base
build_node
