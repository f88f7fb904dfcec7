"""The SGLang HiCache backend, driven the way SGLang drives it: the dynamic
factory constructs it with (storage_config, kwargs), registers the host
pool, then calls batch_exists / batch_set_v1 / batch_get_v1 with page keys
and host indices."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from fakes import HostPool, StorageConfig, TensorLike
from strata.keys import chunk_hashes

PAGE = 4
TOKEN_BYTES = 256


def make_backend(server, **cfg):
    extra = {
        "backend_name": "strata",
        "module_path": "strata.adapters.sglang",
        "class_name": "StrataHiCacheStorage",
        "strata_seeds": server.addr,
    }
    extra.update(cfg.pop("extra", {}))
    config = StorageConfig(extra_config=extra, **cfg)
    # As StorageBackendFactory._create_dynamic_backend does.
    module = importlib.import_module(extra["module_path"])
    return getattr(module, extra["class_name"])(config, {})


def page_keys(tokens, salt):
    return [salt + h.hex() for h in chunk_hashes(tokens, PAGE)]


@pytest.mark.parametrize("mla", [False, True])
def test_zero_copy_round_trip(server, key, mla):
    backend = make_backend(server, is_mla_model=mla, model_name=key("model"))
    pool = HostPool(pages=16, page_size=PAGE, token_bytes=TOKEN_BYTES, mla=mla)
    backend.register_mem_pool_host(pool)
    keys = page_keys(list(range(6 * PAGE)), "")
    rng = np.random.default_rng(7)
    pool.buf[:6] = rng.integers(0, 256, pool.buf[:6].shape, dtype=np.uint8)

    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys[:4], pool.indices(range(4))) == [True] * 4
    assert backend.batch_exists(keys) == 4
    assert backend.exists(keys[0]) and not backend.exists(keys[5])
    # Already stored pages are not sent again, and still report success.
    assert backend.batch_set_v1(keys[:6], pool.indices(range(6))) == [True] * 6

    got = backend.batch_get_v1(keys[:6], pool.indices(range(8, 14)))
    assert got == [True] * 6
    assert np.array_equal(pool.buf[:6], pool.buf[8:14])
    missing = page_keys(list(range(100, 100 + PAGE)), "")
    assert backend.batch_get_v1(missing, pool.indices([15])) == [False]
    backend.close()


def test_tensor_parallel_ranks_do_not_collide(server, key):
    model = key("model")
    keys = page_keys(list(range(PAGE)), "")
    pools, backends = [], []
    for rank in range(2):
        b = make_backend(server, tp_rank=rank, tp_size=2, model_name=model)
        p = HostPool(pages=2, page_size=PAGE, token_bytes=TOKEN_BYTES)
        p.buf[0] = rank + 1
        b.register_mem_pool_host(p)
        assert b.batch_set_v1(keys, p.indices([0])) == [True]
        pools.append(p)
        backends.append(b)
    for rank, (b, p) in enumerate(zip(backends, pools)):
        assert b.batch_get_v1(keys, p.indices([1])) == [True]
        assert (p.buf[1] == rank + 1).all()
        b.close()


def test_generic_path(server, key):
    backend = make_backend(server, model_name=key("model"))
    value = TensorLike(np.arange(64, dtype=np.float32))
    assert backend.set("p0", value) is True
    assert backend.batch_set(["p1", "p2"], [b"one", b"two"]) is True
    assert backend.batch_exists(["p0", "p1", "p2", "p3"]) == 3
    out = TensorLike(np.zeros(64, dtype=np.float32))
    assert backend.get("p0", out) is out and np.array_equal(out.array, value.array)
    assert backend.get("p1") == b"one"
    assert backend.get("nope") is None
    assert backend.batch_get(["p1", "nope"]) == [b"one", None]
    backend.close()


def test_layout_mismatch_is_a_clear_error(server, key):
    backend = make_backend(server, model_name=key("model"))
    pool = HostPool(pages=2, page_size=PAGE, token_bytes=TOKEN_BYTES, mla=True)  # 1 buffer/page
    backend.register_mem_pool_host(pool)
    with pytest.raises(ValueError, match="page_first"):
        backend.batch_set_v1(["a"], pool.indices([0]))
    backend.close()
