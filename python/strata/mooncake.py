"""A ``MooncakeDistributedStore``-compatible store over :class:`strata.Client`.

Two faces share this one implementation:

* ``strata.mooncake.MooncakeDistributedStore``: Mooncake's method names,
  arguments and status codes, with a missing key returned as ``None``
  (Mooncake's ``b""`` looks like an empty value);
* ``mooncake.store.MooncakeDistributedStore`` from the separately installed
  ``python/mooncake-compat`` package (it replaces the ``mooncake`` package
  in its environment): Mooncake 0.3.13's conventions exactly, ``b""`` for a
  miss included, so engines that hard-code ``from mooncake.store import
  MooncakeDistributedStore`` (SGLang's Mooncake HiCache backend, vLLM's
  ``MooncakeStoreConnector``, LMCache's Mooncake connector) run on strata
  unchanged.

Where the cluster is (``setup``): ``STRATA_SEEDS`` if set; else an
``etcd://host:port[,...]`` ``metadata_server`` is asked for the strata nodes
registered under ``/strata/<cluster>/nodes/`` (``STRATA_CLUSTER_NAME``,
default ``default``); else ``master_server_addr`` is taken as a strata node
(there is no master in strata; this is said once in the log). Segment
sizes, protocol and devices are the server's business and are accepted and
ignored. The differences that remain are listed in python/README.md.
"""

from __future__ import annotations

import base64
import ctypes
import json
import logging
import mmap
import os
import re
import socket
import threading
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

from .adapters._options import client_options
from .client import Client
from .errors import InvalidArgumentError, NotFoundError, StrataError, TooLargeError, mooncake_code

logger = logging.getLogger(__name__)

OK = 0
OBJECT_NOT_FOUND = NotFoundError.mooncake_code
INVALID_PARAMS = InvalidArgumentError.mooncake_code
# Upper bound on the keys remove_all / remove_by_regex walk (SCAN on every node).
SCAN_MAX_KEYS = 10_000_000
ETCD_TIMEOUT_S = 5.0


def _code(e: BaseException, read: bool = False) -> int:
    """Mooncake's status for ``e``; a read whose value does not fit the
    destination is ``-600`` (INVALID_PARAMS) there."""
    if read and isinstance(e, TooLargeError):
        return INVALID_PARAMS
    return mooncake_code(e)


class ReplicateConfig:
    """Mooncake's replication options. Accepted and ignored: the cluster's
    ``replica_num`` applies to every write."""

    def __init__(self) -> None:
        self.replica_num = 1
        self.with_soft_pin = False
        self.preferred_segment = ""
        self.preferred_segments: List[str] = []
        self.prefer_alloc_in_same_node = False

    def __repr__(self) -> str:
        return f"ReplicateConfig(replica_num={self.replica_num})"


class MooncakeHostMemAllocator:
    """Page-aligned host memory for an engine's KV pool (SGLang's
    ``MooncakeHostTensorAllocator`` uses it): anonymous mappings, freed by
    ``free`` or when the allocator goes away."""

    def __init__(self) -> None:
        self._maps: Dict[int, mmap.mmap] = {}

    def alloc(self, size: int) -> int:
        if size <= 0:
            return 0
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError, OverflowError):
            return 0
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self._maps[ptr] = m
        return ptr

    def free(self, ptr: int) -> int:
        m = self._maps.pop(ptr, None)
        if m is None:
            return INVALID_PARAMS
        try:
            m.close()
        except BufferError:  # still viewed by a tensor: freed with it
            self._maps[ptr] = m
            return INVALID_PARAMS
        return OK


class ReplicaDescriptor:
    """One copy of a value, as ``batch_get_replica_desc`` lists them:
    ``endpoint`` (the node's RESP address) and ``status``. Mooncake's tier
    predicates answer ``False``: the node decides the tier and may move a
    value between DRAM and NVMe at any time, so engines log "unknown"."""

    def __init__(self, endpoint: str, status: str = "COMPLETE") -> None:
        self.endpoint = endpoint
        self.status = status

    def is_memory_replica(self) -> bool:
        return False

    def is_disk_replica(self) -> bool:
        return False

    def is_local_disk_replica(self) -> bool:
        return False

    def __getitem__(self, name: str) -> str:
        return getattr(self, name)

    def __repr__(self) -> str:
        return f"ReplicaDescriptor({self.endpoint!r}, {self.status!r})"


class BufferHandle(bytearray):
    """What ``get_buffer`` returns: the value's bytes (a buffer), with
    Mooncake's ``ptr()`` and ``size()``."""

    def ptr(self) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(self)) if len(self) else 0

    def size(self) -> int:
        return len(self)


def _etcd_nodes(metadata_server: str, cluster: str) -> List[str]:
    """RESP addresses of the strata nodes registered in etcd (the v3 JSON
    gateway: no etcd client library needed)."""
    prefix = f"/strata/{cluster}/nodes/".encode()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = json.dumps({"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode()})
    last: Optional[Exception] = None
    for endpoint in metadata_server[len("etcd://"):].split(","):
        try:
            req = urllib.request.Request(f"http://{endpoint}/v3/kv/range", body.encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=ETCD_TIMEOUT_S) as r:
                kvs = json.load(r).get("kvs", [])
            return [json.loads(base64.b64decode(kv["value"]))["resp_addr"] for kv in kvs]
        except (OSError, ValueError, KeyError) as e:
            last = e
    raise ConnectionError(f"etcd {metadata_server}: {last}")


def resolve_seeds(metadata_server: str, master_server_addr: str) -> str:
    """See the module doc: ``STRATA_SEEDS``, etcd, then the master address."""
    seeds = os.environ.get("STRATA_SEEDS")
    if seeds:
        return seeds
    if metadata_server.startswith("etcd://"):
        cluster = os.environ.get("STRATA_CLUSTER_NAME", "default")
        nodes = _etcd_nodes(metadata_server, cluster)
        if not nodes:
            raise ConnectionError(f"no strata node of cluster {cluster!r} is registered in {metadata_server}")
        return ",".join(nodes)
    logger.info(
        "strata has no master: using master_server_addr %s as a strata node address "
        "(set STRATA_SEEDS or an etcd:// metadata_server to name the cluster instead)",
        master_server_addr,
    )
    return master_server_addr


def _data_plane(cfg: Dict[str, Any], local_hostname: str) -> Dict[str, Any]:
    """The client's data-plane options: ``strata_data_bind`` /
    ``strata_data_advertise`` when set, else an address ``local_hostname``
    names (Mooncake's address of this engine host, often ``host:port``).
    A loopback or empty one (Mooncake configs for one machine say
    ``localhost``) leaves the client's default, the route to the seeds,
    which is loopback exactly when the nodes are."""
    options = client_options(cfg)
    if "data_bind" not in options and local_hostname:
        name = local_hostname.rsplit(":", 1)[0] if local_hostname.count(":") == 1 else local_hostname
        ip = socket.gethostbyname(name)
        if not ip.startswith("127."):
            options["data_bind"] = f"{ip}:0"
    return options


def _config_file() -> Dict[str, Any]:
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if not path:
        raise InvalidArgumentError("setup() without arguments needs MOONCAKE_CONFIG_PATH")
    with open(path) as f:
        return json.load(f)


class MooncakeDistributedStore:
    """Mooncake's store API on a strata cluster."""

    # A missing key's value from get/get_batch: ``None`` here, ``b""`` in
    # the mooncake.store drop-in (Mooncake's own convention).
    MISSING: Optional[bytes] = None

    def __init__(self) -> None:
        self._client: Optional[Client] = None
        self._hostname = ""
        self._pool: Optional[MooncakeHostMemAllocator] = None
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr,
        engine=None, **options)`` (as vLLM and SGLang call it), ``setup(dict)``
        with Mooncake's config keys, or ``setup()`` reading the JSON file
        named by ``MOONCAKE_CONFIG_PATH``."""
        try:
            cfg = self._setup_args(args, kwargs)
            seeds = cfg.get("strata_seeds") or resolve_seeds(
                str(cfg.get("metadata_server") or "P2PHANDSHAKE"),
                str(cfg.get("master_server_address") or cfg.get("master_server_addr") or "127.0.0.1:7379"),
            )
            host = str(cfg.get("local_hostname") or "")
            self._hostname = host or "127.0.0.1"
            self._client = Client(seeds, **_data_plane(cfg, host))
            return OK
        except StrataError as e:
            return _code(e)
        except (OSError, ValueError, TypeError) as e:
            logger.warning("strata Mooncake setup failed: %s", e)
            return INVALID_PARAMS

    @staticmethod
    def _setup_args(args: tuple, kwargs: dict) -> Dict[str, Any]:
        if len(args) == 1 and isinstance(args[0], dict):
            return dict(args[0])
        if not args and not kwargs:
            return _config_file()
        names = ["local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
                 "protocol", "rdma_devices", "master_server_address", "engine"]
        cfg = dict(zip(names, args))
        if "master_server_addr" in kwargs:
            kwargs["master_server_address"] = kwargs.pop("master_server_addr")
        cfg.update(kwargs)
        return cfg

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's dummy client talks to a local real client; here
        ``server_address`` (or ``STRATA_SEEDS``) names the strata nodes."""
        return self.setup("127.0.0.1", "P2PHANDSHAKE", mem_pool_size, local_buffer_size, "tcp", "", server_address)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 0) -> int:
        """Kept for signature compatibility; ``setup`` does the work."""
        return OK if self._client is not None else INVALID_PARAMS

    def health_check(self) -> int:
        """``0`` when a node answers."""
        return self._status(lambda c: c.info("server"))

    def get_hostname(self) -> str:
        return self._hostname

    def close(self) -> int:
        if self._client is not None:
            self._client.close()
            self._client = None
        return OK

    # -- plain values ------------------------------------------------------

    def put(self, key: str, value: Any, config: Any = None) -> int:
        """Stores ``value`` (replacing an existing one: Mooncake's ``upsert``)."""
        return self._status(lambda c: c.put(key, value))

    upsert = put

    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        """Stores the concatenation of ``parts``."""
        try:
            value = b"".join(bytes(memoryview(p)) for p in parts)
        except TypeError:
            return INVALID_PARAMS
        return self.put(key, value)

    upsert_parts = put_parts

    def get(self, key: str) -> Optional[bytes]:
        """The value; a miss (or any failure: Mooncake gives no code here)
        is ``MISSING``."""
        try:
            value = self._c().get(key)
        except StrataError:
            return self.MISSING
        return self.MISSING if value is None else value

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: Any = None) -> int:
        """``0`` if every put succeeded, else the first failure's code."""
        try:
            results = self._c().put_batch(keys, values)
        except StrataError as e:
            return _code(e)
        return next((_code(r) for r in results if r is not None), OK)

    upsert_batch = put_batch

    def get_batch(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        """Per key its value, or ``MISSING``."""
        try:
            results = self._c().get_batch(keys)
        except StrataError:
            return [self.MISSING] * len(keys)
        return [self.MISSING if r is None or isinstance(r, StrataError) else r for r in results]

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The value as a buffer with ``ptr()``/``size()``, ``None`` if missing."""
        value = self._c_or_none(lambda c: c.get(key))
        return None if value is None else BufferHandle(value)

    def batch_get_buffer(self, keys: Sequence[str]) -> List[Optional[BufferHandle]]:
        try:
            results = self._c().get_batch(keys)
        except StrataError:
            return [None] * len(keys)
        return [BufferHandle(r) if isinstance(r, (bytes, bytearray)) else None for r in results]

    def is_exist(self, key: str) -> int:
        """``1`` present, ``0`` absent, negative on error."""
        try:
            return 1 if self._c().exists(key) else 0
        except StrataError as e:
            return _code(e)

    def batch_is_exist(self, keys: Sequence[str]) -> List[int]:
        try:
            found = self._c().exists_batch(keys)
        except StrataError as e:
            return [_code(e)] * len(keys)
        return [_code(f) if isinstance(f, StrataError) else int(f) for f in found]

    def get_size(self, key: str) -> int:
        """Value length, ``-704`` if missing."""
        try:
            size = self._c().get_size(key)
        except StrataError as e:
            return _code(e)
        return OBJECT_NOT_FOUND if size is None else size

    # -- removal -------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> int:
        """``0`` removed, ``-704`` missing. strata's read leases pin the
        value being read, not the key, so a remove never waits and ``force``
        changes nothing."""
        try:
            return OK if self._c().remove(key) else OBJECT_NOT_FOUND
        except StrataError as e:
            return _code(e)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[int]:
        return [self.remove(k, force) for k in keys]

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        """Removes every key ``re.search(pattern)`` matches (a ``SCAN`` of
        every node); the number removed, or a negative code."""
        try:
            rx = re.compile(pattern)
        except (re.error, TypeError):
            return INVALID_PARAMS
        return self._remove_matching(lambda k: rx.search(k) is not None)

    def remove_all(self, force: bool = False) -> int:
        """Removes every key of the cluster; the number removed."""
        return self._remove_matching(lambda k: True)

    def _remove_matching(self, want) -> int:
        try:
            keys = [k.decode(errors="surrogateescape") for k in self._c().scan("*", SCAN_MAX_KEYS)]
            return sum(1 for k in keys if want(k) and self._c().remove(k))
        except StrataError as e:
            return _code(e)

    # -- zero copy -----------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        return self._status(lambda c: c.register_buffer(buffer_ptr, size))

    def unregister_buffer(self, buffer_ptr: int) -> int:
        try:
            return OK if self._c().unregister_buffer(buffer_ptr) else INVALID_PARAMS
        except StrataError as e:
            return _code(e)

    def alloc_from_mem_pool(self, size: int) -> int:
        """A registered host buffer of ``size`` bytes for zero-copy calls
        (``0`` on failure); it lives until ``close``."""
        with self._lock:
            if self._pool is None:
                self._pool = MooncakeHostMemAllocator()
            ptr = self._pool.alloc(size)
        if ptr and self.register_buffer(ptr, size) != OK:
            self._pool.free(ptr)
            return 0
        return ptr

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._status(lambda c: c.put_from(key, buffer_ptr, size))

    # strata's put_from always overwrites: Mooncake's upsert_from.
    upsert_from = put_from

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or a negative code (``-704`` missing, ``-600`` the
        value does not fit ``size``)."""
        try:
            return self._c().get_into(key, buffer_ptr, size)
        except StrataError as e:
            return _code(e, read=True)

    def batch_put_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Any = None
    ) -> List[int]:
        """Per key ``0`` or a negative code."""
        try:
            results = self._c().batch_put_from(keys, buffer_ptrs, sizes)
        except StrataError as e:
            return [_code(e)] * len(keys)
        return [OK if r is None else _code(r) for r in results]

    batch_upsert_from = batch_put_from

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> List[int]:
        """Per key the bytes read or a negative code."""
        try:
            results = self._c().batch_get_into(keys, buffer_ptrs, sizes)
        except StrataError as e:
            return [_code(e, read=True)] * len(keys)
        return [_code(r, read=True) if isinstance(r, StrataError) else r for r in results]

    def batch_put_from_multi_buffers(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], config: Any = None,
    ) -> List[int]:
        """Each key's value is the concatenation of its buffers. strata
        moves one contiguous range per value, so the parts are gathered
        into a staging buffer first (one copy)."""
        try:
            if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
                raise ValueError("keys, buffers and sizes differ in length")
            staged = [self._gather(p, s) for p, s in zip(all_buffer_ptrs, all_sizes)]
        except (StrataError, ValueError) as e:
            return [_code(e) if isinstance(e, StrataError) else INVALID_PARAMS] * len(keys)
        try:
            results = self._c().batch_put_from(list(keys), staged)
        except StrataError as e:
            return [_code(e)] * len(keys)
        return [OK if r is None else _code(r) for r in results]

    batch_upsert_from_multi_buffers = batch_put_from_multi_buffers

    def batch_get_into_multi_buffers(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]], all_sizes: Sequence[Sequence[int]],
    ) -> List[int]:
        """Reads each value and scatters it over its buffers in order;
        per key the bytes read or a negative code."""
        try:
            if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
                raise ValueError("keys, buffers and sizes differ in length")
            for p, s in zip(all_buffer_ptrs, all_sizes):
                self._check_parts(p, s)
            staged = [bytearray(sum(s)) for s in all_sizes]
            results = self._c().batch_get_into(list(keys), staged)
        except StrataError as e:
            return [_code(e, read=True)] * len(keys)
        except ValueError:
            return [INVALID_PARAMS] * len(keys)
        out = []
        for buf, ptrs, sizes, r in zip(staged, all_buffer_ptrs, all_sizes, results):
            if isinstance(r, StrataError):
                out.append(_code(r, read=True))
                continue
            self._scatter(buf, r, ptrs, sizes)
            out.append(r)
        return out

    def batch_get_replica_desc(self, keys: Sequence[str]) -> Dict[str, List[ReplicaDescriptor]]:
        """Per key present, a :class:`ReplicaDescriptor` for the node that
        owns it in the current slot map; absent keys are left out."""
        c = self._c()
        present = self.batch_is_exist(keys)
        out: Dict[str, List[ReplicaDescriptor]] = {}
        for k, p in zip(keys, present):
            if p == 1:
                owner = c.owner_of(k)
                out[k] = [ReplicaDescriptor(owner)] if owner else []
        return out

    # -- helpers ---------------------------------------------------------------

    def _check_parts(self, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        if len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} buffers for {len(sizes)} sizes")
        registry = self._c()._registry
        for p, s in zip(ptrs, sizes):
            registry.check(p, s)

    def _gather(self, ptrs: Sequence[int], sizes: Sequence[int]) -> bytearray:
        self._check_parts(ptrs, sizes)
        buf = bytearray(sum(sizes))
        at = 0
        base = ctypes.addressof(ctypes.c_char.from_buffer(buf)) if buf else 0
        for p, s in zip(ptrs, sizes):
            ctypes.memmove(base + at, p, s)
            at += s
        return buf

    @staticmethod
    def _scatter(buf: bytearray, length: int, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        base = ctypes.addressof(ctypes.c_char.from_buffer(buf)) if buf else 0
        at = 0
        for p, s in zip(ptrs, sizes):
            n = max(0, min(s, length - at))
            if n:
                ctypes.memmove(p, base + at, n)
            at += s

    def _c(self) -> Client:
        if self._client is None:
            raise InvalidArgumentError("setup() has not succeeded")
        return self._client

    def _c_or_none(self, op) -> Any:
        try:
            return op(self._c())
        except StrataError:
            return None

    def _status(self, op) -> int:
        try:
            op(self._c())
            return OK
        except StrataError as e:
            return _code(e)
