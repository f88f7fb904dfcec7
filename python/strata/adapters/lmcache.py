"""LMCache remote connector (``RemoteConnector``) on strata, and the
``ConnectorAdapter`` that LMCache's remote-storage-plugin loader creates it
through. LMCache config::

    remote_url: "strata://10.0.0.1:7379,10.0.0.2:7379"
    remote_serde: "naive"
    remote_storage_plugins: ["strata"]
    extra_config:
      remote_storage_plugin.strata.module_path: strata.adapters.lmcache
      remote_storage_plugin.strata.class_name: StrataConnectorAdapter

(The older ``external://host:0/strata.adapters.lmcache/?connector_name=StrataConnector``
URL works too.)

Layout: a chunk is two strata keys. ``"{key}"`` holds the KV bytes,
written zero-copy from the memory object's buffer and read zero-copy into
the one LMCache allocates; ``"{key}#meta"`` holds a small JSON header
(length, shape, dtype, format) and is written after the bytes, so a chunk is
visible (``exists``) only once it is complete. ``key`` is
``CacheEngineKey.to_string()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, List, Optional

from ..client import Client
from ..errors import NotFoundError, StrataError

try:  # The real base classes when LMCache is installed (its loaders check them).
    from lmcache.v1.storage_backend.connector import ConnectorAdapter as _AdapterBase
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _Base
except ImportError:  # pragma: no cover - depends on the environment

    class _Base:  # type: ignore[no-redef]
        """Stand-in for LMCache's ``RemoteConnector``."""

    class _AdapterBase:  # type: ignore[no-redef]
        """Stand-in for LMCache's ``ConnectorAdapter``."""

        def __init__(self, schema: str = "") -> None:
            self.schema = schema

        def can_parse(self, url: str) -> bool:
            return self.schema != "" and url.startswith(self.schema)


logger = logging.getLogger(__name__)

SCHEME = "strata://"
META_SUFFIX = "#meta"
META_VERSION = 1


def _key(key: Any) -> str:
    return key.to_string() if hasattr(key, "to_string") else str(key)


def _nbytes(payload: Any) -> int:
    """Length of a memory object's bytes: a buffer or a tensor."""
    if hasattr(payload, "data_ptr"):
        return int(payload.numel()) * int(payload.element_size())
    return memoryview(payload).nbytes


def _dtype_name(dtype: Any) -> str:
    return str(dtype)


def _dtype(name: str) -> Any:
    """``"torch.bfloat16"`` back to the torch dtype (the name itself when
    torch is absent)."""
    try:
        import torch

        return getattr(torch, name.rsplit(".", 1)[-1])
    except (ImportError, AttributeError):
        return name


def _fmt(value: int) -> Any:
    try:
        from lmcache.v1.memory_management import MemoryFormat

        return MemoryFormat(value)
    except ImportError:
        return value


def _seeds_from_url(url: Optional[str]) -> Optional[str]:
    if not url:
        return None
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0] or None


class StrataConnector(_Base):
    """LMCache ``RemoteConnector`` on a strata cluster. Its async methods
    run the blocking client calls in the loop's default executor."""

    def __init__(
        self,
        url: Optional[str] = None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        local_cpu_backend: Any = None,
        config: Any = None,
    ) -> None:
        extra = dict(getattr(config, "extra_config", None) or {})
        seeds = (
            _seeds_from_url(url if url and url.startswith(SCHEME) else None)
            or extra.get("strata_seeds")
            or os.environ.get("STRATA_SEEDS", "127.0.0.1:7379")
        )
        self.client = Client(seeds)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend

    # -- sync cores ----------------------------------------------------------------

    def _exists(self, key: Any) -> bool:
        return self.client.exists(_key(key) + META_SUFFIX)

    def _put(self, key: Any, memory_obj: Any) -> None:
        k = _key(key)
        payload = memory_obj.byte_array
        length = _nbytes(payload)
        fmt = memory_obj.get_memory_format()
        meta = {
            "v": META_VERSION,
            "len": length,
            "shape": [int(d) for d in memory_obj.get_shape()],
            "dtype": _dtype_name(memory_obj.get_dtype()),
            "fmt": int(getattr(fmt, "value", fmt)),
        }
        self.client.put_from(k, payload)
        self.client.put(k + META_SUFFIX, json.dumps(meta).encode())

    def _get(self, key: Any) -> Any:
        k = _key(key)
        raw = self.client.get(k + META_SUFFIX)
        if raw is None:
            return None
        meta = json.loads(raw)
        if meta.get("v") != META_VERSION:
            logger.warning("strata chunk %s has header version %s", k, meta.get("v"))
            return None
        memory_obj = self.local_cpu_backend.allocate(
            meta["shape"], _dtype(meta["dtype"]), _fmt(meta["fmt"])
        )
        if memory_obj is None:
            logger.warning("LMCache could not allocate memory for %s", k)
            return None
        try:
            read = self.client.get_into(k, memory_obj.byte_array, meta["len"])
        except NotFoundError:
            # The bytes were evicted after the header was read: a miss.
            return None
        if read != meta["len"]:
            logger.warning("strata chunk %s is %d bytes, header says %d", k, read, meta["len"])
            return None
        return memory_obj

    def _prefix(self, keys: List[Any]) -> int:
        return self.client.prefix([_key(k) + META_SUFFIX for k in keys])

    async def _run(self, fn, *args) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fn, *args)

    # -- RemoteConnector -------------------------------------------------------------

    async def exists(self, key: Any) -> bool:
        return await self._run(self._exists, key)

    def exists_sync(self, key: Any) -> bool:
        return self._exists(key)

    async def get(self, key: Any) -> Any:
        return await self._run(self._get, key)

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self._run(self._put, key, memory_obj)

    async def list(self) -> List[str]:
        """Not supported (strata-client has no key listing); LMCache's
        built-in Redis connector does not list either."""
        return []

    async def close(self) -> None:
        self.client.close()

    def remove_sync(self, key: Any) -> bool:
        k = _key(key)
        had_meta = self.client.remove(k + META_SUFFIX)
        return self.client.remove(k) or had_meta

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[Any]) -> List[Any]:
        return await self._run(lambda: [self._get(k) for k in keys])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[Any], memory_objs: List[Any]) -> None:
        await self._run(lambda: [self._put(k, m) for k, m in zip(keys, memory_objs)])

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[Any], stop_after_first_not_exits: bool = True) -> List[bool]:
        if stop_after_first_not_exits:
            n = self._prefix(keys)
            return [True] * n + [False] * (len(keys) - n)
        found = self.client.exists_batch([_key(k) + META_SUFFIX for k in keys])
        return [f is True for f in found]

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[Any], pin: bool = False) -> int:
        """Chunks stored, from the first on (one ``PREFIX`` per node)."""
        return await self._run(self._prefix, keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any]) -> List[Any]:
        """The chunks found, from the first on, up to the first miss."""

        def run() -> List[Any]:
            out = []
            for k in keys:
                obj = self._get(k)
                if obj is None:
                    break
                out.append(obj)
            return out

        return await self._run(run)

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        try:
            await self._run(self.client.info, "server")
            return 0
        except StrataError as e:
            return e.mooncake_code

    def __repr__(self) -> str:
        return f"<StrataConnector {self.client.config.seeds}>"


class StrataConnectorAdapter(_AdapterBase):
    """Creates :class:`StrataConnector` for ``strata://`` URLs."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def create_connector(self, context: Any) -> StrataConnector:
        return StrataConnector(
            url=context.url,
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
        )
