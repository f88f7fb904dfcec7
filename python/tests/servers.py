"""Real strata-server (and etcd) processes for the tests, on free loopback
ports; everything started here is stopped by its owner's ``stop()``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
MAX_VALUE_BYTES = 8 << 20
START_ATTEMPTS = 5


def server_binary() -> Path:
    """``STRATA_SERVER_BIN``, else ``$CARGO_TARGET_DIR/debug/strata-server``."""
    explicit = os.environ.get("STRATA_SERVER_BIN")
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "strata-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """One raw RESP command; the first reply chunk."""
    payload = f"*{len(args)}\r\n".encode()
    for a in args:
        payload += f"${len(a.encode())}\r\n{a}\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(65536)


def wait_for(condition, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not true within {timeout} s")


def start_retrying(start_once) -> None:
    """Calls ``start_once()`` (pick ports, start, wait until ready; stop what
    it started if that fails) again while it fails because a port it picked
    was taken before the process bound it (another test's outgoing
    connection got it as its ephemeral port), as the Rust harness does."""
    for attempt in range(START_ATTEMPTS):
        try:
            start_once()
            return
        except Exception as e:
            if "address already in use" not in str(e).lower() or attempt + 1 == START_ATTEMPTS:
                raise


class Server:
    """One strata-server process."""

    def __init__(self, extra: Optional[List[str]] = None, pool: str = "256MiB") -> None:
        binary = server_binary()
        if not binary.exists():
            raise FileNotFoundError(f"{binary} missing: run `cargo build -p strata-server`")
        start_retrying(lambda: self._start_once(binary, pool, extra or []))

    def _start_once(self, binary: Path, pool: str, extra: List[str]) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="strata-server-", suffix=".log", delete=False)
        args = [
            str(binary),
            "--port", str(self.port),
            "--metrics-port", "0",
            "--data-port", "0",
            "--cpu-memory-pool-size", pool,
            "--max-value-size", str(MAX_VALUE_BYTES),
        ] + extra
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(self._ready, f"strata-server on port {self.port}")
        except Exception:
            self.stop()
            raise

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"strata-server exited:\n{self.log_text()}")
        return resp(self.port, "PING").startswith(b"+PONG")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


class Etcd:
    """A single-member etcd (Debian's etcd-server), data in a temp dir."""

    def __init__(self) -> None:
        binary = os.environ.get("STRATA_TEST_ETCD") or shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(binary).exists():
            raise FileNotFoundError("etcd not found (apt-get install etcd-server)")
        start_retrying(lambda: self._start_once(binary))

    def _start_once(self, binary: str) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="strata-etcd-")
        self.port = free_port()
        peer_port = free_port()
        while peer_port == self.port:
            peer_port = free_port()
        peer = f"http://127.0.0.1:{peer_port}"
        client = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="strata-etcd-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [
                binary, "--name", "default", "--data-dir", f"{self.dir.name}/data",
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"default={peer}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(self._healthy, "etcd healthy")
        except Exception:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            log = Path(self.log.name).read_text(errors="replace")
            raise RuntimeError(f"etcd exited:\n{log[-2000:]}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            return b'"health":"true"' in s.recv(4096)

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.dir.cleanup()
        os.unlink(self.log.name)
