#!/bin/bash
# Entrypoint of strata-node: pick the transfer protocol, then exec strata-server
# configured by STRATA_* environment variables (docs/OPERATIONS.md).
#
#   entrypoint.sh [strata-server flags...]   start a node
#   entrypoint.sh <command> [args...]        run anything else (strata-bench, bash, ...)
#
# Extra env read here (not by strata-server):
#   STRATA_STANDALONE   non-empty: run standalone, whatever STRATA_METADATA_SERVER
#                       says (docker-compose.yml sets etcd://etcd:2379 for every node).
#   STRATA_RDMA_NETDEV  netdev for soft-RoCE (default eth0).
set -euo pipefail

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ] && [ "$1" != strata-server ]; then
    exec "$@"
fi
[ "${1:-}" = strata-server ] && shift

log() { echo "strata-entrypoint: $*" >&2; }

# --- protocol selection: the only place that decides tcp vs rdma -------------
# 1. An explicit STRATA_PROTOCOL is obeyed as is.
# 2. Otherwise try soft-RoCE (rxe over eth0). If that fails: TCP, with one line.
# 3. If it works, use rdma only when this strata-server accepts it (asked with
#    --print-config, so this flips by itself once rdma is built in).
choose_protocol() {
    if [ -n "${STRATA_PROTOCOL:-}" ]; then
        log "protocol ${STRATA_PROTOCOL} (set by STRATA_PROTOCOL)"
        return
    fi
    local netdev=${STRATA_RDMA_NETDEV:-eth0} out
    if ! out=$(rdma link add rxe0 type rxe netdev "$netdev" 2>&1) \
        && ! rdma link show rxe0/1 >/dev/null 2>&1; then
        out=$(printf '%s' "${out:-rdma link add failed}" | tr '\n' ' ' | sed 's/ *$//')
        log "soft-RoCE unavailable ($out); using TCP"
        export STRATA_PROTOCOL=tcp
        return
    fi
    if strata-server --protocol rdma --print-config >/dev/null 2>&1; then
        log "soft-RoCE rxe0 on $netdev is up; using RDMA"
        export STRATA_PROTOCOL=rdma
    else
        log "soft-RoCE rxe0 on $netdev is up, but rdma is not built into this strata-server; using TCP"
        export STRATA_PROTOCOL=tcp
    fi
}
choose_protocol

# --- listeners and cluster mode ------------------------------------------------
# Inside a container the node must listen on its interface, not loopback;
# publish ports deliberately (docker-compose.yml publishes on 127.0.0.1 only).
export STRATA_BIND=${STRATA_BIND:-0.0.0.0}
if [ -n "${STRATA_STANDALONE:-}" ]; then
    export STRATA_METADATA_SERVER=standalone
fi
cluster="metadata_server=${STRATA_METADATA_SERVER:-standalone}"
if [ "${STRATA_METADATA_SERVER:-standalone}" != standalone ]; then
    cluster="$cluster node_id=${STRATA_NODE_ID:-} advertise_host=${STRATA_ADVERTISE_HOST:-} host_name=${STRATA_HOST_NAME:-} replica_num=${STRATA_REPLICA_NUM:-1} node_ttl_s=${STRATA_NODE_TTL_S:-5}"
fi
log "starting strata-server bind=$STRATA_BIND port=${STRATA_PORT:-7379} metrics=${STRATA_METRICS_PORT:-9379} data=${STRATA_DATA_PORT:-7380} pool=${STRATA_CPU_MEMORY_POOL_SIZE:-default} $cluster"
exec strata-server "$@"
