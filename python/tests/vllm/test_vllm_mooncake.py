"""vLLM's own Mooncake Store configuration and setup code (what its
MooncakeStoreConnector worker runs first) against strata's ``mooncake.store``
drop-in: the reference deployment's mooncake.json, unchanged, reaches a
strata node. (The connector's transfers themselves need CUDA: its worker
records ``torch.cuda.Event``s around every save.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm_tests_helpers", reason="runs in the vllm venv (scripts/engine-venv.sh vllm)")

from harness import mooncake_env, run_driver  # noqa: E402

HERE = Path(__file__).resolve().parent


def test_vllm_mooncake_setup_reaches_strata(server, tmp_path):
    cfg = tmp_path / "mooncake.json"
    # The reference deployment's file: sizes as strings, a tenant, an
    # RDMA device name; master_server_address has no meaning for strata.
    cfg.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE", "master_server_address": "127.0.0.1:50051",
        "protocol": "rdma", "device_name": "mlx5_0", "global_segment_size": "64MB",
        "local_buffer_size": "64MB", "tenant_id": "team-a",
    }))
    env = mooncake_env(MOONCAKE_CONFIG_PATH=str(cfg), STRATA_SEEDS=server.addr, VLLM_TARGET_DEVICE="cpu")
    (r,) = run_driver(str(HERE / "mooncake_setup_driver.py"), "setup", env=env)
    assert r["module"].startswith("mooncake"), r
    assert r == {**r, "put": 0, "got": "through vLLM's setup", "tenant": "team-a", "health": 0}, r
