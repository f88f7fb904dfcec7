"""A KV-aware router in miniature: it follows the KV events of several
strata nodes (vLLM's format, ``kv_events_endpoint``), keeps an index of
which node holds which block in which tier, and for a prompt picks the
node holding its longest cached prefix.

Needs pyzmq, msgspec and the strata SDK (for ``strata.keys``); no vLLM.

    python kv_router.py --publisher a=tcp://10.0.0.1:5557,tcp://10.0.0.1:5558 \\
        --publisher b=tcp://10.0.0.2:5557 --tokens 1,1,1,...      # or token lists on stdin

A publisher is ``name=PUB endpoint[,replay endpoint]``. With a replay
endpoint the router asks for the batches it missed when it sees a gap in
the sequence numbers (and, when it joins, for those sent before); a node
whose numbers go back has restarted, and what was known of it is dropped.

How a prompt maps to blocks (docs/OPERATIONS.md, "KV events"): the
adapters key block ``i`` by the chained SHA-256 ``h[i]`` of
``strata.keys.chunk_hashes(tokens, block_size)``, and events carry
``int.from_bytes(h[i][-8:], "big")``. Since ``h[i]`` commits to every
token before it, the longest run of leading hashes a node holds is the
prefix it can serve. In a strata cluster a prompt's blocks are spread over
the nodes (each publishes the keys it owns); the union of all the nodes'
index is what the cluster holds (``Router.cluster_prefix``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import msgspec
import zmq

from strata.keys import chunk_hashes

END_SEQ = (-1).to_bytes(8, "big", signed=True)
# Tiers a router would rather load from first, as vLLM names them.
MEDIUM_ORDER = ("GPU", "CPU", "STORAGE")


def block_ids(tokens: Sequence[int], block_size: int) -> List[int]:
    """The block hashes strata's events carry for ``tokens``' full blocks."""
    return [int.from_bytes(h[-8:], "big") for h in chunk_hashes(tokens, block_size)]


@dataclass
class Node:
    name: str
    sub: zmq.Socket
    replay: Optional[zmq.Socket]
    blocks: Dict[int, Set[str]] = field(default_factory=lambda: defaultdict(set))
    last_seq: Optional[int] = None
    block_size: Optional[int] = None

    # The highest sequence number a replay brought: live batches up to it
    # were applied already.
    replayed_to: int = -1

    def apply(self, seq: int, payload: bytes, live: bool = True) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            if not live or seq <= self.replayed_to:
                return  # a batch applied already
            # Numbers that go back on the live stream: the node restarted.
            self.blocks.clear()
            self.replayed_to = -1
        self.last_seq = seq
        if not live:
            self.replayed_to = seq
        ts, events, _rank = msgspec.msgpack.decode(payload)
        for e in events:
            kind = e["type"]
            if kind == "BlockStored":
                self.block_size = e["block_size"]
                for h in e["block_hashes"]:
                    self.blocks[h].add(e["medium"])
            elif kind == "BlockRemoved":
                for h in e["block_hashes"]:
                    media = self.blocks.get(h)
                    if media is not None:
                        media.discard(e["medium"])
                        if not media:
                            del self.blocks[h]
            elif kind == "AllBlocksCleared":
                self.blocks.clear()

    def prefix(self, ids: Sequence[int]) -> int:
        n = 0
        while n < len(ids) and ids[n] in self.blocks:
            n += 1
        return n


class Router:
    def __init__(self, publishers: Dict[str, Tuple[str, Optional[str]]], topic: bytes = b"") -> None:
        self.ctx = zmq.Context.instance()
        self.poller = zmq.Poller()
        self.nodes: Dict[zmq.Socket, Node] = {}
        for name, (endpoint, replay_endpoint) in publishers.items():
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            sub.connect(endpoint)
            replay = None
            if replay_endpoint:
                replay = self.ctx.socket(zmq.DEALER)
                replay.connect(replay_endpoint)
            self.poller.register(sub, zmq.POLLIN)
            self.nodes[sub] = Node(name, sub, replay)

    def poll(self, timeout_ms: int = 100) -> int:
        """Applies what arrived within ``timeout_ms``; returns how many batches."""
        n = 0
        for sock, _ in self.poller.poll(timeout_ms):
            node = self.nodes[sock]
            while True:
                try:
                    _topic, seq, payload = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                seq = int.from_bytes(seq, "big")
                # Batches missed (or sent before this router joined): ask for them.
                missed = seq > (node.last_seq + 1 if node.last_seq is not None else 0)
                if missed and node.replay is not None:
                    self._replay(node, node.last_seq + 1 if node.last_seq is not None else 0)
                node.apply(seq, payload)
                n += 1
        return n

    def _replay(self, node: Node, start: int, timeout_ms: int = 2000) -> None:
        node.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while node.replay.poll(timeout_ms):
            _, _topic, seq, payload = node.replay.recv_multipart()
            if seq == END_SEQ:
                return
            node.apply(int.from_bytes(seq, "big"), payload, live=False)

    def longest_prefix(self, tokens: Sequence[int], block_size: int) -> Dict[str, Tuple[int, str]]:
        """Per node: (leading blocks of ``tokens`` it holds, the best medium
        of its last one)."""
        ids = block_ids(tokens, block_size)
        out = {}
        for node in self.nodes.values():
            n = node.prefix(ids)
            media = node.blocks.get(ids[n - 1], set()) if n else set()
            out[node.name] = (n, next((m for m in MEDIUM_ORDER if m in media), ""))
        return out

    def best(self, tokens: Sequence[int], block_size: int) -> Tuple[Optional[str], int]:
        """The node holding the longest prefix of ``tokens`` (ties: the
        first named), and how many blocks; ``(None, 0)`` if none holds any."""
        ranked = self.longest_prefix(tokens, block_size)
        name, (n, _) = max(ranked.items(), key=lambda kv: kv[1][0], default=(None, (0, "")))
        return (name, n) if n else (None, 0)

    def cluster_prefix(self, tokens: Sequence[int], block_size: int) -> int:
        """Leading blocks held by any node (a cluster spreads a prompt)."""
        ids = block_ids(tokens, block_size)
        n = 0
        while n < len(ids) and any(ids[n] in node.blocks for node in self.nodes.values()):
            n += 1
        return n

    def close(self) -> None:
        for node in self.nodes.values():
            node.sub.close(linger=0)
            if node.replay is not None:
                node.replay.close(linger=0)


def parse_publisher(text: str) -> Tuple[str, Tuple[str, Optional[str]]]:
    name, _, endpoints = text.partition("=")
    pub, _, replay = endpoints.partition(",")
    if not name or not pub:
        raise argparse.ArgumentTypeError(f"{text!r}: want name=tcp://host:port[,tcp://host:replay_port]")
    return name, (pub, replay or None)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--publisher", action="append", type=parse_publisher, required=True)
    p.add_argument("--block-size", type=int, default=16, help="the nodes' kv_events_block_size")
    p.add_argument("--topic", default="", help="the nodes' kv_events_topic prefix to follow")
    p.add_argument("--listen-s", type=float, default=1.0, help="follow the events this long before each answer")
    p.add_argument("--tokens", help="comma-separated token ids; else one list per line on stdin")
    args = p.parse_args(argv)
    router = Router(dict(args.publisher), args.topic.encode())
    prompts = [args.tokens] if args.tokens else (line for line in sys.stdin if line.strip())
    try:
        for prompt in prompts:
            deadline = time.monotonic() + args.listen_s
            while time.monotonic() < deadline:
                router.poll(50)
            tokens = [int(t) for t in prompt.replace(",", " ").split()]
            name, blocks = router.best(tokens, args.block_size)
            print(f"{name or '-'}\t{blocks}\t{router.longest_prefix(tokens, args.block_size)}", flush=True)
    finally:
        router.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
