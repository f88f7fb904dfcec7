"""The engines across hosts: a three-node cluster on the network bed
(scripts/netbed.sh; etcd and each node on a host of its own, started with
the docs' multi-host commands), the engines writing on the "prefill" host
and hitting on the "decode" host, as a prefill/decode deployment does.
Values are of a Llama-3-8B-shaped cache (32 layers, 8 KV heads of 128,
bf16): LMCache's 32 MiB chunks and SGLang's 8 MiB pages go zero-copy, the
nodes pulling them from the writer's data plane on its own host address.
SGLang's Mooncake backend finds the cluster through etcd
(``metadata_server: etcd://...``) on the ``mooncake.store`` drop-in."""

from __future__ import annotations

import json
import uuid

from harness import lmcache_plugin_config, mooncake_env, run_driver

# LMCache: layers, KV heads, head size (its chunk is 256 tokens, so 32 MiB).
LMC_SHAPE = "32,8,128"
CHUNK = 256
# SGLang: page, layers, KV heads, head dim, device tokens (8 MiB per k and v page).
SGL_SHAPE = "128,32,8,128,1024"
SGL_PAGES = 4


def pulled(bed) -> int:
    """Bytes the nodes pulled from clients' data planes over TCP."""
    return bed.total("transfer_in_tcp_bytes")


def test_lmcache_stores_on_prefill_and_hits_on_decode(bed, tmp_path):
    config = lmcache_plugin_config(tmp_path / "lmcache.yaml", bed.seeds, CHUNK)
    prompt = {"seed": 41, "tokens": 2 * CHUNK}
    env = {"PYTHONHASHSEED": "0", "STRATA_LMC_SHAPE": LMC_SHAPE}
    before = pulled(bed)
    *stored, errors = run_driver("lmcache_driver.py", config, json.dumps([{"op": "store", "prompt": prompt}]),
                                 env=env, host="prefill")
    assert errors["errors"] == [], errors
    chunk_bytes = 2 * 32 * CHUNK * 8 * 128 * 2
    assert pulled(bed) - before >= 2 * chunk_bytes, "the 32 MiB chunks were not pulled from prefill's data plane"
    *read, errors = run_driver("lmcache_driver.py", config, json.dumps(
        [{"op": "lookup", "prompt": prompt}, {"op": "retrieve", "prompt": prompt}]), env=env, host="decode")
    assert errors["errors"] == [], errors
    lookup, retrieve = read
    assert lookup == {"op": "lookup", "hit_tokens": prompt["tokens"]}
    assert retrieve["retrieved_tokens"] == prompt["tokens"] and retrieve["equal"] is True, retrieve


def test_sglang_server_path_backs_up_on_prefill_and_prefetches_on_decode(bed):
    tag = uuid.uuid4().hex[:6]
    scenarios = [
        {"name": "mha", "pool": "mha", "path": "v1", "seed": 51, "ranks": {}, "model": f"org/bed-mha-{tag}",
         "pages": SGL_PAGES},
        {"name": "mamba", "pool": "mamba", "path": "v1", "seed": 52, "ranks": {}, "model": f"org/bed-mamba-{tag}",
         "pages": SGL_PAGES},
    ]
    env = {"STRATA_SGL_SHAPE": SGL_SHAPE}
    tokens = SGL_PAGES * int(SGL_SHAPE.split(",")[0])
    before = pulled(bed)
    written = run_driver("sglang_server_driver.py", "write", bed.seeds, json.dumps(scenarios), env=env, host="prefill")
    for r in written:
        assert r.get("backed_up_tokens") == tokens, r
    # The MHA model's k and v pages (the hybrid model's, of half the layers,
    # are 4 MiB: sent with the command).
    assert pulled(bed) - before >= 2 * SGL_PAGES * (8 << 20), "the 8 MiB pages were not pulled"
    read = run_driver("sglang_server_driver.py", "read", bed.seeds, json.dumps(scenarios), env=env, host="decode")
    for r in read:
        assert (r["hit_tokens"], r["loaded_tokens"], r["pages_equal"]) == (tokens, tokens, SGL_PAGES), r
    assert [r["state_equal"] for r in read if r["name"] == "mamba"] == [True]


def test_mooncake_drop_in_finds_the_cluster_through_etcd_across_hosts(bed):
    tag = uuid.uuid4().hex[:6]
    pages = 4
    scenario = {"name": "mc", "backend": "mooncake", "pool": "mha", "layout": "page_first", "path": "v1",
                "seed": 61, "model": f"bed-mc-{tag}", "pages": pages, "metadata_server": bed.metadata_server}
    # Mooncake's master address names no strata process: etcd finds the nodes.
    env = mooncake_env(STRATA_SGL_SHAPE="16,32,8,128,1024")
    [w] = run_driver("sglang_driver.py", "write", "127.0.0.1:1", json.dumps([scenario]), env=env, host="prefill")
    assert w.get("backed_up_tokens") == pages * 16, w
    [r] = run_driver("sglang_driver.py", "read", "127.0.0.1:1", json.dumps([scenario]), env=env, host="decode")
    assert (r["hit_tokens"], r["pages_equal"]) == (pages * 16, pages), r


def test_no_node_used_cross_memory_attach(bed):
    # Each bed host has its own pid namespace, as separate machines have:
    # every byte above went over the network.
    assert bed.total("cma_sessions") == 0
