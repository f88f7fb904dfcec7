"""redis-py with ``ssl=True`` against a real strata-server's TLS port, with
certificates made here by the openssl CLI: client certificates required
and presented, a client without one refused, and a plaintext client on
the TLS port told to use TLS."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))

from servers import Server, free_port, wait_for  # noqa: E402

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
        issue(d, "client", "extendedKeyUsage=clientAuth\n")
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
