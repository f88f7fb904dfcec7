"""Where a client's data plane listens and what it advertises: the route
to the seeds by default, ``STRATA_DATA_BIND`` / ``STRATA_DATA_ADVERTISE``
(also for a client built from seeds alone, as the engine adapters build
theirs), and the engine configs' ``strata_data_bind`` keys. A loopback
address other than 127.0.0.1 stands in for a second interface; cross-host
routes run on the network-namespace bed (scripts/netbed.sh)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import strata
from strata.adapters import lmcache
from strata.adapters._options import client_options
from strata.mooncake import MooncakeDistributedStore, _data_plane


def _host(client: strata.Client) -> str:
    return client.data_endpoint.rsplit(":", 1)[0]


def test_loopback_seeds_keep_the_data_plane_on_loopback(server, monkeypatch):
    monkeypatch.delenv("STRATA_DATA_BIND", raising=False)
    monkeypatch.delenv("STRATA_DATA_ADVERTISE", raising=False)
    with strata.Client(server.addr) as c:
        assert c.config.data_bind == ""
        assert _host(c) == "127.0.0.1"


def test_the_environment_sets_the_data_plane_of_a_client_from_seeds(server, monkeypatch, key):
    monkeypatch.setenv("STRATA_DATA_BIND", "127.0.0.2:0")
    # cma off: the node must pull the payload from the data plane itself.
    with strata.Client(server.addr, cma=False) as c:
        assert _host(c) == "127.0.0.2"
        value = np.random.default_rng(7).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
        assert len(value) > c.config.inline_put_max_bytes
        c.put(key(), value)
        assert c.get(key()) == value
    # A set value wins over the environment.
    with strata.Client(server.addr, data_bind="127.0.0.3:0") as c:
        assert _host(c) == "127.0.0.3"
    monkeypatch.setenv("STRATA_DATA_BIND", "0.0.0.0:0")
    monkeypatch.setenv("STRATA_DATA_ADVERTISE", "127.0.0.4")
    with strata.Client(server.addr) as c:
        assert _host(c) == "127.0.0.4"
    monkeypatch.setenv("STRATA_DATA_BIND", "not an address")
    with pytest.raises(strata.StrataError, match="STRATA_DATA_BIND"):
        strata.Client(server.addr)


def test_an_unspecified_bind_advertises_the_route(server, monkeypatch, key):
    monkeypatch.delenv("STRATA_DATA_BIND", raising=False)
    monkeypatch.delenv("STRATA_DATA_ADVERTISE", raising=False)
    with strata.Client(server.addr, data_bind="0.0.0.0:0", cma=False) as c:
        assert _host(c) == "127.0.0.1"
        c.put(key(), b"x" * (5 << 20))
        assert c.get(key()) == b"x" * (5 << 20)


def test_engine_configs_pass_the_data_plane_addresses():
    assert client_options({}) == {}
    assert client_options({"strata_data_bind": "10.0.0.5:0", "strata_data_advertise": ""}) == {
        "data_bind": "10.0.0.5:0"
    }
    opts = client_options({"strata_client": {"cma": False, "data_bind": "a"}, "strata_data_bind": "b"})
    assert opts == {"cma": False, "data_bind": "b"}
    # Mooncake's local_hostname is this engine host's address; a loopback
    # one (single-machine configs) leaves the route to the seeds.
    assert _data_plane({}, "10.1.2.3:12345") == {"data_bind": "10.1.2.3:0"}
    assert _data_plane({}, "10.1.2.3") == {"data_bind": "10.1.2.3:0"}
    assert _data_plane({}, "localhost") == {}
    assert _data_plane({}, "") == {}
    assert _data_plane({"strata_data_bind": "10.9.9.9:0"}, "10.1.2.3") == {"data_bind": "10.9.9.9:0"}


def test_the_mooncake_facade_takes_strata_data_bind(server, monkeypatch):
    monkeypatch.delenv("STRATA_DATA_BIND", raising=False)
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                    "master_server_address": server.addr, "strata_data_bind": "127.0.0.2:0"}) == 0
    assert _host(s._client) == "127.0.0.2"
    s.close()


def test_the_lmcache_connector_takes_strata_data_bind(server, monkeypatch):
    if lmcache._Base.__module__ != lmcache.__name__:
        pytest.skip("LMCache is installed: its connector tests run in python/tests/engines")
    monkeypatch.delenv("STRATA_DATA_BIND", raising=False)
    config = SimpleNamespace(
        use_layerwise=False,
        extra_config={"strata_seeds": server.addr, "strata_data_bind": "127.0.0.2:0",
                      "strata_client": {"cma": False}},
    )
    conn = lmcache.StrataConnector(config=config)
    try:
        assert _host(conn.client) == "127.0.0.2"
        assert conn.client.config.cma is False
    finally:
        conn.client.close()
