"""SGLang HiCache storage backend (``HiCacheStorage``) on strata.

Load it with SGLang's dynamic backend (tested with sglang 0.5.23)::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata.adapters.sglang", "class_name": "StrataHiCacheStorage",
        "interface_v1": 1, "strata_seeds": "10.0.0.1:7379,10.0.0.2:7379"}'

SGLang's ``StorageBackendFactory`` constructs ``StrataHiCacheStorage(storage_config,
kwargs)``. SGLang's server builds a ``HybridCacheController`` over a host
pool group (even for a plain model: a group holding only the KV pool): it
calls ``register_mem_pool_host(kv_pool)``, then
``register_mem_host_pool_v2(pool, name)`` for every pool of the group
(``kv`` too), then ``on_host_pools_registered()``. KV pages then move through
``batch_exists`` and either the zero-copy ``batch_get_v1``/``batch_set_v1``
(with ``"interface_v1": 1``) or the generic copying ``batch_get``/``batch_set``;
a hybrid model's sidecar pools (Mamba state, SWA, indexers) through
``batch_exists_v2``/``batch_get_v2``/``batch_set_v2``. The legacy
``HiCacheController`` of older SGLang makes the same KV calls without the
v2 ones. Both KV paths store the same keys and bytes, so ``batch_exists``
finds what either wrote.

Keys: a page becomes one strata key per component (``k`` and ``v`` for MHA,
``kv`` for MLA)::

    {prefix}:{shard}:{layout}-{dtype}:{page_hash}:{component}

and a sidecar pool's page one key per buffer SGLang gives for it (``c0``,
``c1``, ...), or ``page`` for its flat bytes::

    {prefix}:{shard}:{pool}.{layout}-{dtype}:{page_hash}:{component}

* ``prefix``: ``extra_config["strata_key_prefix"]`` or ``"sglang:" + model``;
* ``shard``: every rank that changes what a page holds: ``tp{r}of{n}`` (MHA;
  MLA pages are the same on every tp rank and use ``mla``, or
  ``mla-dcp{r}of{n}-tp{n}-page{p}`` under decode context parallelism; Mamba
  state is tp-sharded even beside MLA), then ``.pp{r}of{n}`` when pipeline
  parallel and ``.cp{r}of{n}`` when attention context parallel;
* ``layout-dtype``: the host pool's layout and dtype, since both change
  the bytes of a page (two engines with different layouts never read each
  other's pages as their own).

Refused, with the reason, at attach (before any transfer runs): DeepSeek-V4
compressed pools (their block-group hits), split heads (``tp_lcm_size``
with the ``page_head`` layout), and host layouts whose pages SGLang can
neither hand out as buffers nor copy as a flat page.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from ..client import Client
from ._once import OnceLog
from ._sglang_pages import COPY_LAYOUTS, PoolPages, has_flat_pages, probe_buffers, register_memory

try:  # The real base class when SGLang is installed (its factory checks it).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - depends on the environment

    class _Base:  # type: ignore[no-redef]
        """Stand-in for ``sglang.srt.mem_cache.hicache_storage.HiCacheStorage``."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host


logger = logging.getLogger(__name__)

KV_POOL = "kv"
# Sidecar pools whose hits SGLang counts in block groups (DeepSeek-V4's
# compressed caches): refused at attach.
REFUSED_POOL_PREFIX = "deepseek_v4"
# Sidecar pools sharded by tp rank even when the KV pool is MLA (replicated).
TP_SHARDED_POOLS = ("mamba",)


def _extra(storage_config: Any) -> dict:
    return dict(getattr(storage_config, "extra_config", None) or {})


def _cfg(storage_config: Any, name: str, default: Any) -> Any:
    value = getattr(storage_config, name, default)
    return default if value is None else value


def shard_name(storage_config: Any, tp_sharded: bool = False) -> str:
    """The part of a key that names which slice of a page this rank holds
    (``tp_sharded``: a pool split by tp rank even in an MLA model)."""
    pp_rank, pp_size = _cfg(storage_config, "pp_rank", 0), _cfg(storage_config, "pp_size", 1)
    cp_rank, cp_size = _cfg(storage_config, "attn_cp_rank", 0), _cfg(storage_config, "attn_cp_size", 1)
    tp_rank, tp_size = _cfg(storage_config, "tp_rank", 0), _cfg(storage_config, "tp_size", 1)
    if _cfg(storage_config, "is_mla_model", False) and not tp_sharded:
        shard = "mla"
        dcp_size = _cfg(storage_config, "dcp_size", 1)
        if dcp_size > 1:
            dcp_rank = _cfg(storage_config, "dcp_rank", 0)
            page = _cfg(storage_config, "logical_page_size", 0)
            shard += f"-dcp{dcp_rank}of{dcp_size}-tp{tp_size}-page{page}"
    else:
        shard = f"tp{tp_rank}of{tp_size}"
    if pp_size > 1:
        shard += f".pp{pp_rank}of{pp_size}"
    if cp_size > 1:
        shard += f".cp{cp_rank}of{cp_size}"
    return shard


def _name(pool_name: Any) -> str:
    """A pool name as SGLang's ``PoolName`` enum or a plain string."""
    return str(getattr(pool_name, "value", pool_name))


def _geometry(pool: Any) -> str:
    dtype = str(getattr(pool, "dtype", "")).replace("torch.", "")
    return f"{getattr(pool, 'layout', None)}-{dtype}"


class StrataHiCacheStorage(_Base):
    """``HiCacheStorage`` backed by a strata cluster."""

    def __init__(self, storage_config: Any = None, kwargs: Any = None) -> None:
        extra = _extra(storage_config)
        if _cfg(storage_config, "should_split_heads", False):
            raise ValueError(
                "strata HiCache backend: split heads (tp_lcm_size with the page_head "
                "layout) is not supported; drop tp_lcm_size or use --hicache-mem-layout page_first"
            )
        seeds = extra.get("strata_seeds") or os.environ.get("STRATA_SEEDS", "127.0.0.1:7379")
        options = dict(extra.get("strata_client") or {})
        self.storage_config = storage_config
        self.is_mla = bool(_cfg(storage_config, "is_mla_model", False))
        self.components = ["kv"] if self.is_mla else ["k", "v"]
        model = (_cfg(storage_config, "model_name", "") or "").replace("/", "-")
        self.prefix = extra.get("strata_key_prefix") or "sglang:" + model
        self.zero_copy_requested = bool(extra.get("interface_v1", 0))
        self.mem_pool_host: Any = None
        self.kv: Optional[PoolPages] = None
        self.sidecars: Dict[str, PoolPages] = {}
        self.failures = OnceLog(logger, "strata HiCache backend")
        self.client = Client(seeds, **options)

    # -- registration (runs inside SGLang's attach: raising fails it cleanly) --

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Checks the KV host pool's layout once, and registers its memory so
        page pointers into it may be transferred."""
        anchor = getattr(getattr(mem_pool_host, "anchor_entry", None), "host_pool", None)
        if anchor is not None:  # a host pool group: its KV pool is the anchor
            mem_pool_host = anchor
        layout = getattr(mem_pool_host, "layout", None)
        buffers, reason = probe_buffers(mem_pool_host)
        zero_copy = buffers == len(self.components)
        if not zero_copy and layout not in COPY_LAYOUTS:
            got = f"{buffers} buffers per page" if buffers is not None else f"no page buffers ({reason})"
            raise ValueError(
                f"strata HiCache backend: host layout {layout!r} gives {got}; "
                f"supported: one buffer per component (page_first, page_first_direct, page_head) "
                f"or {', '.join(COPY_LAYOUTS)}"
            )
        super().register_mem_pool_host(mem_pool_host)
        head = f"{self.prefix}:{shard_name(self.storage_config)}:{_geometry(mem_pool_host)}"
        self.kv = PoolPages(self.client, mem_pool_host, head, self.components, zero_copy, self.failures)
        register_memory(self.client, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A pool of SGLang's host pool group: the KV pool again (already
        registered), or a sidecar whose pages are stored under its own keys."""
        name = _name(host_pool_name)
        super_register = getattr(super(), "register_mem_host_pool_v2", None)
        if name == KV_POOL:
            if self.kv is None:
                self.register_mem_pool_host(host_pool)
            elif host_pool is not self.kv.pool:
                raise ValueError("strata HiCache backend: a second KV host pool was registered")
        else:
            self.sidecars[name] = self._sidecar(host_pool, name)
            register_memory(self.client, host_pool)
        if super_register is not None:
            super_register(host_pool, host_pool_name)

    def _sidecar(self, pool: Any, name: str) -> PoolPages:
        if name.startswith(REFUSED_POOL_PREFIX):
            raise NotImplementedError(
                f"strata HiCache backend: host pool {name!r} (DeepSeek-V4 compressed caches, "
                "hit in block groups) is not supported; run this model with another backend"
            )
        buffers, reason = probe_buffers(pool)
        if buffers:
            components = [f"c{i}" for i in range(buffers)]
        elif has_flat_pages(pool):
            components = ["page"]
        else:
            raise ValueError(
                f"strata HiCache backend: host pool {name!r} ({type(pool).__name__}) gives neither "
                f"page buffers ({reason}) nor flat pages"
            )
        shard = shard_name(self.storage_config, tp_sharded=name in TP_SHARDED_POOLS)
        head = f"{self.prefix}:{shard}:{name}.{_geometry(pool)}"
        return PoolPages(self.client, pool, head, components, bool(buffers), self.failures)

    def on_host_pools_registered(self) -> None:
        if self.kv is None:
            raise RuntimeError("strata HiCache backend: host pools registered without a KV pool")
        logger.info(
            "strata HiCache backend: KV pages %s (%s), sidecar pools: %s",
            "zero-copy" if self.kv.zero_copy else "copied", self.kv.head,
            ", ".join(f"{n} ({'zero-copy' if p.zero_copy else 'copied'})" for n, p in self.sidecars.items()) or "none",
        )

    def _pages(self) -> PoolPages:
        if self.kv is None:
            raise RuntimeError("strata HiCache backend: no host pool registered")
        return self.kv

    # -- KV pages: existence, zero-copy v1, generic (copying) path ---------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of consecutive pages, from the first, fully stored (one
        ``PREFIX`` per node)."""
        return self._pages().stored_prefix(keys)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Writes each page from the host pool; pages already stored are
        not sent again. Per page whether it is stored."""
        return self._pages().put(keys, host_indices)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page into the host pool. Per page whether all of it
        arrived whole (a value of the wrong size counts as a miss)."""
        return self._pages().get(keys, host_indices)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Reads one page into ``target_location`` (a flat page tensor):
        that tensor, or ``None`` on a miss."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Per page its target (flat page tensors, as SGLang's controller
        passes them) or ``None`` on a miss."""
        pages = self._pages()
        if target_locations is None:
            target_locations = [pages.pool.get_dummy_flat_data_page() for _ in keys]
        return pages.get_flat(list(keys), list(target_locations))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        """Stores flat pages (as SGLang's ``get_data_page`` returns them);
        whether every page is stored."""
        if not keys or values is None:
            return False
        return all(self._pages().put_flat(list(keys), list(values)))

    # -- v2: every pool of the group, with SGLang's per-pool hit policies --------------

    def _pool(self, name: Any) -> Optional[PoolPages]:
        n = _name(name)
        return self.kv if n == KV_POOL else self.sidecars.get(n)

    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """The longest KV prefix whose every pool holds what its hit policy
        asks (all pages, or the trailing ``len(transfer.keys)``), with the
        prefix lengths from which a request may restore."""
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransferResult

        # Keyed by SGLang's PoolName members, as its own backends key them.
        kv_pages = self._pages().stored_prefix(keys)
        hits: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            present = self._present(transfer, keys[:kv_pages])
            pool_restorable = _restorable(transfer, present)
            if pool_restorable:
                hits[transfer.name] = max(pool_restorable)
            restorable &= pool_restorable
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    def _present(self, transfer: Any, hashes: List[str]) -> List[bool]:
        pool = self._pool(transfer.name)
        if pool is None:
            self.failures("exists", f"pool {_name(transfer.name)!r} was never registered")
            return [False] * len(hashes)
        return pool.stored_each(hashes)

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Reads each transfer's pages into its pool; per pool, per page
        whether it arrived whole."""
        return {t.name: self._transfer(t, put=False) for t in transfers}

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Writes each transfer's pages from its pool; per pool, per page
        whether it is stored."""
        return {t.name: self._transfer(t, put=True) for t in transfers}

    def _transfer(self, transfer: Any, put: bool) -> List[bool]:
        keys = list(transfer.keys or [])
        pool = self._pool(transfer.name)
        if pool is None:
            self.failures("set" if put else "get", f"pool {_name(transfer.name)!r} was never registered")
            return [False] * len(keys)
        return (pool.put if put else pool.get)(keys, transfer.host_indices)

    # -- lifecycle -------------------------------------------------------------------

    def clear(self) -> None:
        """Not supported: strata has no per-tenant flush; pages age out by LRU."""

    def get_stats(self) -> Optional[Tuple[str, Dict[str, int]]]:
        return None

    def close(self) -> None:
        self.client.close()


def _restorable(transfer: Any, present: List[bool]) -> set:
    """Prefix lengths (in pages, from 1) a pool's hit policy allows, given
    which of the KV prefix's pages the pool holds."""
    policy = str(getattr(transfer.hit_policy, "value", transfer.hit_policy))
    if policy == "all_pages":
        boundary = present.index(False) if False in present else len(present)
        return set(range(1, boundary + 1))
    if policy == "trailing_pages":
        window = max(1, len(transfer.keys or []))
        return {n for n in range(1, len(present) + 1) if all(present[max(0, n - window) : n])}
    # block_groups pools are refused at attach; any other policy is a miss.
    return set()
