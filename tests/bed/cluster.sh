#!/usr/bin/env bash
# The documented multi-host cluster, run as documented on the network bed
# (scripts/netbed.sh): etcd on one host, three strata-server nodes on
# three others, the Python SDK writing from a "prefill" host and reading
# from a "decode" host, and redis-cli following -MOVED between hosts.
#
# The etcd and node commands are read from docs/OPERATIONS.md ("Cluster")
# and run as written, with the bed's addresses in place of the example
# ones (10.0.0.1 for etcd, 10.0.0.11 for the node's own) and the data dir
# and binary paths of this run: when the docs change, this runs the new
# commands.
#
#   tests/bed/cluster.sh            (root; after `cargo build -p strata-server`
#                                    and with the strata wheel installed in
#                                    STRATA_TEST_PYTHON's environment)
#
# Env: STRATA_SERVER (default $CARGO_TARGET_DIR/debug/strata-server),
# STRATA_TEST_PYTHON (default python3). Everything it starts it stops (the
# bed's `down`, on any exit).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BED="$ROOT/scripts/netbed.sh"
SERVER=${STRATA_SERVER:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/strata-server}
PY=${STRATA_TEST_PYTHON:-python3}
# The documented commands run as a user types them: no STRATA_* settings
# from the caller's environment (scripts/test.sh exports STRATA_PORT and
# others for its earlier steps, and a node reads them as config).
for var in $(compgen -e | grep '^STRATA_' || true); do unset "$var"; done
# Bounds of each wait; every wait polls a condition.
START_TIMEOUT_S=30
POLL_S=0.1

[ -x "$SERVER" ] || { echo "cluster bed: $SERVER missing: run cargo build -p strata-server" >&2; exit 1; }
"$PY" -c 'import strata' || { echo "cluster bed: $PY cannot import strata (install the wheel)" >&2; exit 1; }

# Under /var/tmp, on disk: the nodes keep their default NVMe tier (preallocated
# files) in TMPDIR, which is here, so nothing outlives the run even after a
# kill -9.
WORK=$(mktemp -d /var/tmp/strata-bed.XXXXXX)
export TMPDIR=$WORK
failed=1
cleanup() {
  "$BED" down || true
  if [ "$failed" -ne 0 ]; then
    for log in "$WORK"/*.log; do
      [ -f "$log" ] && { echo "--- $log (last 30 lines)"; tail -n 30 "$log"; }
    done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "cluster bed: FAIL: $*" >&2
  exit 1
}

# wait_for WHAT CMD...: polls CMD until it succeeds, at most START_TIMEOUT_S.
wait_for() {
  local what=$1 deadline=$((SECONDS + START_TIMEOUT_S))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "timed out waiting for $what"
    sleep "$POLL_S"
  done
}

# The commands of the docs' "Cluster" section: the first sh block after
# the heading, its etcd and strata-server lines.
docs_block=$(awk '/^## Cluster$/ {s=1} s && /^```sh$/ {b=1; next} b && /^```$/ {exit} b' docs/OPERATIONS.md)
ETCD_DOC=$(grep '^etcd ' <<<"$docs_block") || fail "no etcd command in docs/OPERATIONS.md's Cluster section"
NODE_DOC=$(grep '^strata-server ' <<<"$docs_block") || fail "no strata-server command in docs/OPERATIONS.md's Cluster section"
echo "docs: $ETCD_DOC"
echo "docs: $NODE_DOC"
# Every other multi-host node command of the docs is this one, with
# HOST / ETCD for the addresses: what runs here is what they say.
while IFS= read -r cmd; do
  same=$(sed -E 's/ HOST / 10.0.0.11 /; s|etcd://ETCD:|etcd://10.0.0.1:|; s/ +$//' <<<"$cmd")
  [ "$same" = "$NODE_DOC" ] || fail "a documented node command differs from the Cluster section's: '$cmd'"
done < <(grep -ohE 'strata-server [^`|]*--metadata-server[^`|]*' README.md docs/*.md python/README.md)

"$BED" up
ETCD_IP=$("$BED" ip etcd)
NODES=(node1 node2 node3)

# Docs' example address -> the bed's (10.0.0.1 must not match 10.0.0.11).
on_bed() { sed -E "s/10\.0\.0\.1([^0-9]|$)/$ETCD_IP\1/g; s/10\.0\.0\.11([^0-9]|$)/$1\1/g"; }

etcd_cmd=$(on_bed "" <<<"$ETCD_DOC" | sed "s|--data-dir /var/lib/etcd|--data-dir $WORK/etcd|")
read -r -a etcd_argv <<<"$etcd_cmd"
"$BED" exec etcd "${etcd_argv[@]}" >"$WORK/etcd.log" 2>&1 &
# Healthy as seen from a node host: across the bridge, not its loopback.
wait_for "etcd at $ETCD_IP:2379" "$BED" exec node1 etcdctl --endpoints "http://$ETCD_IP:2379" endpoint health

# Without --bind / --advertise-host a node of a remote etcd refuses to
# start (it would register 127.0.0.1), naming the flags.
set +e
refused=$("$BED" exec node1 "$SERVER" --metadata-server "etcd://$ETCD_IP:2379" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q -- "--bind 0.0.0.0" <<<"$refused" && grep -q -- "--advertise-host" <<<"$refused" ||
  fail "a loopback node with a remote etcd was not refused clearly (exit $rc): $refused"
echo "refused as expected: a loopback node with a remote etcd (exit 2, names --bind and --advertise-host)"

for n in "${NODES[@]}"; do
  ip=$("$BED" ip "$n")
  node_cmd=$(on_bed "$ip" <<<"$NODE_DOC")
  read -r -a argv <<<"$node_cmd"
  argv[0]=$SERVER
  echo "$n: ${argv[*]}"
  "$BED" exec "$n" "${argv[@]}" >"$WORK/$n.log" 2>&1 &
done

ring_of() { [ "$("$BED" exec prefill redis-cli -p 7379 -h "$1" INFO cluster | tr -d '\r' | sed -n 's/^ring_nodes://p')" = 3 ]; }
for n in "${NODES[@]}"; do
  wait_for "$n's ring to hold 3 nodes" ring_of "$("$BED" ip "$n")"
done
echo "ring: 3 nodes, as seen by each"

# What the nodes registered: their own bed address, never loopback.
registered=$("$BED" exec etcd etcdctl --endpoints "http://$ETCD_IP:2379" get --prefix /strata/default/nodes/ --print-value-only)
for n in "${NODES[@]}"; do
  grep -q "$("$BED" ip "$n"):7379" <<<"$registered" || fail "$n did not register $("$BED" ip "$n"):7379: $registered"
done
grep -q "127\.0\.0\.1" <<<"$registered" && fail "a node registered a loopback address: $registered"

N1=$("$BED" ip node1)
"$BED" exec prefill "$PY" tests/bed/sdk_across_hosts.py put "$N1:7379" "$("$BED" ip prefill)"
"$BED" exec decode "$PY" tests/bed/sdk_across_hosts.py get "$N1:7379" "$("$BED" ip decode)"

# No node took a payload by cross-memory attach: each host has its own
# pid namespace, as on separate machines.
for n in "${NODES[@]}"; do
  info=$("$BED" exec decode redis-cli -p 7379 -h "$("$BED" ip "$n")" INFO | tr -d '\r')
  grep -qx "cma_sessions:0" <<<"$info" || fail "$n: cross-memory attach was used: $(grep '^cma_' <<<"$info")"
done

# redis-cli -c from an engine host: SET on node1 lands on each key's owner
# by -MOVED, which names the owner's bed address; GET reads it back.
moved=0
for i in $(seq 1 30); do
  key="bed:cli:$i"
  out=$("$BED" exec decode redis-cli -p 7379 -h "$N1" GET "$key")
  case "$out" in
    MOVED*) grep -Eq "MOVED [0-9]+ ${ETCD_IP%.*}\.1[123]:7379" <<<"$out" || fail "MOVED names no bed node: $out"
            moved=$((moved + 1)) ;;
  esac
  [ "$("$BED" exec decode redis-cli -p 7379 -c -h "$N1" SET "$key" "v$i")" = OK ] || fail "redis-cli -c SET $key"
  got=$("$BED" exec prefill redis-cli -p 7379 -c -h "$("$BED" ip node3)" GET "$key")
  [ "$got" = "v$i" ] || fail "redis-cli -c GET $key from node3: $got"
done
[ "$moved" -gt 0 ] || fail "no key of 30 was redirected: is node1 alone in the ring?"
echo "redis-cli -c: 30 keys set via node1 and read via node3 ($moved redirected by -MOVED)"

for n in "${NODES[@]}"; do
  grep -q "panicked" "$WORK/$n.log" && fail "$n panicked"
done
failed=0
echo "cluster bed: passed"
