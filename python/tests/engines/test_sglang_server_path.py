"""strata's HiCache backend on the path SGLang's server takes (sglang 0.5.23
from PyPI): the documented command line parsed by SGLang, the tree cache
built by its own ``create_unified_radix_cache`` (a ``HostPoolGroup`` and a
``HybridCacheController`` attaching the backend through the v2 pool
registration), pages backed up by that controller in one process and
prefetched by a fresh one in another. Every page, and a hybrid model's
sidecar pages (a Mamba state, a sliding window), must come back byte for
byte."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from harness import Server, driver_results, run_driver, start_driver

PAGES = 6
TOKENS = PAGES * 16
DRIVER = "sglang_server_driver.py"
# What SGLang 0.5.23's server builds for hierarchical cache with a storage
# backend. If a release changes it, these tests fail here first, before a
# backend that only knows an older path silently stops being attached.
SERVER_PATH = {"tree": "UnifiedRadixCache", "controller": "HybridCacheController",
               "host_pools": "HostPoolGroup", "backend": "StrataHiCacheStorage"}


def scenario(name, pool="mha", path="v1", seed=1, ranks=None, model=None, **extra):
    return {"name": name, "pool": pool, "path": path, "seed": seed, "ranks": ranks or {},
            "model": model or name, "pages": PAGES, **extra}


@pytest.fixture(scope="module")
def written(server):
    tag = uuid.uuid4().hex[:6]
    m = lambda n: f"org/{n}-{tag}"  # noqa: E731  (a "/" as in real model names)
    writes = [
        scenario("mha", model=m("mha")),
        scenario("mha_generic", path="generic", seed=2, model=m("mha_generic")),
        scenario("mla", pool="mla", seed=3, model=m("mla"), ranks={"tp_rank": 0, "tp_size": 2}),
        scenario("mla_rank1", pool="mla", seed=33, model=m("mla"), ranks={"tp_rank": 1, "tp_size": 2}),
        scenario("mamba", pool="mamba", seed=4, model=m("mamba")),
        scenario("mamba_generic", pool="mamba", path="generic", seed=5, model=m("mamba_generic")),
        scenario("mamba_no_state", pool="mamba", seed=6, model=m("mamba_no_state"), no_state=True),
        scenario("swa", pool="swa", seed=9, model=m("swa")),
        scenario("swa_no_window", pool="swa", seed=10, model=m("swa_no_window"), no_state=True),
        scenario("pp0", seed=7, model=m("pp"), ranks={"pp_rank": 0, "pp_size": 2}),
        scenario("pp1", seed=8, model=m("pp"), ranks={"pp_rank": 1, "pp_size": 2}),
    ]
    results = {r["name"]: r for r in run_driver(DRIVER, "write", server.addr, json.dumps(writes))}
    return {w["name"]: w for w in writes}, results


# Per hybrid model: its sidecar pool and the trailing pages it keeps (the
# driver's SIDECARS: one Mamba state, a two-page sliding window).
SIDECAR_PAGES = {"mamba": 1, "swa": 2}


def pools(s: dict) -> list:
    return ["kv", s["pool"]] if s["pool"] in SIDECAR_PAGES else ["kv"]


def test_the_server_path_builds_a_hybrid_controller_that_attaches_strata(written):
    writes, results = written
    for name, r in results.items():
        assert "error" not in r, r
        assert {k: r[k] for k in SERVER_PATH} == SERVER_PATH, r
        assert r["pools"] == pools(writes[name]), r


def test_backup_through_the_controller(written):
    writes, results = written
    for name, r in results.items():
        if name == "mla_rank1":
            # MLA pages are the same on every tp rank: SGLang backs up from rank 0 only.
            assert r["skipped"] is True and r["backed_up_tokens"] == 0, r
            continue
        assert (r["backed_up_tokens"], r["skipped"]) == (TOKENS, False), r
        pool = writes[name]["pool"]
        with_state = pool in SIDECAR_PAGES and not writes[name].get("no_state")
        assert r.get("sidecar_pages") == ({pool: SIDECAR_PAGES[pool]} if with_state else None), r


def test_prefetch_in_a_fresh_process_gets_every_page_and_the_sidecars(server, written):
    writes, _ = written
    w = dict(writes)
    reads = [
        w["mha"], w["mha_generic"], w["mla"], w["pp0"], w["pp1"], w["mamba"], w["mamba_generic"],
        # Both controller paths store the same keys and bytes.
        {**w["mha"], "name": "mha_read_generic", "path": "generic"},
        {**w["mamba"], "name": "mamba_read_generic", "path": "generic"},
        w["swa"], {**w["swa"], "name": "swa_read_generic", "path": "generic"},
        # MLA: rank 1 reads the pages rank 0 wrote.
        {**w["mla"], "name": "mla_read_rank1", "ranks": {"tp_rank": 1, "tp_size": 2}},
        # KV pages without the state (or window) at their end: nothing a
        # hybrid model can restore.
        w["mamba_no_state"], w["swa_no_window"],
        # Never written: a clean miss.
        scenario("absent", model="never-written-" + uuid.uuid4().hex[:6]),
    ]
    results = {r["name"]: r for r in run_driver(DRIVER, "read", server.addr, json.dumps(reads))}
    for name, r in results.items():
        assert "error" not in r, r
        assert {k: r[k] for k in SERVER_PATH} == SERVER_PATH, r
    full = {"hit_tokens": TOKENS, "loaded_tokens": TOKENS, "pages_equal": PAGES}
    for name in ["mha", "mha_generic", "mla", "pp0", "pp1", "mha_read_generic", "mla_read_rank1"]:
        assert {k: results[name][k] for k in full} == full, results[name]
    for name in ["mamba", "mamba_generic", "mamba_read_generic", "swa", "swa_read_generic"]:
        r = results[name]
        assert {k: r[k] for k in full} == full, r
        pages = SIDECAR_PAGES[name.split("_")[0]]
        assert (r["state_pages"], r["state_equal"]) == (pages, True), r
    for name in ["mamba_no_state", "swa_no_window", "absent"]:
        assert (results[name]["hit_tokens"], results[name]["loaded_tokens"]) == (0, 0), results[name]


def test_a_node_killed_mid_run_is_a_miss_not_a_crash(tmp_path):
    node = Server(pool="128MiB")
    try:
        s = scenario("killed", model="org/killed-" + uuid.uuid4().hex[:6], pause=True)
        [w] = run_driver(DRIVER, "write", node.addr, json.dumps([s]))
        assert w["backed_up_tokens"] == TOKENS, w
        proc = start_driver(DRIVER, "read", node.addr, json.dumps([s]),
                            env={"STRATA_DRIVER_PAUSE_DIR": str(tmp_path)})
        wait_for_file(tmp_path / "ready-killed", proc)
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
        (tmp_path / "go-killed").touch()
        results = {r["name"]: r for r in driver_results(proc, f"{DRIVER} read")}
    finally:
        node.stop()
    # The driver exited cleanly: SGLang's prefetch and backup threads lived
    # through it, and the controller detached.
    r = results["killed"]
    assert "error" not in r, r
    assert (r["hit_tokens"], r["loaded_tokens"]) == (0, 0), r


def wait_for_file(path, proc, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"driver exited {proc.returncode} before {path.name}: {proc.stderr.read()[-4000:]}")
        assert time.monotonic() < deadline, f"no {path.name} within {timeout_s} s"
        time.sleep(0.05)
