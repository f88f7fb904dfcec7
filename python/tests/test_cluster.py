"""A real two-node cluster (etcd + two strata-server processes): the client
routes each key to its owner, and batches split across nodes."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from servers import Etcd, Server, resp, wait_for


@pytest.fixture(scope="module")
def cluster():
    try:
        etcd = Etcd()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    nodes = []
    try:
        for i in range(2):
            nodes.append(
                Server(
                    [
                        "--metadata-server", etcd.url, "--cluster-name", "pytest",
                        "--node-id", f"n{i}", "--host-name", f"h{i}",
                    ],
                    pool="128MiB",
                )
            )
        for n in nodes:
            wait_for(lambda n=n: resp(n.port, "CLUSTER", "INFO").count(b"cluster_known_nodes:2") == 1,
                     f"node {n.port} sees both nodes")
        yield nodes
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()


def test_keys_spread_and_batches_split(cluster):
    with strata.Client([cluster[0].addr]) as c:
        wait_for(lambda: len(c.cluster_nodes()) == 2, "client learns both nodes", 30)
        keys = [f"cluster:{i}" for i in range(64)]
        owners = {c.owner_of(k) for k in keys}
        assert owners == {n.addr for n in cluster}
        blocks = [np.full(32768, i, dtype=np.uint8) for i in range(64)]
        assert c.batch_put_from(keys, blocks) == [None] * 64
        outs = [np.zeros(32768, dtype=np.uint8) for _ in range(64)]
        assert c.batch_get_into(keys, outs) == [32768] * 64
        assert all((o == i).all() for i, o in enumerate(outs))
        assert c.prefix(keys) == 64
        assert c.remove(keys[10])
        assert c.prefix(keys) == 10
        assert c.get_batch(keys[:2]) == [blocks[0].tobytes(), blocks[1].tobytes()]
