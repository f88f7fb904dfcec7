"""The key helper: the documented algorithm, computed independently here."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import strata
from strata.keys import chunk_hashes, chunk_keys


def reference(tokens, chunk):
    out, prior = [], b""
    for i in range(0, len(tokens) - len(tokens) % chunk, chunk):
        data = b"".join(t.to_bytes(4, "little") for t in tokens[i : i + chunk])
        prior = hashlib.sha256(prior + data).digest()
        out.append(prior)
    return out


def test_chain_matches_the_documented_algorithm():
    tokens = list(range(1000, 1000 + 70))
    assert chunk_hashes(tokens, 16) == reference(tokens, 16)
    assert len(chunk_hashes(tokens, 16)) == 4
    assert len(chunk_hashes(tokens, 16, include_partial=True)) == 5


def test_pinned_vector():
    # Pinned: changing this breaks every stored cache.
    keys = chunk_keys([1, 2, 3, 4], 2, model="m", tp_rank=0, tp_size=2)
    assert keys[0] == "strata:m:0of2:34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f"
    second = hashlib.sha256(bytes.fromhex(keys[0][-64:]) + bytes([3, 0, 0, 0, 4, 0, 0, 0]))
    assert keys[1] == "strata:m:0of2:" + second.hexdigest()


def test_prefix_sharing_and_namespacing():
    a = chunk_keys(list(range(64)), 16, model="org/llama")
    b = chunk_keys(list(range(48)) + [7] * 16, 16, model="org/llama")
    assert a[:3] == b[:3] and a[3] != b[3]
    assert chunk_keys(range(16), 16, model="x", tp_rank=1, tp_size=2) != chunk_keys(range(16), 16, model="x")
    assert chunk_keys(range(16), 16, model="x")[0] != chunk_keys(range(16), 16, model="y")[0]
    assert ":all:" in chunk_keys(range(16), 16, model="x", tp_rank=None)[0]
    assert chunk_keys(range(16), 16, model="a:b")[0].startswith("strata:a%3Ab:")
    assert chunk_keys(np.arange(32), 16, model="x") == chunk_keys(list(range(32)), 16, model="x")


def test_same_keys_in_another_process():
    code = "import strata; print(strata.chunk_keys(range(100), 10, model='m')[-1])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == chunk_keys(range(100), 10, model="m")[-1]


@pytest.mark.parametrize("tokens, chunk", [([-1], 1), ([1 << 32], 1), (["a"], 1), ([1], 0)])
def test_bad_tokens_and_sizes(tokens, chunk):
    with pytest.raises(strata.InvalidArgumentError):
        chunk_hashes(tokens, chunk)
