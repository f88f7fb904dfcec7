#!/usr/bin/env bash
# Build strata's container images locally, with no container registry:
#
#   strata-base:bookworm  Debian bookworm minbase made by debootstrap, with
#                         etcd, rdma-core, iproute2, curl, redis-tools,
#                         prometheus. Reused when it exists and its label
#                         strata.base.packages matches BASE_PACKAGES (a base
#                         built from another package list is remade; pass
#                         --rebuild to remake it anyway).
#   strata-node:dev       strata-base + the host-built release strata-server
#                         (and strata-bench when it has been built) + docker/entrypoint.sh
#                         + docker/bench.sh (as strata-cluster-bench, the compose bench).
#
# The binaries are built on the host (`cargo build --release -p strata-server`)
# into ${CARGO_TARGET_DIR:-target}; nothing is compiled inside docker.
#
# Needs: root (debootstrap and the docker daemon), a Debian or Debian-based
# host (debootstrap is installed with apt-get when missing), and docker.
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
# etcd-client provides etcdctl (the etcd healthcheck); prometheus is the compose
# service that scrapes every node; the rest is the brief's list.
BASE_PACKAGES=etcd-server,etcd-client,rdma-core,ibverbs-providers,iproute2,ca-certificates,curl,redis-tools,prometheus
# What the base is made from, as a label on the image: a base imported from
# another list (an older images.sh) lacks packages the compose file needs, so
# build_base remakes it instead of reusing it.
BASE_LABEL=strata.base.packages
BASE_HASH=$(printf 'bookworm minbase %s' "$BASE_PACKAGES" | sha256sum | cut -c1-16)

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
    local old=""
    if have_image "$BASE_IMAGE"; then
        old=$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")
        local have
        have=$(docker image inspect -f "{{index .Config.Labels \"$BASE_LABEL\"}}" "$BASE_IMAGE" 2>/dev/null || true)
        if [ "$REBUILD" = 0 ] && [ "$have" = "$BASE_HASH" ]; then
            log "$BASE_IMAGE exists with this package list; not rebuilding (use --rebuild)"
            return
        fi
        [ "$REBUILD" = 1 ] ||
            log "$BASE_IMAGE was made from another package list ($BASE_LABEL=${have:-none}, want $BASE_HASH); rebuilding"
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
        -c "LABEL $BASE_LABEL=$BASE_HASH" \
        -m "debootstrap --variant=minbase bookworm + $BASE_PACKAGES" \
        - "$BASE_IMAGE" >/dev/null
    rm -rf --one-file-system "$dir"
    trap - EXIT
    # The base this one replaced goes once the node image no longer uses it.
    [ "$old" = "$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")" ] || REPLACED_BASE=$old
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
        log "no $bench (cargo build --release -p strata-bench); node image without strata-bench"
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

REPLACED_BASE=""
build_base
build_node
if [ -n "$REPLACED_BASE" ]; then
    docker rmi "$REPLACED_BASE" >/dev/null 2>&1 || log "old base ${REPLACED_BASE:7:12} still in use; left in place"
fi
