"""The pages of one SGLang host pool as strata keys: how they are named,
written, read and counted. The HiCache backend (``sglang.py``) holds one of
these for the KV pool and one for each sidecar pool SGLang registers
through its v2 calls (Mamba state, SWA, indexers).

A page is stored as one value per component: the buffers SGLang's
``get_page_buffer_meta`` hands out for it (zero-copy: a pointer straight
into the host pool), or, for layouts that have no such buffers, its flat
bytes (``get_data_page(flat=True)``) cut into the same components. Nothing
here raises into SGLang's transfer threads: a failure is a miss, logged
once by the caller's ``OnceLog``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

# Layouts whose pages are copied through a flat page (several buffers per
# component, one per layer, so no zero-copy pointer per page exists).
COPY_LAYOUTS = ("layer_first",)

Failures = Callable[[str, Any], None]


def probe_buffers(pool: Any) -> tuple[Optional[int], Optional[BaseException]]:
    """How many buffers ``get_page_buffer_meta`` gives for one page of
    ``pool`` (``None`` and the reason when it gives none)."""
    import torch

    page = int(getattr(pool, "page_size", 1) or 1)
    try:
        ptrs, _ = pool.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
    except (ValueError, NotImplementedError, AssertionError, AttributeError) as e:
        return None, e
    return len(ptrs), None


def has_flat_pages(pool: Any) -> bool:
    return all(hasattr(pool, m) for m in ("get_data_page", "set_from_flat_data_page", "get_dummy_flat_data_page"))


def register_memory(client: Any, pool: Any) -> None:
    """Registers the pool's host buffers, so page pointers into them may be
    transferred zero-copy."""
    kv = getattr(pool, "kv_buffer", None)
    buffers = getattr(pool, "get_hybrid_pool_buffer", None)
    found = [kv] if kv is not None else (buffers() if buffers else [])
    for buf in _flatten(found):
        if hasattr(buf, "numel") and int(buf.numel()) > 0:
            client.register_buffer(buf)


def _flatten(items: Any) -> List[Any]:
    out: List[Any] = []
    for item in items if isinstance(items, (list, tuple)) else [items]:
        if isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        elif item is not None:
            out.append(item)
    return out


class PoolPages:
    """Pages of one host pool under ``{head}:{page_hash}:{component}``."""

    def __init__(self, client: Any, pool: Any, head: str, components: Sequence[str], zero_copy: bool,
                 failures: Failures) -> None:
        self.client = client
        self.pool = pool
        self.head = head
        self.components = list(components)
        self.zero_copy = zero_copy
        self.page = int(getattr(pool, "page_size", 1) or 1)
        self.failures = failures

    # -- keys and existence ----------------------------------------------------

    def keys(self, hashes: Sequence[str]) -> List[str]:
        return [f"{self.head}:{h}:{c}" for h in hashes for c in self.components]

    def per_page(self, ok: Sequence[bool]) -> List[bool]:
        n = len(self.components)
        return [all(ok[i : i + n]) for i in range(0, len(ok), n)]

    def stored_prefix(self, hashes: Sequence[str]) -> int:
        """Pages, from the first, fully stored (one ``PREFIX`` per node)."""
        if not hashes:
            return 0
        try:
            return self.client.prefix(self.keys(hashes)) // len(self.components)
        except Exception as e:
            self.failures("exists", e)
            return 0

    def stored_each(self, hashes: Sequence[str]) -> List[bool]:
        """Per page whether all of it is stored."""
        if not hashes:
            return []
        try:
            return self.per_page([p is True for p in self.client.exists_batch(self.keys(hashes))])
        except Exception as e:
            self.failures("exists", e)
            return [False] * len(hashes)

    # -- transfers between the host pool and strata -----------------------------------

    def starts(self, hashes: Sequence[str], host_indices: Any) -> List[int]:
        if host_indices is None or len(host_indices) != len(hashes) * self.page:
            got = 0 if host_indices is None else len(host_indices)
            raise ValueError(f"{got} host indices for {len(hashes)} pages of {self.page}")
        return [int(host_indices[i * self.page]) for i in range(len(hashes))]

    def put(self, hashes: Sequence[str], host_indices: Any) -> List[bool]:
        """Writes each page from the host pool; pages already stored are
        not sent again. Per page whether it is stored."""
        if not hashes:
            return []
        try:
            if not self.zero_copy:
                pages = [self.pool.get_data_page(i, flat=True) for i in self.starts(hashes, host_indices)]
                return self.put_flat(hashes, pages)
            ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
            return self.per_page(self._put_missing(self.keys(hashes), list(ptrs), list(sizes)))
        except Exception as e:
            self.failures("set", e)
            return [False] * len(hashes)

    def get(self, hashes: Sequence[str], host_indices: Any) -> List[bool]:
        """Reads each page into the host pool. Per page whether all of it
        arrived whole (a value of the wrong size counts as a miss)."""
        if not hashes:
            return []
        try:
            if not self.zero_copy:
                return self._get_flat_into_pool(hashes, host_indices)
            skeys = self.keys(hashes)
            ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
            results = self.client.batch_get_into(skeys, list(ptrs), list(sizes))
        except Exception as e:
            self.failures("get", e)
            return [False] * len(hashes)
        return self.per_page(self._whole(skeys, results, list(sizes)))

    def _get_flat_into_pool(self, hashes: Sequence[str], host_indices: Any) -> List[bool]:
        starts = self.starts(hashes, host_indices)
        pages = self.get_flat(hashes, [self.pool.get_dummy_flat_data_page() for _ in hashes])
        for start, page in zip(starts, pages):
            if page is not None:
                self.pool.set_from_flat_data_page(start, page)
        return [p is not None for p in pages]

    # -- flat pages (SGLang's generic path, and layouts without page buffers) ----------

    def _split(self, flat: Any) -> List[Any]:
        return list(flat.contiguous().view(len(self.components), -1))

    def put_flat(self, hashes: Sequence[str], pages: Sequence[Any]) -> List[bool]:
        try:
            parts = [p for page in pages for p in self._split(page)]
            return self.per_page(self._put_missing(self.keys(hashes), parts, None))
        except Exception as e:
            self.failures("set", e)
            return [False] * len(hashes)

    def get_flat(self, hashes: Sequence[str], targets: Sequence[Any]) -> List[Any]:
        """Reads each page into its flat target; per page the target or ``None``."""
        try:
            skeys = self.keys(hashes)
            parts = [p for t in targets for p in self._split(t)]
            results = self.client.batch_get_into(skeys, parts)
        except Exception as e:
            self.failures("get", e)
            return [None] * len(hashes)
        sizes = [int(p.numel()) * int(p.element_size()) for p in parts]
        whole = self.per_page(self._whole(skeys, results, sizes))
        return [t if ok else None for t, ok in zip(targets, whole)]

    # -- shared ----------------------------------------------------------------------

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
