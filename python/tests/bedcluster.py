"""A strata cluster on the network bed (scripts/netbed.sh): etcd and three
nodes, each on a host of its own, started with the commands of
docs/OPERATIONS.md's "Cluster" section (read from the docs, as
tests/bed/cluster.sh does, with the bed's addresses in place of the
example ones); engines run on the bed's "prefill" and "decode" hosts.
Needs root (network namespaces). ``stop()`` takes the whole bed down."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

from servers import ROOT, server_binary

BED = ROOT / "scripts" / "netbed.sh"
PREFIX = os.environ.get("NETBED_PREFIX", "sbed-")
NODES = ("node1", "node2", "node3")
START_TIMEOUT_S = 60.0


def without_strata_settings(env) -> dict:
    """``env`` less the ``STRATA_*`` variables nodes and SDKs read as config."""
    return {k: v for k, v in env.items() if not k.startswith("STRATA_")}


def bed_ip(host: str) -> str:
    return subprocess.check_output([str(BED), "ip", host], text=True).strip()


def on(host: str, *cmd: str, timeout: float = 30.0) -> str:
    """Runs ``cmd`` on a bed host; its stdout."""
    return subprocess.run([str(BED), "exec", host, *cmd], capture_output=True, text=True,
                          timeout=timeout, check=True).stdout


def documented_commands() -> Dict[str, str]:
    """The etcd and strata-server lines of the docs' Cluster section."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    block = re.search(r"^## Cluster$.*?^```sh$\n(.*?)^```$", text, re.S | re.M).group(1)
    lines = block.splitlines()
    return {"etcd": next(l for l in lines if l.startswith("etcd ")),
            "node": next(l for l in lines if l.startswith("strata-server "))}


def on_bed(command: str, etcd_ip: str, own_ip: str = "") -> List[str]:
    """A documented command with the bed's addresses (10.0.0.1: etcd,
    10.0.0.11: the host's own)."""
    command = re.sub(r"10\.0\.0\.11(?![0-9])", own_ip, command)
    return shlex.split(re.sub(r"10\.0\.0\.1(?![0-9])", etcd_ip, command))


class BedCluster:
    """``node_args(host, work_dir)``: flags added to the documented node
    command on each node host (e.g. TLS files made in ``work_dir``, which
    ``prepare(work_dir)`` may fill first)."""

    def __init__(self, node_args: Callable[[str, str], List[str]] = lambda host, work: [],
                 prepare: Callable[[str], None] = lambda work: None) -> None:
        if os.geteuid() != 0:
            raise PermissionError("the network bed needs root (network namespaces)")
        self.work = tempfile.TemporaryDirectory(prefix="strata-bed-", dir="/var/tmp")
        self.procs: List[subprocess.Popen] = []
        self.node_args = node_args
        subprocess.run([str(BED), "up"], check=True, timeout=60)
        try:
            prepare(self.work.name)
        except BaseException:
            self.stop()
            raise
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        docs = documented_commands()
        self.etcd_ip = bed_ip("etcd")
        etcd = [a if a != "/var/lib/etcd" else f"{self.work.name}/etcd" for a in on_bed(docs["etcd"], self.etcd_ip)]
        self._spawn("etcd", etcd)
        # Healthy as seen from a node's host, across the bridge (etcdctl
        # reports on stderr; its exit status is the answer).
        self._wait("etcd", lambda: on("node1", "etcdctl", "--endpoints", f"http://{self.etcd_ip}:2379",
                                      "endpoint", "health") is not None)
        binary = str(server_binary())
        self.node_argv = {}
        for n in NODES:
            argv = on_bed(docs["node"], self.etcd_ip, bed_ip(n))
            self.node_argv[n] = [binary, *argv[1:], *self.node_args(n, self.work.name)]
            self._spawn(n, self.node_argv[n])
        self.wait_ring(3)
        self.seeds = f"{bed_ip('node1')}:7379"
        self.metadata_server = f"etcd://{self.etcd_ip}:2379"

    def _spawn(self, host: str, argv: List[str]) -> None:
        log = open(Path(self.work.name) / f"{host}.log", "ab")
        # The documented commands as a user runs them: no STRATA_* settings
        # of the caller's (a node reads them as config); the nodes' default
        # NVMe tier goes to TMPDIR, inside this run's dir.
        env = {**without_strata_settings(os.environ), "TMPDIR": self.work.name}
        self.procs.append(subprocess.Popen([str(BED), "exec", host, *argv], stdout=log,
                                           stderr=subprocess.STDOUT, env=env))

    def _wait(self, what: str, condition) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"bed: {what} not up within {START_TIMEOUT_S} s:\n{self.logs()}")

    def wait_ring(self, nodes: int) -> None:
        """Until every node's ring has ``nodes`` members."""
        for n in NODES:
            self._wait(f"{n}'s ring of {nodes}", lambda n=n: self.info(n).get("ring_nodes") == str(nodes))

    def wait_replicated(self) -> None:
        """Until no node has keys short of their copies."""
        self._wait("every key at replica_num copies", lambda: self.total("under_replicated_keys") == 0)

    def kill(self, node: str) -> None:
        """``kill -9`` of everything running on ``node``'s host."""
        pids = subprocess.run(["ip", "netns", "pids", f"{PREFIX}{node}"], capture_output=True,
                              text=True).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids])

    def restart(self, node: str) -> None:
        """Starts ``node`` again with its documented command."""
        self._spawn(node, self.node_argv[node])

    def info(self, node: str) -> Dict[str, str]:
        """A node's ``INFO``, asked from the decode host."""
        out = on("decode", "redis-cli", "-h", bed_ip(node), "-p", "7379", "INFO", "everything")
        return dict(l.split(":", 1) for l in out.replace("\r", "").splitlines() if ":" in l)

    def total(self, field: str) -> int:
        """``field`` of ``INFO``, summed over the nodes."""
        return sum(int(self.info(n).get(field, 0)) for n in NODES)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(Path(self.work.name).glob("*.log")))

    def stop(self) -> None:
        subprocess.run([str(BED), "down"], timeout=60)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.work.cleanup()
