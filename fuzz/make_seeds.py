#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/. Rerun after editing;
the seeds are committed so a fresh checkout fuzzes from realistic inputs."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


DESC = b"tcp://127.0.0.1:7400/7f0012340000+1048576#9a3c01ee"
SRC = DESC + b"@17"

REQUESTS = {
    "ping": resp("PING"),
    "ping_inline": b"PING\r\n",
    "set_get": resp("SET", "user:42:name", "alice") + resp("GET", "user:42:name"),
    "set_px_nx": resp("SET", "k", "v", "PX", "1500", "NX"),
    "pipeline": resp("MSET", "a", "1", "b", "2") + resp("MGET", "a", "b", "c") + resp("DEL", "a"),
    "put_desc": resp("PUT", "blk:0", DESC, "TTL", "60000"),
    "get_desc": resp("GET", "blk:0", DESC),
    "mput": resp("MPUT", "k1", DESC, "k2", b"rdma://[fe80::1:2]:80/10+1#deadbeef"),
    "release_prefix": resp("RELEASE", "7", "8") + resp("PREFIX", "p0", "p1", "p2", "PIN", "500"),
    "inline_quoted": b"SET k \"a b\\x41\\n\" 'it\\'s'\r\nGET k\n",
    "empty_arrays": b"*0\r\n*-1\r\n\r\n" + resp("DBSIZE"),
    "oversize_then_ping": resp("SET", "k", b"v" * 101) + resp("PING"),
    "hello_auth": resp("HELLO", "3", "AUTH", "default", "pw") + resp("CLIENT", "SETNAME", "x"),
    "config_scan": resp("CONFIG", "GET", "max*") + resp("SCAN", "0", "MATCH", "user:*", "COUNT", "100"),
    "partial": resp("SET", "k", "0123456789")[:-5],
    "binary_value": resp("SET", b"\x00\xff", bytes(range(256))),
}

DESCRIPTORS = {
    "doc_example": SRC,
    "no_epoch": DESC,
    "rdma_name": b"rdma://node-1.example:1/0+0#00000000",
    "ipv6_max_addr": b"tcp://[::1]:65535/ffffffffffffffff+0#ffffffff@0",
    "max_len": b"tcp://h:7/0+18446744073709551615#0000000a@18446744073709551615",
    "ipv6_link": b"tcp://[fe80::1:2]:80/10+1#deadbeef",
    "leading_zeros": b"tcp://10.0.0.5:7380/0000abc+00010#0badf00d@0042",
    "underscore_host": b"tcp://store_a-1.local:7380/1000+4096#01020304@1",
    "range_overflow": b"tcp://h:80/1+18446744073709551615#00000000",
    "bad_port": b"tcp://h:65536/0+1#00000000",
    "trailing": b"tcp://h:80/10+1#00000000@17x",
    "upper_hex": b"tcp://h:80/1A+1#00000000",
}

CONFIGS = {
    "empty": "{}",
    "ports": '{"port": 7400, "metrics_port": 0, "data_port": 7401}',
    "sizes_text": '{"cpu_memory_pool_size": "256MiB", "max_value_size": "1MiB", "max_request_size": "4 GB"}',
    "sizes_num": '{"cpu_memory_pool_size": 268435456, "max_value_size": 1048576}',
    "full": """{
  "bind": "0.0.0.0",
  "port": 7379,
  "metrics_port": 9379,
  "data_port": 7380,
  "lease_ttl_ms": 5000,
  "max_leases": 4096,
  "cpu_memory_pool_size": "1GiB",
  "max_value_size": "512MiB",
  "max_request_size": "1GiB",
  "max_connections": 1024,
  "eviction_policy": "lru",
  "eviction_high_watermark": 0.95,
  "requirepass": "s3cret",
  "metadata_server": "standalone",
  "protocol": "tcp",
  "log_level": "info,strata_server=debug"
}""",
    "bad_values": '{"port": 70000, "cpu_memory_pool_size": "1KiB", "eviction_high_watermark": 2, "protocol": "rdma", "bogus": 1}',
    "ipv6_bind": '{"bind": "::1", "max_connections": "1000000"}',
    "log_filter": '{"log_level": "warn,strata_server[conn{peer=1}]=trace,/x.*y/=debug"}',
    "floats": '{"eviction_high_watermark": "0.5", "lease_ttl_ms": 1e3, "max_leases": 1.5}',
    "bools_nulls": '{"requirepass": true, "port": null}',
    "nested": '{"port": [1], "bind": {"a": 1}}',
    "same_port": '{"port": 9000, "metrics_port": 9000, "data_port": 9000}',
    "not_object": "[1, 2]",
}

# Pattern and key; the fuzz input is u16 LE pattern length, pattern, key.
GLOBS = {
    "star": (b"*", b"abc"),
    "user": (b"user:*:name", b"user:42:name"),
    "question": (b"h?llo", b"hello"),
    "class": (b"h[ae]llo", b"hallo"),
    "negated": (b"h[^e]llo", b"hello"),
    "range": (b"h[a-z]llo", b"hxllo"),
    "reversed_range": (b"h[b-a]llo", b"hallo"),
    "escapes": (b"a\\?c\\*", b"a?c*"),
    "hostile": (b"a*" * 20 + b"b", b"a" * 100),
    "unterminated": (b"key[abc", b"keyb"),
    "binary": (b"\xff*[\x00-\x05]", b"\xff\x10\x03"),
    "stars": (b"**a**?*", b"xxaxy"),
    "trailing_backslash": (b"abc\\", b"abc\\"),
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())


write("request_scan", REQUESTS)
write("descriptor", DESCRIPTORS)
write("config", CONFIGS)
write("glob", {n: len(p).to_bytes(2, "little") + p + k for n, (p, k) in GLOBS.items()})
