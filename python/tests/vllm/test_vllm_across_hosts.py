"""strata's vLLM connector across hosts, as in prefill/decode
disaggregation: a three-node cluster on the network bed
(scripts/netbed.sh, the docs' multi-host commands), a ``kv_producer``
scheduler and worker on the "prefill" host storing a prompt's blocks, a
``kv_consumer`` on the "decode" host loading them into its own paged cache
(vLLM's code on both sides, vllm_driver.py). Blocks of 256 tokens of an
8-KV-head, 128-dim fp16 model: 1 MiB per block and layer, each sent from
the producer's paged cache with its command (values up to
``inline_put_max_bytes`` are; larger ones the nodes pull) and read by the
consumer straight into its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import run_driver

HERE = Path(__file__).resolve().parent
BLOCK = 256
LAYERS = 2
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
    "num_hidden_layers": LAYERS, "vocab_size": 32000, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
}
# Three full blocks of shared prefix, then a partial one.
PROMPT = {"id": 7, "tokens": 3 * BLOCK + 40, "prefix": 3 * BLOCK}
VALUE_BYTES = BLOCK * 2 * 8 * 128 * 2  # k and v of one block of one layer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-1mib-blocks")
    (d / "config.json").write_text(json.dumps(MODEL))
    return str(d)


def drive(host, *steps):
    env = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "TRANSFORMERS_OFFLINE": "1",
           "STRATA_VLLM_BLOCKS": f"{BLOCK},16,{4 * BLOCK}"}
    return run_driver(str(HERE / "vllm_driver.py"), json.dumps(list(steps)), env=env, host=host)


def test_producer_on_prefill_consumer_on_decode(bed, model_dir):
    cfg = {"seeds": bed.seeds, "model": model_dir, "namespace": "bed-pd"}
    before = bed.total("total_net_input_bytes")
    (stored,) = drive("prefill", {"op": "store", "req": PROMPT, "role": "kv_producer", **cfg})
    assert stored["saved"] == 3, stored
    assert bed.total("total_net_input_bytes") - before >= 3 * LAYERS * VALUE_BYTES, \
        "the 1 MiB blocks did not reach the nodes over the network"
    (loaded,) = drive("decode", {"op": "load", "req": PROMPT, "role": "kv_consumer", **cfg})
    assert loaded["computed"] == 3 * BLOCK and loaded["bytes_equal"] and loaded["invalid"] == [], loaded
    assert loaded["loaded"] == 3 * LAYERS, loaded
    assert bed.total("cma_sessions") == 0
