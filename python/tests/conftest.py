"""Fixtures: one real strata-server for the session (built from this
workspace), and a fresh client with a unique key prefix per test."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import strata  # noqa: E402
from servers import Server  # noqa: E402


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = strata.Client(server.addr)
    yield c
    c.close()


@pytest.fixture
def key(request):
    """A key prefix no other test uses: tests share one server."""
    tag = uuid.uuid4().hex[:8]
    return lambda name="k": f"{request.node.name}:{tag}:{name}"
