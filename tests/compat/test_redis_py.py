"""Black-box RESP conformance tests via redis-py, each run over RESP2 and RESP3.

Expected behaviour is real Redis 7's; strata-only differences are marked
`strata_only` (skipped elsewhere). Fixtures live in conftest.py.
"""
import fnmatch
import os
import random
import socket
import time

import pytest
import redis

from conftest import HOST, PORT, make_client

SEED = 0x5747A7A


def rng(salt=0):
    return random.Random(SEED + salt)


def wait_until(pred, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def err(r, *args):
    """Run a command that must fail; return the ResponseError text (redis-py strips a leading 'ERR ')."""
    with pytest.raises(redis.ResponseError) as ei:
        r.execute_command(*args)
    return str(ei.value)


def raw(r, *args):
    """Send one command and return the parsed reply without redis-py's per-command callbacks."""
    c = r.connection_pool.get_connection()
    try:
        c.send_command(*args)
        return c.read_response()
    finally:
        r.connection_pool.release(c)


def as_map(reply):
    """RESP3 map -> dict; RESP2 flat array -> dict."""
    if isinstance(reply, dict):
        return reply
    assert isinstance(reply, list) and len(reply) % 2 == 0, reply
    return dict(zip(reply[0::2], reply[1::2]))


def s(x):
    return x.decode() if isinstance(x, bytes) else x


# --------------------------------------------------------------------------- basics

def test_ping_echo(r):
    assert r.ping() is True
    assert raw(r, "PING") == b"PONG"
    assert raw(r, "PING", "hello") == b"hello"
    assert r.echo(b"") == b""
    assert r.echo(b"a\x00b\r\nc") == b"a\x00b\r\nc"
    assert r.echo(bytes(range(256))) == bytes(range(256))


BINARY_VALUES = {
    "empty": b"",
    "nul_crlf": b"a\x00b\r\nc\r\n\x00",
    "all_bytes": bytes(range(256)),
    "crlf_only": b"\r\n",
    "1MiB_random": rng(1).randbytes(1 << 20),
}


@pytest.mark.parametrize("name", list(BINARY_VALUES))
def test_set_get_binary(r, prefix, name):
    v = BINARY_VALUES[name]
    k = prefix + name
    assert r.set(k, v) is True
    assert r.get(k) == v
    assert r.strlen(k) == len(v)
    assert r.exists(k) == 1


def test_non_utf8_keys(r, prefix):
    keys = [prefix.encode() + suffix for suffix in
            (b"\xff\xfe\xfd", b"\x00nul", b"cr\r\nlf", b"sp ace", b"\xc3\x28", bytes(range(128, 256)))]
    for i, k in enumerate(keys):
        assert r.set(k, b"v%d" % i) is True
    assert r.mget(keys) == [b"v%d" % i for i in range(len(keys))]
    assert r.exists(*keys) == len(keys)
    assert set(r.keys(prefix + "*")) == set(keys)
    assert r.delete(*keys) == len(keys)
    assert r.exists(*keys) == 0


def test_get_missing_and_overwrite(r, prefix):
    k = prefix + "k"
    assert r.get(k) is None
    assert r.set(k, b"one") is True
    assert r.set(k, b"two-longer") is True
    assert r.get(k) == b"two-longer"
    assert r.strlen(k) == 10
    assert r.strlen(prefix + "missing") == 0


# --------------------------------------------------------------------------- SET options

def test_set_nx_xx(r, prefix):
    k = prefix + "k"
    assert r.set(k, b"x", xx=True) is None          # XX on missing: nil
    assert r.exists(k) == 0
    assert r.set(k, b"a", nx=True) is True          # NX on missing: OK
    assert r.set(k, b"b", nx=True) is None          # NX on existing: nil, value untouched
    assert r.get(k) == b"a"
    assert r.set(k, b"c", xx=True) is True          # XX on existing: OK
    assert r.get(k) == b"c"


def test_set_ex_px(r, prefix):
    k1, k2 = prefix + "ex", prefix + "px"
    assert r.set(k1, b"v", ex=100) is True
    assert 0 < r.ttl(k1) <= 100
    assert 0 < r.pttl(k1) <= 100_000
    assert r.set(k2, b"v", px=100_000) is True
    assert 0 < r.pttl(k2) <= 100_000
    assert 0 < r.ttl(k2) <= 100
    assert r.get(k1) == b"v" and r.get(k2) == b"v"


def test_set_option_combinations(r, prefix):
    k = prefix + "k"
    assert r.set(k, b"a", nx=True, ex=100) is True
    assert 0 < r.ttl(k) <= 100
    assert r.set(k, b"b", nx=True, px=5000) is None
    assert r.get(k) == b"a" and r.ttl(k) > 5            # failed NX leaves TTL alone
    assert r.set(k, b"c", xx=True, px=50_000) is True
    assert r.get(k) == b"c" and 0 < r.pttl(k) <= 50_000
    assert r.set(prefix + "none", b"z", xx=True, ex=10) is None
    assert r.exists(prefix + "none") == 0
    # options are case-insensitive
    assert r.execute_command("SET", k, b"d", "xx", "px", "60000") is True
    assert r.get(k) == b"d" and 0 < r.pttl(k) <= 60_000


def test_plain_set_clears_ttl(r, prefix):
    k = prefix + "k"
    r.set(k, b"v", ex=100)
    assert r.ttl(k) > 0
    r.set(k, b"w")
    assert r.ttl(k) == -1


@pytest.mark.parametrize("opts,msg", [
    (("EX", "0"), "invalid expire time in 'set' command"),
    (("EX", "-1"), "invalid expire time in 'set' command"),
    (("PX", "0"), "invalid expire time in 'set' command"),
    (("PX", "-5"), "invalid expire time in 'set' command"),
    (("EX", "abc"), "value is not an integer or out of range"),
    (("EX",), "syntax error"),
    (("NX", "XX"), "syntax error"),
    (("XX", "NX"), "syntax error"),
    (("EX", "10", "PX", "100"), "syntax error"),
    (("BOGUS",), "syntax error"),
], ids=["ex0", "ex-1", "px0", "px-5", "ex_nonint", "ex_noarg", "nx_xx", "xx_nx", "ex_px", "bogus"])
def test_set_errors(r, prefix, opts, msg):
    k = prefix + "k"
    assert err(r, "SET", k, b"v", *opts) == msg
    assert r.exists(k) == 0                         # nothing stored on error
    r.set(k, b"orig")
    assert err(r, "SET", k, b"new", *opts) == msg
    assert r.get(k) == b"orig" and r.ttl(k) == -1   # existing key untouched


# --------------------------------------------------------------------------- multi-key

def test_mset_mget(r, prefix):
    ks = [prefix + f"k{i}" for i in range(5)]
    assert r.mset({ks[0]: b"a", ks[2]: b"\x00c", ks[4]: b""}) is True
    assert r.mget(ks) == [b"a", None, b"\x00c", None, b""]
    assert r.mget([prefix + "nope"]) == [None]
    # MSET with a repeated key: last one wins
    assert r.execute_command("MSET", ks[1], b"x", ks[1], b"y") is True
    assert r.get(ks[1]) == b"y"
    # MGET with duplicate keys returns each position
    assert r.mget([ks[0], ks[0], ks[3]]) == [b"a", b"a", None]


def test_mset_odd_args(r, prefix):
    assert err(r, "MSET", prefix + "a") == "wrong number of arguments for 'mset' command"
    assert err(r, "MSET", prefix + "a", b"1", prefix + "b") == "wrong number of arguments for 'mset' command"
    assert r.exists(prefix + "a") == 0


@pytest.mark.parametrize("cmd", ["DEL", "UNLINK"])
def test_del_unlink_counts(r, prefix, cmd):
    a, b, c = prefix + "a", prefix + "b", prefix + "c"
    r.mset({a: b"1", b: b"2"})
    assert r.execute_command(cmd, a, b, c) == 2
    assert r.execute_command(cmd, a, b, c) == 0
    r.set(a, b"1")
    assert r.execute_command(cmd, a, a, a) == 1     # duplicates count once
    assert r.exists(a) == 0


def test_exists_counts_duplicates(r, prefix):
    a, b = prefix + "a", prefix + "b"
    r.set(a, b"1")
    assert r.exists(a) == 1
    assert r.exists(b) == 0
    assert r.exists(a, a, a) == 3                   # each occurrence counted
    assert r.exists(a, b, a, b) == 2


# --------------------------------------------------------------------------- expiry

def test_ttl_pttl_special_values(r, prefix):
    k = prefix + "k"
    assert r.ttl(k) == -2 and r.pttl(k) == -2
    r.set(k, b"v")
    assert r.ttl(k) == -1 and r.pttl(k) == -1


def test_expire_then_key_disappears(r, prefix):
    k, other = prefix + "k", prefix + "other"
    r.set(k, b"v")
    r.set(other, b"w")
    assert r.expire(k, 1) is True
    assert r.ttl(k) in (0, 1)
    assert 0 < r.pttl(k) <= 1000
    assert r.expire(prefix + "missing", 10) is False
    assert wait_until(lambda: r.get(k) is None, timeout=10)
    assert r.exists(k) == 0
    assert r.ttl(k) == -2 and r.pttl(k) == -2
    assert r.get(other) == b"w"


def test_set_px_expires(r, prefix):
    k = prefix + "k"
    r.set(k, b"v", px=150)
    assert wait_until(lambda: r.exists(k) == 0, timeout=10)
    assert r.get(k) is None
    assert prefix.encode() + b"k" not in r.keys(prefix + "*")


def test_expire_nonpositive_deletes(r, prefix):
    k = prefix + "k"
    r.set(k, b"v")
    assert r.expire(k, 0) is True       # Redis: EXPIRE with <= 0 deletes the key immediately
    assert r.exists(k) == 0
    r.set(k, b"v")
    assert r.expire(k, -10) is True
    assert r.get(k) is None


def test_expire_errors(r, prefix):
    assert err(r, "EXPIRE", prefix + "k") == "wrong number of arguments for 'expire' command"
    assert err(r, "EXPIRE", prefix + "k", "abc") == "value is not an integer or out of range"


# --------------------------------------------------------------------------- SCAN / KEYS / DBSIZE

@pytest.mark.parametrize("count", [None, 1, 7, 1000])
def test_scan_full_iteration(r, prefix, count):
    n = 257
    want = {f"{prefix}k:{i}".encode() for i in range(n)}
    p = r.pipeline(transaction=False)
    for k in want:
        p.set(k, b"v")
    for i in range(20):
        p.set(f"{prefix}other:{i}", b"x")
    p.execute()
    got = []
    cursor = 0
    calls = 0
    while True:
        args = ["SCAN", cursor, "MATCH", prefix + "k:*"]
        if count:
            args += ["COUNT", count]
        cursor, batch = r.execute_command(*args)
        assert isinstance(cursor, int) and isinstance(batch, list)
        got.extend(batch)
        calls += 1
        assert calls < 100_000
        if cursor == 0:
            break
    assert set(got) == want                     # every key present throughout, as a set
    assert all(fnmatch.fnmatchcase(s(k), prefix + "k:*") for k in got)
    assert set(r.scan_iter(match=prefix + "*", count=count or 10)) >= want


def test_scan_no_match_and_errors(r, prefix):
    r.set(prefix + "a", b"1")
    assert set(r.scan_iter(match=prefix + "zzz*")) == set()
    assert err(r, "SCAN", "abc") == "invalid cursor"
    assert err(r, "SCAN", 0, "COUNT", 0) == "syntax error"
    assert err(r, "SCAN", 0, "COUNT", "x") == "value is not an integer or out of range"


def test_keys_patterns(r, prefix):
    names = ["a1", "b1", "c1", "d1", "ab", "*x", "yx", "a?", "aa1", "[x]"]
    r.mset({prefix + n: b"v" for n in names})

    def keys(pat):
        return sorted(s(k)[len(prefix):] for k in r.keys(prefix + pat))

    assert keys("*") == sorted(names)
    assert keys("?1") == ["a1", "b1", "c1", "d1"]
    assert keys("[abc]1") == ["a1", "b1", "c1"]
    assert keys("[^a]1") == ["b1", "c1", "d1"]
    assert keys("[a-c]1") == ["a1", "b1", "c1"]
    assert keys("\\*x") == ["*x"]
    assert keys("*x") == ["*x", "yx"]
    assert keys("a\\?") == ["a?"]
    assert keys("a?") == ["a1", "a?", "ab"]
    assert keys("\\[x\\]") == ["[x]"]
    assert keys("a*1") == ["a1", "aa1"]
    assert keys("nomatch*") == []


def test_dbsize(r, prefix):
    before = r.dbsize()
    assert isinstance(before, int) and before >= 0
    r.mset({prefix + f"k{i}": b"v" for i in range(5)})
    assert r.dbsize() == before + 5
    r.delete(prefix + "k0")
    assert r.dbsize() == before + 4


def test_flushall(r, prefix):
    r.mset({prefix + f"k{i}": b"v" for i in range(10)})
    assert r.dbsize() >= 10
    assert r.flushall() is True
    assert r.dbsize() == 0
    assert r.get(prefix + "k0") is None
    assert r.keys("*") == []


# --------------------------------------------------------------------------- server / connection

def test_info(r):
    reply = raw(r, "INFO")
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    assert "# Server" in text
    assert "\r\n" in text
    parsed = r.info()
    assert isinstance(parsed, dict)
    assert "connected_clients" in parsed and int(parsed["connected_clients"]) >= 1
    assert isinstance(r.info("server"), dict)


def test_config_get(r):
    cfg = r.config_get("maxmemory*")
    assert isinstance(cfg, dict) and cfg
    assert "maxmemory" in cfg
    int(cfg["maxmemory"])
    assert all(fnmatch.fnmatchcase(k, "maxmemory*") for k in cfg)
    assert r.config_get("no-such-config-parameter-xyz") == {}


def test_select(r):
    assert r.execute_command("SELECT", 0) is True
    assert err(r, "SELECT", "abc") == "value is not an integer or out of range"
    assert err(r, "SELECT", 99999) == "DB index is out of range"


@pytest.mark.strata_only
def test_strata_select_nonzero_refused(r):
    assert err(r, "SELECT", 1) == "DB index is out of range"
    assert r.ping() is True


def test_client_name_and_id(r):
    assert raw(r, "CLIENT", "GETNAME") is None
    assert r.client_setname("compat-suite") is True
    assert raw(r, "CLIENT", "GETNAME") == b"compat-suite"
    cid = r.client_id()
    assert isinstance(cid, int) and cid > 0
    assert r.client_id() == cid                                 # same connection, same id
    other = make_client(2)
    try:
        assert other.client_id() != cid
    finally:
        other.close()
    assert err(r, "CLIENT", "SETNAME", "has space") == "Client names cannot contain spaces, newlines or special characters."


def test_client_setinfo(r, hello_info):
    if hello_info["server"] == "redis" and tuple(map(int, hello_info["version"].split(".")[:2])) < (7, 2):
        pytest.skip("CLIENT SETINFO needs Redis >= 7.2")
    assert r.execute_command("CLIENT", "SETINFO", "LIB-NAME", "compat-suite") in (True, b"OK", "OK")
    assert r.execute_command("CLIENT", "SETINFO", "LIB-VER", "1.2.3") in (True, b"OK", "OK")


def test_hello(r, proto):
    reply = as_map(r.execute_command("HELLO", proto))
    h = {s(k): v for k, v in reply.items()}
    for f in ("server", "version", "proto", "id", "mode", "role"):
        assert f in h, f
    assert h["proto"] == proto
    assert isinstance(h["id"], int) and h["id"] == r.client_id()
    assert s(h["mode"]) in ("standalone", "cluster")
    assert s(h["role"]) == "master"
    assert isinstance(s(h["server"]), str) and s(h["version"])
    msg = err(r, "HELLO", 4)
    assert msg.startswith("NOPROTO")


def test_command_count(r):
    n = raw(r, "COMMAND", "COUNT")
    assert isinstance(n, int) and n > 20


def test_unknown_command(r):
    msg = err(r, "NOSUCHCMD", "arg1")
    assert msg.startswith("unknown command")
    assert "'NOSUCHCMD'" in msg                    # Redis echoes the name as sent
    assert r.ping() is True                        # connection still usable


@pytest.mark.parametrize("args,name", [
    (("GET",), "get"), (("get",), "get"), (("GeT",), "get"),
    (("SET", "k"), "set"), (("STRLEN",), "strlen"), (("ECHO",), "echo"),
    (("ECHO", "a", "b"), "echo"), (("EXISTS",), "exists"), (("DEL",), "del"),
    (("TTL",), "ttl"), (("KEYS",), "keys"), (("MGET",), "mget"),
])
def test_wrong_arity(r, args, name):
    assert err(r, *args) == f"wrong number of arguments for '{name}' command"
    assert r.ping() is True


def test_quit(proto):
    sock = socket.create_connection((HOST, int(PORT)), timeout=10)
    try:
        f = sock.makefile("rb")
        if proto == 3:
            sock.sendall(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
            assert f.read(1) == b"%"                # RESP3 map
            # drain the rest of the map by asking PING afterwards and reading up to +PONG
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            buf = b""
            while not buf.endswith(b"+PONG\r\n"):
                chunk = f.read1(4096)
                assert chunk, "connection closed early"
                buf += chunk
        sock.sendall(b"*1\r\n$4\r\nQUIT\r\n")
        assert f.readline() == b"+OK\r\n"
        assert f.read() == b""                       # server closed the connection
    finally:
        sock.close()
    c = make_client(proto)
    assert c.execute_command("QUIT") is True
    c.close()


# --------------------------------------------------------------------------- pipelining

def test_pipeline_1000_mixed(r, prefix):
    g = rng(7)
    model = {}
    keys = [f"{prefix}k{i}".encode() for i in range(40)]
    pipe = r.pipeline(transaction=False)
    expected = []
    for i in range(1000):
        op = g.choice(["set", "set", "get", "get", "mget", "del", "exists", "strlen", "echo", "ping", "setnx", "err"])
        k = g.choice(keys)
        if op == "set":
            v = g.randbytes(g.randint(0, 64))
            pipe.set(k, v); model[k] = v; expected.append(True)
        elif op == "setnx":
            v = b"nx%d" % i
            pipe.set(k, v, nx=True)
            if k in model:
                expected.append(None)
            else:
                model[k] = v; expected.append(True)
        elif op == "get":
            pipe.get(k); expected.append(model.get(k))
        elif op == "mget":
            ks = g.sample(keys, 3)
            pipe.mget(ks); expected.append([model.get(x) for x in ks])
        elif op == "del":
            ks = g.sample(keys, 2)
            pipe.delete(*ks)
            expected.append(sum(1 for x in ks if model.pop(x, None) is not None))
        elif op == "exists":
            ks = [k, k, g.choice(keys)]
            pipe.exists(*ks); expected.append(sum(1 for x in ks if x in model))
        elif op == "strlen":
            pipe.strlen(k); expected.append(len(model.get(k, b"")))
        elif op == "echo":
            v = b"e%d\x00\r\n" % i
            pipe.echo(v); expected.append(v)
        elif op == "ping":
            pipe.ping(); expected.append(True)
        elif op == "err":
            pipe.execute_command("SET", k, b"v", "EX", "0")
            expected.append("invalid expire time in 'set' command")
    results = pipe.execute(raise_on_error=False)
    assert len(results) == 1000
    for i, (got, want) in enumerate(zip(results, expected)):
        if isinstance(want, str):
            assert isinstance(got, redis.ResponseError) and str(got) == want, (i, got)
        else:
            assert got == want, (i, got, want)
    assert r.mget(keys) == [model.get(k) for k in keys]


def test_pipeline_raw_burst(proto, prefix):
    """1000 commands written in one send, replies read back in order (no client library)."""
    k = (prefix + "raw").encode()
    parts = []
    if proto == 3:
        parts.append(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
    for i in range(500):
        v = b"%d" % i
        parts.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
        parts.append(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
    parts.append(b"*1\r\n$4\r\nQUIT\r\n")
    sock = socket.create_connection((HOST, int(PORT)), timeout=30)
    try:
        sock.sendall(b"".join(parts))
        buf = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        sock.close()
    want = b"".join(b"+OK\r\n$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(500)) + b"+OK\r\n"
    assert buf.endswith(want)
    if proto == 2:
        assert buf == want


# --------------------------------------------------------------------------- strata-only

@pytest.mark.strata_only
def test_strata_meta(r, prefix):
    k = prefix + "meta"
    v = rng(3).randbytes(4096)
    r.set(k, v)
    m = {s(a): b for a, b in as_map(r.execute_command("STRATA.META", k)).items()}
    for f in ("size", "tier", "created", "checksum"):
        assert f in m, (f, m)
    assert int(m["size"]) == len(v)
    # A missing key is nil, like GET (documented in docs/PROTOCOL.md).
    assert r.execute_command("STRATA.META", prefix + "missing") is None


@pytest.mark.strata_only
def test_strata_toolarge(proto, prefix):
    limit = os.environ.get("STRATA_MAX_VALUE_SIZE")
    if not limit:
        pytest.skip("set STRATA_MAX_VALUE_SIZE (bytes) to the server's max value size")
    k = prefix + "big"
    c = make_client(proto)
    try:
        with pytest.raises(redis.ResponseError) as ei:
            c.set(k, b"\x00" * (int(limit) + 1))
        assert str(ei.value).startswith("TOOLARGE"), str(ei.value)
    except redis.ConnectionError:
        pass  # server may drop the connection after refusing the payload
    finally:
        c.close()
    c = make_client(proto)
    try:
        assert c.ping() is True
        assert c.exists(k) == 0
    finally:
        c.close()
