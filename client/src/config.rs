//! How a client reaches the cluster and which path each payload takes:
//! the settings, their defaults, and the measured reasons for them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use strata_rdma::Protocol;

/// How to reach the cluster and how hard to try.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// RESP addresses (`host:port`) of nodes to learn the slot map from;
    /// any one that answers is enough. A standalone node (or a plain Redis)
    /// is a cluster of one.
    pub seeds: Vec<String>,
    /// Where this client's data-plane listener binds; nodes connect to it to
    /// pull PUT payloads, so it must be reachable from them. `None`:
    /// `STRATA_DATA_BIND` if set, else the local address of the route to
    /// the first seed that has one, port 0 (127.0.0.1 for seeds on
    /// loopback; see `crate::route`).
    pub data_bind: Option<SocketAddr>,
    /// Host that nodes dial to reach the data plane, put in this client's
    /// descriptors instead of the bound address (needed when `data_bind` is
    /// `0.0.0.0`, e.g. in a container, where the nodes should dial another
    /// address than the route's). `None`: `STRATA_DATA_ADVERTISE` if set,
    /// else the route's address for a bind of `0.0.0.0`, else the bound
    /// address.
    pub data_advertise: Option<String>,
    /// Extra tries after the first: for `BUSY` and stale reads, for socket
    /// failures when `failover_enabled` is off, and the most `-MOVED`
    /// redirects followed in a row.
    pub retry_attempts: u32,
    /// Deadline for connecting, writing one request, and reading one reply.
    pub timeout: Duration,
    /// While a slot's owner is unreachable, serve reads from its replicas
    /// and retry writes on the new owner, for up to `failover_timeout_ms`.
    pub failover_enabled: bool,
    /// How long one operation keeps trying other nodes before it fails.
    /// Also bounds a connect attempt when failover is on.
    pub failover_timeout_ms: u64,
    /// How often the slot map is refreshed in the background and nodes
    /// that failed are probed again (0: never; refreshes still follow
    /// redirects and failures).
    pub health_check_interval_ms: u64,
    /// Data plane of this client; must match the nodes' `protocol` (their
    /// descriptors name it). RDMA needs the `rdma` feature.
    pub protocol: Protocol,
    /// With nodes on this host that offer it, move payloads by
    /// cross-memory attach (`process_vm_readv`) instead of `protocol`,
    /// where both sides are allowed to read each other (same user, same
    /// pid namespace). `false` keeps every node on `protocol`.
    pub cma: bool,
    /// Threads that copy one cross-memory read (a GET's value) of
    /// [`strata_rdma::cma::SPLIT_MIN_BYTES`] or more: the calling thread
    /// and `cma_lanes - 1` helpers, started on first use (1: the calling
    /// thread alone; at most [`strata_rdma::cma::LANES_MAX`]). Two speed up
    /// large reads where a core is free, and slow them where every core is
    /// busy (docs/bench-notes/cross-memory-attach.md).
    pub cma_lanes: usize,
    /// Zero-copy reads (`get_into`, `get_many`) of values up to this many
    /// bytes come back in the GET reply itself (`GET key desc INLINE n`),
    /// read from the socket straight into the buffer: one round trip and
    /// no lease, where a data-plane read would add a round trip. Batches
    /// ask at most [`BATCH_INLINE_GET_MAX`] (their larger values go faster
    /// spread over several data-plane connections than one after another
    /// on the command connection); over cross-memory attach or RDMA, whose
    /// reads are one copy with no round trip through the node's CPU, at
    /// most [`ONE_SIDED_INLINE_GET_MAX`]. 0: every value by the data plane.
    pub inline_get_max: u64,
    /// A single zero-copy GET over TCP into a destination of at least this
    /// many bytes (and at most `inline_get_max`) asks for the two halves
    /// of the value at once, each inline on its own command connection
    /// (`GET key desc INLINE n RANGE off len`), and checks that both came
    /// from one write: the inline counterpart of the data plane's split
    /// reads (`strata_rdma::tcp::SPLIT_PIECE_BYTES_MIN`). 0: never.
    pub split_get_min: u64,
    /// Zero-copy writes (`put_from`) of values up to this many bytes over
    /// TCP send the payload with the command (`SET key value`, written
    /// straight from the buffer, which the node streams into its arena):
    /// one round trip, where the node's pull from this client's data plane
    /// would add one. Never over cross-memory attach or RDMA. Batches
    /// (`put_many`) send such values as pipelined SETs in one write, which
    /// beat a pulled `MPUT` up to 1 MiB and tied at 4 MiB
    /// (docs/bench-notes/batches.md); larger values go in one `MPUT`
    /// whose payloads the node pulls. 0: every value by the data plane.
    pub inline_put_max: u64,
    /// Congestion control of this client's command connections and data
    /// plane (its senders: SET payloads, and PUT payloads the nodes pull):
    /// `None` or `auto` (CUBIC, else Reno, in place of a host default of
    /// BBR; any other host default kept), `host`, or a name such as
    /// `cubic`. Checked at connect. See `strata_rdma::sockopt` for why.
    pub tcp_congestion: Option<String>,
    /// Each exchange with a node polls its sockets for the reply instead
    /// of sleeping, until this long passes with nothing arriving (at most
    /// [`SPIN_MAX`]; a long reply keeps it spinning for up to 64 times
    /// this in all; at most a quarter of the cores spin at once per
    /// process). 0: off.
    /// Pays where waking an idle CPU is slow and a core is free; costs
    /// where the cores are busy (docs/bench-notes/waking-sleeping-cpus.md).
    ///
    /// [`SPIN_MAX`]: crate::SPIN_MAX
    pub spin_us: u64,
    /// Once a reply has begun to arrive (or a long request to drain), the
    /// exchange polls for the rest instead of sleeping between bursts,
    /// until this long passes with nothing arriving (at most
    /// [`SPIN_MAX`]; counted the same way as `spin_us`, which it extends
    /// and never shortens); the TCP data plane's reads (values above
    /// `inline_get_max`, the larger values of a batch) poll the same way.
    /// Costs a core only while a transfer is under way, never while
    /// waiting for a node to start answering. 0: off.
    /// Default [`DEFAULT_STREAM_SPIN_US`]
    /// (docs/bench-notes/polling-mid-transfer.md).
    ///
    /// [`SPIN_MAX`]: crate::SPIN_MAX
    /// [`DEFAULT_STREAM_SPIN_US`]: crate::DEFAULT_STREAM_SPIN_US
    pub stream_spin_us: u64,
    /// After a request that took at least 20 µs to write (a large PUT
    /// sent with its payload, a batch of them), the exchange polls for the
    /// reply for as long again as the write took, up to this many µs (at
    /// most [`SPIN_MAX`]), instead of sleeping while the node takes the
    /// payload in: a large call's wait for its reply is then no longer a
    /// wake-up. Likewise before a reply that may bring 80 KiB or more
    /// into the caller's buffers (a large GET, a batch of them): for as
    /// long as reading it at about 4 GB/s takes, up to this, while no more
    /// exchanges are in flight in the process than may poll at once (a
    /// quarter of its cores). Costs at most as much CPU as the transfer
    /// does, only around long ones. 0: off. Default
    /// [`DEFAULT_ECHO_SPIN_US`] (docs/bench-notes/polling-after-a-transfer.md).
    ///
    /// [`SPIN_MAX`]: crate::SPIN_MAX
    /// [`DEFAULT_ECHO_SPIN_US`]: crate::DEFAULT_ECHO_SPIN_US
    pub echo_spin_us: u64,
    /// Talk TLS to the nodes' RESP ports (their `tls_port`); `None`:
    /// plain TCP. Seeds and the addresses nodes advertise must then be
    /// TLS ports (a TLS cluster, `tls_cluster yes`, advertises them).
    pub tls: Option<TlsOptions>,
}

/// How the client speaks TLS to the nodes.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA certificates that sign the nodes' certificates.
    pub ca_file: PathBuf,
    /// PEM client certificate and its key, for nodes that ask for one
    /// (`tls_auth_clients yes` or `optional`).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the nodes' certificates must carry; `None`: the host of
    /// each node's address (an IP address or a DNS name).
    pub server_name: Option<String>,
}

/// See [`ClientConfig::inline_get_max`]. Over the TCP data plane a read's
/// extra round trip costs as much as moving a few hundred KiB: with CUBIC
/// on strata's sockets (`tcp_congestion: auto`), inline GETs were faster
/// than data-plane reads at 4 and 8 MiB, with 1 and 4 clients, and about
/// even at 16 MiB (docs/bench-notes/congestion-control.md).
pub const DEFAULT_INLINE_GET_MAX: u64 = 8 << 20;

/// The most a GET of a batch returns inline: 8 values of 1 MiB read over
/// several data-plane connections at once moved faster than inline one
/// after another (docs/bench-notes/inline-or-data-plane.md).
pub const BATCH_INLINE_GET_MAX: u64 = 256 * 1024;

/// See [`ClientConfig::split_get_min`]: never, by default. Under BBR one
/// loopback stream takes much longer to move a reply of 1 MiB than one of
/// 1020 KiB, which two halves on two connections get around; under CUBIC,
/// which `tcp_congestion: auto` puts in BBR's place, whole GETs of 1 and
/// 4 MiB were faster than halves (docs/bench-notes/ranged-gets.md). `1 << 20`
/// is the setting for a client that keeps BBR (`tcp_congestion: host`).
pub const DEFAULT_SPLIT_GET_MIN: u64 = 0;

/// See [`ClientConfig::inline_put_max`]: a `SET` beat a pulled `PUT` from
/// 16 KiB to 1 MiB (docs/bench-notes/inline-or-data-plane.md), and with
/// CUBIC on strata's sockets (`tcp_congestion: auto`) at 4 MiB too; at
/// 8 MiB and more it was faster with one client but slower with four,
/// whose large payloads hold the command connection they share
/// (docs/bench-notes/congestion-control.md).
pub const DEFAULT_INLINE_PUT_MAX: u64 = 4 << 20;

/// The most a GET returns inline where the read would go by cross-memory
/// attach or RDMA: a cross-memory read of 128 KiB already matches an
/// inline GET, and of 256 KiB beats it
/// (docs/bench-notes/inline-or-data-plane.md).
pub const ONE_SIDED_INLINE_GET_MAX: u64 = 64 * 1024;

impl ClientConfig {
    /// One seed.
    pub fn new(addr: impl Into<String>) -> Self {
        Self::with_seeds([addr])
    }

    pub fn with_seeds<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Self {
            seeds: seeds.into_iter().map(Into::into).collect(),
            data_bind: None,
            data_advertise: None,
            retry_attempts: 3,
            timeout: Duration::from_secs(30),
            failover_enabled: true,
            failover_timeout_ms: 5000,
            health_check_interval_ms: 2000,
            protocol: Protocol::Tcp,
            cma: true,
            cma_lanes: crate::DEFAULT_CMA_LANES,
            inline_get_max: DEFAULT_INLINE_GET_MAX,
            split_get_min: DEFAULT_SPLIT_GET_MIN,
            inline_put_max: DEFAULT_INLINE_PUT_MAX,
            tcp_congestion: None,
            spin_us: 0,
            stream_spin_us: crate::DEFAULT_STREAM_SPIN_US,
            echo_spin_us: crate::DEFAULT_ECHO_SPIN_US,
            tls: None,
        }
    }
}
