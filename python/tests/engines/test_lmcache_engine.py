"""strata's LMCache connector driven by LMCache's own engine (lmcache 0.5.6
from PyPI, CPU): one process stores a prompt's KV, a fresh process with the
same config looks it up and retrieves it; every token must hit and every
retrieved tensor must equal what was stored. Against one node (the plugin
config of python/README.md) and a 3-node cluster with replica_num 2 (the
remote_url form), where a node is killed before the read."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from harness import Server, lmcache_plugin_config, run_driver

CHUNK = 256
P1 = {"seed": 1, "tokens": 5 * CHUNK}
P2 = {"seed": 2, "tokens": 5 * CHUNK, "shared": [1, 3 * CHUNK]}  # shares 3 chunks with P1
UNSEEN = {"seed": 3, "tokens": 2 * CHUNK}


def plugin_config(tmp_path, seeds, extra=""):
    """python/README.md's LMCache config, with this test's seeds."""
    return lmcache_plugin_config(tmp_path / "lmcache-plugin.yaml", seeds, CHUNK, extra)


def url_config(tmp_path, seeds):
    """The deprecated remote_url form (LMCache's external:// loader)."""
    path = tmp_path / "lmcache-url.yaml"
    path.write_text(textwrap.dedent(f"""\
        chunk_size: {CHUNK}
        local_cpu: true
        max_local_cpu_size: 1
        remote_serde: "naive"
        remote_url: "external://127.0.0.1:0/strata.adapters.lmcache/?connector_name=StrataConnector"
        extra_config:
          strata_seeds: "{seeds}"
        """))
    return str(path)


def lmcache(config, *steps):
    # LMCache hashes chunks with Python's hash() unless vLLM supplies one:
    # every process of a deployment must share PYTHONHASHSEED.
    results = run_driver("lmcache_driver.py", config, json.dumps(list(steps)), env={"PYTHONHASHSEED": "0"})
    *outcomes, errors = results
    assert errors == {"op": "thread_errors", "errors": []}
    return outcomes


def assert_reads_everything(config):
    outcomes = lmcache(
        config,
        {"op": "lookup", "prompt": P1}, {"op": "retrieve", "prompt": P1},
        {"op": "lookup", "prompt": P2}, {"op": "retrieve", "prompt": P2},
        {"op": "lookup", "prompt": UNSEEN}, {"op": "list"},
    )
    lookup1, retrieve1, lookup2, retrieve2, unseen, listed = outcomes
    assert lookup1 == {"op": "lookup", "hit_tokens": P1["tokens"]}
    assert retrieve1["retrieved_tokens"] == P1["tokens"] and retrieve1["equal"] is True, retrieve1
    assert lookup2 == {"op": "lookup", "hit_tokens": 3 * CHUNK}
    assert retrieve2["retrieved_tokens"] == 3 * CHUNK and retrieve2["equal"] is True, retrieve2
    assert unseen == {"op": "lookup", "hit_tokens": 0}
    assert listed["keys"] >= 5


def test_single_node_plugin_config(server, tmp_path):
    config = plugin_config(tmp_path, server.addr)
    (stored,) = lmcache(config, {"op": "store", "prompt": P1})
    assert stored["remote_tokens"] == P1["tokens"], stored
    assert_reads_everything(config)


def test_partial_last_chunk_comes_back_reshaped(server, tmp_path):
    config = plugin_config(tmp_path, server.addr, extra="save_unfull_chunk: true")
    prompt = {"seed": 4, "tokens": 4 * CHUNK + 77}
    (stored,) = lmcache(config, {"op": "store", "prompt": prompt})
    assert stored["remote_tokens"] == prompt["tokens"], stored
    lookup, retrieved = lmcache(config, {"op": "lookup", "prompt": prompt}, {"op": "retrieve", "prompt": prompt})
    assert lookup == {"op": "lookup", "hit_tokens": prompt["tokens"]}
    assert retrieved["retrieved_tokens"] == prompt["tokens"] and retrieved["equal"] is True, retrieved


def test_cluster_with_replicas_survives_a_killed_node(cluster, tmp_path):
    config = url_config(tmp_path, ",".join(n.addr for n in cluster))
    (stored,) = lmcache(config, {"op": "store", "prompt": P1})
    assert stored["remote_tokens"] == P1["tokens"], stored
    cluster[1].proc.kill()
    cluster[1].proc.wait()
    assert_reads_everything(config)


def test_node_stopped_mid_way_gives_misses_not_exceptions(tmp_path):
    node = Server(pool="256MiB")
    try:
        config = plugin_config(tmp_path, node.addr)
        stored, before, _, after_kill = lmcache(
            config,
            {"op": "store", "prompt": P1},
            {"op": "lookup", "prompt": P1},
            {"op": "stop_server", "pid": node.proc.pid},
            {"op": "store", "prompt": UNSEEN, "wait": False},
        )
        # A fresh engine while the node is down: misses, no exception.
        lookup, retrieved = lmcache(config, {"op": "lookup", "prompt": P1}, {"op": "retrieve", "prompt": P1})
    finally:
        node.stop()
    assert stored["remote_tokens"] == P1["tokens"], stored
    assert before == {"op": "lookup", "hit_tokens": P1["tokens"]}
    assert "error" not in after_kill, after_kill
    assert lookup == {"op": "lookup", "hit_tokens": 0}
    assert retrieved["retrieved_tokens"] == 0 and retrieved["equal"] is True
