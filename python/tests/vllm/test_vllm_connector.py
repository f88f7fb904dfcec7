"""strata's vLLM connector driven by vLLM 0.33.0's own code (config,
connector factory, ``Scheduler``, worker-side connector lifecycle), in
fresh processes (vllm_driver.py): what one process stores, a scheduler in
another finds as external tokens and its worker loads byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm_tests_helpers", reason="runs in the vllm venv (scripts/engine-venv.sh vllm)")

from harness import run_driver  # noqa: E402

HERE = Path(__file__).resolve().parent
BLOCK = 16
# vLLM's test requests: `prefix` tokens of 1, then i * id. R1 and R2 share
# a 3-block prefix; UNSEEN shares nothing.
R1 = {"id": 1, "tokens": 53, "prefix": 48}
R2 = {"id": 2, "tokens": 60, "prefix": 48}
EXACT = {"id": 4, "tokens": 48, "prefix": 48}
UNSEEN = {"id": 3, "tokens": 40, "prefix": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama config (vLLM reads only config.json here)."""
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
}


def drive(*steps):
    env = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "TRANSFORMERS_OFFLINE": "1"}
    return run_driver(str(HERE / "vllm_driver.py"), json.dumps(list(steps)), env=env)


def base(server, model_dir, ns, **kw):
    return {"seeds": server.addr, "model": model_dir, "namespace": ns, **kw}


def test_factory_loads_the_connector_and_refuses_an_unreachable_store(server, model_dir):
    (loaded, unreachable) = drive({"op": "factory", **base(server, model_dir, "f")})
    assert loaded["cls"] == "strata.adapters.vllm.StrataConnector"
    assert "cannot reach strata at 127.0.0.1:1" in unreachable["error"], unreachable


@pytest.mark.parametrize("layout", ["flash", "blocks_first"])
def test_prefix_stored_by_one_process_is_loaded_by_another(server, model_dir, layout):
    ns = f"x-{layout}"
    (stored,) = drive({"op": "store", "req": R1, "again": R2, "layout": layout, **base(server, model_dir, ns)})
    assert stored == {"op": "store", "computed": 0, "saved": 3, "again": 3 * BLOCK}, stored

    hit, exact, unseen = drive(
        {"op": "load", "req": R2, "layout": layout, **base(server, model_dir, ns)},
        {"op": "load", "req": EXACT, "layout": layout, **base(server, model_dir, ns)},
        {"op": "load", "req": UNSEEN, "layout": layout, **base(server, model_dir, ns)},
    )
    # 3 blocks of external tokens; only the other 12 are computed.
    assert hit["computed"] == 3 * BLOCK and hit["scheduled"] == R2["tokens"] - 3 * BLOCK, hit
    assert hit["bytes_equal"] and hit["untouched"] and hit["invalid"] == [], hit
    assert hit["loaded"] == 3 * 2, hit  # blocks x layers
    # R2's 3 full blocks are all stored already: nothing new to save.
    assert hit["saved_now"] == 0, hit
    # A fully stored prompt still computes its last block's token.
    assert exact["computed"] == 2 * BLOCK and exact["bytes_equal"], exact
    assert unseen["computed"] == 0 and unseen["loaded"] == 0, unseen


def test_producer_only_stores_and_consumer_only_loads(server, model_dir):
    p = base(server, model_dir, "pd")
    (produced, consumed_store) = drive(
        {"op": "store", "req": R1, "role": "kv_producer", **p},
        {"op": "store", "req": R1, "role": "kv_consumer", **base(server, model_dir, "consumer-writes")},
    )
    assert produced["saved"] == 3, produced
    assert consumed_store["saved"] == 0, consumed_store
    (consumer, producer, nothing) = drive(
        {"op": "load", "req": R2, "role": "kv_consumer", **p},
        {"op": "load", "req": R2, "role": "kv_producer", **p},
        {"op": "load", "req": R2, "role": "kv_both", **base(server, model_dir, "consumer-writes")},
    )
    assert consumer["computed"] == 3 * BLOCK and consumer["bytes_equal"], consumer
    assert producer["computed"] == 0 and producer["loaded"] == 0, producer
    assert nothing["computed"] == 0, nothing


def test_a_block_lost_after_lookup_is_reported_and_recomputed(server, model_dir):
    ns = base(server, model_dir, "evict")
    (stored,) = drive({"op": "store", "req": R1, **ns})
    assert stored["saved"] == 3
    (lost,) = drive({"op": "load", "req": R2, "drop_key_of_block": 1, **ns})
    assert lost["computed"] == 3 * BLOCK and lost["removed"] is True, lost
    # Block 1 (one layer's key gone) and every block after it go back to
    # vLLM for recompute; block 0 landed intact.
    assert lost["invalid"] == lost["expect_invalid"] and len(lost["invalid"]) == 2, lost
    assert lost["intact"] is True, lost


def test_cluster_with_replicas_serves_hits_after_a_node_is_killed(cluster, model_dir):
    seeds = ",".join(n.addr for n in cluster)
    cfg = {"seeds": seeds, "model": model_dir, "namespace": "cl"}
    (stored,) = drive({"op": "store", "req": R1, **cfg})
    assert stored["saved"] == 3
    cluster[1].proc.kill()
    cluster[1].proc.wait()
    (hit,) = drive({"op": "load", "req": R2, **cfg})
    assert hit["computed"] == 3 * BLOCK and hit["bytes_equal"] and hit["invalid"] == [], hit
