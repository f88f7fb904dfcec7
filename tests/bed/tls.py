"""A TLS cluster across the bed's hosts (scripts/netbed.sh).

The documented three-node cluster (docs/OPERATIONS.md "Cluster") with the
TLS flags of docs/OPERATIONS.md "TLS" added on every node: a certificate per
node naming its own address, client certificates required, ``tls_port``
beside the plaintext port and ``tls_cluster yes``, so nodes call each
other, copy replicas and advertise themselves over TLS, and the data plane
speaks TLS (``tls_data_plane``, on by default in a TLS cluster). The
plaintext port stays open only for this script's ``INFO`` checks.

From the engine hosts, over the TLS ports only:

- the Python SDK (``tls_*`` settings, from ``STRATA_TLS_*``) writes values
  of every path on "prefill" (inline, sent with the command, and large
  ones the node pulls from the client's TLS data plane) and reads each
  back byte-exact on "decode" (tests/bed/sdk_across_hosts.py);
- ``redis-cli --tls -c`` follows ``-MOVED`` to each key's owner;
- GETs above the SDK's inline limit were read from the nodes' data planes
  (``data_reads_served``), which with ``tls_data_plane yes`` speak TLS only;
- after ``kill -9`` of one node, every value is still read back from the
  two others (its replicas were copied over TLS).

    python tests/bed/tls.py    (root; STRATA_SERVER_BIN, STRATA_TEST_PYTHON with the SDK)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))

from bedcluster import BED, NODES, BedCluster, bed_ip, on, without_strata_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Beside the plaintext 7379 and the data plane on 7380 (port + 1).
TLS_PORT = 7390
KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
ENGINE_HOSTS = ("prefill", "decode")


def openssl(d: str, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def issue(d: str, name: str, ext: str) -> None:
    """``name``.crt and .key, signed by the CA in ``d``, with ``ext``."""
    openssl(d, "req", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    Path(d, f"{name}.ext").write_text(ext)
    openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


def make_certs(d: str) -> None:
    """As docs/OPERATIONS.md "TLS" makes them: a CA; per node a certificate
    naming its address; for the engines' SDKs one that is also a server
    certificate for their data planes (the nodes pull large PUTs from it)."""
    openssl(d, "req", "-x509", *KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=strata bed CA")
    both = "extendedKeyUsage=serverAuth,clientAuth\n"
    for n in NODES:
        issue(d, n, f"subjectAltName=IP:{bed_ip(n)}\n{both}")
    engines = ",".join(f"IP:{bed_ip(h)}" for h in ENGINE_HOSTS)
    issue(d, "engine", f"subjectAltName={engines}\n{both}")


def tls_flags(host: str, d: str) -> List[str]:
    return ["--tls-port", str(TLS_PORT), "--tls-cluster", "yes",
            "--tls-cert-file", f"{d}/{host}.crt", "--tls-key-file", f"{d}/{host}.key",
            "--tls-ca-cert-file", f"{d}/ca.crt"]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def sdk(bed: BedCluster, host: str, mode: str, seed: str) -> None:
    d = bed.work.name
    env = {**without_strata_settings(os.environ), "STRATA_TLS_CA_FILE": f"{d}/ca.crt",
           "STRATA_TLS_CERT_FILE": f"{d}/engine.crt", "STRATA_TLS_KEY_FILE": f"{d}/engine.key"}
    py = os.environ.get("STRATA_TEST_PYTHON", sys.executable)
    out = subprocess.run([str(BED), "exec", host, py, str(ROOT / "tests/bed/sdk_across_hosts.py"), mode,
                          f"{seed}:{TLS_PORT}", bed_ip(host)], env=env, capture_output=True,
                         text=True, timeout=300)
    check(out.returncode == 0, f"SDK {mode} on {host} over TLS:\n{out.stdout}{out.stderr}\n{bed.logs()}")
    print(f"{host}: {out.stdout.strip()}")


def redis_cli_follows_moved(bed: BedCluster) -> None:
    d = bed.work.name
    tls = ["--tls", "--cacert", f"{d}/ca.crt", "--cert", f"{d}/engine.crt", "--key", f"{d}/engine.key"]
    for i in range(6):
        key = f"bed:tls:cli:{i}"
        on("decode", "redis-cli", *tls, "-c", "-h", bed_ip("node1"), "-p", str(TLS_PORT), "SET", key, f"v{i}")
        got = on("decode", "redis-cli", *tls, "-c", "-h", bed_ip("node2"), "-p", str(TLS_PORT), "GET", key)
        check(got.strip() == f"v{i}", f"redis-cli --tls -c: {key} read back {got!r}")
    print("redis-cli --tls -c: SET and GET followed -MOVED over TLS")


def config(bed: BedCluster, node: str, key: str) -> str:
    out = on("decode", "redis-cli", "-h", bed_ip(node), "-p", "7379", "CONFIG", "GET", key)
    return out.split()[-1] if out.split() else ""


def main() -> None:
    bed = BedCluster(node_args=tls_flags, prepare=make_certs)
    try:
        for n in NODES:
            check(config(bed, n, "tls_data_plane") == "yes", f"{n}: tls_data_plane is not yes")
        sdk(bed, "prefill", "put", bed_ip("node1"))
        before = bed.total("data_reads_served")
        sdk(bed, "decode", "get", bed_ip("node2"))
        check(bed.total("data_reads_served") > before, "no GET went by the (TLS) data plane")
        redis_cli_follows_moved(bed)
        bed.wait_replicated()
        bed.kill("node3")
        for n in ("node1", "node2"):
            bed._wait(f"{n}'s ring of 2", lambda n=n: bed.info(n).get("ring_nodes") == "2")
        os.environ["BED_SDK_NODES"] = "2"
        sdk(bed, "decode", "get", bed_ip("node1"))
        print("tls bed: ok")
    finally:
        bed.stop()


if __name__ == "__main__":
    main()
