"""SGLang HiCache storage backend (``HiCacheStorage``) on strata.

Load it with SGLang's dynamic backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata.adapters.sglang", "class_name": "StrataHiCacheStorage",
        "strata_seeds": "10.0.0.1:7379,10.0.0.2:7379"}'

SGLang then constructs ``StrataHiCacheStorage(storage_config, kwargs)``,
calls ``register_mem_pool_host(host_pool)`` and drives ``batch_exists``,
``batch_get_v1`` and ``batch_set_v1`` (the zero-copy host-pool path), or the
generic ``get``/``set``/``batch_get``/``batch_set``.

Keys: each page key SGLang hands over (a chained SHA-256 of the page's
tokens) becomes one strata key per host-pool component of the page:
``"{prefix}:{page_key}:{rank}:{component}"``, where ``prefix`` is
``extra_config["strata_key_prefix"]`` or ``"sglang:" + model_name``, ``rank`` is
``"{tp_rank}of{tp_size}"`` (``"all"`` for MLA models, whose KV is the same
on every rank) and ``component`` is ``k``/``v`` (MHA) or ``kv`` (MLA).
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional

from ..client import Client
from ..errors import StrataError

try:  # The real base class when SGLang is installed (its factory checks it).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - depends on the environment

    class _Base:  # type: ignore[no-redef]
        """Stand-in for ``sglang.srt.mem_cache.hicache_storage.HiCacheStorage``."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host


logger = logging.getLogger(__name__)


def _extra(storage_config: Any) -> dict:
    return dict(getattr(storage_config, "extra_config", None) or {})


class StrataHiCacheStorage(_Base):
    """``HiCacheStorage`` backed by a strata cluster."""

    def __init__(self, storage_config: Any = None, kwargs: Any = None) -> None:
        extra = _extra(storage_config)
        seeds = extra.get("strata_seeds") or os.environ.get("STRATA_SEEDS", "127.0.0.1:7379")
        options = dict(extra.get("strata_client") or {})
        self.client = Client(seeds, **options)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        model = (getattr(storage_config, "model_name", None) or "").replace("/", "-")
        self.prefix = extra.get("strata_key_prefix") or f"sglang:{model}"
        tp_rank = getattr(storage_config, "tp_rank", 0)
        tp_size = getattr(storage_config, "tp_size", 1)
        self.rank = "all" if self.is_mla else f"{tp_rank}of{tp_size}"
        self.components = ["kv"] if self.is_mla else ["k", "v"]
        self.mem_pool_host: Any = None

    # -- host pool (zero copy) -----------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host pool's buffers so page pointers into them may
        be transferred."""
        super().register_mem_pool_host(mem_pool_host)
        buffers = getattr(mem_pool_host, "get_hybrid_pool_buffer", None)
        for buf in buffers() if buffers else [mem_pool_host.kv_buffer]:
            if buf is not None and int(buf.numel()) > 0:
                self.client.register_buffer(buf)

    def _page_keys(self, keys: List[str]) -> List[str]:
        return [f"{self.prefix}:{k}:{self.rank}:{c}" for k in keys for c in self.components]

    def _page_meta(self, keys: List[str], host_indices: Any) -> tuple:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        want = len(keys) * len(self.components)
        if len(ptrs) != want or any(isinstance(p, (list, tuple)) for p in ptrs):
            raise ValueError(
                f"host pool layout gives {len(ptrs)} buffers for {len(keys)} pages; "
                f"strata expects {len(self.components)} contiguous buffer(s) per page "
                "(use --hicache-mem-layout page_first or page_first_direct)"
            )
        return self._page_keys(keys), list(ptrs), list(sizes)

    def _per_page(self, ok: List[bool]) -> List[bool]:
        n = len(self.components)
        return [all(ok[i : i + n]) for i in range(0, len(ok), n)]

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Writes each page from the host pool; pages already stored are
        not sent again. Per page whether it is stored."""
        if not keys:
            return []
        skeys, ptrs, sizes = self._page_meta(keys, host_indices)
        present = self.client.exists_batch(skeys)
        missing = [i for i, p in enumerate(present) if p is not True]
        ok = [p is True for p in present]
        if missing:
            results = self.client.batch_put_from(
                [skeys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing]
            )
            for i, r in zip(missing, results):
                ok[i] = r is None
                if r is not None:
                    logger.warning("strata put %s failed: %s", skeys[i], r)
        return self._per_page(ok)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page into the host pool. Per page whether all of it
        arrived whole (a value of the wrong size counts as a miss)."""
        if not keys:
            return []
        skeys, ptrs, sizes = self._page_meta(keys, host_indices)
        results = self.client.batch_get_into(skeys, ptrs, sizes)
        ok = [r == s for r, s in zip(results, sizes)]
        return self._per_page(ok)

    # -- existence -----------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of consecutive pages, from the first, fully stored."""
        if not keys:
            return 0
        if self.mem_pool_host is None:
            return self.client.prefix([self._plain(k) for k in keys])
        return self.client.prefix(self._page_keys(keys)) // len(self.components)

    # -- generic (copying) path ------------------------------------------------------

    def _plain(self, key: str) -> str:
        return f"{self.prefix}:{key}:{self.rank}"

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Without a target: the bytes or ``None``. Into a tensor or buffer:
        that object, or ``None`` if missing. Into a pointer (with
        ``target_sizes``, in a registered buffer): whether it was read."""
        k = self._plain(key)
        try:
            if target_location is None:
                return self.client.get(k)
            if isinstance(target_location, int):
                return self.client.get_into(k, target_location, target_sizes) == target_sizes
            self.client.get_into(k, target_location)
            return target_location
        except StrataError:
            return False if isinstance(target_location, int) else None

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """Per key as :meth:`get`; with pointer targets (Mooncake style),
        the number of keys read from the first on."""
        if target_locations is not None and all(isinstance(t, int) for t in target_locations):
            results = self.client.batch_get_into([self._plain(k) for k in keys], target_locations, target_sizes)
            ok = [r == s for r, s in zip(results, target_sizes)]
            return ok.index(False) if False in ok else len(ok)
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Stores ``value`` (tensor or buffer), or ``target_sizes`` bytes at
        the pointer ``target_location``. Whether it is stored."""
        k = self._plain(key)
        try:
            if value is None and isinstance(target_location, int):
                self.client.put_from(k, target_location, target_sizes)
            elif hasattr(value, "data_ptr"):
                self.client.put_from(k, value)
            else:
                self.client.put(k, value)
            return True
        except StrataError as e:
            logger.warning("strata set %s failed: %s", key, e)
            return False

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        """Whether every key is stored."""
        if not keys:
            return False
        values = values if values is not None else [None] * len(keys)
        locations = target_locations if target_locations is not None else [None] * len(keys)
        sizes = target_sizes if target_sizes is not None else [None] * len(keys)
        return all([self.set(k, v, t, s) for k, v, t, s in zip(keys, values, locations, sizes)])

    def clear(self) -> None:
        """Not supported: strata has no per-tenant flush; keys age out by LRU."""

    def close(self) -> None:
        self.client.close()
