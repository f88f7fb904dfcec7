#!/usr/bin/env bash
# A test bed of hosts that are real network peers, on one machine: each
# "host" is a network namespace with its own address on a private bridge
# (veth pairs), its own loopback, and (for the processes `exec` starts) its
# own hostname and pid namespace, so nodes and clients meet as they do
# across machines: over the bridge, never by loopback or cross-memory
# attach.
#
#   scripts/netbed.sh up              make the bed (removes a leftover one first)
#   scripts/netbed.sh down            remove everything `up` made; idempotent
#   scripts/netbed.sh exec NAME CMD…  run CMD on host NAME (see HOSTS)
#   scripts/netbed.sh ip NAME         print host NAME's address
#   scripts/netbed.sh hosts           print "NAME ADDRESS" per host
#
# Needs root and iproute2 (`ip netns`), util-linux (`unshare`).
#
# Isolation: the bridge itself lives in a namespace of its own (sbed-br),
# so the machine's root namespace gets no link, address or route; no
# namespace has a default route, so traffic between the bed's addresses
# stays on the bridge and nothing can leave for the host's networks. The
# subnet (NETBED_NET, default 10.213.7) exists only inside the bed and
# cannot collide with the host's own. Every name starts with sbed- (or
# NETBED_PREFIX), so a bed left by a killed run is found and removed by the
# next `up`/`down`; two beds with different NETBED_PREFIX and NETBED_NET can
# run side by side.
set -euo pipefail

PREFIX=${NETBED_PREFIX:-sbed-}
NET=${NETBED_NET:-10.213.7}
BRIDGE_NS=${PREFIX}br
# name, last octet: etcd, three storage nodes, two engine clients.
HOSTS=(etcd:10 node1:11 node2:12 node3:13 prefill:21 decode:22)
# How long `down` waits for processes to stop after SIGTERM before SIGKILL.
STOP_GRACE_S=10

die() {
  echo "netbed: $*" >&2
  exit 1
}

host_ip() {
  local h
  for h in "${HOSTS[@]}"; do
    if [ "${h%%:*}" = "$1" ]; then
      echo "$NET.${h##*:}"
      return
    fi
  done
  die "no host named '$1' (hosts: ${HOSTS[*]%%:*})"
}

# Namespaces this bed owns, whether or not `up` finished making them.
bed_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}" || true
}

# Stops what runs inside the bed's namespaces (the processes `exec`
# started, found by namespace, nothing else), then removes the namespaces;
# their veth ends and the bridge go with them.
down() {
  local ns pids waited=0
  for ns in $(bed_namespaces); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  done
  while [ $waited -lt $((STOP_GRACE_S * 10)) ]; do
    pids=""
    for ns in $(bed_namespaces); do
      pids="$pids$(ip netns pids "$ns" 2>/dev/null || true)"
    done
    [ -z "$pids" ] && break
    sleep 0.1
    waited=$((waited + 1))
  done
  for ns in $(bed_namespaces); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  [ -z "$(bed_namespaces)" ] || die "could not remove: $(bed_namespaces | tr '\n' ' ')"
}

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  command -v unshare >/dev/null || die "needs unshare (util-linux)"
  down
  trap 'down' ERR
  ip netns add "$BRIDGE_NS"
  ip -n "$BRIDGE_NS" link set lo up
  ip -n "$BRIDGE_NS" link add br0 type bridge
  ip -n "$BRIDGE_NS" link set br0 up
  local h name ns
  for h in "${HOSTS[@]}"; do
    name=${h%%:*}
    ns=$PREFIX$name
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends are made inside the bed: the host's end is eth0 in its
    # namespace, the bridge's end a port of br0.
    ip -n "$BRIDGE_NS" link add "v-$name" type veth peer name eth0 netns "$ns"
    ip -n "$BRIDGE_NS" link set "v-$name" master br0 up
    ip -n "$ns" addr add "$(host_ip "$name")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  trap - ERR
}

# Runs CMD on host NAME: in its network namespace, with a hostname of its
# own (node ids and failure domains default to the hostname) and a pid
# namespace of its own (as on another machine, cross-memory attach cannot
# reach the other hosts' processes). CMD is its pid namespace's first
# process, so it gets only the signals it handles (strata-server and etcd
# stop on SIGTERM); `down` sends SIGTERM to everything in the bed, then
# SIGKILL after STOP_GRACE_S. If this process is killed, CMD gets SIGTERM.
exec_on() {
  local name=$1
  shift
  [ $# -gt 0 ] || die "exec $name: no command"
  host_ip "$name" >/dev/null
  ip netns list | awk '{print $1}' | grep -qx "$PREFIX$name" || die "host $name is not up (run: $0 up)"
  exec ip netns exec "$PREFIX$name" unshare --uts --pid --kill-child=SIGTERM \
    sh -c 'hostname "$0" && exec "$@"' "$PREFIX$name" "$@"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  exec)
    shift
    [ $# -ge 1 ] || die "usage: $0 exec NAME CMD..."
    exec_on "$@"
    ;;
  ip)
    [ $# -eq 2 ] || die "usage: $0 ip NAME"
    host_ip "$2"
    ;;
  hosts)
    for h in "${HOSTS[@]}"; do echo "${h%%:*} $(host_ip "${h%%:*}")"; done
    ;;
  *) die "usage: $0 up | down | exec NAME CMD... | ip NAME | hosts" ;;
esac
