"""LMCache remote connector (``RemoteConnector``) on strata (tested with
lmcache 0.5.6). LMCache config, the remote-storage-plugin way::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_serde: "naive"
    remote_storage_plugins: ["strata"]
    extra_config:
      remote_storage_plugin.strata.module_path: strata.adapters.lmcache
      remote_storage_plugin.strata.class_name: StrataConnectorAdapter
      remote_storage_plugin.strata.seeds: "10.0.0.1:7379,10.0.0.2:7379"
      # optional: where the nodes pull this engine's large chunks from
      # (default: this host's address on the route to the seeds)
      strata_data_bind: "10.0.0.21:0"

LMCache then asks the adapter for a connector for the URL
``plugin://strata`` (any plugin name whose type is ``strata``, e.g.
``strata.primary``). ``class_name: StrataConnector`` also works, for any
plugin name. The deprecated ``remote_url`` form is
``external://127.0.0.1:0/strata.adapters.lmcache/?connector_name=StrataConnector``
with the seeds in ``extra_config.strata_seeds``; setting it and a plugin
makes two backends.

Layout: a chunk is one strata key, ``CacheEngineKey.to_string()`` (model,
world size, worker, chunk hash, dtype), holding the chunk's KV bytes only,
written zero-copy from the memory object's buffer and read zero-copy into a
buffer LMCache allocates with the engine's own full-chunk shapes (as
LMCache's Mooncake connector does with ``save_chunk_meta: false``). A
shorter value is the last, partial chunk of a prompt and is reshaped with
LMCache's ``reshape_partial_chunk``. Every failure is a miss (``None``,
``False``, ``0``), logged once per kind with its reason, never an exception
in LMCache's threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, List, Optional

from ..client import Client
from ._once import OnceLog
from ._options import client_options

try:  # The real base classes when LMCache is installed (its loaders check them).
    from lmcache.v1.storage_backend.connector import ConnectorAdapter as _AdapterBase
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _Base
except ImportError:  # pragma: no cover - depends on the environment

    class _Base:  # type: ignore[no-redef]
        """Stand-in for LMCache's ``RemoteConnector``."""

        def __init__(self, config: Any, metadata: Any) -> None:
            pass

    class _AdapterBase:  # type: ignore[no-redef]
        """Stand-in for LMCache's ``ConnectorAdapter``."""

        def __init__(self, schema: str = "") -> None:
            self.schema = schema


logger = logging.getLogger(__name__)

PLUGIN_TYPE = "strata"
DEFAULT_SEEDS = "127.0.0.1:7379"
# Upper bound on the keys list() returns (it walks every node's keyspace).
LIST_MAX_KEYS = 1_000_000


def _key(key: Any) -> str:
    return key.to_string() if hasattr(key, "to_string") else str(key)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _plugin_seeds(extra: dict, plugin_name: Optional[str]) -> Optional[str]:
    """``remote_storage_plugin.<name>.seeds`` for the plugin named, else for
    the one plugin entry that loads this module."""
    if plugin_name:
        return extra.get(f"remote_storage_plugin.{plugin_name}.seeds")
    ours = [
        k[: -len(".module_path")]
        for k, v in extra.items()
        if k.startswith("remote_storage_plugin.") and k.endswith(".module_path") and v == __name__
    ]
    return extra.get(f"{ours[0]}.seeds") if len(ours) == 1 else None


def resolve_seeds(config: Any, plugin_name: Optional[str] = None) -> str:
    """Where the cluster is: the plugin's ``seeds``,
    ``extra_config["strata_seeds"]``, ``STRATA_SEEDS``, then the default."""
    extra = dict(getattr(config, "extra_config", None) or {})
    return (
        _plugin_seeds(extra, plugin_name)
        or extra.get("strata_seeds")
        or os.environ.get("STRATA_SEEDS")
        or DEFAULT_SEEDS
    )


class StrataConnector(_Base):
    """LMCache ``RemoteConnector`` on a strata cluster. Its async methods
    run the blocking client calls in the loop's default executor."""

    def __init__(
        self,
        url: Optional[str] = None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        local_cpu_backend: Any = None,
        config: Any = None,
        metadata: Any = None,
        plugin_name: Optional[str] = None,
    ) -> None:
        config = config if config is not None else getattr(local_cpu_backend, "config", None)
        metadata = metadata if metadata is not None else getattr(local_cpu_backend, "metadata", None)
        if getattr(config, "use_layerwise", False):
            raise ValueError("strata LMCache connector: use_layerwise is not supported")
        # Sets meta_shapes / meta_dtypes / meta_fmt / full_chunk_size_bytes,
        # which this connector allocates with and LMCache's recovery reads.
        super().__init__(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.model_name = getattr(metadata, "model_name", None)
        self.failures = OnceLog(logger, "strata LMCache connector")
        extra = dict(getattr(config, "extra_config", None) or {})
        self.client = Client(resolve_seeds(config, plugin_name), **client_options(extra))

    # -- sync cores ----------------------------------------------------------------

    def _allocate(self) -> Any:
        obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
        if obj is None:
            self.failures("allocate", "LMCache's CPU buffer is full")
        return obj

    def _finish(self, key: str, obj: Any, result: Any) -> Any:
        """The memory object for a read of ``result`` bytes, or ``None``
        (and the object released) on a miss."""
        if isinstance(result, int) and result > 0:
            try:
                return self.reshape_partial_chunk(obj, result)
            except ValueError as e:
                self.failures("get", f"{key}: {e}")
        elif isinstance(result, Exception) and getattr(result, "code", "") != "NOTFOUND":
            self.failures("get", f"{key}: {result}")
        obj.ref_count_down()
        return None

    def _get_many(self, keys: List[Any]) -> List[Any]:
        objs = [self._allocate() for _ in keys]
        idx = [i for i, o in enumerate(objs) if o is not None]
        out: List[Any] = [None] * len(keys)
        if not idx:
            return out
        skeys = [_key(keys[i]) for i in idx]
        try:
            results = self.client.batch_get_into(skeys, [objs[i].byte_array for i in idx])
        except Exception as e:
            results = [e] * len(idx)
        for i, k, r in zip(idx, skeys, results):
            out[i] = self._finish(k, objs[i], r)
        return out

    def _put_many(self, keys: List[Any], memory_objs: List[Any]) -> None:
        skeys = [_key(k) for k in keys]
        try:
            results = self.client.batch_put_from(skeys, [m.byte_array for m in memory_objs])
        except Exception as e:
            results = [e] * len(skeys)
        for k, r in zip(skeys, results):
            if r is not None:
                self.failures("put", f"{k}: {r}")

    def _exists(self, key: Any) -> bool:
        try:
            return self.client.exists(_key(key))
        except Exception as e:
            self.failures("exists", e)
            return False

    def _prefix(self, keys: List[Any]) -> int:
        try:
            return self.client.prefix([_key(k) for k in keys])
        except Exception as e:
            self.failures("contains", e)
            return 0

    async def _run(self, fn, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- RemoteConnector -------------------------------------------------------------

    async def exists(self, key: Any) -> bool:
        return await self._run(self._exists, key)

    def exists_sync(self, key: Any) -> bool:
        return self._exists(key)

    async def get(self, key: Any) -> Any:
        return (await self._run(self._get_many, [key]))[0]

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self._run(self._put_many, [key], [memory_obj])

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[Any]) -> List[Any]:
        return await self._run(self._get_many, list(keys))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[Any], memory_objs: List[Any]) -> None:
        await self._run(self._put_many, list(keys), list(memory_objs))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[Any]) -> int:
        """Chunks stored, from the first on (one ``PREFIX`` per node)."""
        return self._prefix(list(keys))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[Any], pin: bool = False) -> int:
        return await self._run(self._prefix, list(keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any]) -> List[Any]:
        """The chunks found, from the first on, up to the first miss (the
        ones after it are released)."""
        got = await self._run(self._get_many, list(keys))
        out = []
        for i, obj in enumerate(got):
            if obj is None:
                for later in got[i + 1 :]:
                    if later is not None:
                        later.ref_count_down()
                break
            out.append(obj)
        return out

    async def list(self) -> List[str]:
        """Keys of this model's chunks (``SCAN`` over every node, at most
        ``LIST_MAX_KEYS``)."""
        pattern = f"{_glob_escape(self.model_name)}@*" if self.model_name else "*"

        def scan() -> List[str]:
            try:
                return [k.decode(errors="replace") for k in self.client.scan(pattern, LIST_MAX_KEYS)]
            except Exception as e:
                self.failures("list", e)
                return []

        return await self._run(scan)

    def remove_sync(self, key: Any) -> bool:
        try:
            return self.client.remove(_key(key))
        except Exception as e:
            self.failures("remove", e)
            return False

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        try:
            await self._run(self.client.info, "server")
            return 0
        except Exception as e:
            return int(getattr(e, "mooncake_code", -1))

    async def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"<StrataConnector {self.client.config.seeds}>"


class StrataConnectorAdapter(_AdapterBase):
    """Creates :class:`StrataConnector` for ``plugin://strata[.<instance>]``
    (LMCache's remote storage plugins)."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and url[len("plugin://"):].split(".", 1)[0] == PLUGIN_TYPE

    def create_connector(self, context: Any) -> StrataConnector:
        return StrataConnector(
            url=context.url,
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
            metadata=getattr(context, "metadata", None),
            plugin_name=getattr(context, "plugin_name", None),
        )
