"""``strata.Client``: the Python face of the Rust client (``strata-client``).

Every call releases the GIL while it waits on the network. Single-key calls
raise a :class:`strata.errors.StrataError` subclass on failure; batch calls
return one outcome per key, in order, with a failed key's exception object
in its place (never raised), so one bad key does not hide the others.
Argument errors (wrong types, sizes, pointers) are raised before anything is
sent, as :class:`strata.errors.InvalidArgumentError`.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from . import _native
from .buffers import Registry, resolve, resolve_all, tensor_span
from .config import ClientConfig, ConfigLike
from .errors import InvalidArgumentError, StrataError
from .staging import CudaCopier, Stager, device_span

Key = Union[str, bytes]


class Client:
    """A client of a strata cluster (or of one node).

    ``Client("127.0.0.1:7379")``, ``Client(["a:7379", "b:7379"])``,
    ``Client(ClientConfig(...))`` or ``Client({"seeds": ..., "timeout_ms": ...})``;
    keyword arguments override fields. Thread-safe; use as a context manager
    or call :meth:`close`.
    """

    def __init__(self, config: ConfigLike = None, **overrides: Any) -> None:
        self.config = ClientConfig.coerce(config, **overrides)
        c = self.config
        self._registry = Registry()
        # Made on the first CUDA tensor (it allocates pinned memory).
        self._stager: Optional[Stager] = None
        self._native = _native.NativeClient(
            c.seeds,
            c.data_bind,
            c.retry_attempts,
            c.timeout_ms,
            c.failover,
            c.failover_timeout_ms,
            c.health_check_interval_ms,
            c.threads,
            c.cma,
            c.inline_get_max_bytes,
            c.inline_put_max_bytes,
            c.tcp_congestion,
            c.cma_lanes,
            c.split_get_min_bytes,
            c.spin_us,
            c.stream_spin_us,
            c.echo_spin_us,
            c.data_advertise,
            c.protocol,
            c.rdma_device,
            c.rdma_fallback_tcp,
            c.tls_ca_file,
            c.tls_cert_file,
            c.tls_key_file,
            c.tls_server_name,
        )

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Closes connections and the data plane. Idempotent."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.is_closed()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plain values ------------------------------------------------------

    def put(self, key: Key, value: Any) -> None:
        """Stores ``value`` (bytes or any contiguous buffer) under ``key``.

        Values up to ``inline_max_bytes`` go inline on the command
        connection; larger ones zero-copy (the node pulls them)."""
        if device_span(value) is not None:
            self.put_from(key, value)
            return
        if not _is_tensor(value):
            size = _nbytes_or_raise(value)
            if size <= self.config.inline_max_bytes:
                self._native.set(key, bytes(value))
                return
        self._native.put_from(*self._one(key, value, None))

    def get(self, key: Key) -> Optional[bytes]:
        """The value of ``key``, or ``None`` if it does not exist (an empty
        value is ``b""``, never confused with a missing key)."""
        return self._native.get(key)

    def put_batch(self, keys: Sequence[Key], values: Sequence[Any]) -> List[Optional[StrataError]]:
        """Stores each value; per key ``None`` (stored) or the exception."""
        keys, values = list(keys), list(values)
        if len(keys) != len(values):
            raise InvalidArgumentError(f"{len(keys)} keys for {len(values)} values")
        out: List[Optional[StrataError]] = [None] * len(keys)
        small = [
            i
            for i, v in enumerate(values)
            if device_span(v) is None
            and not _is_tensor(v)
            and _nbytes_or_raise(v) <= self.config.inline_max_bytes
        ]
        small_set = set(small)
        large = [i for i in range(len(keys)) if i not in small_set]
        if small:
            results = self._native.set_batch([keys[i] for i in small], [bytes(values[i]) for i in small])
            for i, r in zip(small, results):
                out[i] = r
        if large:
            results = self.batch_put_from([keys[i] for i in large], [values[i] for i in large])
            for i, r in zip(large, results):
                out[i] = r
        return out

    def get_batch(self, keys: Sequence[Key]) -> List[Union[bytes, None, StrataError]]:
        """Per key its value, ``None`` if missing, or the exception."""
        return self._native.get_batch(list(keys))

    def exists(self, key: Key) -> bool:
        return self._native.exists(key)

    def exists_batch(self, keys: Sequence[Key]) -> List[Union[bool, StrataError]]:
        """Per key whether it exists, or the exception."""
        return self._native.exists_batch(list(keys))

    def prefix(self, keys: Sequence[Key]) -> int:
        """How many keys, from the first, are all present (one ``PREFIX``
        per node)."""
        return self._native.prefix(list(keys))

    def remove(self, key: Key) -> bool:
        """Deletes ``key``; whether it existed."""
        return self._native.remove(key)

    def get_size(self, key: Key) -> Optional[int]:
        """Length of the value of ``key``, ``None`` if it does not exist."""
        return self._native.value_size(key)

    def scan(self, pattern: Key = "*", limit: int = 100_000) -> List[bytes]:
        """Keys matching the Redis glob ``pattern`` on every node (``SCAN``
        per node; a key held by several nodes is listed once), at most
        ``limit``."""
        if isinstance(pattern, str):
            pattern = pattern.encode()
        if limit < 0:
            raise InvalidArgumentError("limit must be >= 0")
        return self._native.scan(pattern, limit)

    def info(self, section: str = "default") -> str:
        return self._native.info(section)

    # -- zero copy -----------------------------------------------------------

    def register_buffer(self, ptr: Any, size: Optional[int] = None) -> None:
        """Declares ``[ptr, ptr + size)`` valid for transfers until
        :meth:`unregister_buffer`, so raw ``int`` pointers into it may be
        passed to the zero-copy calls. A tensor may be passed instead of
        ``ptr``. Buffers and tensors passed directly need no registration."""
        if not isinstance(ptr, int) and hasattr(ptr, "data_ptr"):
            ptr, size = tensor_span(ptr, size)
        if size is None:
            raise InvalidArgumentError("a size is required with a pointer")
        self._registry.add(ptr, size)

    def unregister_buffer(self, ptr: Any) -> bool:
        """Forgets a registration; whether there was one."""
        if not isinstance(ptr, int) and hasattr(ptr, "data_ptr"):
            ptr = int(ptr.data_ptr())
        return self._registry.remove(ptr)

    def put_from(self, key: Key, buffer: Any, size: Optional[int] = None) -> None:
        """Stores ``buffer[:size]`` under ``key``; the node pulls the bytes
        straight from that memory (no copy in this process). A CUDA tensor
        (or ``__cuda_array_interface__`` array) is staged through pinned
        host memory (see :mod:`strata.staging`)."""
        if type(buffer) is int and size is not None:
            # The engines' path (registered memory by address), first and
            # with no helper calls: it runs once per block.
            self._registry.check(buffer, size)
            self._native.put_from(key, buffer, size)
            return
        if device_span(buffer) is not None:
            err = self.batch_put_from([key], [buffer], None if size is None else [size])[0]
            if err is not None:
                raise err
            return
        self._native.put_from(*self._one(key, buffer, size))

    def get_into(self, key: Key, buffer: Any, size: Optional[int] = None) -> int:
        """Reads the value of ``key`` into ``buffer[:size]``; returns its
        length. Raises ``NotFoundError`` if missing and ``TooLargeError`` if
        it does not fit (the destination then holds unspecified bytes).
        CUDA tensors are staged as in :meth:`put_from`."""
        if type(buffer) is int and size is not None:
            self._registry.check(buffer, size)
            return self._native.get_into(key, buffer, size)
        if device_span(buffer) is not None:
            r = self.batch_get_into([key], [buffer], None if size is None else [size])[0]
            if isinstance(r, BaseException):
                raise r
            return r
        return self._native.get_into(*self._one(key, buffer, size))

    def batch_put_from(
        self, keys: Sequence[Key], buffers: Sequence[Any], sizes: Optional[Sequence[int]] = None
    ) -> List[Optional[StrataError]]:
        """Zero-copy put of each ``(key, buffer)`` (MPUT per node): per key
        ``None`` (stored) or the exception. CUDA buffers are staged (the
        device copy of one group overlaps the transfer of the previous)."""
        return self._batch(keys, buffers, sizes, put=True)

    def batch_get_into(
        self, keys: Sequence[Key], buffers: Sequence[Any], sizes: Optional[Sequence[int]] = None
    ) -> List[Union[int, StrataError]]:
        """Zero-copy get of each ``(key, buffer)`` (pipelined GETs per node):
        per key the length read or the exception. CUDA buffers are staged."""
        return self._batch(keys, buffers, sizes, put=False)

    def _batch(self, keys, buffers, sizes, put: bool) -> list:
        native = self._native.batch_put_from if put else self._native.batch_get_into
        keys, buffers = list(keys), list(buffers)
        if len(keys) != len(buffers):
            raise InvalidArgumentError(f"{len(keys)} keys for {len(buffers)} buffers")
        if sizes is not None and len(sizes) != len(buffers):
            raise InvalidArgumentError(f"{len(sizes)} sizes for {len(buffers)} buffers")
        spans = [device_span(b) for b in buffers]
        dev = [i for i, s in enumerate(spans) if s is not None]
        if not dev:
            return native(*resolve_all(self._registry, keys, buffers, sizes))
        for i in dev:
            if sizes is not None:
                if not 0 < sizes[i] <= spans[i][1]:
                    raise InvalidArgumentError(
                        f"size {sizes[i]} is outside the CUDA buffer's {spans[i][1]} bytes")
                spans[i] = (spans[i][0], sizes[i])
            if spans[i][1] <= 0:
                raise InvalidArgumentError("a CUDA buffer must hold at least one byte")
        host = [i for i in range(len(keys)) if spans[i] is None]
        out: list = [None] * len(keys)
        if host:
            res = native(*resolve_all(
                self._registry, [keys[i] for i in host], [buffers[i] for i in host],
                None if sizes is None else [sizes[i] for i in host]))
            for i, r in zip(host, res):
                out[i] = r
        stager = self._staging()

        def over_host(ks, ptrs, ns):
            return native(*resolve_all(self._registry, ks, ptrs, ns))

        move = stager.put if put else stager.get
        res = move([keys[i] for i in dev], [spans[i] for i in dev], over_host)
        for i, r in zip(dev, res):
            out[i] = r
        return out

    def _staging(self) -> Stager:
        if self._stager is None:
            self._stager = Stager(CudaCopier(), self._registry, self.config.gpu_staging_bytes // 2)
        return self._stager

    # -- cluster -------------------------------------------------------------

    def owner_of(self, key: Key) -> Optional[str]:
        """RESP address of the node owning ``key`` in the current slot map."""
        return self._native.owner_of(key)

    def cluster_nodes(self) -> List[str]:
        return self._native.cluster_nodes()

    @property
    def data_endpoint(self) -> str:
        return self._native.data_endpoint()

    def cma_stats(self) -> dict:
        """This client's own cross-memory-attach reads (zero-copy GETs from
        nodes on this host): ``reads``, ``bytes``, ``errors``, and
        ``lane_pieces``, the pieces of long reads that helper threads copied
        (``cma_lanes``), and ``misaligned``, reads of 64 KiB or more into
        memory not aligned like the node's arena modulo 64 bytes (copied at
        half speed or less: align the buffers). Nodes count only the PUT
        payloads they read."""
        reads, nbytes, errors, lane_pieces, misaligned = self._native.cma_stats()
        return {"reads": reads, "bytes": nbytes, "errors": errors, "lane_pieces": lane_pieces,
                "misaligned": misaligned}

    def _one(self, key: Key, target: Any, size: Optional[int]) -> tuple:
        target, size = resolve(self._registry, target, size)
        return key, target, size


def _is_tensor(value: Any) -> bool:
    return not isinstance(value, (bytes, bytearray, memoryview)) and hasattr(value, "data_ptr")


def _nbytes_or_raise(value: Any) -> int:
    try:
        return memoryview(value).nbytes
    except TypeError:
        raise InvalidArgumentError(
            f"a value must be bytes or a contiguous buffer, not {type(value).__name__}"
        ) from None
