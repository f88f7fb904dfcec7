"""Fixtures and helpers for the engine tests: real strata-server processes (and etcd)
from python/tests/servers.py. These tests run in the engines venv
(scripts/engine-venv.sh), where LMCache and SGLang are installed from PyPI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from servers import Etcd, Server, resp, wait_for  # noqa: E402

DRIVER_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def server():
    s = Server(pool="512MiB")
    yield s
    s.stop()


CLUSTER_NAME = f"engines-{os.getpid()}"


@pytest.fixture(scope="module")
def etcd():
    e = Etcd()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def etcd_url(etcd):
    return etcd.url


@pytest.fixture(scope="module")
def cluster_name():
    return CLUSTER_NAME


@pytest.fixture(scope="module")
def cluster(etcd):
    """Three nodes in etcd with replica_num 2 (distinct host names)."""
    nodes = []
    try:
        for i in range(3):
            nodes.append(
                Server(
                    [
                        "--metadata-server", etcd.url, "--cluster-name", CLUSTER_NAME,
                        "--node-id", f"n{i}", "--host-name", f"h{i}", "--replica-num", "2",
                    ],
                    pool="384MiB",
                )
            )
        for n in nodes:
            wait_for(lambda n=n: b"cluster_known_nodes:3" in resp(n.port, "CLUSTER", "INFO"),
                     f"node {n.port} sees all three nodes")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="module")
def bed():
    """A three-node cluster on the network bed (python/tests/bedcluster.py);
    skipped only where the bed cannot be made (not root)."""
    from bedcluster import BedCluster

    try:
        cluster = BedCluster()
    except PermissionError as e:
        pytest.skip(str(e))
    yield cluster
    cluster.stop()


def lmcache_plugin_config(path: Path, seeds: str, chunk: int, extra: str = "") -> str:
    """python/README.md's LMCache config (the remote storage plugin), with
    these seeds, written to ``path``."""
    path.write_text(textwrap.dedent(f"""\
        {extra}
        chunk_size: {chunk}
        local_cpu: true
        max_local_cpu_size: 1
        remote_serde: "naive"
        remote_storage_plugins: ["strata"]
        extra_config:
          remote_storage_plugin.strata.module_path: strata.adapters.lmcache
          remote_storage_plugin.strata.class_name: StrataConnectorAdapter
          remote_storage_plugin.strata.seeds: "{seeds}"
        """))
    return str(path)


def mooncake_env(**extra: str) -> dict:
    """Environment for a driver that imports ``mooncake.store``: strata's
    drop-in, installed (by scripts/test.sh) into ``STRATA_MOONCAKE_COMPAT``."""
    where = os.environ.get("STRATA_MOONCAKE_COMPAT")
    if not where:
        raise RuntimeError("STRATA_MOONCAKE_COMPAT is not set: install python/mooncake-compat with --target")
    return {"PYTHONPATH": where, **extra}


BED = HERE.parents[2] / "scripts" / "netbed.sh"


def start_driver(script: str, *args: str, env: dict = None, host: str = None) -> subprocess.Popen:
    """Starts a driver in a fresh interpreter (collect it with
    ``driver_results``); with ``host``, on that host of the network bed
    (scripts/netbed.sh)."""
    full_env = dict(os.environ)
    if host:  # an engine host of the bed: no STRATA_* settings of this host's
        from bedcluster import without_strata_settings

        full_env = without_strata_settings(full_env)
    # SGLang JIT-builds a C++ extension with the venv's ninja.
    full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env.get('PATH', '')}"
    full_env.update(env or {})
    on_host = [str(BED), "exec", host] if host else []
    return subprocess.Popen(
        [*on_host, sys.executable, str(HERE / script), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
    )


def driver_results(proc: subprocess.Popen, what: str) -> list:
    """A started driver's ``RESULT {json}`` lines, once it exits."""
    try:
        stdout, stderr = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    results = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise AssertionError(f"{what} exited {proc.returncode}:\n{stdout[-4000:]}\n{stderr[-8000:]}")
    return results


def run_driver(script: str, *args: str, env: dict = None, host: str = None) -> list:
    """Runs a driver in a fresh interpreter (on ``host`` of the network
    bed, if given); its ``RESULT {json}`` lines."""
    return driver_results(start_driver(script, *args, env=env, host=host), f"{script} {args[0]}")
