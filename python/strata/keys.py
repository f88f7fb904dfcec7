"""Deterministic keys for KV-cache chunks: the same tokens give the same
keys in every process, on every machine, in every release.

Algorithm (see python/README.md, "Key helper"):

1. Split ``token_ids`` into chunks of ``chunk_size`` tokens; a trailing
   partial chunk is dropped unless ``include_partial=True``.
2. ``h[0] = SHA-256(tokens of chunk 0)``,
   ``h[i] = SHA-256(h[i-1] || tokens of chunk i)``: each token is 4 bytes,
   unsigned little-endian; ``h[i-1]`` is the 32-byte digest (not hex).
   So a chunk's hash commits to every token before it: equal hashes mean
   equal prefixes. This is the same chain SGLang's HiCache uses for page
   hashes (``get_hash_str``), so keys agree with SGLang's own hashing.
3. Key ``i`` is ``"{namespace}:{model}:{rank}:{hex(h[i])}"`` where ``rank`` is
   ``"{tp_rank}of{tp_size}"``, or ``"all"`` when ``tp_rank`` is ``None``
   (MLA models, whose KV is the same on every rank). ``%`` and ``:`` in
   ``model`` and ``namespace`` are percent-encoded so fields never run
   together.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Iterable, List, Optional

from .errors import InvalidArgumentError

DIGEST_BYTES = 32


def _as_list(token_ids: Any) -> List[int]:
    if hasattr(token_ids, "tolist"):  # numpy array, torch tensor
        token_ids = token_ids.tolist()
    return list(token_ids)


def _token_bytes(chunk: List[int]) -> bytes:
    try:
        return struct.pack(f"<{len(chunk)}I", *chunk)
    except struct.error:
        bad = next((t for t in chunk if not isinstance(t, int) or not 0 <= t < 1 << 32), None)
        raise InvalidArgumentError(f"token id {bad!r} is not an int in [0, 2**32)") from None


def chunk_hashes(
    token_ids: Iterable[int],
    chunk_size: int,
    *,
    include_partial: bool = False,
    prior_hash: Optional[bytes] = None,
) -> List[bytes]:
    """The chained SHA-256 digest of each chunk (32 bytes each).

    ``prior_hash`` continues a chain (the digest of the chunk before
    ``token_ids[0]``)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise InvalidArgumentError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if prior_hash is not None and len(prior_hash) != DIGEST_BYTES:
        raise InvalidArgumentError("prior_hash must be a 32-byte SHA-256 digest")
    tokens = _as_list(token_ids)
    end = len(tokens) if include_partial else len(tokens) - len(tokens) % chunk_size
    out: List[bytes] = []
    prior = prior_hash
    for start in range(0, end, chunk_size):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        h.update(_token_bytes(tokens[start : start + chunk_size]))
        prior = h.digest()
        out.append(prior)
    return out


def _field(text: str) -> str:
    return str(text).replace("%", "%25").replace(":", "%3A")


def chunk_keys(
    token_ids: Iterable[int],
    chunk_size: int,
    *,
    model: str,
    tp_rank: Optional[int] = 0,
    tp_size: int = 1,
    namespace: str = "strata",
    include_partial: bool = False,
) -> List[str]:
    """One key per chunk (see the module doc for the exact format)."""
    if tp_rank is None:
        rank = "all"
    else:
        if not (0 <= tp_rank < tp_size):
            raise InvalidArgumentError(f"tp_rank {tp_rank} outside [0, {tp_size})")
        rank = f"{tp_rank}of{tp_size}"
    head = f"{_field(namespace)}:{_field(model)}:{rank}:"
    hashes = chunk_hashes(token_ids, chunk_size, include_partial=include_partial)
    return [head + h.hex() for h in hashes]
