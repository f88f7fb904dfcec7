"""Pub/sub and keyspace notifications through redis-py, in RESP2 and RESP3
(runs against Redis too: no strata-only behaviour here)."""
import time

import pytest
import redis

from conftest import HOST, PORT, make_client


def next_message(ps, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = ps.get_message(timeout=0.1)
        if m is not None:
            return m
    raise AssertionError("no message within %ss" % timeout)


@pytest.fixture
def pub():
    c = make_client(2)
    yield c
    c.close()


def test_subscribe_publish_unsubscribe(r, pub, prefix):
    ch = prefix + "news"
    ps = r.pubsub()
    ps.subscribe(ch, ch + "2")
    assert next_message(ps) == {"type": "subscribe", "pattern": None, "channel": ch.encode(), "data": 1}
    assert next_message(ps)["data"] == 2
    assert pub.publish(ch, b"hello") == 1
    assert next_message(ps) == {"type": "message", "pattern": None, "channel": ch.encode(), "data": b"hello"}
    assert pub.pubsub_numsub(ch, prefix + "none") == [(ch.encode(), 1), ((prefix + "none").encode(), 0)]
    ps.unsubscribe()
    got = sorted(next_message(ps)["data"] for _ in range(2))
    assert got == [0, 1]
    assert pub.publish(ch, b"x") == 0
    ps.close()


def test_psubscribe_gets_pmessage(r, pub, prefix):
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.psubscribe(prefix + "*")
    time.sleep(0.1)
    ps.get_message(timeout=0.5)
    assert pub.publish(prefix + "a", b"1") == 1
    m = next_message(ps)
    assert m["type"] == "pmessage"
    assert m["pattern"] == (prefix + "*").encode()
    assert m["channel"] == (prefix + "a").encode() and m["data"] == b"1"
    assert pub.pubsub_numpat() >= 1
    assert (prefix + "a").encode() not in pub.pubsub_channels(prefix + "*")
    ps.close()


def test_resp2_subscribed_mode_allows_only_pubsub_and_ping():
    conn = redis.Connection(host=HOST, port=int(PORT), protocol=2)
    conn.connect()
    try:
        conn.send_command("SUBSCRIBE", "compat:mode")
        assert conn.read_response() == [b"subscribe", b"compat:mode", 1]
        conn.send_command("PING")
        assert conn.read_response() == [b"pong", b""]
        conn.send_command("GET", "x")
        with pytest.raises(redis.ResponseError, match="only .*SUBSCRIBE.*allowed in this context"):
            conn.read_response()
        conn.send_command("UNSUBSCRIBE")
        assert conn.read_response() == [b"unsubscribe", b"compat:mode", 0]
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG", True)
    finally:
        conn.disconnect()


def test_keyspace_notifications(r, pub, prefix):
    old = pub.config_get("notify-keyspace-events")["notify-keyspace-events"]
    pub.config_set("notify-keyspace-events", "KEA")
    try:
        assert set(pub.config_get("notify-keyspace-events")["notify-keyspace-events"]) == set("AKE")
        ps = r.pubsub(ignore_subscribe_messages=True)
        ps.psubscribe("__keyspace@0__:" + prefix + "*", "__keyevent@0__:*")
        time.sleep(0.1)
        ps.get_message(timeout=0.5)
        k = prefix + "k"
        pub.set(k, b"v")
        pub.pexpire(k, 100)
        pub.mset({prefix + "m": b"1"})
        pub.delete(prefix + "m")
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and ("expired", k) not in seen:
            m = ps.get_message(timeout=0.1)
            if m is None:
                pub.exists(k)  # a read makes a lazy server notice the expiry
                continue
            ch = m["channel"].decode()
            if ch.startswith("__keyevent@0__:") and m["data"].decode().startswith(prefix):
                seen.append((ch.split(":", 1)[1], m["data"].decode()))
            elif ch.startswith("__keyspace@0__:"):
                assert m["pattern"].decode().startswith("__keyspace@0__:")
        assert seen == [("set", k), ("expire", k), ("set", prefix + "m"), ("del", prefix + "m"), ("expired", k)]
        ps.close()
    finally:
        pub.config_set("notify-keyspace-events", old)


def test_config_set_rejects_bad_flags(pub):
    with pytest.raises(redis.ResponseError, match="notify-keyspace-events"):
        pub.config_set("notify-keyspace-events", "K?")
