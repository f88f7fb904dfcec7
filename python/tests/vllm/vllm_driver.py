"""Drives strata's vLLM connector through vLLM's own code (vllm 0.33.0, no
GPU): vLLM's config, connector factory, real ``Scheduler`` and the worker
side through ``ensure_kv_transfer_initialized`` and
``KVConnectorModelRunnerMixin.kv_connector_no_forward``, as vLLM's own
connector tests do, with vLLM's test helpers (``vllm_tests_helpers``: its
``tests/v1/kv_connector/unit/utils.py``, from the sdist).

The one part played here is the forward pass: the test writes each block's
KV (bytes derived from the block's tokens) into a paged KV cache in vLLM's
layout. Everything else is vLLM's code calling the connector.

Usage: vllm_driver.py STEPS_JSON, a list of ``{"op": ..., ...}`` run in
order in this process; prints one ``RESULT {json}`` line per step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from unittest.mock import MagicMock, patch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from strata.keys import chunk_hashes  # noqa: E402
import vllm_tests_helpers as h  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_transfer_state import (  # noqa: E402
    ensure_kv_transfer_initialized,
    ensure_kv_transfer_shutdown,
    get_kv_transfer_group,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin  # noqa: E402

# Tokens per block, blocks in the paged cache and the scheduler's token
# budget per step: vLLM's test sizes by default; the across-hosts test sets
# blocks of 1 MiB per layer.
BLOCK, NUM_BLOCKS, BATCH_TOKENS = (int(x) for x in os.environ.get("STRATA_VLLM_BLOCKS", "16,64,64").split(","))
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def vllm_config(cfg, role):
    vc = h.create_vllm_config(
        model=cfg["model"],
        block_size=BLOCK,
        max_num_batched_tokens=BATCH_TOKENS,
        kv_connector="StrataConnector",
        kv_connector_module_path="strata.adapters.vllm",
        kv_role=role,
        kv_connector_extra_config={"strata_seeds": cfg["seeds"], "strata_namespace": cfg.get("namespace", "t")},
        kv_load_failure_policy="recompute",
    )
    # The test model is a config.json alone: no tokenizer to load.
    vc.model_config.skip_tokenizer_init = True
    return vc


def kv_cache_config(vc):
    mc = vc.model_config
    spec = FullAttentionSpec(
        block_size=BLOCK,
        num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
        head_size=mc.get_head_size(),
        dtype=mc.dtype,
    )
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)],
    )


def paged_caches(vc, layout):
    """Zeroed per-layer KV caches in one of vLLM's layouts."""
    mc = vc.model_config
    heads, size = mc.get_num_kv_heads(vc.parallel_config), mc.get_head_size()
    shape = {
        "flash": (2, NUM_BLOCKS, BLOCK, heads, size),  # FlashAttention: K/V split first
        "blocks_first": (NUM_BLOCKS, 2, heads, BLOCK, size),  # CPU attention backend
    }[layout]
    return {n: torch.zeros(shape, dtype=mc.dtype) for n in LAYERS}


def block_view(kv, block_id):
    return kv[:, block_id] if kv.shape[0] == 2 and kv.shape[1] == NUM_BLOCKS else kv[block_id]


def fill(kv, layer_index, block_id, tokens):
    """The 'forward pass': a block's KV as a function of its tokens (every
    token before it included, as real KV is) and the layer."""
    seed = int.from_bytes(hashlib.sha256(f"{layer_index}:{tokens}".encode()).digest()[:7], "little")
    view = block_view(kv, block_id)
    gen = torch.Generator().manual_seed(seed)
    view.copy_(torch.randn(view.shape, generator=gen).to(kv.dtype))


def expected(kv, layer_index, tokens):
    scratch = torch.zeros_like(kv)
    fill(scratch, layer_index, 0, tokens)
    return block_view(scratch, 0)


class Engine:
    """One vLLM scheduler and its worker-side connector, in this process."""

    def __init__(self, cfg, role, layout="flash"):
        self.vc = vllm_config(cfg, role)
        self.kcc = kv_cache_config(self.vc)
        self.scheduler = h.create_scheduler(self.vc, num_blocks=NUM_BLOCKS, kv_cache_config=self.kcc)
        tp = MagicMock()
        tp.broadcast_object.side_effect = lambda value, src=0: value
        with patch("vllm.distributed.parallel_state.get_tp_group", return_value=tp):
            ensure_kv_transfer_initialized(self.vc, self.kcc)
        self.worker = get_kv_transfer_group()
        self.kv = paged_caches(self.vc, layout)
        self.worker.register_kv_caches(self.kv)

    def step(self, computed_by_forward=True):
        """One engine step: schedule, 'forward' (fill the blocks scheduled
        for compute), the worker's connector calls, update from output."""
        out = self.scheduler.schedule()
        if computed_by_forward:
            for new in out.scheduled_new_reqs:
                req = self.scheduler.requests[new.req_id]
                first = new.num_computed_tokens // BLOCK
                last = (new.num_computed_tokens + out.num_scheduled_tokens[new.req_id]) // BLOCK
                for b in range(first, last):
                    for li, name in enumerate(LAYERS):
                        fill(self.kv[name], li, new.block_ids[0][b], req.prompt_token_ids[: (b + 1) * BLOCK])
        runner_out = KVConnectorModelRunnerMixin.kv_connector_no_forward(out, self.vc)
        reqs = [self.scheduler.requests[r] for r in out.num_scheduled_tokens]
        model_out = h.create_model_runner_output(reqs, invalid_block_ids=runner_out.kv_connector_output.invalid_block_ids if runner_out.kv_connector_output else None)
        self.scheduler.update_from_output(out, model_out)
        return out, runner_out

    def run(self, req, steps=2):
        self.scheduler.add_request(req)
        first, runner_out = self.step()
        for _ in range(steps - 1):
            self.step()
        return first, runner_out

    def close(self):
        assert self.worker.wait_for_saves(), "saves did not finish"
        ensure_kv_transfer_shutdown()


def loaded_blocks_match(engine, new, prompt, n):
    for b in range(n):
        for li, name in enumerate(LAYERS):
            got = block_view(engine.kv[name], new.block_ids[0][b])
            if not torch.equal(got, expected(engine.kv[name], li, prompt[: (b + 1) * BLOCK])):
                return False
    return True


def request(spec):
    """vLLM's test request: ``prefix`` tokens of 1, then ``i * id``."""
    return h.create_request(
        request_id=spec["id"], num_tokens=spec["tokens"], common_prefix_len=spec.get("prefix", 0),
        block_size=BLOCK, max_tokens=2,
    )


def op_factory(cfg):
    vc = vllm_config(cfg, "kv_both")
    conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kv_cache_config(vc))
    result(op="factory", cls=type(conn).__module__ + "." + type(conn).__name__)
    try:
        bad = dict(cfg, seeds="127.0.0.1:1")
        KVConnectorFactory.create_connector(vllm_config(bad, "kv_both"), KVConnectorRole.SCHEDULER, kv_cache_config(vc))
        result(op="unreachable", error=None)
    except Exception as e:
        result(op="unreachable", error=str(e))


def op_store(cfg):
    """Prefill a prompt (3 full blocks and a partial one) through kv_both
    or kv_producer; then a fresh scheduler in this process looks it up."""
    eng = Engine(cfg, cfg.get("role", "kv_both"), cfg.get("layout", "flash"))
    first, _ = eng.run(request(cfg["req"]))
    new = first.scheduled_new_reqs[0]
    assert eng.worker.wait_for_saves(), "saves did not finish"
    # A fresh scheduler (empty local prefix cache) in the same process.
    again = None
    if cfg.get("again"):
        fresh = h.create_scheduler(eng.vc, num_blocks=NUM_BLOCKS, kv_cache_config=eng.kcc)
        fresh.add_request(request(cfg["again"]))
        again = fresh.schedule().scheduled_new_reqs[0].num_computed_tokens
        fresh.connector.shutdown()
    eng.close()
    result(op="store", computed=new.num_computed_tokens, saved=eng.worker.stats["saved_blocks"], again=again)


def op_load(cfg):
    """A fresh process: the scheduler's hit, and the worker's loaded bytes."""
    eng = Engine(cfg, cfg.get("role", "kv_both"), cfg.get("layout", "flash"))
    req = request(cfg["req"])
    tokens = list(req.prompt_token_ids)
    if cfg.get("drop_key_of_block") is not None:
        # Evicted between lookup and load: plan the load, then lose a key.
        eng.scheduler.add_request(req)
        out = eng.scheduler.schedule()
        new = out.scheduled_new_reqs[0]
        hit = new.num_computed_tokens
        b = cfg["drop_key_of_block"]
        keys = eng.worker._keys(0, [chunk_hashes(tokens, BLOCK)[b].hex()], LAYERS[1])
        removed = eng.worker.client.remove(keys[0])
        runner_out = KVConnectorModelRunnerMixin.kv_connector_no_forward(out, eng.vc)
        invalid = sorted(runner_out.kv_connector_output.invalid_block_ids)
        expect_invalid = sorted(new.block_ids[0][b : hit // BLOCK])
        result(op="load", computed=hit, removed=removed, invalid=invalid, expect_invalid=expect_invalid,
               intact=loaded_blocks_match(eng, new, tokens, b))
        ensure_kv_transfer_shutdown()
        return
    first, runner_out = eng.run(req, steps=1)
    new = first.scheduled_new_reqs[0]
    n = new.num_computed_tokens // BLOCK
    invalid = sorted(runner_out.kv_connector_output.invalid_block_ids) if runner_out.kv_connector_output else []
    untouched = all(
        not block_view(eng.kv[name], b).any() for name in LAYERS for b in range(NUM_BLOCKS) if b not in new.block_ids[0]
    )
    result(op="load", computed=new.num_computed_tokens, scheduled=first.num_scheduled_tokens[new.req_id],
           bytes_equal=loaded_blocks_match(eng, new, tokens, n), invalid=invalid, untouched=untouched,
           loaded=eng.worker.stats["loaded_blocks"], saved_now=eng.worker.stats["saved_blocks"])
    eng.close()


if __name__ == "__main__":
    for step in json.loads(sys.argv[1]):
        {"factory": op_factory, "store": op_store, "load": op_load}[step["op"]](step)
