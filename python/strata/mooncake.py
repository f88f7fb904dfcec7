"""A ``MooncakeDistributedStore``-compatible facade over :class:`strata.Client`.

An integration written for Mooncake Store switches with one import::

    from strata.mooncake import MooncakeDistributedStore   # was: from mooncake.store import ...

Methods keep Mooncake's names, arguments and return conventions: status
integers (``0`` success, negative Mooncake ``ErrorCode`` values on failure,
see ``strata.errors``) instead of exceptions. The differences that remain
are listed in python/README.md ("Mooncake facade"); the main ones:

* a missing key is ``None`` from ``get`` (Mooncake: ``b""``, which looks
  like an empty value) and ``None`` entries in ``get_batch``;
* ``put`` overwrites an existing key (Mooncake's ``put`` keeps the old value
  silently; its ``upsert`` is what strata's ``put`` does);
* ``setup``'s ``master_server_addr`` names strata nodes (``host:port``, comma
  separated); segment sizes, protocol and device are the server's business
  and are ignored here.
"""

from __future__ import annotations

import socket
from typing import Any, List, Optional, Sequence

from .client import Client
from .errors import InvalidArgumentError, NotFoundError, StrataError, mooncake_code

OK = 0
OBJECT_NOT_FOUND = NotFoundError.mooncake_code
INVALID_PARAMS = InvalidArgumentError.mooncake_code


class MooncakeDistributedStore:
    """Mooncake's store API on a strata cluster."""

    def __init__(self) -> None:
        self._client: Optional[Client] = None

    def setup(
        self,
        local_hostname: str = "127.0.0.1",
        metadata_server: str = "P2PHANDSHAKE",
        global_segment_size: int = 0,
        local_buffer_size: int = 0,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = "127.0.0.1:7379",
        *_engine: Any,
        **_options: Any,
    ) -> int:
        """Connects to the strata node(s) in ``master_server_addr``; this
        client's data plane binds ``local_hostname`` (any port)."""
        try:
            host = local_hostname.rsplit(":", 1)[0] if local_hostname.count(":") == 1 else local_hostname
            ip = socket.gethostbyname(host or "127.0.0.1")
            self._client = Client(master_server_addr, data_bind=f"{ip}:0")
            return OK
        except StrataError as e:
            return mooncake_code(e)
        except OSError:
            return INVALID_PARAMS

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 0) -> int:
        """Kept for signature compatibility; ``setup`` does the work."""
        return OK if self._client is not None else INVALID_PARAMS

    def close(self) -> int:
        if self._client is not None:
            self._client.close()
            self._client = None
        return OK

    # -- plain values ------------------------------------------------------

    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self._status(lambda c: c.put(key, value))

    upsert = put

    def get(self, key: str) -> Optional[bytes]:
        """The value, or ``None`` if missing (never ``b""`` for a miss);
        ``None`` too on any other failure, as Mooncake returns no code here."""
        try:
            return self._c().get(key)
        except StrataError:
            return None

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: Any = None) -> int:
        """``0`` if every put succeeded, else the first failure's code."""
        try:
            results = self._c().put_batch(keys, values)
        except StrataError as e:
            return mooncake_code(e)
        return next((mooncake_code(r) for r in results if r is not None), OK)

    def get_batch(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        """Per key its value, or ``None`` (missing or failed)."""
        try:
            results = self._c().get_batch(keys)
        except StrataError:
            return [None] * len(keys)
        return [None if isinstance(r, StrataError) else r for r in results]

    def is_exist(self, key: str) -> int:
        """``1`` present, ``0`` absent, negative on error."""
        try:
            return 1 if self._c().exists(key) else 0
        except StrataError as e:
            return mooncake_code(e)

    def batch_is_exist(self, keys: Sequence[str]) -> List[int]:
        try:
            found = self._c().exists_batch(keys)
        except StrataError as e:
            return [mooncake_code(e)] * len(keys)
        return [mooncake_code(f) if isinstance(f, StrataError) else int(f) for f in found]

    def remove(self, key: str, force: bool = False) -> int:
        """``0`` removed, ``-704`` missing. strata has no read leases that
        block a remove, so ``force`` changes nothing."""
        try:
            return OK if self._c().remove(key) else OBJECT_NOT_FOUND
        except StrataError as e:
            return mooncake_code(e)

    def get_size(self, key: str) -> int:
        """Value length, ``-704`` if missing."""
        try:
            size = self._c().get_size(key)
        except StrataError as e:
            return mooncake_code(e)
        return OBJECT_NOT_FOUND if size is None else size

    # -- zero copy -----------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        return self._status(lambda c: c.register_buffer(buffer_ptr, size))

    def unregister_buffer(self, buffer_ptr: int) -> int:
        try:
            return OK if self._c().unregister_buffer(buffer_ptr) else INVALID_PARAMS
        except StrataError as e:
            return mooncake_code(e)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._status(lambda c: c.put_from(key, buffer_ptr, size))

    # strata's put_from always overwrites: Mooncake's upsert_from.
    upsert_from = put_from

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or a negative code (``-704`` missing, ``-10`` the value
        does not fit ``size``)."""
        try:
            return self._c().get_into(key, buffer_ptr, size)
        except StrataError as e:
            return mooncake_code(e)

    def batch_put_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int], config: Any = None
    ) -> List[int]:
        """Per key ``0`` or a negative code."""
        try:
            results = self._c().batch_put_from(keys, buffer_ptrs, sizes)
        except StrataError as e:
            return [mooncake_code(e)] * len(keys)
        return [OK if r is None else mooncake_code(r) for r in results]

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> List[int]:
        """Per key the bytes read or a negative code."""
        try:
            results = self._c().batch_get_into(keys, buffer_ptrs, sizes)
        except StrataError as e:
            return [mooncake_code(e)] * len(keys)
        return [mooncake_code(r) if isinstance(r, StrataError) else r for r in results]

    # -- helpers ---------------------------------------------------------------

    def _c(self) -> Client:
        if self._client is None:
            raise InvalidArgumentError("setup() has not succeeded")
        return self._client

    def _status(self, op) -> int:
        try:
            op(self._c())
            return OK
        except StrataError as e:
            return mooncake_code(e)
