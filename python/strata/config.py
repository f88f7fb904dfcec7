"""How a :class:`strata.Client` reaches the cluster (``ClientConfig``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, List, Mapping, Sequence, Union

from .errors import InvalidArgumentError


@dataclass
class ClientConfig:
    """Settings of one client; the defaults are the Rust client's.

    ``seeds``: RESP addresses (``host:port``) of any nodes; the client learns
    the slot map from the first that answers (a standalone node is a
    cluster of one). ``data_bind``: where this client's data-plane listener
    binds (``ip:port``); nodes connect to it to pull PUT payloads, so it
    must be reachable from them. Empty (default): ``STRATA_DATA_BIND`` if
    set (also when this config comes from seeds alone), else the local
    address of the route to the first seed that has one, port 0
    (``127.0.0.1`` for seeds on loopback). ``data_advertise``: the host
    the nodes dial for it, put in this client's descriptors instead of the
    bound address; empty (default): ``STRATA_DATA_ADVERTISE`` if set, else
    the route's address when ``data_bind`` is ``0.0.0.0``, else the bound
    address. ``inline_max_bytes``: ``put`` sends values up to this size
    inline on the command connection (one round trip) and larger ones
    zero-copy. ``threads``: 0 (default): each calling thread drives the
    client's sockets itself while it waits, so a reply wakes it directly;
    1-64: that many tokio worker threads do, and run the data plane's
    sends of large PUT payloads in parallel.
    ``cma``: with nodes on this host, move payloads by cross-memory attach
    where both processes may (same user and pid namespace); ``False`` keeps
    every node on the network data plane. ``inline_get_max_bytes``:
    ``get_into`` and ``batch_get_into`` receive values up to this size in
    the GET reply itself, read straight into the buffer (one round trip,
    no lease) rather than by a data-plane read (for a batch at most 256 KiB;
    by cross-memory attach or RDMA at most 64 KiB); 0 sends every value by
    the data plane. ``inline_put_max_bytes``: over TCP, ``put_from`` of a
    value up to this size sends it with the command, straight from the
    buffer (one round trip), rather than having the node pull it; 0: every
    value pulled. ``tcp_congestion``: congestion control of this client's
    sockets: ``"auto"`` (CUBIC, else Reno, in place of a host default of
    BBR; any other host default kept), ``"host"``, or a name such as
    ``"cubic"``; checked at connect. ``cma_lanes``: threads that copy one cross-memory read of
    2 MiB or more (1: the calling thread alone; at most 16).
    ``split_get_min_bytes``: over TCP, ``get_into`` into a buffer of at
    least this size (up to ``inline_get_max_bytes``) asks for the value's
    two halves at once on two connections, and checks both are of one
    write; 0 (default): never (1 MiB helped under BBR).
    ``spin_us``: with ``threads=0``, a call polls its sockets instead of
    sleeping until this long (at most 1000 us) passes with nothing
    arriving (64 times this in all at most), so a quick reply, or a long
    one arriving in bursts, costs no sleep and wake-up; at most a quarter
    of the cores spin at once per process; 0 (default): never. Worth it only with idle cores (one caller per host).
    ``stream_spin_us``: once a reply has begun to arrive, a call polls for
    the rest instead of sleeping between its bursts, until this long (at
    most 1000 us) passes with nothing arriving; it costs a core only while
    a transfer runs. 50 (default); 0: never.
    ``echo_spin_us``: after a request that took 20 us or more to write (a
    large ``put_from`` sent with its payload, a batch of them), a call
    polls for the reply for as long again as the write took, up to this
    (at most 1000 us), instead of sleeping while the node takes the
    payload in; likewise before a reply of 80 KiB or more into the
    caller's buffers (a large ``get_into``), for as long as reading it at
    about 4 GB/s takes, while few calls are in flight in the process; it
    costs at most the CPU the transfer does. 200 (default); 0: never.
    ``gpu_staging_bytes``: pinned
    host memory (allocated on first use, two halves) through which CUDA
    tensors are staged; a CUDA value must fit one half.
    ``protocol``: the data plane, as the nodes' ``protocol``: ``"tcp"``
    (default) or ``"rdma"`` (RDMA READ over verbs; needs a wheel built with
    the ``rdma`` feature, see python/README.md, and ``data_bind`` or the
    route's address on the RDMA device). ``rdma_device``: the verbs device
    (``mlx5_0``, ``rxe0``; empty: the first active one with a RoCEv2 GID).
    ``rdma_fallback_tcp``: start on TCP, with one warning, where no RDMA
    device works (the nodes must then speak TCP too).
    ``tls_ca_file``: PEM CA certificates that sign the nodes' certificates;
    set, the client speaks TLS to the nodes' TLS ports (the seeds must be
    those ports: a cluster with ``tls_cluster yes`` advertises them) and,
    where the nodes use ``tls_data_plane``, on the data plane too; empty
    (default): plain TCP. ``tls_cert_file`` / ``tls_key_file``: this
    client's PEM certificate and key, for nodes that ask for one
    (``tls_auth_clients``) and for the node to pull PUTs from this client
    over TLS. ``tls_server_name``: the name the nodes' certificates must
    carry; empty: the host of each node's address.
    """

    seeds: List[str] = field(default_factory=lambda: ["127.0.0.1:7379"])
    data_bind: str = ""
    data_advertise: str = ""
    retry_attempts: int = 3
    timeout_ms: int = 30_000
    failover: bool = True
    failover_timeout_ms: int = 5_000
    health_check_interval_ms: int = 2_000
    threads: int = 0
    inline_max_bytes: int = 16 * 1024
    cma: bool = True
    inline_get_max_bytes: int = 8 * 1024 * 1024
    inline_put_max_bytes: int = 4 * 1024 * 1024
    tcp_congestion: str = "auto"
    cma_lanes: int = 2
    split_get_min_bytes: int = 0
    spin_us: int = 0
    stream_spin_us: int = 50
    echo_spin_us: int = 200
    gpu_staging_bytes: int = 128 * 1024 * 1024
    protocol: str = "tcp"
    rdma_device: str = ""
    rdma_fallback_tcp: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""

    @classmethod
    def from_env(cls, prefix: str = "STRATA_") -> "ClientConfig":
        """Reads ``STRATA_SEEDS`` (comma-separated), ``STRATA_DATA_BIND``,
        ``STRATA_TIMEOUT_MS``, ... (each field, upper-cased)."""
        values: dict = {}
        for f in fields(cls):
            raw = os.environ.get(prefix + f.name.upper())
            if raw is not None:
                values[f.name] = raw
        return cls.coerce(values)

    @classmethod
    def coerce(cls, config: "ConfigLike" = None, **overrides: Any) -> "ClientConfig":
        """A config from a ``ClientConfig``, a ``"host:port[,host:port]"``
        string, a list of seeds, or a mapping of field names."""
        if config is None:
            base: dict = {}
        elif isinstance(config, ClientConfig):
            base = {f.name: getattr(config, f.name) for f in fields(cls)}
        elif isinstance(config, str):
            base = {"seeds": config}
        elif isinstance(config, Mapping):
            base = dict(config)
        elif isinstance(config, Sequence):
            base = {"seeds": list(config)}
        else:
            raise InvalidArgumentError(
                f"config must be a ClientConfig, str, list or dict, not {type(config).__name__}"
            )
        base.update(overrides)
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(base) - set(known))
        if unknown:
            raise InvalidArgumentError(f"unknown config keys: {', '.join(unknown)}")
        out = cls()
        for name, value in base.items():
            setattr(out, name, _convert(name, value, known[name].type))
        return out


def _convert(name: str, value: Any, kind: Any) -> Any:
    try:
        if name == "seeds":
            seeds = value.split(",") if isinstance(value, str) else list(value)
            seeds = [str(s).strip() for s in seeds if str(s).strip()]
            if not seeds:
                raise ValueError("no seed address")
            return seeds
        if kind in ("bool", bool):
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind in ("int", int):
            n = int(value)
            if n < 0:
                raise ValueError("negative")
            return n
        return str(value)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"config {name}={value!r}: {e}") from None


ConfigLike = Union[ClientConfig, str, Sequence[str], Mapping[str, Any], None]
