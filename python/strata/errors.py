"""Exceptions raised by strata, one class per stable error code.

Every class derives from :class:`StrataError` and carries ``code``: the
same code word the Rust client (``strata_client::Error``) and the server's
error replies use (``NOTFOUND``, ``TOOLARGE``, ...). ``mooncake_code`` is
the negative status the Mooncake-compatible facade returns for it
(Mooncake's ``ErrorCode`` where a counterpart exists).
"""

from __future__ import annotations


class StrataError(Exception):
    """Base of every strata error."""

    code = "ERR"
    mooncake_code = -1  # INTERNAL_ERROR


class NotFoundError(StrataError, KeyError):
    """The key does not exist."""

    code = "NOTFOUND"
    mooncake_code = -704  # OBJECT_NOT_FOUND

    # KeyError quotes its message; keep the plain one.
    __str__ = Exception.__str__


class TooLargeError(StrataError):
    """A value over the node's limit, or larger than the destination."""

    code = "TOOLARGE"
    mooncake_code = -10  # BUFFER_OVERFLOW


class StaleError(StrataError):
    """A descriptor or lease named a value that changed since."""

    code = "STALE"
    mooncake_code = -800  # TRANSFER_FAIL


class BadDescriptorError(StrataError):
    """A descriptor was malformed or named memory the peer may not read."""

    code = "BADDESC"
    mooncake_code = -800  # TRANSFER_FAIL


class NoSpaceError(StrataError):
    """The node has no room for the value."""

    code = "NOSPACE"
    mooncake_code = -200  # NO_AVAILABLE_HANDLE


class BusyError(StrataError):
    """The node is overloaded (after the client's own bounded retries)."""

    code = "BUSY"
    mooncake_code = -1010  # UNAVAILABLE_IN_CURRENT_STATUS


class MovedError(StrataError):
    """The slot moved more times in a row than the client follows."""

    code = "MOVED"


class IoError(StrataError, OSError):
    """A socket failure or timeout on the command connection or data plane."""

    code = "IO"
    mooncake_code = -900  # RPC_FAIL


class ProtocolError(StrataError):
    """A reply that does not fit the protocol."""

    code = "PROTOCOL"


class ServerError(StrataError):
    """Any other error reply; ``code`` is its code word (e.g. ``ERR``)."""

    code = "ERR"


class InvalidArgumentError(StrataError, ValueError, TypeError):
    """The call itself was wrong: a bad key type, pointer, size or buffer.

    Raised before anything is sent. Also a ``ValueError`` and a
    ``TypeError``, so generic handlers catch it too.
    """

    code = "INVALID"
    mooncake_code = -600  # INVALID_PARAMS


BY_CODE = {
    cls.code: cls
    for cls in (
        NotFoundError,
        TooLargeError,
        StaleError,
        BadDescriptorError,
        NoSpaceError,
        BusyError,
        MovedError,
        IoError,
        ProtocolError,
        InvalidArgumentError,
    )
}


def mooncake_code(error: BaseException) -> int:
    """The Mooncake-style negative status for ``error``."""
    return getattr(error, "mooncake_code", -1)
