"""The Python SDK between two engine hosts of the bed (tests/bed/cluster.sh):
``put`` on the "prefill" host writes values of every path (inline SETs,
payloads sent with the command, and payloads above
``inline_put_max_bytes`` that a node pulls from this client's data plane
across the bridge); ``get`` on the "decode" host reads every one back,
byte-exact, as bytes and zero-copy into buffers. Both run with the SDK's
defaults: the data plane's address is the route's, never configured.

    python sdk_across_hosts.py put|get SEEDS EXPECTED_DATA_HOST

``BED_SDK_NODES`` (default 3): the nodes the slot map should have.

Values are derived from their key, so the reader needs nothing from the
writer but the key names. Exits non-zero on the first mismatch.
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

import strata

# name -> size: inline SET (<= inline_max_bytes), sent with the command
# (<= inline_put_max_bytes), pulled by the node (above it: 8 and 32 MiB,
# LMCache's chunk size).
SIZES = {
    "tiny": 100,
    "small": 4 << 10,
    "block": 64 << 10,
    "mib": 1 << 20,
    "pulled-8mib": 8 << 20,
    "pulled-32mib": 32 << 20,
}
# Keys per size: spread over the three nodes' slots.
COPIES = 4
PREFIX = "bed:sdk"
# Nodes the slot map should have (fewer after one was killed).
NODES = int(os.environ.get("BED_SDK_NODES", "3"))


def value_of(key: str, size: int) -> bytes:
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def keys():
    for name, size in SIZES.items():
        for i in range(COPIES):
            yield f"{PREFIX}:{name}:{i}", size


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def put(client: strata.Client) -> None:
    pulled = client.config.inline_put_max_bytes
    check(max(SIZES.values()) > pulled, f"no value above inline_put_max_bytes ({pulled})")
    for key, size in keys():
        value = value_of(key, size)
        if size >= SIZES["mib"]:
            # Zero-copy from a buffer, as engines write their KV blocks.
            client.put_from(key, np.frombuffer(value, dtype=np.uint8))
        else:
            client.put(key, value)
    print(f"put {COPIES * len(SIZES)} values, largest {max(SIZES.values()) >> 20} MiB")


def get(client: strata.Client) -> None:
    owners = set()
    for key, size in keys():
        expected = value_of(key, size)
        check(client.get_size(key) == size, f"{key}: size {client.get_size(key)} != {size}")
        got = client.get(key)
        check(got == expected, f"{key}: get returned other bytes")
        if size >= SIZES["mib"]:
            buf = np.zeros(size, dtype=np.uint8)
            n = client.get_into(key, buf)
            check(n == size, f"{key}: get_into read {n} of {size}")
            check(buf.tobytes() == expected, f"{key}: get_into wrote other bytes")
        owners.add(client.owner_of(key))
    names = [k for k, s in keys() if s >= SIZES["mib"]]
    bufs = [np.zeros(SIZES[k.split(":")[2]], dtype=np.uint8) for k in names]
    results = client.batch_get_into(names, bufs)
    for k, b, r in zip(names, bufs, results):
        check(r == b.nbytes, f"{k}: batch_get_into gave {r!r}")
        check(b.tobytes() == value_of(k, b.nbytes), f"{k}: batch_get_into wrote other bytes")
    check(client.get(f"{PREFIX}:missing") is None, "a missing key is not None")
    check(len(owners) == NODES, f"the keys live on {sorted(owners)}, expected {NODES} nodes")
    print(f"read {COPIES * len(SIZES)} values back byte-exact (get, get_into, batch_get_into)")


def main() -> None:
    mode, seeds, data_host = sys.argv[1:4]
    # STRATA_TLS_* (and any other setting) from the environment, as
    # ClientConfig.from_env reads them.
    client = strata.Client(strata.ClientConfig.from_env(), seeds=seeds)
    try:
        host = client.data_endpoint.rsplit(":", 1)[0]
        check(host == data_host, f"data plane on {client.data_endpoint}, expected host {data_host}")
        nodes = client.cluster_nodes()
        check(len(nodes) == NODES, f"slot map has {nodes}, expected {NODES} nodes")
        {"put": put, "get": get}[mode](client)
        stats = client.cma_stats()
        check(not stats or stats.get("reads", 0) == 0, f"cross-memory attach was used: {stats}")
    finally:
        client.close()


if __name__ == "__main__":
    main()
