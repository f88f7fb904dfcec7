"""redis-py with ``ssl=True`` and the Python SDK's ``tls_*`` settings
against a real strata-server's TLS port, with certificates made here by
the openssl CLI: client certificates required and presented, a client
without one refused, and a plaintext client on the TLS port told to use
TLS."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))

import strata  # noqa: E402
from servers import Server, free_port, resp, wait_for  # noqa: E402

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def issue(d: Path, name: str, ext: str) -> None:
    openssl(d, "req", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    (d / f"{name}.ext").write_text(ext)
    openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


@pytest.fixture(scope="module")
def certs():
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        openssl(d, "req", "-x509", *KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=strata test CA")
        issue(d, "node", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                         "extendedKeyUsage=serverAuth,clientAuth\n")
        # Also a server certificate for the SDK's data plane, which the
        # node dials to pull large PUTs.
        issue(d, "client", "subjectAltName=IP:127.0.0.1\n"
                           "extendedKeyUsage=serverAuth,clientAuth\n")
        yield d


@pytest.fixture(scope="module")
def tls_server(certs):
    tls_port = free_port()
    s = Server(extra=["--tls-port", str(tls_port),
                      "--tls-cert-file", str(certs / "node.crt"),
                      "--tls-key-file", str(certs / "node.key"),
                      "--tls-ca-cert-file", str(certs / "ca.crt")])
    s.tls_port = tls_port
    yield s
    s.stop()


def tls_client(certs: Path, port: int, with_cert: bool) -> redis.Redis:
    extra = {"ssl_certfile": str(certs / "client.crt"),
             "ssl_keyfile": str(certs / "client.key")} if with_cert else {}
    return redis.Redis(host="127.0.0.1", port=port, ssl=True,
                       ssl_ca_certs=str(certs / "ca.crt"), socket_timeout=5, **extra)


def test_redis_py_ssl_with_a_client_certificate(certs, tls_server):
    r = tls_client(certs, tls_server.tls_port, with_cert=True)
    wait_for(lambda: r.ping(), "PONG over TLS")
    value = bytes(range(256)) * 4096
    assert r.set("tls:big", value)
    assert r.get("tls:big") == value
    r.close()


def test_redis_py_without_a_certificate_is_refused(certs, tls_server):
    r = tls_client(certs, tls_server.tls_port, with_cert=False)
    with pytest.raises((redis.exceptions.ConnectionError, OSError)):
        r.ping()
    r.close()


def test_plaintext_client_on_the_tls_port_is_told_to_use_tls(tls_server):
    with socket.create_connection(("127.0.0.1", tls_server.tls_port), timeout=5) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"-ERR this port speaks TLS (tls_port)"), reply


@pytest.fixture(scope="module")
def tls_cluster_node(certs):
    """A node that advertises its TLS port (``tls_cluster yes``), so the SDK
    routes to it there, with payloads over the TLS data plane."""
    tls_port = free_port()
    s = Server(extra=["--tls-port", str(tls_port), "--tls-cluster", "yes",
                      "--tls-cert-file", str(certs / "node.crt"),
                      "--tls-key-file", str(certs / "node.key"),
                      "--tls-ca-cert-file", str(certs / "ca.crt"),
                      "--cma", "off"], pool="160MiB")
    s.tls_port = tls_port
    yield s
    s.stop()


def sdk(certs: Path, port: int, **tls) -> strata.Client:
    return strata.Client([f"127.0.0.1:{port}"], cma=False, timeout_ms=5000,
                         tls_ca_file=str(certs / "ca.crt"), tls_server_name="localhost", **tls)


def test_the_sdk_over_tls_moves_values_inline_and_by_the_tls_data_plane(certs, tls_cluster_node):
    identity = {"tls_cert_file": str(certs / "client.crt"), "tls_key_file": str(certs / "client.key")}
    port = tls_cluster_node.tls_port
    # With the command (the defaults' inline limits), then by the data
    # plane (limits 0): the node pulls each PUT from this client and the
    # client reads each GET from the node, both over TLS.
    for limits in ({}, {"inline_put_max_bytes": 0, "inline_get_max_bytes": 0}):
        with sdk(certs, port, **identity, **limits) as c:
            c.put("tls:small", b"v")
            assert c.get("tls:small") == b"v"
            for n in (1 << 20, 6 << 20):
                value = np.frombuffer(np.random.default_rng(n).bytes(n), dtype=np.uint8)
                c.put_from(f"tls:{n}", value)
                out = np.zeros(n, dtype=np.uint8)
                assert c.get_into(f"tls:{n}", out) == n
                assert (out == value).all(), f"{n} bytes changed over TLS ({limits})"
    served = int(resp(tls_cluster_node.port, "INFO", "stats").decode().split("data_reads_served:")[1].split()[0])
    assert served > 0, "no GET went by the TLS data plane"


def test_the_sdk_without_a_client_certificate_is_refused(certs, tls_cluster_node):
    with pytest.raises(strata.StrataError):
        sdk(certs, tls_cluster_node.tls_port).get("tls:small")


def test_sdk_tls_settings_without_a_ca_are_refused(certs):
    with pytest.raises(strata.InvalidArgumentError, match="tls_ca_file"):
        strata.Client(["127.0.0.1:1"], tls_cert_file=str(certs / "client.crt"),
                      tls_key_file=str(certs / "client.key"))
    with pytest.raises(strata.InvalidArgumentError, match="go together"):
        strata.Client(["127.0.0.1:1"], tls_ca_file=str(certs / "ca.crt"),
                      tls_cert_file=str(certs / "client.crt"))
