"""The mooncake.store drop-in (python/mooncake-compat) under SGLang's own
Mooncake HiCache backend (sglang 0.5.23's MooncakeStore, unmodified):
SGLang's HiCacheController backs pages up through it in one process and
prefetches them in a fresh one, against one node (master_server_address
naming it) and a 3-node cluster found through etcd (metadata_server
etcd://, as a Mooncake deployment names its metadata service)."""

from __future__ import annotations

import json
import uuid

from harness import mooncake_env, run_driver

PAGES = 6


def scenarios(tag, **kw):
    base = {"backend": "mooncake", "pages": PAGES, "path": "v1", **kw}
    return [
        {**base, "name": "mha", "pool": "mha", "layout": "page_first", "seed": 21, "model": f"mc-mha-{tag}"},
        {**base, "name": "mla", "pool": "mla", "layout": "page_first", "seed": 22, "model": f"mc-mla-{tag}"},
        {**base, "name": "pp1", "pool": "mha", "layout": "page_first", "seed": 23, "model": f"mc-pp-{tag}",
         "ranks": {"pp_rank": 1, "pp_size": 2}},
    ]


def round_trip(seeds, env, **kw):
    tag = uuid.uuid4().hex[:6]
    writes = scenarios(tag, **kw)
    written = run_driver("sglang_driver.py", "write", seeds, json.dumps(writes), env=env)
    for r in written:
        assert r.get("backed_up_tokens") == PAGES * 16, r
    absent = {**writes[0], "name": "absent", "model": f"mc-none-{tag}"}
    read = {r["name"]: r for r in run_driver("sglang_driver.py", "read", seeds, json.dumps(writes + [absent]), env=env)}
    for w in writes:
        assert read[w["name"]] == {"name": w["name"], "hit_tokens": PAGES * 16,
                                   "loaded_tokens": PAGES * 16, "pages_equal": PAGES}, read[w["name"]]
    assert read["absent"]["hit_tokens"] == 0


def test_sglang_mooncake_backend_on_one_node(server):
    round_trip(server.addr, mooncake_env())


def test_sglang_mooncake_backend_finds_the_cluster_through_etcd(cluster, etcd_url, cluster_name):
    env = mooncake_env(STRATA_CLUSTER_NAME=cluster_name)
    # master_server_address names Mooncake's master, which strata has not:
    # the etcd metadata server is what finds the nodes.
    round_trip("127.0.0.1:1", env, metadata_server=etcd_url)
