"""Drives strata's HiCache backend through SGLang's own HiCacheController
(its backup and prefetch threads, on CPU pools), one role per process.

    python sglang_driver.py write|read SEEDS SCENARIOS_JSON

Each scenario names a host pool (MHA or MLA, a layout), the ranks this
process plays, and which backend and controller path to use: strata's
adapter (zero-copy v1 or generic), or with ``"backend": "mooncake"``
SGLang's own Mooncake backend over the ``mooncake.store`` drop-in.
``write`` fills the pool's pages with bytes derived from the scenario's seed
and backs them up through ``write_storage``; ``read`` prefetches the same
tokens into a fresh pool, as SGLang's scheduler does, and compares every
page with the bytes the writer put there. One JSON line per scenario goes
to stdout. The only part played here rather than by SGLang is the
scheduler's hand-off of a storage hit to the IO thread (allocate host
slots, enqueue), which HiRadixCache does inline.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

# Page size, layers, KV heads, head dim and device pool tokens: tiny in the
# tests; python/bench/sglang_compare.sh sets a Llama-3-8B-shaped cache.
PAGE, LAYERS, HEADS, HEAD_DIM, TOKENS_DEVICE = (
    int(x) for x in os.environ.get("STRATA_SGL_SHAPE", "16,4,4,32,1024").split(",")
)
TIMEOUT_S = 600


def build(s: dict):
    """Device pool, its allocator and a CPU host pool, as SGLang builds them."""
    if s["pool"] == "mla":
        dev = MLATokenToKVPool(TOKENS_DEVICE, PAGE, torch.bfloat16, 64, 16, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
        host = MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, s["layout"], pin_memory=False,
            device_capacity_tokens=dev.size, start_layer=0, end_layer=LAYERS,
            target_layer_num=dev.layer_num, override_kv_cache_dim=dev.kv_cache_dim,
        )
    else:
        dev = MHATokenToKVPool(TOKENS_DEVICE, PAGE, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
        host = MHATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, s["layout"], pin_memory=False,
            device_capacity_tokens=dev.size, start_layer=0, end_layer=LAYERS,
        )
    alloc = PagedTokenToKVPoolAllocator(TOKENS_DEVICE, PAGE, torch.bfloat16, "cpu", dev, False)
    return alloc, host


def controller(s: dict, seeds: str) -> HiCacheController:
    ranks = s.get("ranks", {})
    get_parallel().override_permanently(
        tp_rank=ranks.get("tp_rank", 0), tp_size=ranks.get("tp_size", 1),
        pp_rank=ranks.get("pp_rank", 0), pp_size=ranks.get("pp_size", 1),
        attn_dcp_size=1, attn_dcp_rank=0,
    )
    alloc, host = build(s)
    if s.get("backend") == "mooncake":
        # SGLang's own Mooncake backend, importing mooncake.store (strata's
        # drop-in package), configured the way a Mooncake user does.
        backend, extra = "mooncake", {
            "master_server_address": seeds,
            "metadata_server": s.get("metadata_server", "P2PHANDSHAKE"),
            "protocol": "tcp",
            "device_name": "",
            "global_segment_size": 0,
        }
    else:
        backend, extra = "dynamic", {
            "backend_name": "strata",
            "module_path": "strata.adapters.sglang",
            "class_name": "StrataHiCacheStorage",
            "strata_seeds": seeds,
        }
        if s["path"] == "v1":
            extra["interface_v1"] = 1
    return HiCacheController(
        alloc, host, PAGE, dist.group.WORLD, threading.Event(),
        storage_backend=backend, model_name=s["model"], storage_backend_extra_config=extra,
    )


def expected_page(s: dict, page: int, nbytes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(s["seed"] * 100003 + page)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def tokens(s: dict) -> list:
    return list(range(s.get("first_token", 0), s.get("first_token", 0) + s["pages"] * PAGE))


def page_bytes(host, index: int) -> torch.Tensor:
    return host.get_data_page(index, flat=True).contiguous().view(torch.uint8)


def write(s: dict, seeds: str) -> dict:
    cc = controller(s, seeds)
    host = cc.mem_pool_host
    ids = tokens(s)
    indices = host.alloc(len(ids))
    nbytes = page_bytes(host, 0).numel()
    for p in range(s["pages"]):
        host.set_from_flat_data_page(int(indices[p * PAGE]), expected_page(s, p, nbytes).view(host.dtype))
    hashes = get_storage_hash_str(ids, None, page_size=PAGE)
    start = time.perf_counter()
    cc.write_storage(indices, ids, hash_value=hashes)
    op = cc.ack_backup_queue.get(timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    cc.detach_storage_backend()
    return {"backed_up_tokens": op.completed_tokens, "skipped": cc.backup_skip,
            "seconds": seconds, "bytes": len(ids) * host.get_size_per_token()}


def read(s: dict, seeds: str) -> dict:
    cc = controller(s, seeds)
    host = cc.mem_pool_host
    ids = tokens(s)
    start = time.perf_counter()
    cc.prefetch(f"req-{s['model']}", ids)
    hit = cc.prefetch_hit_queue.get(timeout=TIMEOUT_S)
    out = {"hit_tokens": hit.storage_hit_count, "loaded_tokens": 0, "pages_equal": 0}
    if hit.storage_hit_count:
        hit.host_indices = host.alloc(hit.storage_hit_count)
        cc.prefetch_buffer.put(hit)
        ack = cc.ack_prefetch_queue.get(timeout=TIMEOUT_S)
        out["seconds"] = time.perf_counter() - start
        out["bytes"] = ack.completed_tokens * host.get_size_per_token()
        out["loaded_tokens"] = ack.completed_tokens
        nbytes = page_bytes(host, 0).numel()
        for p in range(ack.completed_tokens // PAGE):
            got = page_bytes(host, int(hit.host_indices[p * PAGE]))
            out["pages_equal"] += int(torch.equal(got, expected_page(s, p, nbytes)))
    cc.detach_storage_backend()
    return out


def main(write=write, read=read) -> None:
    """``ROLE SEEDS SCENARIOS_JSON`` from the command line: each scenario
    through ``write`` or ``read``, one ``RESULT`` line each (also the
    server-path driver's loop)."""
    role, seeds, scenarios = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    # A one-process gloo group (SGLang's controller wants a tp group), on a
    # free loopback port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    for s in scenarios:
        try:
            result = (write if role == "write" else read)(s, seeds)
            if not s.get("timed"):
                result.pop("seconds", None)
                result.pop("bytes", None)
        except Exception as e:  # reported, so the test can assert on it
            result = {"error": f"{type(e).__name__}: {e}"}
        print("RESULT " + json.dumps({"name": s["name"], **result}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
