"""strata: Python SDK for the strata KV-cache store.

``strata.Client`` wraps the Rust client (``strata-client``) through a PyO3
extension: the protocol, routing, retries and the zero-copy data plane are
all the Rust client's. See python/README.md.
"""

from . import errors
from .client import Client
from .config import ClientConfig
from .errors import (
    BadDescriptorError,
    BusyError,
    InvalidArgumentError,
    IoError,
    MovedError,
    NoSpaceError,
    NotFoundError,
    ProtocolError,
    ServerError,
    StaleError,
    StrataError,
    TooLargeError,
)
from .keys import chunk_keys, chunk_hashes

__all__ = [
    "Client",
    "ClientConfig",
    "errors",
    "chunk_keys",
    "chunk_hashes",
    "StrataError",
    "NotFoundError",
    "TooLargeError",
    "StaleError",
    "BadDescriptorError",
    "NoSpaceError",
    "BusyError",
    "MovedError",
    "IoError",
    "ProtocolError",
    "ServerError",
    "InvalidArgumentError",
]
