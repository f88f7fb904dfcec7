"""Keyspace notifications, seen by real subscribers (redis-py in RESP2 and
RESP3, and redis-cli) while the strata SDK and redis-py write: exactly the
events of a scripted sequence, tier moves included; a stalled subscriber
is cut off at its output limit while writers go on; and a router
subscribed to every node of a cluster sees each write once."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

import strata
from servers import Server, resp, wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
from keyspace_watch import ClusterEvents  # noqa: E402

MIB = 1 << 20
PATTERN = "__keyevent@0__:*"


class PySubscriber:
    """A redis-py pattern subscriber collecting (event, key) in a thread."""

    def __init__(self, port: int, protocol: int) -> None:
        self.r = redis.Redis(port=port, protocol=protocol)
        self.ps = self.r.pubsub(ignore_subscribe_messages=True)
        self.ps.psubscribe(PATTERN)
        # The subscribe confirmation, so nothing published after this is missed.
        wait_for(lambda: self.ps.get_message(timeout=0.1) is None and self.ps.subscribed, "psubscribe")
        self.events = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            m = self.ps.get_message(timeout=0.1)
            if m and m["type"] == "pmessage":
                self.events.append((m["channel"].decode().split(":", 1)[1], m["data"].decode()))

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        self.ps.close()
        self.r.close()


class CliSubscriber:
    """`redis-cli --csv psubscribe`, as an operator would run it."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            ["redis-cli", "-p", str(port), "--csv", "psubscribe", PATTERN],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()
        wait_for(lambda: any("psubscribe" in l for l in self.lines), "redis-cli subscribed")

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    @property
    def events(self):
        out = []
        for line in self.lines:
            f = re.findall(r'"((?:[^"\\]|\\.)*)"', line)
            if f and f[0] == "pmessage":
                out.append((f[2].split(":", 1)[1], f[3]))
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=5)
        self._t.join(timeout=5)


def info(port: int, section: str = "stats") -> dict:
    text = resp(port, "INFO", section).decode()
    return dict(l.split(":", 1) for l in text.splitlines() if ":" in l and not l.startswith("$"))


def block(i: int, size: int = MIB) -> np.ndarray:
    return np.full(size, i % 251, dtype=np.uint8)


def subscribers(port):
    subs = [PySubscriber(port, 2), PySubscriber(port, 3), CliSubscriber(port)]
    return subs


def settle(subs, want: int, what: str) -> None:
    wait_for(lambda: all(len(s.events) >= want for s in subs), what, timeout=20)
    time.sleep(0.3)  # anything extra would have arrived by now


def test_scripted_sequence_with_spill_and_promotion():
    # 16 MiB of DRAM over the default NVMe tier: 1 MiB blocks spill.
    node = Server(["--notify-keyspace-events", "KEAT"], pool="16MiB")
    subs = []
    try:
        subs = subscribers(node.port)
        c = strata.Client(node.addr)
        r = redis.Redis(port=node.port)
        r.set("s:one", b"v")                       # set
        c.put("s:two", block(2, 256 * 1024))       # set (zero-copy PUT)
        r.delete("s:one")                          # del
        r.set("s:three", b"v", px=200)             # set, expire ... expired
        wait_for(lambda: r.exists("s:three") == 0 and info(node.port)["keyspace_events_expired"] != "0",
                 "s:three expired")
        fill = [f"s:fill:{i:02d}" for i in range(30)]
        # MPUTs of 3 (a batch reserves all its room before it commits):
        # 30 × set, and the oldest blocks spill.
        for b in range(0, 30, 3):
            assert c.put_batch(fill[b:b + 3], [block(i) for i in range(b, b + 3)]) == [None] * 3
        def spilled_fill():
            return [k for e, k in subs[0].events if e == "spilled" and k.startswith("s:fill:")]
        wait_for(lambda: spilled_fill(), "a fill block spilled")
        back = spilled_fill()[0]
        got = c.get(back)                          # promoted
        assert got == block(int(back.rsplit(":", 1)[1])).tobytes()
        want_min = 6 + 30 + 1
        settle(subs, want_min, "events")
        for s in subs:
            ev = s.events
            script = [x for x in ev if not x[1].startswith("s:fill:") and x[0] != "spilled"]
            assert script == [("set", "s:one"), ("set", "s:two"), ("del", "s:one"),
                              ("set", "s:three"), ("expire", "s:three"), ("expired", "s:three")], s
            sets = [k for e, k in ev if e == "set" and k.startswith("s:fill:")]
            assert sets == fill, s
            spilled = [k for e, k in ev if e == "spilled"]
            assert spilled and not [x for x in ev if x[0] == "evicted"], ev
            for k in spilled:
                # A value is spilled only after it was written (s:two
                # before the fill, by the thread's own connection).
                assert ev.index(("spilled", k)) > ev.index(("set", k)), (k, ev)
            assert [k for e, k in ev if e == "promoted"] == [back], ev
        # The same counts in INFO and /metrics' source.
        st = info(node.port)
        assert int(st["keyspace_events_set"]) == 33
        assert int(st["keyspace_events_promoted"]) == 1
        assert int(st["pubsub_subscribers"]) == 3
        c.close()
        r.close()
    finally:
        for s in subs:
            s.close()
        node.stop()


def test_eviction_without_nvme_names_exactly_the_keys_that_left():
    node = Server(["--ssd-pool-size", "0", "--notify-keyspace-events", "Ee$"], pool="16MiB")
    sub = None
    try:
        sub = PySubscriber(node.port, 3)
        c = strata.Client(node.addr)
        keys = [f"e:{i:02d}" for i in range(30)]
        for i, k in enumerate(keys):
            c.put(k, block(i))
        wait_for(lambda: len(sub.events) >= 30 + int(info(node.port)["evicted_keys"]), "events")
        time.sleep(0.3)
        evicted = {k for e, k in sub.events if e == "evicted"}
        gone = {k for k in keys if c.get(k) is None}
        assert evicted and evicted == gone
        assert len(evicted) == int(info(node.port)["evicted_keys"])
        c.close()
    finally:
        if sub:
            sub.close()
        node.stop()


def test_a_stalled_subscriber_is_cut_off_and_writers_go_on():
    node = Server(["--pubsub-output-buffer-limit", "1MiB"])
    try:
        # A subscriber that never reads, with a small receive buffer.
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stalled.connect(("127.0.0.1", node.port))
        stalled.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nc\r\n")
        assert b"subscribe" in stalled.recv(256)
        fast = PySubscriber.__new__(PySubscriber)
        fast.r = redis.Redis(port=node.port)
        fast.ps = fast.r.pubsub(ignore_subscribe_messages=True)
        fast.ps.subscribe("c")
        fast.ps.get_message(timeout=1)
        got = []

        def read_fast():
            while len(got) < 20000:
                m = fast.ps.get_message(timeout=5)
                if m is None:
                    return
                if m["type"] == "message":
                    got.append(m["data"])
        t = threading.Thread(target=read_fast)
        t.start()
        w = redis.Redis(port=node.port)
        payload = b"x" * 1024
        receivers = []
        for _ in range(40):
            p = w.pipeline(transaction=False)
            for _ in range(500):
                p.publish("c", payload)
            receivers += p.execute()
            # The reading subscriber (Python, on a shared CPU) keeps within
            # its limit; the stalled one falls behind without bound. At
            # most 100 + 500 messages of ~1 KiB outstanding stay under the
            # 1 MiB limit by themselves: 500 + 500 did only where the
            # kernel's socket buffers held the rest, which depends on the
            # congestion control (a full run under CUBIC cut the reader).
            deadline = time.monotonic() + 10
            while len(got) < len(receivers) - 100 and time.monotonic() < deadline:
                time.sleep(0.001)
        t.join(timeout=30)
        # Every message reached the reading subscriber; the stalled one was
        # dropped from the receivers once cut.
        assert len(got) == 20000
        assert receivers[0] == 2 and receivers[-1] == 1
        st = info(node.port)
        assert st["pubsub_disconnected"] == "1"
        assert int(st["pubsub_dropped"]) > 0
        # The node closed the stalled connection: what it holds ends in EOF,
        # after at most the limit plus the socket buffers.
        stalled.settimeout(10)
        total = 0
        while True:
            chunk = stalled.recv(1 << 16)
            if not chunk:
                break
            total += len(chunk)
        assert total < 20000 * 1024 // 2
        stalled.close()
        assert w.ping()
        fast.ps.close()
        fast.r.close()
        w.close()
    finally:
        node.stop()


def test_a_router_subscribed_to_every_node_sees_each_write_once():
    from test_cluster import new_etcd, start_nodes
    etcd = new_etcd()
    nodes = []
    watch = None
    try:
        nodes = start_nodes(etcd, 3, "events", "64MiB",
                            lambda i: ["--host-name", f"h{i}", "--replica-num", "2",
                                       "--notify-keyspace-events", "E$g"])
        watch = ClusterEvents(nodes[0].addr, ["set", "del"])
        assert len(watch.nodes) == 3
        time.sleep(0.5)
        c = strata.Client(nodes[1].addr)
        keys = [f"r:{i:03d}" for i in range(60)]
        c.put_batch(keys, [block(i, 64 * 1024) for i in range(60)])
        for k in keys[:10]:
            c.remove(k)
        seen = []
        deadline = time.time() + 20
        while len(seen) < 70 and time.time() < deadline:
            try:
                seen.append(watch.get(timeout=1))
            except Exception:
                pass
        time.sleep(0.5)
        while True:
            try:
                seen.append(watch.get(timeout=0.2))
            except Exception:
                break
        sets = sorted(k.decode() for _, e, k in seen if e == "set")
        dels = sorted(k.decode() for _, e, k in seen if e == "del")
        assert sets == keys, "each write once, from its owner"
        assert dels == keys[:10]
        # Owners differ: the events came from more than one node.
        assert len({n for n, _, _ in seen}) > 1
        c.close()
    finally:
        if watch:
            watch.close()
        for n in nodes:
            n.stop()
        etcd.stop()


def test_values_nvme_reclaims_are_published_as_evicted_exactly():
    # 16 MiB of DRAM over 16 MiB of NVMe (1 MiB blocks), 64 MiB written:
    # the NVMe tier reclaims blocks, and every value that leaves the node,
    # from either tier, is published once as evicted.
    node = Server(["--ssd-pool-size", "16MiB", "--ssd-max-value-size", "1MiB",
                   "--notify-keyspace-events", "Ee$T"], pool="16MiB")
    sub = None
    try:
        sub = PySubscriber(node.port, 2)
        c = strata.Client(node.addr)
        keys = [f"n:{i:03d}" for i in range(64)]
        for b in range(0, 64, 2):
            assert c.put_batch(keys[b:b + 2], [block(i, MIB - 4096) for i in range(b, b + 2)]) == [None] * 2
        # Once the writes have settled (nothing queued for NVMe), the keys
        # published as evicted are exactly the keys gone: nothing leaves
        # silently (the reaper reports what reclaims dropped), nothing is
        # reported that is still held, and nothing twice.
        wait_for(lambda: info(node.port, "tiers")["nvme_spill_queued_bytes"] == "0", "spill queue empty")

        def differ():
            ev = {k for e, k in sub.events if e == "evicted"}
            gone = {k for k in keys if not c.exists(k)}
            return sorted(ev ^ gone)
        try:
            wait_for(lambda: not differ(), "evicted events match the keys gone", timeout=10)
        except TimeoutError:
            pass  # the asserts below say what differs
        evicted = [k for e, k in sub.events if e == "evicted"]
        gone = {k for k in keys if not c.exists(k)}
        assert gone, "NVMe reclaimed nothing: the test did not fill it"
        assert len(evicted) == len(set(evicted)), "each value evicted once"
        assert set(evicted) == gone, (differ(), sub.events[-30:])
        assert int(info(node.port)["keyspace_events_evicted"]) == len(gone)
        c.close()
    finally:
        if sub:
            sub.close()
        node.stop()


def test_a_ttl_that_passes_on_nvme_is_published_when_a_read_finds_it():
    node = Server(["--notify-keyspace-events", "Ex"], pool="16MiB")
    sub = None
    try:
        sub = PySubscriber(node.port, 2)
        c = strata.Client(node.addr)
        r = redis.Redis(port=node.port)
        r.set("t:short", block(1, MIB).tobytes(), px=1500)
        for b in range(0, 30, 3):  # push it down to NVMe
            assert c.put_batch([f"t:fill:{i}" for i in range(b, b + 3)],
                               [block(i) for i in range(b, b + 3)]) == [None] * 3
        wait_for(lambda: int(info(node.port, "tiers")["nvme_spilled"]) > 0, "spills")
        time.sleep(1.6)
        assert sub.events == [], "nothing expired in DRAM"
        assert r.get("t:short") is None
        wait_for(lambda: sub.events == [("expired", "t:short")], "expired published")
        c.close()
        r.close()
    finally:
        if sub:
            sub.close()
        node.stop()
