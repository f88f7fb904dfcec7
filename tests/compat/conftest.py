"""Shared fixtures for the strata RESP conformance suite (black box).

Target: STRATA_HOST (default 127.0.0.1), STRATA_PORT (required).
The suite is destructive (FLUSHALL): point it at a dedicated server.
"""
import os
import re
import uuid

import pytest
import redis

HOST = os.environ.get("STRATA_HOST", "127.0.0.1")
PORT = os.environ.get("STRATA_PORT")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "strata_only: intentional strata difference; skipped on other servers")
    if not PORT:
        raise pytest.UsageError("STRATA_PORT is required (e.g. STRATA_PORT=6379 pytest tests/compat)")


def make_client(protocol, **kw):
    return redis.Redis(host=HOST, port=int(PORT), protocol=protocol,
                       socket_timeout=30, socket_connect_timeout=10, **kw)


@pytest.fixture(scope="session")
def hello_info():
    """HELLO 3 reply of the target, keys/values decoded to str where bytes."""
    c = make_client(3)
    try:
        raw = c.execute_command("HELLO", 3)
    finally:
        c.close()
    return {k.decode() if isinstance(k, bytes) else k:
            v.decode() if isinstance(v, bytes) else v for k, v in raw.items()}


@pytest.fixture(scope="session")
def server_kind(hello_info):
    """'strata', 'redis', ... as announced by the `server` field of HELLO."""
    return hello_info["server"]


@pytest.fixture(autouse=True)
def _skip_strata_only(request, server_kind):
    if request.node.get_closest_marker("strata_only") and server_kind != "strata":
        pytest.skip(f"strata-only behaviour (target is {server_kind!r})")


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def proto(request):
    return request.param


@pytest.fixture
def r(proto):
    c = make_client(proto)
    yield c
    c.close()


@pytest.fixture
def prefix(request):
    """Unique, glob-safe key prefix for one test; every key under it is deleted afterwards."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)
    p = f"compat:{name}:{uuid.uuid4().hex[:12]}:"
    yield p
    c = make_client(2)
    try:
        keys = list(c.scan_iter(match=p + "*", count=1000))
        for i in range(0, len(keys), 500):
            c.delete(*keys[i:i + 500])
    finally:
        c.close()
