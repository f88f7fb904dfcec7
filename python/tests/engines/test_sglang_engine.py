"""strata's HiCache backend driven by SGLang's own code (sglang 0.5.23 from
PyPI): the factory loads it from the documented extra config, SGLang's
HiCacheController backs pages up from a real host KV pool in one process,
and a fresh controller in another process prefetches them into a fresh
pool. Every page must come back byte for byte."""

from __future__ import annotations

import json
import uuid

import pytest

from harness import run_driver

PAGES = 6


def scenario(name, pool="mha", layout="page_first", path="v1", seed=1, ranks=None, model=None, pages=PAGES):
    return {"name": name, "pool": pool, "layout": layout, "path": path, "seed": seed,
            "ranks": ranks or {}, "model": model or name, "pages": pages}


@pytest.fixture(scope="module")
def written(server):
    tag = uuid.uuid4().hex[:6]
    m = lambda n: f"org/{n}-{tag}"  # noqa: E731  (a "/" as in real model names)
    writes = [
        scenario("v1", model=m("v1")),
        scenario("generic", path="generic", seed=2, model=m("generic")),
        scenario("direct", layout="page_first_direct", seed=3, model=m("direct")),
        scenario("layer_first", layout="layer_first", seed=4, model=m("layer_first")),
        scenario("head", layout="page_head", seed=10, model=m("head")),
        scenario("mla", pool="mla", seed=5, model=m("mla"), ranks={"tp_rank": 0, "tp_size": 2}),
        scenario("mla_rank1", pool="mla", seed=55, model=m("mla"), ranks={"tp_rank": 1, "tp_size": 2}),
        scenario("pp0", seed=6, model=m("pp"), ranks={"pp_rank": 0, "pp_size": 2}),
        scenario("pp1", seed=7, model=m("pp"), ranks={"pp_rank": 1, "pp_size": 2}),
        scenario("tp0", seed=8, model=m("tp"), ranks={"tp_rank": 0, "tp_size": 2}),
        scenario("tp1", seed=9, model=m("tp"), ranks={"tp_rank": 1, "tp_size": 2}),
    ]
    results = {r["name"]: r for r in run_driver("sglang_driver.py", "write", server.addr, json.dumps(writes))}
    return {w["name"]: w for w in writes}, results


def test_backup_through_the_controller(written):
    writes, results = written
    for name, r in results.items():
        assert "error" not in r, r
        if name == "mla_rank1":
            # MLA pages are the same on every tp rank: SGLang backs up from rank 0 only.
            assert r["skipped"] is True
        else:
            assert r == {"name": name, "backed_up_tokens": PAGES * 16, "skipped": False}


def test_prefetch_in_a_fresh_process_gets_every_page(server, written):
    writes, _ = written
    w = dict(writes)
    reads = [
        w["v1"], w["generic"], w["direct"], w["layer_first"], w["head"],
        # Both controller paths store the same keys and bytes.
        {**w["v1"], "name": "v1_read_generic", "path": "generic"},
        {**w["generic"], "name": "generic_read_v1", "path": "v1"},
        # MLA: rank 1 reads the pages rank 0 wrote.
        w["mla"], {**w["mla"], "name": "mla_read_rank1", "ranks": {"tp_rank": 1, "tp_size": 2}},
        # Pipeline stages and tp ranks writing the same page hashes keep both.
        w["pp0"], w["pp1"], w["tp0"], w["tp1"],
        # Never written: a clean miss.
        scenario("absent", model="never-written-" + uuid.uuid4().hex[:6]),
        # A layout other than the writer's holds other bytes: not a hit.
        {**w["v1"], "name": "other_layout", "layout": "page_first_direct"},
    ]
    results = {r["name"]: r for r in run_driver("sglang_driver.py", "read", server.addr, json.dumps(reads))}
    full = {"hit_tokens": PAGES * 16, "loaded_tokens": PAGES * 16, "pages_equal": PAGES}
    for name in ["v1", "generic", "direct", "layer_first", "head", "v1_read_generic", "generic_read_v1",
                 "mla", "mla_read_rank1", "pp0", "pp1", "tp0", "tp1"]:
        assert results[name] == {"name": name, **full}, results[name]
    for name in ["absent", "other_layout"]:
        assert results[name] == {"name": name, "hit_tokens": 0, "loaded_tokens": 0, "pages_equal": 0}


def test_factory_loads_it_and_unsupported_setups_are_refused_up_front(server):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    from strata.adapters.sglang import StrataHiCacheStorage

    def config(**kw):
        base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                    is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                    model_name="m", extra_config={"backend_name": "strata", "module_path": "strata.adapters.sglang",
                                                  "class_name": "StrataHiCacheStorage", "strata_seeds": server.addr})
        base.update(kw)
        return HiCacheStorageConfig(**base)

    backend = StorageBackendFactory.create_backend("dynamic", config(), None)
    assert isinstance(backend, StrataHiCacheStorage)
    # Pools the backend cannot store are refused when SGLang registers them
    # (its attach then fails with the reason), never inside a transfer.
    with pytest.raises(NotImplementedError, match="DeepSeek-V4"):
        backend.register_mem_host_pool_v2(object(), "deepseek_v4_c4")
    with pytest.raises(ValueError, match="neither page buffers .* nor flat pages"):
        backend.register_mem_host_pool_v2(object(), "swa")
    with pytest.raises(RuntimeError, match="without a KV pool"):
        backend.on_host_pools_registered()
    backend.close()
    with pytest.raises(Exception, match="split heads"):
        StorageBackendFactory.create_backend("dynamic", config(should_split_heads=True, tp_lcm_size=4), None)
