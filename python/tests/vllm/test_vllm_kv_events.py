"""A node's KV events read by vLLM 0.33.0's own decoder
(``vllm.distributed.kv_events``: msgspec's decoder of ``KVEventBatch``),
after strata's vLLM connector stored a prompt's blocks through vLLM's
scheduler and worker (vllm_driver.py); and the example router
(python/examples/kv_router.py) picking the node with the longest cached
prefix from two nodes' events."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm_tests_helpers", reason="runs in the vllm venv (scripts/engine-venv.sh vllm)")

import msgspec  # noqa: E402
import vllm_tests_helpers as h  # noqa: E402
import zmq  # noqa: E402
from strata.keys import chunk_hashes  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    MEDIUM_CPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

from harness import run_driver  # noqa: E402
from servers import Server, resp  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BLOCK = 16
TOPIC = b"kv@strata-test@tiny"
R1 = {"id": 1, "tokens": 53, "prefix": 48}
R2 = {"id": 2, "tokens": 60, "prefix": 48}
WAIT_S = 20.0
DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def tokens_of(spec):
    """The prompt vLLM's test helper builds (the driver's ``request``)."""
    req = h.create_request(request_id=spec["id"], num_tokens=spec["tokens"],
                           common_prefix_len=spec["prefix"], block_size=BLOCK, max_tokens=2)
    return list(req.prompt_token_ids)


def block_ids(tokens):
    """What a router looks up: each digest's last 8 bytes, big-endian."""
    return [int.from_bytes(d[-8:], "big") for d in chunk_hashes(tokens, BLOCK)]


def info_endpoint(node, field):
    text = resp(node.port, "INFO", "stats").decode()
    line = next(l for l in text.splitlines() if l.startswith(field + ":"))
    return line.split(":", 1)[1].strip().replace("0.0.0.0", "127.0.0.1")


def publishing_node(topic: bytes = TOPIC) -> Server:
    return Server(["--kv-events-endpoint", "tcp://*:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
                   "--kv-events-topic", topic.decode(), "--kv-events-block-size", str(BLOCK),
                   "--ssd-pool-size", "0"], pool="64MiB")


@pytest.fixture
def node():
    s = publishing_node()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from test_vllm_connector import TINY_LLAMA

    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


def store(node, model_dir, spec, ns):
    env = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "TRANSFORMERS_OFFLINE": "1"}
    step = {"op": "store", "req": spec, "seeds": node.addr, "model": model_dir, "namespace": ns}
    (stored,) = run_driver(str(HERE / "vllm_driver.py"), json.dumps([step]), env=env)
    assert stored["saved"] == 3, stored
    return stored


class Subscriber:
    """A SUB socket of this process on a node's stream, decoding every
    batch with vLLM's decoder and checking its framing."""

    def __init__(self, node):
        self.node = node
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.sock.connect(info_endpoint(node, "kv_events_endpoint"))
        self.last_seq = None
        self.raw = {}
        self.events = []

    def recv(self, timeout_s: float) -> bool:
        if not self.sock.poll(int(timeout_s * 1000)):
            return False
        topic, seq, payload = self.sock.recv_multipart()
        assert topic == TOPIC
        seq = int.from_bytes(seq, "big")
        if self.last_seq is not None:
            assert seq == self.last_seq + 1, (self.last_seq, seq)
        self.last_seq = seq
        self.raw[seq] = payload
        batch = DECODER.decode(payload)
        assert batch.data_parallel_rank == 0 and batch.ts > 1.7e9
        # vLLM's encoder writes the same batch back to the same msgpack value.
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch)) == msgspec.msgpack.decode(payload)
        self.events.extend(batch.events)
        return True

    def join(self, probe_key: str) -> None:
        """Writes a block key until its event arrives (a SUB's subscription
        reaches the PUB a moment after it connects)."""
        deadline = time.monotonic() + WAIT_S
        while not self.recv(0.2):
            resp(self.node.port, "SET", probe_key, "x")
            assert time.monotonic() < deadline, "the node published nothing"

    def until(self, what, done) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"no events for {what}: {self.events}"
            self.recv(0.5)

    def stored(self):
        return {hh for e in self.events if isinstance(e, BlockStored) for hh in e.block_hashes}

    def close(self):
        self.sock.close(linger=0)


def keys_of(node, digest):
    """The connector's keys (one per layer) of the block with ``digest``."""
    reply = resp(node.port, "KEYS", f"*:{digest.hex()}:*").decode()
    return [line for line in reply.split("\r\n")[1:] if line and line[0] not in "*$"]


def test_vllm_decodes_the_events_of_blocks_the_connector_stored(node, model_dir):
    sub = Subscriber(node)
    try:
        probe = "probe:x:tp0of1:" + "ab" * 32
        sub.join(probe)
        store(node, model_dir, R1, "kvev")
        want = block_ids(tokens_of(R1))
        assert len(want) == 3
        sub.until("the stored blocks", lambda: set(want) <= sub.stored())
        for e in sub.events:
            if isinstance(e, BlockStored):
                assert e.medium == MEDIUM_CPU and e.block_size == BLOCK, e
                assert e.parent_block_hash is None and e.token_ids == [] and e.lora_id is None, e
        assert sub.stored() == set(want) | {int("ab" * 8, 16)}

        # One layer's key of block 1 deleted: the block is gone from CPU.
        digests = chunk_hashes(tokens_of(R1), BLOCK)
        layers = keys_of(node, digests[1])
        assert len(layers) == 2 and all(k.startswith("kvev:") for k in layers), layers
        assert resp(node.port, "DEL", layers[0]) == b":1\r\n", layers
        removed = lambda: [hh for e in sub.events if isinstance(e, BlockRemoved) for hh in e.block_hashes]  # noqa: E731
        sub.until("DEL", lambda: want[1] in removed())
        assert [e.medium for e in sub.events if isinstance(e, BlockRemoved)] == [MEDIUM_CPU]

        resp(node.port, "FLUSHALL")
        sub.until("FLUSHALL", lambda: isinstance(sub.events[-1], AllBlocksCleared))

        # Replay from 0: every batch so far, the same bytes, then vLLM's end marker.
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(info_endpoint(node, "kv_events_replay_endpoint"))
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = {}
        while True:
            assert dealer.poll(int(WAIT_S * 1000)), "replay answers"
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == END_SEQ:
                break
            assert topic == TOPIC
            replayed[int.from_bytes(seq, "big")] = payload
        dealer.close(linger=0)
        assert sorted(replayed) == list(range(sub.last_seq + 1))
        for seq, payload in sub.raw.items():
            assert replayed[seq] == payload
            DECODER.decode(payload)
    finally:
        sub.close()


def load_router():
    spec = importlib.util.spec_from_file_location("kv_router", ROOT / "python" / "examples" / "kv_router.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_example_router_picks_the_node_with_the_longest_prefix(node, model_dir):
    other = publishing_node()
    kv_router = load_router()
    router = kv_router.Router(
        {
            "a": (info_endpoint(node, "kv_events_endpoint"), info_endpoint(node, "kv_events_replay_endpoint")),
            "b": (info_endpoint(other, "kv_events_endpoint"), None),
        },
        topic=b"kv@",
    )
    try:
        # Node a: the connector stores R1's three blocks. Node b: only the
        # first block of the same prefix, by the SDK-format key.
        digests = chunk_hashes(tokens_of(R1), BLOCK)
        store(node, model_dir, R1, "route")
        first = "strata:tiny:0of1:" + digests[0].hex()
        ids = kv_router.block_ids(tokens_of(R2), BLOCK)
        deadline = time.monotonic() + WAIT_S
        while router.longest_prefix(tokens_of(R2), BLOCK)["b"][0] < 1 or router.best(tokens_of(R2), BLOCK)[1] < 3:
            resp(other.port, "SET", first, "x")  # until b's SUB has joined
            router.poll(200)
            assert time.monotonic() < deadline, {n.name: dict(n.blocks) for n in router.nodes.values()}
        # R2 shares R1's three full blocks (its fourth is new).
        assert ids[:3] == kv_router.block_ids(tokens_of(R1), BLOCK)
        assert router.best(tokens_of(R2), BLOCK) == ("a", 3)
        assert router.longest_prefix(tokens_of(R2), BLOCK) == {"a": (3, "CPU"), "b": (1, "CPU")}
        assert router.cluster_prefix(tokens_of(R2), BLOCK) == 3
        # Node a flushed: b is the best now.
        resp(node.port, "FLUSHALL")
        deadline = time.monotonic() + WAIT_S
        while router.best(tokens_of(R2), BLOCK) != ("b", 1):
            router.poll(200)
            assert time.monotonic() < deadline
    finally:
        router.close()
        other.stop()
