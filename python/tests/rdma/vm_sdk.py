"""The Python SDK over RDMA READ, for real: run by scripts/rdma-test.sh
inside the soft-RoCE VM (rxe0 and rxe1, from SOFTROCE_* in the
environment), with the wheel built with the ``rdma`` feature on
PYTHONPATH and STRATA_SERVER_BIN a node built with it.

A node with ``protocol: rdma`` on one device and the SDK with
``protocol="rdma"`` on the other (cross-memory attach off: they share the
VM): values from inline sizes to 4 MiB are written and read back
byte-exact, as bytes and zero-copy from and into buffers (GETs by RDMA
READ); a TCP client
against the RDMA node gets the error that names the setting. Plain
asserts, no pytest (the VM has only Debian's python3). Exits non-zero on
the first failure.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time

import strata

# put_from's payloads are pulled by the node's RDMA READs of this process
# and GETs are RDMA READs of the node. From 8 MiB up a pulled PUT from the
# Python SDK timed out on soft-RoCE (issue #54's note): not covered yet.
SIZES = [100, 64 << 10, 1 << 20, 4 << 20]
PATIENCE_S = 60.0


def side(n: int) -> tuple:
    return os.environ[f"SOFTROCE_DEV{n}"], os.environ[f"SOFTROCE_IP{n}"]


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def start_node(dev: str, ip: str, log) -> tuple:
    port = free_port(ip)
    argv = [os.environ["STRATA_SERVER_BIN"], "--bind", ip, "--port", str(port), "--metrics-port", "0",
            "--data-port", "0", "--protocol", "rdma", "--device-name", dev,
            "--cpu-memory-pool-size", "256MiB", "--ssd-pool-size", "0", "--cma", "off"]
    node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            socket.create_connection((ip, port), timeout=0.2).close()
            return node, f"{ip}:{port}"
        except OSError:
            if node.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                sys.exit(f"rdma sdk: the node did not start:\n{log.read().decode(errors='replace')}")
            time.sleep(0.05)


def value(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def info(client: strata.Client) -> dict:
    text = client.info("everything")
    return dict(l.split(":", 1) for l in text.replace("\r", "").splitlines() if ":" in l)


def main() -> None:
    (dev0, ip0), (dev1, ip1) = side(0), side(1)
    with tempfile.TemporaryFile() as log:
        node, addr = start_node(dev1, ip1, log)
        try:
            run(addr, dev0, ip0)
        finally:
            node.kill()
            node.wait()
    print("rdma sdk: ok")


def run(addr: str, dev0: str, ip0: str) -> None:
    client = strata.Client(seeds=[addr], protocol="rdma", rdma_device=dev0, data_bind=f"{ip0}:0",
                           cma=False, timeout_ms=int(PATIENCE_S * 1000))
    for size in SIZES:
        key = f"rdma:{size}"
        client.put(key, value(key, size))
        assert client.get(key) == value(key, size), f"get of {size} bytes differs"
        src = bytearray(value(key + ":zc", size))
        dst = bytearray(size)
        client.put_from(key + ":zc", src)
        assert client.get_into(key + ":zc", dst) == size
        assert dst == src, f"get_into of {size} bytes differs"
        print(f"rdma sdk: {size} bytes byte-exact (put/get, put_from/get_into)")
    counted = {k: v.strip() for k, v in info(client).items() if k.startswith("transfer_") and "_rdma_" in k}
    print(f"rdma sdk: node's RDMA transfer counts: {counted}")
    client.close()
    tcp = strata.Client(seeds=[addr], cma=False, timeout_ms=10_000, retry_attempts=0)
    try:
        tcp.put("rdma:tcp-client", value("x", 32 << 20))
    except strata.StrataError as e:
        assert "set the client's protocol to rdma" in str(e), f"unclear error: {e}"
        print(f"rdma sdk: a TCP client is told: {e}")
    else:
        sys.exit("rdma sdk: a TCP client's zero-copy PUT to an RDMA node succeeded")
    finally:
        tcp.close()


if __name__ == "__main__":
    main()
