"""Real clusters (etcd + strata-server processes): the client routes each
key to its owner and batches split across nodes; nodes sharing one host
still keep every copy."""

from __future__ import annotations

import numpy as np
import pytest

import strata
from servers import Etcd, Server, resp, wait_for


def start_nodes(etcd, count, name, pool, extra=lambda i: []):
    """``count`` nodes of cluster ``name``, returned once each sees all;
    the caller stops them (``nodes`` fills as they start, for cleanup)."""
    nodes = []
    try:
        for i in range(count):
            args = ["--metadata-server", etcd.url, "--cluster-name", name, "--node-id", f"{name}{i}"]
            nodes.append(Server(args + extra(i), pool=pool))
        want = f"cluster_known_nodes:{count}".encode()
        for n in nodes:
            wait_for(lambda n=n: want in resp(n.port, "CLUSTER", "INFO"), f"node {n.port} sees {count} nodes")
    except Exception:
        for n in nodes:
            n.stop()
        raise
    return nodes


def new_etcd():
    try:
        return Etcd()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster():
    etcd = new_etcd()
    try:
        nodes = start_nodes(etcd, 2, "pytest", "128MiB", lambda i: ["--host-name", f"h{i}"])
        yield nodes
        for n in nodes:
            n.stop()
    finally:
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


def test_replicas_survive_a_killed_node_with_default_host_names():
    """Three nodes on one machine, host_name left at its default (all the
    same host): replica_num 2 must still keep two copies, on two nodes."""
    etcd = new_etcd()
    nodes = []
    try:
        nodes = start_nodes(etcd, 3, "samehost", "64MiB", lambda i: ["--replica-num", "2"])
        info = resp(nodes[0].port, "INFO", "cluster").decode()
        assert "replicas_placeable:2" in info and "failure_domains:1" in info, info
        keys = [f"dh:{i}" for i in range(300)]
        with strata.Client([n.addr for n in nodes]) as c:
            wait_for(lambda: len(c.cluster_nodes()) == 3, "client learns the ring", 30)
            assert c.put_batch(keys, [k.encode() * 3 for k in keys]) == [None] * 300
        nodes[1].proc.kill()
        nodes[1].proc.wait()
        survivors = [nodes[0], nodes[2]]
        for n in survivors:
            wait_for(lambda n=n: b"cluster_known_nodes:2" in resp(n.port, "CLUSTER", "INFO"), "ring of two", 60)
        with strata.Client([n.addr for n in survivors]) as c:
            got = c.get_batch(keys)
        assert [g for g, k in zip(got, keys) if g != k.encode() * 3] == []
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()


@pytest.mark.parametrize("threads", [0, 2])
def test_an_idle_client_still_learns_new_nodes(threads):
    """The health check refreshes the map between calls. With ``threads=0``
    the calling threads drive the runtime, so nobody would while Python
    makes no call: the client's idle thread must take it over, and hand it
    back when the next call comes."""
    etcd = new_etcd()
    nodes = []
    try:
        nodes = start_nodes(etcd, 1, f"idle{threads}", "64MiB")
        with strata.Client(nodes[0].addr, threads=threads, health_check_interval_ms=100) as c:
            assert c.cluster_nodes() == [nodes[0].addr]
            nodes.append(Server(["--metadata-server", etcd.url, "--cluster-name", f"idle{threads}",
                                 "--node-id", f"idle{threads}1"], pool="64MiB"))
            # No call from here on until the client has seen the new node.
            wait_for(lambda: len(c.cluster_nodes()) == 2, "idle client learns the second node", 30)
            block = np.full(1 << 20, 7, dtype=np.uint8)
            keys = [f"idle:{threads}:{i}" for i in range(16)]
            assert {c.owner_of(k) for k in keys} == {n.addr for n in nodes}
            assert c.batch_put_from(keys, [block] * 16) == [None] * 16
            out = np.zeros_like(block)
            for k in keys:
                assert c.get_into(k, out) == block.nbytes and (out == 7).all()
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()


def stat(port, name):
    text = resp(port, "INFO", "stats").decode()
    return int(next(l.split(":", 1)[1] for l in text.splitlines() if l.startswith(name + ":")))


@pytest.mark.parametrize("cma", ["auto", "off"])
def test_replica_copies_between_nodes_on_one_host(cma):
    """Two nodes of one user on one host copy replicas by cross-memory
    attach (cma: auto), each value checked through the survivor after the
    owner is killed; with cma: off the same copies go over TCP."""
    etcd = new_etcd()
    nodes = []
    try:
        nodes = start_nodes(etcd, 2, f"repl-{cma}", "64MiB",
                            lambda i: ["--host-name", f"h{i}", "--replica-num", "2", "--cma", cma])
        keys = [f"rc:{i}" for i in range(40)]
        blocks = [np.full(256 * 1024, i, dtype=np.uint8) for i in range(40)]
        with strata.Client([n.addr for n in nodes]) as c:
            wait_for(lambda: len(c.cluster_nodes()) == 2, "client learns the ring", 30)
            assert c.batch_put_from(keys, blocks) == [None] * 40
        via = {t: sum(stat(n.port, f"transfer_replica_{t}_count") for n in nodes) for t in ("cma", "tcp")}
        want = "cma" if cma == "auto" else "tcp"
        other = "tcp" if cma == "auto" else "cma"
        assert via[want] == 40 and via[other] == 0, via
        moved = sum(stat(n.port, f"transfer_replica_{want}_bytes") for n in nodes)
        assert moved == 40 * 256 * 1024
        nodes[0].proc.kill()
        nodes[0].proc.wait()
        wait_for(lambda: b"cluster_known_nodes:1" in resp(nodes[1].port, "CLUSTER", "INFO"), "ring of one", 60)
        with strata.Client([nodes[1].addr]) as c:
            outs = [np.zeros(256 * 1024, dtype=np.uint8) for _ in keys]
            assert c.batch_get_into(keys, outs) == [256 * 1024] * 40
            assert all((o == i).all() for i, o in enumerate(outs))
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()


def test_a_client_cannot_make_a_node_copy_a_process_outside_the_ring():
    """STRATA.REPLICATE's cma descriptor is used only for a process the ring
    lists: one naming this (client) process is ignored, the network
    descriptor is tried instead, and nothing is stored."""
    import ctypes
    import os

    node = Server()
    try:
        secret = ctypes.create_string_buffer(b"s" * 4096, 4096)
        start = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]
        cma = f"cma://{os.getpid()}:{start}/{ctypes.addressof(secret):x}+4096#00000001@1"
        tcp = "tcp://127.0.0.1:1/1000+4096#00000001@1"
        reply = resp(node.port, "STRATA.REPLICATE", "stolen", tcp, "1", "0", cma)
        assert reply.startswith(b"-ERR io"), reply  # the network pull failed: the cma one was never tried
        assert resp(node.port, "EXISTS", "stolen") == b":0\r\n"
        assert stat(node.port, "transfer_replica_cma_count") == 0
    finally:
        node.stop()
