"""SGLang HiCache storage backend (``HiCacheStorage``) on strata.

Load it with SGLang's dynamic backend (tested with sglang 0.5.23)::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata.adapters.sglang", "class_name": "StrataHiCacheStorage",
        "interface_v1": 1, "strata_seeds": "10.0.0.1:7379,10.0.0.2:7379"}'

SGLang's ``StorageBackendFactory`` constructs ``StrataHiCacheStorage(storage_config,
kwargs)``; the cache controller then calls ``register_mem_pool_host(host_pool)``
and, from its prefetch and backup threads, ``batch_exists`` and either the
zero-copy ``batch_get_v1``/``batch_set_v1`` (with ``"interface_v1": 1``) or
the generic copying ``batch_get``/``batch_set``. Both paths store the same
keys and bytes, so ``batch_exists`` finds what either wrote.

Keys: a page becomes one strata key per component (``k`` and ``v`` for MHA,
``kv`` for MLA)::

    {prefix}:{shard}:{layout}-{dtype}:{page_hash}:{component}

* ``prefix``: ``extra_config["strata_key_prefix"]`` or ``"sglang:" + model``;
* ``shard``: every rank that changes what a page holds: ``tp{r}of{n}`` (MHA;
  MLA pages are the same on every tp rank and use ``mla``, or
  ``mla-dcp{r}of{n}-tp{n}-page{p}`` under decode context parallelism), then
  ``.pp{r}of{n}`` when pipeline parallel and ``.cp{r}of{n}`` when attention
  context parallel;
* ``layout-dtype``: the host pool's layout and KV dtype, since both change
  the bytes of a page (two engines with different layouts never read each
  other's pages as their own).

Refused, with the reason, before any transfer runs: hybrid models (the v2
pool calls: Mamba, SWA, DSA sidecars), split heads (``tp_lcm_size`` with the
``page_head`` layout), and host layouts whose pages SGLang cannot hand out
as one buffer per component or copy as a flat page.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from ..client import Client
from ._once import OnceLog

try:  # The real base class when SGLang is installed (its factory checks it).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - depends on the environment

    class _Base:  # type: ignore[no-redef]
        """Stand-in for ``sglang.srt.mem_cache.hicache_storage.HiCacheStorage``."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host


logger = logging.getLogger(__name__)

# Layouts whose pages are copied through a flat page (several buffers per
# component, one per layer, so no zero-copy pointer per page exists).
COPY_LAYOUTS = ("layer_first",)


def _extra(storage_config: Any) -> dict:
    return dict(getattr(storage_config, "extra_config", None) or {})


def _cfg(storage_config: Any, name: str, default: Any) -> Any:
    value = getattr(storage_config, name, default)
    return default if value is None else value


def shard_name(storage_config: Any) -> str:
    """The part of a key that names which slice of a page this rank holds."""
    pp_rank, pp_size = _cfg(storage_config, "pp_rank", 0), _cfg(storage_config, "pp_size", 1)
    cp_rank, cp_size = _cfg(storage_config, "attn_cp_rank", 0), _cfg(storage_config, "attn_cp_size", 1)
    tp_rank, tp_size = _cfg(storage_config, "tp_rank", 0), _cfg(storage_config, "tp_size", 1)
    if _cfg(storage_config, "is_mla_model", False):
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
        self.is_mla = bool(_cfg(storage_config, "is_mla_model", False))
        self.components = ["kv"] if self.is_mla else ["k", "v"]
        model = (_cfg(storage_config, "model_name", "") or "").replace("/", "-")
        self.prefix = f"{extra.get('strata_key_prefix') or 'sglang:' + model}:{shard_name(storage_config)}"
        self.zero_copy_requested = bool(extra.get("interface_v1", 0))
        self.mem_pool_host: Any = None
        self.geometry: Optional[str] = None
        self.zero_copy = False
        self.failures = OnceLog(logger, "strata HiCache backend")
        self.client = Client(seeds, **options)

    # -- registration (runs inside SGLang's attach: raising fails it cleanly) --

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Checks the host pool's layout once, and registers its memory so
        page pointers into it may be transferred."""
        layout = getattr(mem_pool_host, "layout", None)
        if hasattr(mem_pool_host, "entries"):
            raise NotImplementedError(
                "strata HiCache backend: hybrid models (a host pool group) are not supported"
            )
        page = getattr(mem_pool_host, "page_size", 1)
        import torch

        probe = torch.arange(page, dtype=torch.int64)
        try:
            ptrs, _ = mem_pool_host.get_page_buffer_meta(probe)
        except (ValueError, NotImplementedError, AssertionError) as e:
            ptrs = None
            reason = e
        if ptrs is not None and len(ptrs) == len(self.components):
            self.zero_copy = True
        elif layout in COPY_LAYOUTS:
            self.zero_copy = False
        else:
            got = f"{len(ptrs)} buffers per page" if ptrs is not None else f"no page buffers ({reason})"
            raise ValueError(
                f"strata HiCache backend: host layout {layout!r} gives {got}; "
                f"supported: one buffer per component (page_first, page_first_direct, page_head) "
                f"or {', '.join(COPY_LAYOUTS)}"
            )
        super().register_mem_pool_host(mem_pool_host)
        dtype = str(getattr(mem_pool_host, "dtype", "")).replace("torch.", "")
        self.geometry = f"{layout}-{dtype}"
        buffers = getattr(mem_pool_host, "get_hybrid_pool_buffer", None)
        kv = getattr(mem_pool_host, "kv_buffer", None)
        for buf in [kv] if kv is not None else (buffers() if buffers else []):
            if buf is not None and int(buf.numel()) > 0:
                self.client.register_buffer(buf)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        raise NotImplementedError(
            f"strata HiCache backend: hybrid models are not supported (host pool {host_pool_name!s}); "
            "run this model without --hicache-storage-backend or with another backend"
        )

    # -- keys ------------------------------------------------------------------

    def _page_keys(self, keys: List[str]) -> List[str]:
        if self.geometry is None:
            raise RuntimeError("strata HiCache backend: no host pool registered")
        base = f"{self.prefix}:{self.geometry}"
        return [f"{base}:{k}:{c}" for k in keys for c in self.components]

    def _per_page(self, ok: List[bool]) -> List[bool]:
        n = len(self.components)
        return [all(ok[i : i + n]) for i in range(0, len(ok), n)]

    def _page_starts(self, keys: List[str], host_indices: Any) -> List[int]:
        page = self.mem_pool_host.page_size
        if len(host_indices) != len(keys) * page:
            raise ValueError(f"{len(host_indices)} host indices for {len(keys)} pages of {page}")
        return [int(host_indices[i * page]) for i in range(len(keys))]

    # -- existence ---------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of consecutive pages, from the first, fully stored (one
        ``PREFIX`` per node)."""
        if not keys:
            return 0
        try:
            return self.client.prefix(self._page_keys(keys)) // len(self.components)
        except Exception as e:  # a miss, never an exception in SGLang's thread
            self.failures("exists", e)
            return 0

    # -- zero-copy v1 ----------------------------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Writes each page from the host pool; pages already stored are
        not sent again. Per page whether it is stored."""
        if not keys:
            return []
        if not self.zero_copy:
            pages = [self.mem_pool_host.get_data_page(i, flat=True) for i in self._page_starts(keys, host_indices)]
            return self._set_flat(keys, pages)
        try:
            skeys = self._page_keys(keys)
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            return self._per_page(self._put_missing(skeys, list(ptrs), list(sizes)))
        except Exception as e:
            self.failures("set", e)
            return [False] * len(keys)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page into the host pool. Per page whether all of it
        arrived whole (a value of the wrong size counts as a miss)."""
        if not keys:
            return []
        if not self.zero_copy:
            starts = self._page_starts(keys, host_indices)
            pages = self._get_flat(keys, [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys])
            for start, page in zip(starts, pages):
                if page is not None:
                    self.mem_pool_host.set_from_flat_data_page(start, page)
            return [p is not None for p in pages]
        try:
            skeys = self._page_keys(keys)
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            results = self.client.batch_get_into(skeys, list(ptrs), list(sizes))
        except Exception as e:
            self.failures("get", e)
            return [False] * len(keys)
        return self._per_page(self._whole(skeys, results, sizes))

    def _put_missing(self, skeys: List[str], targets: List[Any], sizes: Optional[List[int]]) -> List[bool]:
        present = self.client.exists_batch(skeys)
        ok = [p is True for p in present]
        missing = [i for i, p in enumerate(ok) if not p]
        if missing:
            results = self.client.batch_put_from(
                [skeys[i] for i in missing],
                [targets[i] for i in missing],
                None if sizes is None else [sizes[i] for i in missing],
            )
            for i, r in zip(missing, results):
                ok[i] = r is None
                if r is not None:
                    self.failures("set", f"{skeys[i]}: {r}")
        return ok

    def _whole(self, skeys: List[str], results: List[Any], sizes: List[int]) -> List[bool]:
        ok = []
        for k, r, s in zip(skeys, results, sizes):
            ok.append(r == s)
            if isinstance(r, Exception) and getattr(r, "code", "") != "NOTFOUND":
                self.failures("get", f"{k}: {r}")
        return ok

    # -- generic (copying) path: flat pages, split into the same components ------------

    def _split(self, flat: Any) -> List[Any]:
        return list(flat.contiguous().view(len(self.components), -1))

    def _set_flat(self, keys: List[str], pages: List[Any]) -> List[bool]:
        try:
            parts = [p for page in pages for p in self._split(page)]
            return self._per_page(self._put_missing(self._page_keys(keys), parts, None))
        except Exception as e:
            self.failures("set", e)
            return [False] * len(keys)

    def _get_flat(self, keys: List[str], targets: List[Any]) -> List[Any]:
        """Reads each page into its flat target; per page the target or ``None``."""
        try:
            skeys = self._page_keys(keys)
            parts = [p for t in targets for p in self._split(t)]
            results = self.client.batch_get_into(skeys, parts)
        except Exception as e:
            self.failures("get", e)
            return [None] * len(keys)
        sizes = [int(p.numel()) * int(p.element_size()) for p in parts]
        whole = self._per_page(self._whole(skeys, results, sizes))
        return [t if ok else None for t, ok in zip(targets, whole)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Reads one page into ``target_location`` (a flat page tensor):
        that tensor, or ``None`` on a miss."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Per page its target (flat page tensors, as SGLang's controller
        passes them) or ``None`` on a miss."""
        if target_locations is None:
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        return self._get_flat(list(keys), list(target_locations))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        """Stores flat pages (as SGLang's ``get_data_page`` returns them);
        whether every page is stored."""
        if not keys or values is None:
            return False
        return all(self._set_flat(list(keys), list(values)))

    # -- lifecycle -------------------------------------------------------------------

    def clear(self) -> None:
        """Not supported: strata has no per-tenant flush; pages age out by LRU."""

    def get_stats(self) -> Optional[Tuple[str, Dict[str, int]]]:
        return None

    def close(self) -> None:
        self.client.close()
