"""The LMCache connector, driven the way LMCache drives it: its plugin
loader imports the adapter named in extra_config and asks it for a
connector for the remote_url; the storage backend then awaits exists /
put / get and the batched variants on its event loop."""

from __future__ import annotations

import asyncio
import importlib

import numpy as np
import pytest

from fakes import CacheEngineKey, LocalCPUBackend, MemoryObj


class Config:
    """LMCacheEngineConfig fields the loader reads."""

    def __init__(self, extra):
        self.remote_storage_plugins = ["strata"]
        self.extra_config = extra


class Context:
    """LMCache ConnectorContext."""

    def __init__(self, url, loop, backend, config):
        self.url, self.loop, self.local_cpu_backend, self.config = url, loop, backend, config


def load_connector(server, loop, backend):
    config = Config(
        {
            "remote_storage_plugin.strata.module_path": "strata.adapters.lmcache",
            "remote_storage_plugin.strata.class_name": "StrataConnectorAdapter",
        }
    )
    # As ConnectorManager._remote_adapters_plugin_launcher + create_connector do.
    name = config.remote_storage_plugins[0]
    module = importlib.import_module(config.extra_config[f"remote_storage_plugin.{name}.module_path"])
    adapter = getattr(module, config.extra_config[f"remote_storage_plugin.{name}.class_name"])()
    url = f"strata://{server.addr}"
    assert adapter.can_parse(url) and not adapter.can_parse("redis://x:1")
    return adapter.create_connector(Context(url, loop, backend, config))


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def chunk(i, shape=(2, 4, 16, 8)):
    obj = MemoryObj(shape)
    obj.data[:] = np.random.default_rng(i).integers(0, 256, obj.data.size, dtype=np.uint8)
    return obj


def test_put_exists_get(server, loop, key):
    backend = LocalCPUBackend()
    conn = load_connector(server, loop, backend)
    run = loop.run_until_complete
    k = CacheEngineKey(key("model"), 1, 0, 0xABC)
    missing = CacheEngineKey(key("model"), 1, 0, 0xDEF)
    obj = chunk(1)
    assert run(conn.exists(k)) is False
    run(conn.put(k, obj))
    assert run(conn.exists(k)) is True and conn.exists_sync(k) is True
    got = run(conn.get(k))
    assert got is not None and got is not obj
    assert np.array_equal(got.data, obj.data)
    assert got.get_shape() == obj.get_shape() and got.get_dtype() == "torch.bfloat16"
    assert run(conn.get(missing)) is None
    assert run(conn.list()) == []
    assert run(conn.ping()) == 0
    assert conn.remove_sync(k) is True and run(conn.exists(k)) is False
    run(conn.close())


def test_batched_variants(server, loop, key):
    conn = load_connector(server, loop, LocalCPUBackend())
    run = loop.run_until_complete
    keys = [CacheEngineKey(key("model"), 2, 1, i) for i in range(6)]
    objs = [chunk(i) for i in range(6)]
    run(conn.batched_put(keys[:4], objs[:4]))
    assert conn.batched_contains(keys) == [True] * 4 + [False] * 2
    assert conn.batched_contains([keys[5], keys[0]], stop_after_first_not_exits=False) == [False, True]
    assert run(conn.batched_async_contains("lookup-1", keys)) == 4
    got = run(conn.batched_get(keys[3:5]))
    assert np.array_equal(got[0].data, objs[3].data) and got[1] is None
    partial = run(conn.batched_get_non_blocking("lookup-2", keys))
    assert len(partial) == 4
    assert all(np.array_equal(g.data, o.data) for g, o in zip(partial, objs))
    run(conn.close())


def test_external_url_form(server, loop, monkeypatch):
    # external://host:0/strata.adapters.lmcache/?connector_name=StrataConnector
    # constructs the class with (loop=, local_cpu_backend=, config=).
    module = importlib.import_module("strata.adapters.lmcache")
    conn = module.StrataConnector(
        loop=loop, local_cpu_backend=LocalCPUBackend(), config=Config({"strata_seeds": server.addr})
    )
    assert loop.run_until_complete(conn.ping()) == 0
    loop.run_until_complete(conn.close())
