"""Watch a strata cluster's keyspace events, the way a cache-aware router
learns which node holds which KV-cache blocks.

Each node publishes the events of the keys it owns (a replica's copy is
not news), so a subscriber to every node sees each event once. This asks
one node for the ring (``CLUSTER SHARDS``), subscribes to every node, and
merges what they send. Only redis-py is needed.

    python keyspace_watch.py 127.0.0.1:7379            # all events
    python keyspace_watch.py 127.0.0.1:7379 set evicted

The nodes must publish: ``notify_keyspace_events`` in their config (e.g.
``KEA``, or ``KEAT`` with tier moves) or ``CONFIG SET
notify-keyspace-events KEA`` on each. A node that joins later is not
watched: run ``CLUSTER SHARDS`` again (or restart the watcher) on ring
changes.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Iterator, List, Optional, Tuple

import redis


def node_addresses(seed: str) -> List[Tuple[str, int]]:
    """(host, port) of every node in the ring, from ``CLUSTER SHARDS``."""
    host, port = seed.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port), protocol=3, decode_responses=True)
    try:
        shards = r.execute_command("CLUSTER", "SHARDS")
    finally:
        r.close()
    out = []
    for shard in shards:
        for n in shard["nodes"]:
            out.append((n.get("endpoint") or n["ip"], int(n["port"])))
    return out


class ClusterEvents:
    """Keyspace events from every node of a cluster, merged: iterate for
    ``(node, event, key)`` tuples."""

    def __init__(self, seed: str, events: Optional[List[str]] = None) -> None:
        self.nodes = node_addresses(seed)
        self._queue: "queue.Queue[Tuple[str, str, bytes]]" = queue.Queue()
        self._stop = threading.Event()
        self._subs = []
        self._threads = []
        channels = [f"__keyevent@0__:{e}" for e in events] if events else None
        for host, port in self.nodes:
            r = redis.Redis(host=host, port=port)
            ps = r.pubsub(ignore_subscribe_messages=True)
            if channels:
                ps.subscribe(*channels)
            else:
                ps.psubscribe("__keyevent@0__:*")
            self._subs.append((r, ps))
            t = threading.Thread(target=self._pump, args=(f"{host}:{port}", ps), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, node: str, ps) -> None:
        while not self._stop.is_set():
            try:
                m = ps.get_message(timeout=0.2)
            except (redis.ConnectionError, ValueError):
                return
            if m and m["type"] in ("message", "pmessage"):
                event = m["channel"].decode().split(":", 1)[1]
                self._queue.put((node, event, m["data"]))

    def get(self, timeout: Optional[float] = None) -> Tuple[str, str, bytes]:
        """The next event; raises ``queue.Empty`` after ``timeout``."""
        return self._queue.get(timeout=timeout)

    def __iter__(self) -> Iterator[Tuple[str, str, bytes]]:
        while True:
            yield self.get()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        for r, ps in self._subs:
            ps.close()
            r.close()


def main(argv: List[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    watch = ClusterEvents(argv[1], argv[2:] or None)
    print(f"watching {len(watch.nodes)} node(s): {watch.nodes}", file=sys.stderr)
    try:
        for node, event, key in watch:
            print(f"{node} {event} {key.decode(errors='replace')}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        watch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
