"""Drives strata's HiCache backend through the construction SGLang's server
performs (sglang 0.5.23), one role per process:

    python sglang_server_driver.py write|read SEEDS SCENARIOS_JSON

The server arguments come from the command line a user types
(``prepare_server_args`` with ``--enable-hierarchical-cache
--hicache-storage-backend dynamic --hicache-storage-backend-extra-config
...``, as python/README.md documents); the tree cache from SGLang's own
``create_unified_radix_cache``, which builds a ``HostPoolGroup`` and a
``HybridCacheController`` and attaches the backend (``register_mem_pool_host``,
``register_mem_host_pool_v2`` for each pool, ``on_host_pools_registered``).
The driver then backs pages up and prefetches them through that controller
(its backup and prefetch threads), as the tree does.

Each scenario names the model kind (``mha``, ``mla``, or a hybrid model
with a sidecar pool: ``mamba``, its Mamba state, or ``swa``, its
sliding-window attention layers), the controller path
(``v1`` zero-copy or ``generic``), the ranks this process plays and a seed.
``write`` fills the host pages (and the sidecar's pages at the span's end,
unless ``no_state``) with bytes derived from the seed and backs them up; ``read`` prefetches the same
tokens into a fresh controller in another process and compares every page.
With ``pause``, ``read`` waits after attaching for the test to act (see
``pause``). One JSON line per scenario goes to stdout.

Played here rather than by SGLang: the model runner's device pools (built
as SGLang's own constructors build them, on the CPU), the tree's part
around the controller (the host slots of a storage hit, handed to the IO
thread; a hybrid model's sidecar transfer, built as SGLang's Mamba and SWA
components build it: the span's last pages under their page hashes, a
trailing-page hit), and CUDA's registration of the
host pools (``cudaHostRegister``: there is no GPU, so it is skipped, as the
legacy driver's ``pin_memory=False`` does).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import sglang.srt.mem_cache.pool_host.common as pool_host_common
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_unified_radix_cache
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.server_args import prepare_server_args

import sglang_driver  # its command-line loop

# Page size, layers, KV heads, head dim and device pool tokens: tiny by
# default; the across-hosts test sets a Llama-3-8B-shaped cache.
PAGE, LAYERS, HEADS, HEAD_DIM, TOKENS_DEVICE = (
    int(x) for x in os.environ.get("STRATA_SGL_SHAPE", "16,4,4,32,1024").split(",")
)
TIMEOUT_S = 600
# A hybrid model's sidecar pool and how many of a span's last pages it
# keeps: one Mamba state (at the span's end), or a sliding window's pages.
SWA_WINDOW_PAGES = 2
SIDECARS = {"mamba": (PoolName.MAMBA, 1), "swa": (PoolName.SWA, SWA_WINDOW_PAGES)}

# What SGLang's server, run on a GPU, does with host pools; nothing to do here.
pool_host_common._cuda_host_register = lambda *args, **kwargs: None


class ModelWorker:
    """The one call the tree makes on its model worker when HiCache is on."""

    def register_hicache_layer_transfer_counter(self, counter) -> None:
        self.counter = counter


def model_dir() -> str:
    """A model directory with only a config (the pools here are built from
    the shapes above; ServerArgs reads the config)."""
    d = tempfile.mkdtemp(prefix="sgl-model-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HEADS * HEAD_DIM,
              "intermediate_size": 256, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
              "num_hidden_layers": LAYERS, "vocab_size": 256, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "head_dim": HEAD_DIM}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


def readme_flags(seeds: str, v1: bool) -> list:
    """The README quick start's `python -m sglang.launch_server` flags after
    `--model-path <model>`, as written, with this test's node for the
    documented seeds (and, for the v2 interface, without `interface_v1`)."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = re.search(r"^### vLLM, SGLang, LMCache$(.*?)^### ", readme, re.S | re.M).group(1)
    line = re.search(r"^python -m sglang\.launch_server (.*?)\n\n", section, re.S | re.M).group(1)
    argv = shlex.split(line.replace("\\\n", " "))
    assert argv[:2] == ["--model-path", "<model>"], argv
    argv = argv[2:]
    at = argv.index("--hicache-storage-backend-extra-config") + 1
    extra = json.loads(argv[at])
    assert extra.get("strata_seeds") and extra.get("interface_v1") == 1, extra
    extra["strata_seeds"] = seeds
    if not v1:
        del extra["interface_v1"]
    argv[at] = json.dumps(extra)
    return argv


def server_args(s: dict, seeds: str):
    """The README's command line with this test's model and ranks, parsed
    by SGLang."""
    argv = ["--model-path", MODEL_DIR, "--served-model-name", s["model"], "--device", "cpu",
            "--tp-size", str(s["ranks"].get("tp_size", 1)), "--pp-size", str(s["ranks"].get("pp_size", 1)),
            "--page-size", str(PAGE), "--hicache-ratio", "2", "--skip-tokenizer-init",
            *readme_flags(seeds, s["path"] == "v1")]
    return prepare_server_args(argv)


def device_pools(s: dict):
    """The device KV pool and allocators the model runner would build."""
    if s["pool"] == "mamba":
        return mamba_pools()
    if s["pool"] == "swa":
        return swa_pools()
    if s["pool"] == "mla":
        dev = MLATokenToKVPool(TOKENS_DEVICE, PAGE, torch.bfloat16, 64, 16, LAYERS, "cpu", False,
                               start_layer=0, end_layer=LAYERS)
    else:
        dev = MHATokenToKVPool(TOKENS_DEVICE, PAGE, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False,
                               start_layer=0, end_layer=LAYERS)
    alloc = PagedTokenToKVPoolAllocator(TOKENS_DEVICE, PAGE, torch.bfloat16, "cpu", dev, False)
    return ReqToTokenPool(8, 4096, "cpu", False), alloc


def mamba_pools():
    """A hybrid model's pools: attention on the odd layers, Mamba2 state
    (conv and temporal) on the even ones, as Qwen3-Next-style models have."""
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1, num_heads=2,
                                    head_dim=32, state_size=16, conv_kernel=4)
    mamba_layers = list(range(0, LAYERS, 2))
    req_pool = HybridReqToTokenPool(
        size=8, mamba_size=32, mamba_spec_state_size=8, max_context_len=4096, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=mamba_layers),
        mamba_layer_ids=mamba_layers, enable_mamba_extra_buffer=True,
    )
    dev = HybridLinearKVPool(size=TOKENS_DEVICE, dtype=torch.bfloat16, page_size=PAGE, head_num=HEADS,
                             head_dim=HEAD_DIM, full_attention_layer_ids=list(range(1, LAYERS, 2)),
                             device="cpu", mamba_pool=req_pool.mamba_pool)
    return req_pool, PagedTokenToKVPoolAllocator(TOKENS_DEVICE, PAGE, torch.bfloat16, "cpu", dev, False)


def swa_pools():
    """A hybrid SWA model's pools (Gemma/GPT-OSS-style): sliding-window
    attention on the even layers, full attention on the odd ones."""
    dev = SWAKVPool(size=TOKENS_DEVICE, size_swa=TOKENS_DEVICE, page_size=PAGE, dtype=torch.bfloat16,
                    head_num=HEADS, head_dim=HEAD_DIM, swa_attention_layer_ids=list(range(0, LAYERS, 2)),
                    full_attention_layer_ids=list(range(1, LAYERS, 2)), device="cpu")
    alloc = SWATokenToKVPoolAllocator(TOKENS_DEVICE, TOKENS_DEVICE, PAGE, torch.bfloat16, "cpu", dev, False)
    return ReqToTokenPool(8, 4096, "cpu", False), alloc


def tree_cache(s: dict, seeds: str):
    """SGLang's server-side construction of the tree cache and its controller."""
    ranks = s.get("ranks", {})
    args = server_args(s, seeds)
    get_context().set_server_args(args)
    get_parallel().override_permanently(
        tp_rank=ranks.get("tp_rank", 0), tp_size=ranks.get("tp_size", 1),
        pp_rank=ranks.get("pp_rank", 0), pp_size=ranks.get("pp_size", 1),
        attn_dcp_size=1, attn_dcp_rank=0,
    )
    req_pool, alloc = device_pools(s)
    params = CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc,
                             page_size=PAGE, tp_cache_group=dist.group.WORLD,
                             pp_rank=ranks.get("pp_rank", 0), pp_size=ranks.get("pp_size", 1),
                             # Mamba state at page boundaries (page_size > 1) needs the extra buffer.
                             enable_mamba_extra_buffer=s["pool"] == "mamba",
                             sliding_window_size=SWA_WINDOW_PAGES * PAGE if s["pool"] == "swa" else None)
    ctx = TreeCacheBuildContext(
        server_args=args, params=params, is_hybrid_swa=s["pool"] == "swa", is_hybrid_ssm=s["pool"] == "mamba",
        enable_hierarchical_cache=True, disable_radix_cache=False, tp_worker=ModelWorker(),
        model_config=None, tp_size=ranks.get("tp_size", 1), tp_rank=ranks.get("tp_rank", 0),
        tp_group=dist.group.WORLD,
    )
    cache = create_unified_radix_cache(ctx)
    for entry in cache.cache_controller.mem_pool_host.entries:
        entry.host_pool.pin_memory = False  # page buffers it allocates later: plain host memory
    return cache


def construction(cache) -> dict:
    """What SGLang built: the classes the server path is pinned to."""
    cc = cache.cache_controller
    return {"tree": type(cache).__name__, "controller": type(cc).__name__,
            "host_pools": type(cc.mem_pool_host).__name__,
            "backend": type(cc.storage_backend).__name__ if cc.storage_backend is not None else None,
            "pools": sorted(str(e.name) for e in cc.mem_pool_host.entries)}


def expected_page(s: dict, page: int, nbytes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(s["seed"] * 100003 + page)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def tokens(s: dict) -> list:
    return list(range(s.get("first_token", 0), s.get("first_token", 0) + s["pages"] * PAGE))


def sidecar_host(cc, s: dict):
    return cc.mem_pool_host.entry_map[SIDECARS[s["pool"]][0]].host_pool


def expected_sidecar(s: dict, side) -> list:
    """The sidecar's pages for the span's end, oldest first."""
    dummy = side.get_dummy_flat_data_page()
    nbytes = dummy.numel() * dummy.element_size()
    return [expected_page(s, 10**6 + j, nbytes).view(side.dtype) for j in range(SIDECARS[s["pool"]][1])]


def sidecar_results(op) -> dict:
    """Per sidecar pool the pages SGLang counted as moved."""
    hits = op.pool_storage_result.extra_pool_hit_pages
    return {"sidecar_pages": {str(k): v for k, v in hits.items()}} if hits else {}


def page_bytes(kv_host, index: int) -> torch.Tensor:
    return kv_host.get_data_page(index, flat=True).contiguous().view(torch.uint8)


def write(s: dict, seeds: str) -> dict:
    cache = tree_cache(s, seeds)
    cc = cache.cache_controller
    kv_host = cc.storage_host_pool
    ids = tokens(s)
    indices = cc.mem_pool_host.alloc(len(ids))
    nbytes = page_bytes(kv_host, 0).numel()
    for p in range(s["pages"]):
        kv_host.set_from_flat_data_page(int(indices[p * PAGE]), expected_page(s, p, nbytes).view(kv_host.dtype))
    hashes = get_storage_hash_str(ids, None, page_size=PAGE)
    extra_pools = None
    if s["pool"] in SIDECARS and not s.get("no_state"):
        # The sidecar's pages of the span's end, backed up as SGLang's
        # component does it: under the span's last page hashes, a
        # trailing-page hit (no_state: a writer whose sidecar backup never
        # happened).
        name, n = SIDECARS[s["pool"]]
        side = sidecar_host(cc, s)
        slots = side.alloc(n * side.page_size)
        for j, page in enumerate(expected_sidecar(s, side)):
            side.set_from_flat_data_page(int(slots[j * side.page_size]), page)
        extra_pools = [PoolTransfer(name=name, host_indices=slots, keys=hashes[-n:],
                                    hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    start = time.perf_counter()
    cc.write_storage(indices, ids, hash_value=hashes, extra_pools=extra_pools)
    op = cc.ack_backup_queue.get(timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    out = {**construction(cache), "backed_up_tokens": op.completed_tokens, "skipped": cc.backup_skip,
           **sidecar_results(op),
           "seconds": seconds, "bytes": len(ids) * kv_host.get_size_per_token()}
    cc.detach_storage_backend()
    return out


def read(s: dict, seeds: str) -> dict:
    cache = tree_cache(s, seeds)
    cc = cache.cache_controller
    kv_host = cc.storage_host_pool
    ids = tokens(s)
    # The component's prefetch transfer: its trailing pages, the staging
    # allocated once the hit is known.
    extra_pools = None
    if s["pool"] in SIDECARS:
        name, n = SIDECARS[s["pool"]]
        extra_pools = [PoolTransfer(name=name, keys=["__placeholder__"] * n,
                                    hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    if s.get("pause"):
        pause(s["name"])
    start = time.perf_counter()
    cc.prefetch(CacheRequestHandle(f"req-{s['name']}", 0), ids, extra_pools=extra_pools)
    hit = cc.prefetch_hit_queue.get(timeout=TIMEOUT_S)
    out = {**construction(cache), "hit_tokens": hit.storage_hit_count, "loaded_tokens": 0, "pages_equal": 0}
    if hit.storage_hit_count:
        hit.host_indices = cc.mem_pool_host.alloc(hit.storage_hit_count)
        for transfer in extra_pools or []:
            side = sidecar_host(cc, s)
            transfer.host_indices = side.alloc(len(transfer.keys) * side.page_size)
        cc.prefetch_buffer.put(hit)
        out["loaded_tokens"], pool_hits = completed_tokens(cc)
        if extra_pools:
            out.update(sidecar_check(s, cc, extra_pools[0], pool_hits))
        out["seconds"] = time.perf_counter() - start
        out["bytes"] = out["loaded_tokens"] * kv_host.get_size_per_token()
        nbytes = page_bytes(kv_host, 0).numel()
        for p in range(out["loaded_tokens"] // PAGE):
            got = page_bytes(kv_host, int(hit.host_indices[p * PAGE]))
            out["pages_equal"] += int(torch.equal(got, expected_page(s, p, nbytes)))
    cc.detach_storage_backend()
    return out


def sidecar_check(s: dict, cc, transfer, pool_hits: dict) -> dict:
    """How many sidecar pages SGLang counted as loaded, and whether they
    hold what the writer stored."""
    side = sidecar_host(cc, s)
    got = [side.get_data_page(int(transfer.host_indices[j * side.page_size]), flat=True)
           for j in range(len(transfer.keys))]
    want = expected_sidecar(s, side)
    return {"state_pages": pool_hits.get(transfer.name.value, 0),
            "state_equal": len(got) == len(want) and all(
                torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))}


def pause(name: str) -> None:
    """Waits, with the tree built and the backend attached, until the test
    has done what it does mid-run (e.g. killed the node)."""
    where = os.environ["STRATA_DRIVER_PAUSE_DIR"]
    open(os.path.join(where, f"ready-{name}"), "w").close()
    go = os.path.join(where, f"go-{name}")
    deadline = time.monotonic() + TIMEOUT_S
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {go} within {TIMEOUT_S} s")
        time.sleep(0.05)


def completed_tokens(cc) -> tuple:
    """The prefetch's progress acks, up to the one that ends the request:
    the KV tokens loaded and the pages each sidecar pool loaded."""
    done, pool_hits = 0, {}
    while True:
        ack = cc.ack_prefetch_queue.get(timeout=TIMEOUT_S)
        if ack.completed_tokens is not None:
            done = max(done, ack.completed_tokens)
        if ack.pool_hits:
            pool_hits.update(ack.pool_hits)
        if ack.completed_req:
            return done, pool_hits


def main() -> None:
    try:
        sglang_driver.main(write, read)
    finally:
        shutil.rmtree(MODEL_DIR, ignore_errors=True)


MODEL_DIR = model_dir()

if __name__ == "__main__":
    main()
