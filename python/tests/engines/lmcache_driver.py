"""Drives strata's LMCache connector through LMCache's own engine (lmcache
0.5.6, CPU), one role per process:

    python lmcache_driver.py CONFIG_YAML STEPS_JSON

LMCache loads the connector from the YAML exactly as a user writes it
(remote storage plugin or remote_url) and runs its own store / lookup /
retrieve. The one piece that is not LMCache's code is ``CPUConnector``:
LMCache 0.5.6 ships no connector between its engine and CPU-resident KV
tensors (its GPU connectors need CUDA), so this implements LMCache's
``GPUConnectorInterface`` over a CPU tensor laid out [2, layers, tokens,
hidden], as vLLM's paged cache is seen through a slot mapping.

Steps (run in order, one ``RESULT`` JSON line each):
  {"op": "store", "prompt": P}     store prompt P's KV (bytes derived from P)
                                   and wait until the remote backend has it
                                   (unless "wait": false)
  {"op": "lookup", "prompt": P}    tokens LMCache finds, from the first
  {"op": "retrieve", "prompt": P}  tokens retrieved, and whether every
                                   retrieved token equals what was stored
  {"op": "list"}                   how many keys the connector's list() returns
  {"op": "stop_server", "pid": N}  kill -9 a strata node mid-way
A prompt is {"seed": s, "tokens": n, "shared": [seed, n]}: n token ids
from seed s, the first ``shared`` ones taken from another prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

# The KV shape: a tiny model in the tests; python/bench/lmcache_compare.sh
# sets a Llama-3-8B-shaped one (32,8,128).
LAYERS, HEADS, HEAD_SIZE = (int(x) for x in os.environ.get("STRATA_LMC_SHAPE", "4,2,64").split(","))
HIDDEN = HEADS * HEAD_SIZE
DTYPE = torch.bfloat16
CLOSE_TIMEOUT_S = 30


class CPUConnector(GPUConnectorInterface):
    """KV tensors on the CPU: kvcaches is [2, LAYERS, tokens, HIDDEN]."""

    def __init__(self) -> None:
        self.kvcaches = None

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HIDDEN])

    def from_gpu(self, memory_obj, start, end, **kwargs):
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end])

    def to_gpu(self, memory_obj, start, end, **kwargs):
        kwargs["kvcaches"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for obj, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(obj, s, e, **kwargs)

    def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs):
        for obj, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(obj, s, e, **kwargs)


def prompt_tokens(p: dict) -> list:
    shared = p.get("shared")
    head = prompt_tokens({"seed": shared[0], "tokens": shared[1]}) if shared else []
    g = torch.Generator().manual_seed(p["seed"])
    tail = torch.randint(0, 30000, (p["tokens"] - len(head),), generator=g).tolist()
    return head + tail


def token_kv(token: int, position_seed: int = 0) -> torch.Tensor:
    """Deterministic KV of one token: [2, LAYERS, HIDDEN]."""
    g = torch.Generator().manual_seed(token * 7919 + position_seed)
    return torch.randn(2, LAYERS, HIDDEN, generator=g).to(DTYPE)


def prompt_kv(tokens: list) -> torch.Tensor:
    """KV of a prompt. A token's KV depends on it and its predecessor, so
    prompts that share a prefix share that prefix's KV (as a model's do)."""
    out = torch.empty(2, LAYERS, len(tokens), HIDDEN, dtype=DTYPE)
    prev = [0] + tokens[:-1]
    for i, (t, p) in enumerate(zip(tokens, prev)):
        out[:, :, i] = token_kv(t, p)
    return out


def kv_bytes(tokens: int) -> int:
    return 2 * LAYERS * tokens * HIDDEN * DTYPE.itemsize


def engine(config_path: str):
    config = LMCacheEngineConfig.from_file(config_path)
    meta = LMCacheMetadata(
        model_name="test/tiny-llama", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=DTYPE, kv_shape=(LAYERS, 2, config.chunk_size, HEADS, HEAD_SIZE),
        chunk_size=config.chunk_size,
    )
    eng = LMCacheEngineBuilder.get_or_create(
        f"driver-{os.getpid()}", config, meta, CPUConnector(), lambda t, r: None, lambda o, r: o
    )
    eng.post_init()
    return eng


def wait_stored(eng, t: torch.Tensor, deadline_s: float = 60.0) -> int:
    """Remote puts are asynchronous: wait until LMCache's remote backend
    finds every full chunk of the prompt; the tokens it finds."""
    remote = [name for name in eng.storage_manager.storage_backends if "Remote" in name]
    want = len(t) - len(t) % eng.config.chunk_size
    end = time.monotonic() + deadline_s
    found = 0
    while time.monotonic() < end:
        found = int(eng.lookup(t, search_range=remote))
        if found >= want:
            break
        time.sleep(0.05)
    return found


def run(eng, step: dict) -> dict:
    op = step["op"]
    if op == "stop_server":
        os.kill(step["pid"], signal.SIGKILL)
        return {"op": op}
    if op == "list":
        backend = next(b for n, b in eng.storage_manager.storage_backends.items() if "Remote" in n)
        keys = asyncio.run_coroutine_threadsafe(backend.connection.list(), backend.loop).result(30)
        return {"op": op, "keys": len(keys)}
    tokens = prompt_tokens(step["prompt"])
    t = torch.tensor(tokens, dtype=torch.long)
    if op == "store":
        kv = prompt_kv(tokens)
        start = time.perf_counter()
        eng.store(t, kvcaches=kv)
        remote_tokens = wait_stored(eng, t) if step.get("wait", True) else None
        return {"op": op, "tokens": len(tokens), "remote_tokens": remote_tokens,
                "seconds": time.perf_counter() - start, "bytes": kv_bytes(len(tokens))}
    if op == "lookup":
        return {"op": op, "hit_tokens": int(eng.lookup(t))}
    if op == "retrieve":
        target = torch.zeros(2, LAYERS, len(tokens), HIDDEN, dtype=DTYPE)
        start = time.perf_counter()
        mask = eng.retrieve(t, kvcaches=target)
        seconds = time.perf_counter() - start
        n = int(mask.sum())
        expected = prompt_kv(tokens)
        got_equal = bool(torch.equal(target[:, :, :n].view(torch.int16), expected[:, :, :n].view(torch.int16)))
        leading = bool(mask[:n].all()) if n else True
        untouched = bool((target[:, :, n:] == 0).all())
        return {"op": op, "retrieved_tokens": n, "equal": got_equal and leading and untouched,
                "seconds": seconds, "bytes": kv_bytes(n)}
    raise ValueError(f"unknown step {op}")


def main() -> None:
    config_path, steps = sys.argv[1], json.loads(sys.argv[2])
    eng = engine(config_path)
    errors = []
    # LMCache logs exceptions raised in its own threads; the test counts them.
    threading.excepthook = lambda a: errors.append(f"{a.exc_type.__name__}: {a.exc_value}")
    for step in steps:
        try:
            result = run(eng, step)
        except Exception as e:
            result = {"op": step["op"], "error": f"{type(e).__name__}: {e}"}
        print("RESULT " + json.dumps(result), flush=True)
    print("RESULT " + json.dumps({"op": "thread_errors", "errors": errors}), flush=True)
    # LMCache's Redis connector can hang in close (seen in the benchmark):
    # give the engine's shutdown a bound, then leave.
    closer = threading.Thread(target=LMCacheEngineBuilder.destroy, args=(f"driver-{os.getpid()}",), daemon=True)
    closer.start()
    closer.join(CLOSE_TIMEOUT_S)
    if closer.is_alive():
        print(f"engine shutdown still running after {CLOSE_TIMEOUT_S} s; exiting", file=sys.stderr, flush=True)
        os._exit(0)


if __name__ == "__main__":
    main()
