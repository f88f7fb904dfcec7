//! Node configuration: `strata.json`, overridden by `STRATA_*` environment
//! variables, overridden by command-line flags; validated once at start
//! into [`Config`]. Every bad value is refused with a message that names the
//! key and the allowed range, and all bad values are reported together.
//!
//! Key names follow the reference system's `mooncake.json` where they mean
//! the same thing (`cpu_memory_pool_size`, `max_connections`, ...).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use serde::{Deserialize, Serialize};

/// One setting as it arrives: from JSON it may be a number or a string
/// ("256MiB"); from env and flags it is a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawValue {
    Num(f64),
    Str(String),
    Bool(bool),
}

impl RawValue {
    fn as_text(&self) -> String {
        match self {
            RawValue::Num(n) if n.fract() == 0.0 && n.abs() < 1e18 => format!("{}", *n as i64),
            RawValue::Num(n) => n.to_string(),
            RawValue::Str(s) => s.clone(),
            RawValue::Bool(b) => b.to_string(),
        }
    }
}

/// Every key a config file, a `STRATA_*` variable or a flag may set: the
/// flags of [`Cli`] other than `--config` and `--print-config`, so the list
/// cannot drift from what the node reads. Unknown keys are an error: a typo
/// must not silently leave a default in place.
pub fn keys() -> Vec<String> {
    Cli::command()
        .get_arguments()
        .map(|a| a.get_id().as_str())
        .filter(|id| !matches!(*id, "config" | "print_config" | "help" | "version"))
        .map(String::from)
        .collect()
}

/// Command-line flags; each also reads `STRATA_<KEY>`, and every one is a
/// key of strata.json (docs/OPERATIONS.md, "Configuration keys"). A flag
/// wins over the environment, which wins over the file.
#[derive(Debug, Parser)]
#[command(name = "strata-server", version, about = "strata KV-cache store node")]
pub struct Cli {
    /// Path to strata.json.
    #[arg(long, short = 'c', env = "STRATA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as JSON and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address of the RESP, data-plane and metrics listeners [default: 127.0.0.1].
    #[arg(long, env = "STRATA_BIND")]
    bind: Option<String>,
    /// RESP port [default: 7379]; unset data and metrics ports follow it.
    #[arg(long, env = "STRATA_PORT")]
    port: Option<String>,
    /// RESP port that speaks TLS; 0 = off [default: 0].
    #[arg(long, env = "STRATA_TLS_PORT")]
    tls_port: Option<String>,
    /// PEM certificate (chain) of the TLS port.
    #[arg(long, env = "STRATA_TLS_CERT_FILE")]
    tls_cert_file: Option<String>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "STRATA_TLS_KEY_FILE")]
    tls_key_file: Option<String>,
    /// PEM CA certificates that sign client and peer certificates.
    #[arg(long, env = "STRATA_TLS_CA_CERT_FILE")]
    tls_ca_cert_file: Option<String>,
    /// Client certificates: yes, no or optional [default: yes with a CA, else no].
    #[arg(long, env = "STRATA_TLS_AUTH_CLIENTS")]
    tls_auth_clients: Option<String>,
    /// Node-to-node calls over TLS, TLS port advertised [default: yes when port is 0, else no].
    #[arg(long, env = "STRATA_TLS_CLUSTER")]
    tls_cluster: Option<String>,
    /// The TCP data plane (payloads, replicas' copies) over TLS [default: as --tls-cluster; no with protocol rdma].
    #[arg(long, env = "STRATA_TLS_DATA_PLANE")]
    tls_data_plane: Option<String>,
    /// HTTP port of /metrics and /health; 0 disables [default: port + 2000].
    #[arg(long, env = "STRATA_METRICS_PORT")]
    metrics_port: Option<String>,
    /// Data-plane port peers read leased values from; 0 picks a free one [default: port + 1].
    #[arg(long, env = "STRATA_DATA_PORT")]
    data_port: Option<String>,
    /// How long a zero-copy GET pins a value for its reader, in ms [default: 5000].
    #[arg(long, env = "STRATA_LEASE_TTL_MS")]
    lease_ttl_ms: Option<String>,
    /// Leases one connection may hold; more get -BUSY [default: 4096].
    #[arg(long, env = "STRATA_MAX_LEASES")]
    max_leases: Option<String>,
    /// DRAM arena, e.g. 8GiB [default: 1GiB].
    #[arg(long, env = "STRATA_CPU_MEMORY_POOL_SIZE")]
    cpu_memory_pool_size: Option<String>,
    /// Fault the whole DRAM arena in at start, in the background [default: false].
    #[arg(long, env = "STRATA_CPU_MEMORY_PREFAULT")]
    cpu_memory_prefault: Option<String>,
    /// Largest value [default: 512MiB].
    #[arg(long, env = "STRATA_MAX_VALUE_SIZE")]
    max_value_size: Option<String>,
    /// GPU tier's device memory; needs --features cuda and a GPU [default: 0, none].
    #[arg(long, env = "STRATA_GPU_MEMORY_POOL_SIZE")]
    gpu_memory_pool_size: Option<String>,
    /// CUDA device ordinal of the GPU tier [default: 0].
    #[arg(long, env = "STRATA_GPU_DEVICE_ID")]
    gpu_device_id: Option<String>,
    /// Largest request, all arguments together [default: 1GiB].
    #[arg(long, env = "STRATA_MAX_REQUEST_SIZE")]
    max_request_size: Option<String>,
    /// Concurrent client connections [default: 1024].
    #[arg(long, env = "STRATA_MAX_CONNECTIONS")]
    max_connections: Option<String>,
    /// Node-wide budget for large requests being received [default: 2GiB].
    #[arg(long, env = "STRATA_MAX_BUFFERED_REQUESTS_SIZE")]
    max_buffered_requests_size: Option<String>,
    /// Which unpinned values go first when memory is short [default: lru].
    #[arg(long, env = "STRATA_EVICTION_POLICY")]
    eviction_policy: Option<String>,
    /// Pool fraction above which a write first evicts [default: 0.95].
    #[arg(long, env = "STRATA_EVICTION_HIGH_WATERMARK")]
    eviction_high_watermark: Option<String>,
    /// Password for AUTH (user default); empty = no auth.
    #[arg(long, env = "STRATA_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// etcd://host:port[,host:port] for a cluster; empty = standalone.
    #[arg(long, env = "STRATA_METADATA_SERVER")]
    metadata_server: Option<String>,
    /// PEM CA of etcd's certificate; set = etcd over TLS.
    #[arg(long, env = "STRATA_ETCD_CA_CERT_FILE")]
    etcd_ca_cert_file: Option<String>,
    /// PEM client certificate for etcd.
    #[arg(long, env = "STRATA_ETCD_CERT_FILE")]
    etcd_cert_file: Option<String>,
    /// PEM private key of --etcd-cert-file.
    #[arg(long, env = "STRATA_ETCD_KEY_FILE")]
    etcd_key_file: Option<String>,
    /// etcd user; empty = no etcd authentication.
    #[arg(long, env = "STRATA_ETCD_USER")]
    etcd_user: Option<String>,
    /// Password of --etcd-user (prefer the environment).
    #[arg(long, env = "STRATA_ETCD_PASSWORD", hide_env_values = true)]
    etcd_password: Option<String>,
    /// Nodes register under /strata/<cluster_name>/nodes/ [default: default].
    #[arg(long, env = "STRATA_CLUSTER_NAME")]
    cluster_name: Option<String>,
    /// Stable identity in the ring [default: <host_name>:<port>].
    #[arg(long, env = "STRATA_NODE_ID")]
    node_id: Option<String>,
    /// What other nodes and clients dial [default: the bind address].
    #[arg(long, env = "STRATA_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    /// Failure domain: copies go to distinct hosts first [default: the machine's hostname].
    #[arg(long, env = "STRATA_HOST_NAME")]
    host_name: Option<String>,
    /// Copies of each value, the owner's included, 1-8 [default: 1].
    #[arg(long, env = "STRATA_REPLICA_NUM")]
    replica_num: Option<String>,
    /// etcd lease of this node's record, in seconds [default: 5].
    #[arg(long, env = "STRATA_NODE_TTL_S")]
    node_ttl_s: Option<String>,
    /// Longest a node serves without fresh proof that it owns its slots; peers take over a dead or cut-off node's slots this long after they find it gone [default: 2000].
    #[arg(long, env = "STRATA_FENCE_MS")]
    fence_ms: Option<String>,
    /// Directory of the NVMe tier's files; empty = a temporary one, lost at stop.
    #[arg(long, env = "STRATA_SSD_PATH")]
    ssd_path: Option<String>,
    /// NVMe bytes under DRAM; 0 = no NVMe tier [default: 2GiB].
    #[arg(long, env = "STRATA_SSD_POOL_SIZE")]
    ssd_pool_size: Option<String>,
    /// Largest value kept on NVMe [default: 16MiB].
    #[arg(long, env = "STRATA_SSD_MAX_VALUE_SIZE")]
    ssd_max_value_size: Option<String>,
    /// NVMe I/O engine: psync or io_uring [default: psync].
    #[arg(long, env = "STRATA_SSD_ENGINE")]
    ssd_engine: Option<String>,
    /// Open NVMe files with O_DIRECT [default: true].
    #[arg(long, env = "STRATA_SSD_DIRECT_IO")]
    ssd_direct_io: Option<String>,
    /// DRAM for evicted values waiting for NVMe [default: 256MiB].
    #[arg(long, env = "STRATA_SSD_SPILL_QUEUE_SIZE")]
    ssd_spill_queue_size: Option<String>,
    /// Data plane: tcp, or rdma (needs --features rdma) [default: tcp].
    #[arg(long, env = "STRATA_PROTOCOL")]
    protocol: Option<String>,
    /// RDMA device (mlx5_0, rxe0); empty = the first usable one.
    #[arg(long, env = "STRATA_DEVICE_NAME")]
    device_name: Option<String>,
    /// With rdma: start on TCP with a warning when no device works [default: false].
    #[arg(long, env = "STRATA_RDMA_FALLBACK_TCP")]
    rdma_fallback_tcp: Option<String>,
    /// Same-host clients move payloads by cross-memory attach: auto or off [default: auto].
    #[arg(long, env = "STRATA_CMA")]
    cma: Option<String>,
    /// Threads that copy one cross-memory read of 2 MiB or more [default: 2].
    #[arg(long, env = "STRATA_CMA_LANES")]
    cma_lanes: Option<String>,
    /// Congestion control of the RESP and data-plane sockets: auto, host, or a name such as cubic [default: auto].
    #[arg(long, env = "STRATA_TCP_CONGESTION")]
    tcp_congestion: Option<String>,
    /// Threads of the async runtime; 0 = one per CPU core [default: 0].
    #[arg(long, env = "STRATA_WORKER_THREADS")]
    worker_threads: Option<String>,
    /// µs a connection polls for its next request before sleeping; 0 = off [default: 0].
    #[arg(long, env = "STRATA_BUSY_POLL_US")]
    busy_poll_us: Option<String>,
    /// µs a connection mid-transfer polls for the next bytes before sleeping; 0 = off [default: 50].
    #[arg(long, env = "STRATA_STREAM_POLL_US")]
    stream_poll_us: Option<String>,
    /// Most µs a connection polls for its next request after a long one, as long again as it took; 0 = off [default: 200].
    #[arg(long, env = "STRATA_ECHO_POLL_US")]
    echo_poll_us: Option<String>,
    /// Keyspace notifications, Redis' flags (e.g. KEA) [default: none].
    #[arg(long, env = "STRATA_NOTIFY_KEYSPACE_EVENTS")]
    notify_keyspace_events: Option<String>,
    /// Bytes of messages a subscriber may have waiting before it is cut off [default: 32MiB].
    #[arg(long, env = "STRATA_PUBSUB_OUTPUT_BUFFER_LIMIT")]
    pubsub_output_buffer_limit: Option<String>,
    /// ZMQ endpoint of vLLM-format KV events, e.g. tcp://*:5557 (bind) or tcp://router:5557 (connect) [default: none, off].
    #[arg(long, env = "STRATA_KV_EVENTS_ENDPOINT")]
    kv_events_endpoint: Option<String>,
    /// ZMQ ROUTER endpoint (bound) that replays recent KV-event batches by sequence number [default: none, off].
    #[arg(long, env = "STRATA_KV_EVENTS_REPLAY_ENDPOINT")]
    kv_events_replay_endpoint: Option<String>,
    /// Block changes waiting for the KV-event publisher; more are dropped and counted [default: 100000].
    #[arg(long, env = "STRATA_KV_EVENTS_QUEUE")]
    kv_events_queue: Option<String>,
    /// Topic frame of every KV-event message (llm-d reads the pod and model from it) [default: empty].
    #[arg(long, env = "STRATA_KV_EVENTS_TOPIC")]
    kv_events_topic: Option<String>,
    /// Tokens per block that KV events report: the engines' block (page) size [default: 16].
    #[arg(long, env = "STRATA_KV_EVENTS_BLOCK_SIZE")]
    kv_events_block_size: Option<String>,
    /// A tracing filter, e.g. debug or strata_server=debug [default: info].
    #[arg(long, env = "STRATA_LOG_LEVEL")]
    log_level: Option<String>,
}

impl Cli {
    fn overrides(&self) -> Vec<(&'static str, Option<&String>)> {
        vec![
            ("bind", self.bind.as_ref()),
            ("port", self.port.as_ref()),
            ("tls_port", self.tls_port.as_ref()),
            ("tls_cert_file", self.tls_cert_file.as_ref()),
            ("tls_key_file", self.tls_key_file.as_ref()),
            ("tls_ca_cert_file", self.tls_ca_cert_file.as_ref()),
            ("tls_auth_clients", self.tls_auth_clients.as_ref()),
            ("tls_cluster", self.tls_cluster.as_ref()),
            ("tls_data_plane", self.tls_data_plane.as_ref()),
            ("metrics_port", self.metrics_port.as_ref()),
            ("data_port", self.data_port.as_ref()),
            ("lease_ttl_ms", self.lease_ttl_ms.as_ref()),
            ("max_leases", self.max_leases.as_ref()),
            ("cpu_memory_pool_size", self.cpu_memory_pool_size.as_ref()),
            ("cpu_memory_prefault", self.cpu_memory_prefault.as_ref()),
            ("max_value_size", self.max_value_size.as_ref()),
            ("gpu_memory_pool_size", self.gpu_memory_pool_size.as_ref()),
            ("gpu_device_id", self.gpu_device_id.as_ref()),
            ("max_request_size", self.max_request_size.as_ref()),
            ("max_connections", self.max_connections.as_ref()),
            (
                "max_buffered_requests_size",
                self.max_buffered_requests_size.as_ref(),
            ),
            ("eviction_policy", self.eviction_policy.as_ref()),
            (
                "eviction_high_watermark",
                self.eviction_high_watermark.as_ref(),
            ),
            ("requirepass", self.requirepass.as_ref()),
            ("metadata_server", self.metadata_server.as_ref()),
            ("etcd_ca_cert_file", self.etcd_ca_cert_file.as_ref()),
            ("etcd_cert_file", self.etcd_cert_file.as_ref()),
            ("etcd_key_file", self.etcd_key_file.as_ref()),
            ("etcd_user", self.etcd_user.as_ref()),
            ("etcd_password", self.etcd_password.as_ref()),
            ("cluster_name", self.cluster_name.as_ref()),
            ("node_id", self.node_id.as_ref()),
            ("advertise_host", self.advertise_host.as_ref()),
            ("host_name", self.host_name.as_ref()),
            ("replica_num", self.replica_num.as_ref()),
            ("node_ttl_s", self.node_ttl_s.as_ref()),
            ("fence_ms", self.fence_ms.as_ref()),
            ("ssd_path", self.ssd_path.as_ref()),
            ("ssd_pool_size", self.ssd_pool_size.as_ref()),
            ("ssd_max_value_size", self.ssd_max_value_size.as_ref()),
            ("ssd_engine", self.ssd_engine.as_ref()),
            ("ssd_direct_io", self.ssd_direct_io.as_ref()),
            ("ssd_spill_queue_size", self.ssd_spill_queue_size.as_ref()),
            ("protocol", self.protocol.as_ref()),
            ("device_name", self.device_name.as_ref()),
            ("rdma_fallback_tcp", self.rdma_fallback_tcp.as_ref()),
            ("cma", self.cma.as_ref()),
            ("cma_lanes", self.cma_lanes.as_ref()),
            ("tcp_congestion", self.tcp_congestion.as_ref()),
            ("worker_threads", self.worker_threads.as_ref()),
            ("busy_poll_us", self.busy_poll_us.as_ref()),
            ("stream_poll_us", self.stream_poll_us.as_ref()),
            ("echo_poll_us", self.echo_poll_us.as_ref()),
            (
                "notify_keyspace_events",
                self.notify_keyspace_events.as_ref(),
            ),
            (
                "pubsub_output_buffer_limit",
                self.pubsub_output_buffer_limit.as_ref(),
            ),
            ("kv_events_endpoint", self.kv_events_endpoint.as_ref()),
            (
                "kv_events_replay_endpoint",
                self.kv_events_replay_endpoint.as_ref(),
            ),
            ("kv_events_queue", self.kv_events_queue.as_ref()),
            ("kv_events_topic", self.kv_events_topic.as_ref()),
            ("kv_events_block_size", self.kv_events_block_size.as_ref()),
            ("log_level", self.log_level.as_ref()),
        ]
    }
}

/// The validated, effective configuration.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Config {
    pub bind: IpAddr,
    /// 0: no plaintext RESP port (then `tls_port` is set).
    pub port: u16,
    /// 0: no TLS port. See `crate::tls`.
    pub tls_port: u16,
    /// Empty unless `tls_port` or `tls_cluster` is set.
    pub tls_cert_file: String,
    pub tls_key_file: String,
    /// Empty: clients are not asked for certificates, and with no CA to
    /// check peers by, `tls_cluster` cannot be on.
    pub tls_ca_cert_file: String,
    /// `yes`, `no` or `optional` (resolved at load: never empty).
    pub tls_auth_clients: String,
    /// Peers are called over TLS on their TLS port, which is the RESP
    /// address this node advertises (in etcd, `CLUSTER SLOTS`, `-MOVED`).
    pub tls_cluster: bool,
    /// The data-plane listener speaks TLS (descriptors say `tls`) and
    /// plaintext (`tcp`) descriptors are refused. See `crate::tls`.
    pub tls_data_plane: bool,
    pub metrics_port: u16,
    pub data_port: u16,
    pub lease_ttl_ms: u64,
    pub max_leases: u32,
    pub cpu_memory_pool_size: u64,
    /// Fault the arena in on a background thread at start (`prefault`).
    pub cpu_memory_prefault: bool,
    /// 0: no GPU tier.
    pub gpu_memory_pool_size: u64,
    pub gpu_device_id: u32,
    pub max_value_size: u64,
    pub max_request_size: u64,
    pub max_connections: u32,
    /// Node-wide bound on request bytes buffered beyond each connection's
    /// first MiB.
    pub max_buffered_requests_size: u64,
    pub eviction_policy: String,
    pub eviction_high_watermark: f64,
    #[serde(serialize_with = "redact")]
    pub requirepass: Option<String>,
    /// etcd endpoints (`http://host:port`, `https://` with
    /// `etcd_ca_cert_file`); empty when standalone.
    pub metadata_server: Vec<String>,
    /// See `crate::services::etcd_conn`.
    pub etcd_ca_cert_file: String,
    pub etcd_cert_file: String,
    pub etcd_key_file: String,
    pub etcd_user: String,
    #[serde(serialize_with = "redact")]
    pub etcd_password: Option<String>,
    pub cluster_name: String,
    pub node_id: String,
    pub advertise_host: String,
    pub host_name: String,
    pub replica_num: u32,
    pub node_ttl_s: u32,
    /// See `crate::cluster::fence`.
    pub fence_ms: u64,
    /// Empty: a temporary directory (nothing survives a restart).
    pub ssd_path: String,
    /// 0: no NVMe tier.
    pub ssd_pool_size: u64,
    pub ssd_max_value_size: u64,
    pub ssd_engine: String,
    pub ssd_direct_io: bool,
    pub ssd_spill_queue_size: u64,
    pub protocol: String,
    /// RDMA device (`rxe0`, `mlx5_0`); empty auto-detects.
    pub device_name: String,
    /// With `protocol: rdma`, start on TCP (one warning) instead of failing
    /// when no RDMA device works. Off by default: a node silently on TCP
    /// is a performance incident nobody asked for.
    pub rdma_fallback_tcp: bool,
    /// `auto`: offer cross-memory attach to clients on this host that prove
    /// it works (`STRATA.CMA`); `off`: never.
    pub cma: String,
    /// Threads that copy one cross-memory read (a PUT's payload, a
    /// replica's copy) of `strata_rdma::cma::SPLIT_MIN_BYTES` or more.
    pub cma_lanes: u32,
    /// Congestion control of the RESP and data-plane sockets: `auto` (CUBIC,
    /// else Reno, in place of a host default of BBR; any other host default
    /// kept), `host`, or a name (checked at start: available and allowed).
    /// See `strata_rdma::sockopt`.
    pub tcp_congestion: String,
    /// Async runtime threads; 0: one per CPU core.
    pub worker_threads: u32,
    /// See `crate::busy_poll`; 0: off.
    pub busy_poll_us: u32,
    /// See `crate::busy_poll`; 0: off.
    pub stream_poll_us: u32,
    /// See `crate::busy_poll`; 0: off.
    pub echo_poll_us: u32,
    /// Keyspace notification flags at start, normalized (`CONFIG SET`
    /// changes the live ones, in `Node::pubsub`).
    pub notify_keyspace_events: String,
    pub pubsub_output_buffer_limit: u64,
    /// Empty: no KV-event publisher (see `crate::kv_events`).
    pub kv_events_endpoint: String,
    /// Empty: no replay socket.
    pub kv_events_replay_endpoint: String,
    /// Bound of the queue between the store and the publisher, in changes.
    pub kv_events_queue: u64,
    pub kv_events_topic: String,
    pub kv_events_block_size: u32,
    pub log_level: String,
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn redact<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if v.is_some() { "<set>" } else { "" })
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// The arena must hold at least a few slabs to be useful.
const MIN_POOL: u64 = 4 * MIB;
/// A sanity bound, far above any single machine's DRAM today.
const MAX_POOL: u64 = 64 * TIB;
/// Redis' own proto-max-bulk-len default; values past this are refused.
const DEFAULT_MAX_VALUE: u64 = 512 * MIB;
/// Redis' client-query-buffer-limit default.
const DEFAULT_MAX_REQUEST: u64 = GIB;
/// The NVMe tier a node gets without configuration: small enough for any
/// developer machine's temp directory.
const DEFAULT_SSD_POOL: u64 = 2 * GIB;
/// KV-cache blocks are KiBs to a few MiBs. foyer keeps two blocks (each the
/// size of the largest value) in DRAM as write buffers, so this is kept
/// well below `max_value_size`.
const DEFAULT_SSD_MAX_VALUE: u64 = 16 * MIB;
const DEFAULT_SPILL_QUEUE: u64 = 256 * MIB;
/// A reader needs at least a round trip and a transfer.
const MIN_LEASE_MS: u64 = 100;
/// A lease pins memory; ten minutes is far beyond any transfer.
const MAX_LEASE_MS: u64 = 600_000;
/// Each lease is a small table entry plus a pinned value.
const MAX_LEASES_LIMIT: u64 = 1_000_000;
/// Bounded by file descriptors, not by strata itself.
const MAX_CONNECTIONS_LIMIT: u64 = 1_000_000;
/// vLLM's `max_queue_size` default; 16 bytes a change.
const DEFAULT_KV_EVENTS_QUEUE: u64 = 100_000;
/// 16 bytes a change: at most 256 MiB queued.
const MAX_KV_EVENTS_QUEUE: u64 = 16_000_000;
/// A topic is one frame of every message: keep it a label.
const MAX_KV_EVENTS_TOPIC: usize = 256;
/// Beyond any engine's block or page size.
const MAX_KV_EVENTS_BLOCK_SIZE: u64 = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: IpAddr::from([127, 0, 0, 1]),
            port: 7379,
            tls_port: 0,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_ca_cert_file: String::new(),
            tls_auth_clients: String::new(),
            tls_cluster: false,
            tls_data_plane: false,
            metrics_port: 9379,
            data_port: 7380,
            lease_ttl_ms: 5_000,
            max_leases: 4096,
            cpu_memory_pool_size: GIB,
            cpu_memory_prefault: false,
            gpu_memory_pool_size: 0,
            gpu_device_id: 0,
            max_value_size: DEFAULT_MAX_VALUE,
            max_request_size: DEFAULT_MAX_REQUEST,
            max_connections: 1024,
            max_buffered_requests_size: 2 * GIB,
            eviction_policy: "lru".into(),
            eviction_high_watermark: 0.95,
            requirepass: None,
            metadata_server: Vec::new(),
            etcd_ca_cert_file: String::new(),
            etcd_cert_file: String::new(),
            etcd_key_file: String::new(),
            etcd_user: String::new(),
            etcd_password: None,
            cluster_name: "default".into(),
            node_id: String::new(),
            advertise_host: String::new(),
            host_name: String::new(),
            replica_num: 1,
            node_ttl_s: 5,
            fence_ms: 2000,
            ssd_path: String::new(),
            ssd_pool_size: DEFAULT_SSD_POOL,
            ssd_max_value_size: DEFAULT_SSD_MAX_VALUE,
            ssd_engine: "psync".into(),
            ssd_direct_io: true,
            ssd_spill_queue_size: DEFAULT_SPILL_QUEUE,
            protocol: "tcp".into(),
            device_name: String::new(),
            rdma_fallback_tcp: false,
            cma: "auto".into(),
            cma_lanes: strata_rdma::cma::DEFAULT_LANES as u32,
            tcp_congestion: strata_rdma::sockopt::AUTO.into(),
            worker_threads: 0,
            busy_poll_us: 0,
            stream_poll_us: strata_rdma::spin::STREAM_US_DEFAULT as u32,
            echo_poll_us: strata_rdma::spin::ECHO_US_DEFAULT as u32,
            notify_keyspace_events: String::new(),
            pubsub_output_buffer_limit: 32 * MIB,
            kv_events_endpoint: String::new(),
            kv_events_replay_endpoint: String::new(),
            kv_events_queue: DEFAULT_KV_EVENTS_QUEUE,
            kv_events_topic: String::new(),
            kv_events_block_size: 16,
            log_level: "info".into(),
        }
    }
}

/// Parses "1048576", "512MiB", "4GB", "64 KiB". Binary (KiB, MiB, GiB, TiB,
/// and K, M, G, T) and decimal (KB, MB, GB, TB) suffixes, case-insensitive.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Human form of a byte count for messages.
pub fn show_size(n: u64) -> String {
    for (unit, size) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    format!("{n}")
}

/// Loads file, env and flags, and validates. The error lists every problem.
pub fn load(cli: &Cli) -> Result<Config, String> {
    let mut raw: Vec<(String, RawValue)> = Vec::new();
    if let Some(path) = &cli.config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("config file {}: {e}", path.display()))?;
        raw = parse_file(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    }
    for (key, value) in cli.overrides() {
        if let Some(v) = value {
            raw.push((key.to_string(), RawValue::Str(v.clone())));
        }
    }
    validate(&raw)
}

/// Ports not set follow the RESP port, so `--port N` alone is enough for
/// each of several nodes on one machine: data plane `N + 1`, metrics
/// `N + 2000` (the defaults 7380 and 9379 for 7379).
fn follow_port(cfg: &mut Config, data_set: bool, metrics_set: bool) -> Result<(), String> {
    // With the plaintext port off, the TLS port is the one they follow.
    let base = if cfg.port == 0 {
        cfg.tls_port
    } else {
        cfg.port
    };
    let derive = |offset: u32, key: &str| -> Result<u16, String> {
        u16::try_from(u32::from(base) + offset).map_err(|_| {
            format!("{key}: port {base} + {offset} is past 65535; set {key} explicitly")
        })
    };
    if !data_set {
        cfg.data_port = derive(DATA_PORT_OFFSET, "data_port")?;
    }
    if !metrics_set {
        cfg.metrics_port = derive(METRICS_PORT_OFFSET, "metrics_port")?;
    }
    Ok(())
}

/// The data plane's port above the RESP port, when not set.
pub const DATA_PORT_OFFSET: u32 = 1;
/// The metrics port above the RESP port, when not set.
pub const METRICS_PORT_OFFSET: u32 = 2000;

/// Parses strata.json into (key, value) pairs in file order.
pub fn parse_file(text: &str) -> Result<Vec<(String, RawValue)>, String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let mut out = Vec::new();
    for (k, v) in map {
        let raw: RawValue = serde_json::from_value(v.clone())
            .map_err(|_| format!("{k}: expected a number, string or boolean, got {v}"))?;
        out.push((k, raw));
    }
    Ok(out)
}

/// Applies settings in order (later wins) over the defaults.
pub fn validate(raw: &[(String, RawValue)]) -> Result<Config, String> {
    let mut cfg = Config::default();
    let mut errors = Vec::new();
    for (key, value) in raw {
        if let Err(e) = apply(&mut cfg, key, &value.as_text()) {
            errors.push(format!("{key}: {e}"));
        }
    }
    let set = |name: &str| raw.iter().any(|(k, _)| k == name);
    crate::tls::resolve(
        &mut cfg,
        set("tls_cluster"),
        set("tls_data_plane"),
        &mut errors,
    );
    if let Err(e) = follow_port(&mut cfg, set("data_port"), set("metrics_port")) {
        errors.push(e);
    }
    if cfg.max_value_size > cfg.max_request_size {
        errors.push(format!(
            "max_value_size: {} is larger than max_request_size {} (a value must fit in a request)",
            show_size(cfg.max_value_size),
            show_size(cfg.max_request_size)
        ));
    }
    if cfg.max_buffered_requests_size < cfg.max_request_size {
        errors.push(format!(
            "max_buffered_requests_size: {} is smaller than max_request_size {} (a request of the largest allowed size could never be buffered)",
            show_size(cfg.max_buffered_requests_size),
            show_size(cfg.max_request_size)
        ));
    }
    if cfg.data_port != 0
        && (cfg.data_port == cfg.port
            || cfg.data_port == cfg.metrics_port
            || cfg.data_port == cfg.tls_port)
    {
        errors.push(format!(
            "data_port: {} is already used by port, tls_port or metrics_port; use another port or 0",
            cfg.data_port
        ));
    }
    if cfg.ssd_pool_size != 0 {
        let need = strata_tiering::nvme::MIN_BLOCKS
            * strata_tiering::nvme::block_bytes(
                cfg.ssd_max_value_size + strata_tiering::spill::HEADER_BYTES,
            );
        if cfg.ssd_pool_size < need {
            errors.push(format!(
                "ssd_pool_size: {} is below {} ({} blocks sized for ssd_max_value_size {}); raise it, lower ssd_max_value_size, or use 0 for no NVMe tier",
                show_size(cfg.ssd_pool_size),
                show_size(need),
                strata_tiering::nvme::MIN_BLOCKS,
                show_size(cfg.ssd_max_value_size)
            ));
        }
    }
    check_kv_events(&cfg, &mut errors);
    if cfg.metrics_port != 0 && cfg.metrics_port == cfg.port {
        errors.push(format!(
            "metrics_port: {} is the same as port; use another port or 0 to disable",
            cfg.metrics_port
        ));
    }
    if cfg.metrics_port != 0 && cfg.metrics_port == cfg.tls_port {
        errors.push(format!(
            "metrics_port: {} is the same as tls_port; use another port or 0 to disable",
            cfg.metrics_port
        ));
    }
    if errors.is_empty() {
        crate::tls::check_files(&cfg)?;
        crate::services::etcd_conn::check(&cfg)?;
        cfg.fill_derived();
        reachable_off_host(&cfg)?;
        Ok(cfg)
    } else {
        Err(format!("invalid configuration:\n  {}", errors.join("\n  ")))
    }
}

/// The KV-event keys that only make sense together.
fn check_kv_events(cfg: &Config, errors: &mut Vec<String>) {
    let (pub_, replay) = (&cfg.kv_events_endpoint, &cfg.kv_events_replay_endpoint);
    if pub_.is_empty() && !replay.is_empty() {
        errors.push(
            "kv_events_replay_endpoint: set, but kv_events_endpoint is empty (the replay socket replays what the publisher sent; set both or neither)"
                .into(),
        );
    }
    if !pub_.is_empty() && pub_ == replay {
        errors.push(format!(
            "kv_events_replay_endpoint: {replay:?} is also kv_events_endpoint; give each its own port"
        ));
    }
}

fn size_in(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = parse_size(text).ok_or_else(|| {
        format!(
            "{text:?} is not a size (use bytes or a suffix: KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    })?;
    if n < min || n > max {
        return Err(format!(
            "{} is out of range (allowed {} ..= {})",
            show_size(n),
            show_size(min),
            show_size(max)
        ));
    }
    Ok(n)
}

fn boolean(text: &str) -> Result<bool, String> {
    match text.trim() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("{text:?} is not a boolean (true or false)")),
    }
}

fn int_in(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number (allowed {min} ..= {max})"))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range (allowed {min} ..= {max})"));
    }
    Ok(n)
}

/// A runtime of more threads than this is a typo, not a tuning.
const WORKER_THREADS_MAX: u64 = 1024;

/// Copies of a value beyond this cost more than they protect.
const MAX_REPLICAS: u64 = 8;

/// `etcd://host:port[,host:port...]` → `http://host:port` endpoints.
fn parse_metadata_server(v: &str) -> Result<Vec<String>, String> {
    if v.is_empty() || v == "standalone" {
        return Ok(Vec::new());
    }
    let Some(list) = v.strip_prefix("etcd://") else {
        return Err(format!(
            "{v:?} is not supported (use etcd://host:port[,host:port], or empty for standalone)"
        ));
    };
    let mut out = Vec::new();
    for ep in list.split(',') {
        let ok = ep
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            return Err(format!("{ep:?} in {v:?} is not host:port"));
        }
        out.push(format!("http://{ep}"));
    }
    Ok(out)
}

/// A node that joins a cluster through an etcd on another host registers
/// its advertised address for peers and clients on other hosts: a loopback
/// bind or advertise address would send each of them to itself, so such a
/// node refuses to start rather than join unreachable. A name is looked up
/// here (Debian maps the machine's own hostname to 127.0.1.1, which makes
/// the default `advertise_host` under `--bind 0.0.0.0` loopback there); one
/// that does not resolve is left to the peers, which may know it.
fn reachable_off_host(cfg: &Config) -> Result<(), String> {
    let Some(remote) = cfg
        .metadata_server
        .iter()
        .find(|ep| !host_is_loopback(endpoint_host(ep)))
    else {
        return Ok(());
    };
    let advertise_lo = host_is_loopback(&cfg.advertise_host);
    if !cfg.bind.is_loopback() && !advertise_lo {
        return Ok(());
    }
    let what = if cfg.bind.is_loopback() {
        format!("binds {}", cfg.bind)
    } else {
        format!("advertises {}", cfg.advertise_host)
    };
    Err(format!(
        "invalid configuration:\n  advertise_host: the cluster's etcd {} is on another host, but this node {what}, a loopback address that peers and clients there cannot reach; start it with --bind 0.0.0.0 (or an address of this host) and --advertise-host <this host's address the others dial> (keys bind and advertise_host, STRATA_BIND and STRATA_ADVERTISE_HOST)",
        remote.trim_start_matches("http://")
    ))
}

/// `http://host:port` → `host` (brackets of an IPv6 literal removed).
fn endpoint_host(endpoint: &str) -> &str {
    let hostport = endpoint.trim_start_matches("http://");
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Whether every address `host` names is a loopback address.
fn host_is_loopback(host: &str) -> bool {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    if host.eq_ignore_ascii_case("localhost") || host.ends_with(".localhost") {
        return true;
    }
    use std::net::ToSocketAddrs;
    let Ok(addrs) = (host, 0).to_socket_addrs() else {
        return false;
    };
    let mut any = false;
    for addr in addrs {
        if !addr.ip().is_loopback() {
            return false;
        }
        any = true;
    }
    any
}

/// Ids and names go into etcd keys and CLUSTER NODES lines: keep them
/// printable, without separators.
fn name(v: &str, allow_empty: bool) -> Result<String, String> {
    let ok = v.len() <= 128
        && (allow_empty || !v.is_empty())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if !ok {
        return Err(format!(
            "{v:?} must be 1 to 128 characters of letters, digits, '-', '_', '.', ':'"
        ));
    }
    Ok(v.into())
}

fn path(v: &str) -> Result<String, String> {
    if v.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    Ok(v.into())
}

fn apply(cfg: &mut Config, key: &str, v: &str) -> Result<(), String> {
    match key {
        "bind" => {
            cfg.bind = v
                .trim()
                .parse()
                .map_err(|_| format!("{v:?} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)"))?
        }
        "port" => cfg.port = int_in(v, 0, 65535)? as u16,
        "tls_port" => cfg.tls_port = int_in(v, 0, 65535)? as u16,
        "tls_cert_file" => cfg.tls_cert_file = path(v)?,
        "tls_key_file" => cfg.tls_key_file = path(v)?,
        "tls_ca_cert_file" => cfg.tls_ca_cert_file = path(v)?,
        "tls_auth_clients" => {
            if !["yes", "no", "optional"].contains(&v) {
                return Err(format!("{v:?} is not allowed (yes, no or optional)"));
            }
            cfg.tls_auth_clients = v.into();
        }
        "tls_cluster" => cfg.tls_cluster = boolean(v)?,
        "tls_data_plane" => cfg.tls_data_plane = boolean(v)?,
        "etcd_ca_cert_file" => cfg.etcd_ca_cert_file = path(v)?,
        "etcd_cert_file" => cfg.etcd_cert_file = path(v)?,
        "etcd_key_file" => cfg.etcd_key_file = path(v)?,
        "etcd_user" => cfg.etcd_user = name(v, true)?,
        "etcd_password" => {
            if v.len() > 512 {
                return Err("longer than 512 bytes".into());
            }
            cfg.etcd_password = (!v.is_empty()).then(|| v.to_string());
        }
        "metrics_port" => cfg.metrics_port = int_in(v, 0, 65535)? as u16,
        "data_port" => cfg.data_port = int_in(v, 0, 65535)? as u16,
        "lease_ttl_ms" => cfg.lease_ttl_ms = int_in(v, MIN_LEASE_MS, MAX_LEASE_MS)?,
        "max_leases" => cfg.max_leases = int_in(v, 1, MAX_LEASES_LIMIT)? as u32,
        "cpu_memory_pool_size" => cfg.cpu_memory_pool_size = size_in(v, MIN_POOL, MAX_POOL)?,
        "cpu_memory_prefault" => cfg.cpu_memory_prefault = boolean(v)?,
        "max_value_size" => cfg.max_value_size = size_in(v, 1, 4 * GIB)?,
        "max_request_size" => cfg.max_request_size = size_in(v, KIB, 16 * GIB)?,
        "max_connections" => cfg.max_connections = int_in(v, 1, MAX_CONNECTIONS_LIMIT)? as u32,
        "max_buffered_requests_size" => cfg.max_buffered_requests_size = size_in(v, MIB, 4 * TIB)?,
        "eviction_policy" => {
            if v != "lru" {
                return Err(format!("{v:?} is not a policy (allowed: lru)"));
            }
            cfg.eviction_policy = v.into();
        }
        "eviction_high_watermark" => {
            let f: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{v:?} is not a number (allowed 0.5 ..= 1.0)"))?;
            if !(0.5..=1.0).contains(&f) {
                return Err(format!("{f} is out of range (allowed 0.5 ..= 1.0)"));
            }
            cfg.eviction_high_watermark = f;
        }
        "requirepass" => {
            if v.len() > 512 {
                return Err("longer than 512 bytes".into());
            }
            cfg.requirepass = (!v.is_empty()).then(|| v.to_string());
        }
        "metadata_server" => cfg.metadata_server = parse_metadata_server(v)?,
        "cluster_name" => cfg.cluster_name = name(v, false)?,
        "node_id" => cfg.node_id = name(v, true)?,
        "host_name" => cfg.host_name = name(v, true)?,
        "advertise_host" => {
            if v.contains([':', '/', ' ']) && v.parse::<IpAddr>().is_err() {
                return Err(format!("{v:?} is not a host name or IP address"));
            }
            cfg.advertise_host = v.into();
        }
        "replica_num" => cfg.replica_num = int_in(v, 1, MAX_REPLICAS)? as u32,
        "node_ttl_s" => cfg.node_ttl_s = int_in(v, 1, 60)? as u32,
        "fence_ms" => cfg.fence_ms = int_in(v, 100, 10_000)?,
        "protocol" => {
            // Whether this binary has RDMA, and whether a device works, is
            // checked when the data plane starts.
            if v != "tcp" && v != "rdma" {
                return Err(format!("{v:?} is not a protocol (allowed: tcp, rdma)"));
            }
            cfg.protocol = v.into();
        }
        "device_name" => cfg.device_name = name(v, true)?,
        "cma" => {
            if v != "auto" && v != "off" {
                return Err(format!("{v:?} is not a cma mode (allowed: auto, off)"));
            }
            cfg.cma = v.into();
        }
        "cma_lanes" => cfg.cma_lanes = int_in(v, 1, strata_rdma::cma::LANES_MAX as u64)? as u32,
        "tcp_congestion" => {
            strata_rdma::sockopt::resolve(Some(v))?;
            cfg.tcp_congestion = if v.is_empty() {
                strata_rdma::sockopt::AUTO.into()
            } else {
                v.into()
            };
        }
        "worker_threads" => cfg.worker_threads = int_in(v, 0, WORKER_THREADS_MAX)? as u32,
        "busy_poll_us" => {
            cfg.busy_poll_us = int_in(v, 0, crate::busy_poll::BUSY_POLL_US_MAX)? as u32
        }
        "stream_poll_us" => {
            cfg.stream_poll_us = int_in(v, 0, crate::busy_poll::BUSY_POLL_US_MAX)? as u32
        }
        "echo_poll_us" => {
            cfg.echo_poll_us = int_in(v, 0, crate::busy_poll::BUSY_POLL_US_MAX)? as u32
        }
        "notify_keyspace_events" => {
            cfg.notify_keyspace_events = crate::pubsub::keyspace::Flags::parse(v)?.to_string()
        }
        "pubsub_output_buffer_limit" => {
            cfg.pubsub_output_buffer_limit = size_in(v, 64 * KIB, 4 * GIB)?
        }
        "rdma_fallback_tcp" => cfg.rdma_fallback_tcp = boolean(v)?,
        "ssd_path" => {
            if v.contains('\0') {
                return Err("contains a NUL byte".into());
            }
            cfg.ssd_path = v.into();
        }
        "gpu_memory_pool_size" => {
            let n = parse_size(v).ok_or_else(|| format!("{v:?} is not a size"))?;
            if n != 0 {
                size_in(v, MIN_POOL, MAX_POOL)?;
            }
            cfg.gpu_memory_pool_size = n;
        }
        "gpu_device_id" => {
            cfg.gpu_device_id = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n < 1024)
                .ok_or_else(|| format!("{v:?} is not a device ordinal (0 ..= 1023)"))?;
        }
        "ssd_pool_size" => {
            let n = parse_size(v).ok_or_else(|| format!("{v:?} is not a size"))?;
            if n != 0 {
                size_in(v, MIN_POOL, MAX_POOL)?;
            }
            cfg.ssd_pool_size = n;
        }
        "ssd_max_value_size" => {
            let limit =
                strata_tiering::nvme::MAX_VALUE_BYTES_LIMIT - strata_tiering::spill::HEADER_BYTES;
            cfg.ssd_max_value_size = size_in(v, KIB, limit)?
        }
        "ssd_engine" => {
            if v != "psync" && v != "io_uring" {
                return Err(format!("{v:?} is not an engine (allowed: psync, io_uring)"));
            }
            cfg.ssd_engine = v.into();
        }
        "ssd_direct_io" => cfg.ssd_direct_io = boolean(v)?,
        "ssd_spill_queue_size" => cfg.ssd_spill_queue_size = size_in(v, MIB, 64 * GIB)?,
        "log_level" => {
            tracing_subscriber::EnvFilter::try_new(v)
                .map_err(|e| format!("{v:?} is not a log filter: {e}"))?;
            cfg.log_level = v.into();
        }
        "kv_events_endpoint" => {
            if !v.is_empty() {
                crate::kv_events::endpoint::parse(v)?;
            }
            cfg.kv_events_endpoint = v.into();
        }
        "kv_events_replay_endpoint" => {
            if !v.is_empty() {
                crate::kv_events::endpoint::parse_bind(v)?;
            }
            cfg.kv_events_replay_endpoint = v.into();
        }
        "kv_events_queue" => cfg.kv_events_queue = int_in(v, 1, MAX_KV_EVENTS_QUEUE)?,
        "kv_events_topic" => {
            if v.len() > MAX_KV_EVENTS_TOPIC {
                return Err(format!("longer than {MAX_KV_EVENTS_TOPIC} bytes"));
            }
            cfg.kv_events_topic = v.into();
        }
        "kv_events_block_size" => {
            cfg.kv_events_block_size = int_in(v, 1, MAX_KV_EVENTS_BLOCK_SIZE)? as u32
        }
        _ => {
            return Err(format!("unknown key (known keys: {})", keys().join(", ")));
        }
    }
    Ok(())
}

impl Config {
    /// The keys and values that `CONFIG GET` shows, as strings.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        vec![
            ("bind", self.bind.to_string()),
            ("port", self.port.to_string()),
            ("tls_port", self.tls_port.to_string()),
            ("tls-port", self.tls_port.to_string()),
            ("tls_cert_file", self.tls_cert_file.clone()),
            ("tls_key_file", self.tls_key_file.clone()),
            ("tls_ca_cert_file", self.tls_ca_cert_file.clone()),
            ("tls_auth_clients", self.tls_auth_clients.clone()),
            ("tls_cluster", yes_no(self.tls_cluster)),
            ("tls_data_plane", yes_no(self.tls_data_plane)),
            ("metrics_port", self.metrics_port.to_string()),
            ("data_port", self.data_port.to_string()),
            ("lease_ttl_ms", self.lease_ttl_ms.to_string()),
            ("max_leases", self.max_leases.to_string()),
            (
                "cpu_memory_pool_size",
                self.cpu_memory_pool_size.to_string(),
            ),
            ("maxmemory", self.cpu_memory_pool_size.to_string()),
            ("cpu_memory_prefault", self.cpu_memory_prefault.to_string()),
            (
                "gpu_memory_pool_size",
                self.gpu_memory_pool_size.to_string(),
            ),
            ("gpu_device_id", self.gpu_device_id.to_string()),
            ("max_value_size", self.max_value_size.to_string()),
            ("proto-max-bulk-len", self.max_value_size.to_string()),
            ("max_request_size", self.max_request_size.to_string()),
            ("max_connections", self.max_connections.to_string()),
            ("maxclients", self.max_connections.to_string()),
            (
                "max_buffered_requests_size",
                self.max_buffered_requests_size.to_string(),
            ),
            ("eviction_policy", self.eviction_policy.clone()),
            ("maxmemory-policy", "allkeys-lru".into()),
            (
                "eviction_high_watermark",
                self.eviction_high_watermark.to_string(),
            ),
            ("metadata_server", self.metadata_server.join(",")),
            ("etcd_ca_cert_file", self.etcd_ca_cert_file.clone()),
            ("etcd_cert_file", self.etcd_cert_file.clone()),
            ("etcd_key_file", self.etcd_key_file.clone()),
            ("etcd_user", self.etcd_user.clone()),
            ("cluster_name", self.cluster_name.clone()),
            ("node_id", self.node_id.clone()),
            ("advertise_host", self.advertise_host.clone()),
            ("host_name", self.host_name.clone()),
            ("replica_num", self.replica_num.to_string()),
            ("node_ttl_s", self.node_ttl_s.to_string()),
            ("fence_ms", self.fence_ms.to_string()),
            ("ssd_path", self.ssd_path.clone()),
            ("ssd_pool_size", self.ssd_pool_size.to_string()),
            ("ssd_max_value_size", self.ssd_max_value_size.to_string()),
            ("ssd_engine", self.ssd_engine.clone()),
            ("ssd_direct_io", self.ssd_direct_io.to_string()),
            (
                "ssd_spill_queue_size",
                self.ssd_spill_queue_size.to_string(),
            ),
            ("protocol", self.protocol.clone()),
            ("device_name", self.device_name.clone()),
            ("rdma_fallback_tcp", self.rdma_fallback_tcp.to_string()),
            ("cma", self.cma.clone()),
            ("cma_lanes", self.cma_lanes.to_string()),
            ("tcp_congestion", self.tcp_congestion.clone()),
            ("worker_threads", self.worker_threads.to_string()),
            ("busy_poll_us", self.busy_poll_us.to_string()),
            ("stream_poll_us", self.stream_poll_us.to_string()),
            ("echo_poll_us", self.echo_poll_us.to_string()),
            (
                "notify_keyspace_events",
                self.notify_keyspace_events.clone(),
            ),
            (
                "pubsub_output_buffer_limit",
                self.pubsub_output_buffer_limit.to_string(),
            ),
            ("kv_events_endpoint", self.kv_events_endpoint.clone()),
            (
                "kv_events_replay_endpoint",
                self.kv_events_replay_endpoint.clone(),
            ),
            ("kv_events_queue", self.kv_events_queue.to_string()),
            ("kv_events_topic", self.kv_events_topic.clone()),
            (
                "kv_events_block_size",
                self.kv_events_block_size.to_string(),
            ),
            ("log_level", self.log_level.clone()),
            // redis-benchmark asks for these at start; we persist nothing.
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("databases", "1".into()),
        ]
    }

    /// Fills the values whose default depends on other values or the
    /// machine.
    fn fill_derived(&mut self) {
        if self.host_name.is_empty() {
            self.host_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into());
        }
        if self.advertise_host.is_empty() {
            self.advertise_host = if self.bind.is_unspecified() {
                self.host_name.clone()
            } else {
                self.bind.to_string()
            };
        }
        if self.node_id.is_empty() {
            self.node_id = format!("{}:{}", self.host_name, self.advertised_port());
        }
    }

    /// The data plane to start, from `protocol`, `device_name` and
    /// `rdma_fallback_tcp`.
    pub fn data_protocol(&self) -> strata_rdma::Protocol {
        match self.protocol.as_str() {
            "rdma" => strata_rdma::Protocol::Rdma {
                device_name: (!self.device_name.is_empty()).then(|| self.device_name.clone()),
                fallback_tcp: self.rdma_fallback_tcp,
            },
            _ => strata_rdma::Protocol::Tcp,
        }
    }

    /// `busy_poll_us` as a window (see `crate::busy_poll`).
    pub fn busy_poll(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.busy_poll_us.into())
    }

    /// `stream_poll_us` as a window (see `crate::busy_poll`).
    pub fn stream_poll(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.stream_poll_us.into())
    }

    /// `echo_poll_us` as a cap (see `crate::busy_poll`).
    pub fn echo_poll(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.echo_poll_us.into())
    }

    /// The congestion control to set on strata's sockets; `None` keeps the
    /// host's default. Resolved once, at start (`Node::tcp_congestion`).
    pub fn tcp_congestion(&self) -> Option<String> {
        // The setting was checked when it was parsed, and `auto` and `host`
        // cannot fail: an error here means the kernel changed under us,
        // and the host's default is the safe answer.
        strata_rdma::sockopt::resolve(Some(&self.tcp_congestion)).unwrap_or(None)
    }

    /// The RESP port in this node's record (etcd, `CLUSTER SLOTS`,
    /// `-MOVED`): the TLS port in a TLS cluster, as Redis Cluster does
    /// with `tls-cluster yes`.
    pub fn advertised_port(&self) -> u16 {
        if self.tls_cluster {
            self.tls_port
        } else {
            self.port
        }
    }

    pub fn standalone(&self) -> bool {
        self.metadata_server.is_empty()
    }

    /// The value limit actually enforced: a value must also fit the pool.
    pub fn effective_max_value(&self) -> u64 {
        self.max_value_size.min(self.cpu_memory_pool_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let raw: Vec<_> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), RawValue::Str(v.to_string())))
            .collect();
        validate(&raw)
    }

    #[test]
    fn unset_ports_follow_the_resp_port() {
        let d = v(&[]).unwrap();
        assert_eq!((d.port, d.data_port, d.metrics_port), (7379, 7380, 9379));
        let c = v(&[("port", "7390")]).unwrap();
        assert_eq!((c.data_port, c.metrics_port), (7391, 9390));
        let c = v(&[("port", "7390"), ("data_port", "8000")]).unwrap();
        assert_eq!((c.data_port, c.metrics_port), (8000, 9390));
        let c = v(&[("port", "7390"), ("metrics_port", "0")]).unwrap();
        assert_eq!((c.data_port, c.metrics_port), (7391, 0));
        let e = v(&[("port", "65000")]).unwrap_err();
        assert!(
            e.contains("metrics_port") && e.contains("explicitly"),
            "{e}"
        );
        assert!(v(&[("port", "65000"), ("metrics_port", "9000")]).is_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Some(MIB));
        assert_eq!(parse_size("512MiB"), Some(512 * MIB));
        assert_eq!(parse_size("4 GB"), Some(4_000_000_000));
        assert_eq!(parse_size("2g"), Some(2 * GIB));
        for bad in [
            "",
            "-1",
            "1.5GiB",
            "12XB",
            "99999999999999999999",
            "18446744073709551615T",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn later_settings_win() {
        let c = v(&[("port", "1000"), ("port", "2000")]).unwrap();
        assert_eq!(c.port, 2000);
    }

    #[test]
    fn every_bad_value_is_named_with_its_range() {
        let err = v(&[
            ("port", "70000"),
            ("cpu_memory_pool_size", "1KiB"),
            ("eviction_high_watermark", "2"),
            ("protocol", "udp"),
            ("rdma_fallback_tcp", "maybe"),
            ("bogus", "1"),
            ("bind", "localhost:1"),
        ])
        .unwrap_err();
        for needle in [
            "port: 70000 is out of range (allowed 0 ..= 65535)",
            "cpu_memory_pool_size: 1KiB is out of range (allowed 4MiB ..= 64TiB)",
            "eviction_high_watermark: 2 is out of range",
            "protocol: \"udp\" is not a protocol (allowed: tcp, rdma)",
            "rdma_fallback_tcp: \"maybe\" is not a boolean",
            "bogus: unknown key",
            "bind: \"localhost:1\" is not an IP address",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
        }
    }

    /// `keys()` is the one list: every flag sets a key the node accepts,
    /// and the unknown-key message names each of them.
    #[test]
    fn every_flag_is_a_known_key() {
        let keys = keys();
        let cli = Cli::parse_from(["strata-server"]);
        let flags: Vec<&str> = cli.overrides().iter().map(|(k, _)| *k).collect();
        assert_eq!(flags, keys, "Cli::overrides() and the flags disagree");
        let err = v(&[("bogus", "1")]).unwrap_err();
        let listed: Vec<&str> = err
            .split_once("known keys: ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .map(|list| list.split(", ").collect())
            .unwrap_or_default();
        assert_eq!(listed, keys, "the unknown-key message: {err}");
        for key in &keys {
            let accepted = v(&[(key, "")]).err().unwrap_or_default();
            assert!(!accepted.contains("unknown key"), "{key}: {accepted}");
        }
    }

    #[test]
    fn json_numbers_and_strings() {
        let raw =
            parse_file(r#"{"cpu_memory_pool_size": 268435456, "max_value_size": "1MiB"}"#).unwrap();
        let c = validate(&raw).unwrap();
        assert_eq!(c.cpu_memory_pool_size, 256 * MIB);
        assert_eq!(c.max_value_size, MIB);
        assert!(parse_file("[1]").is_err());
        assert!(parse_file(r#"{"port": [1]}"#).is_err());
    }

    #[test]
    fn rdma_selection() {
        let c = v(&[("protocol", "rdma"), ("device_name", "rxe0")]).unwrap();
        assert_eq!(
            c.data_protocol(),
            strata_rdma::Protocol::Rdma {
                device_name: Some("rxe0".into()),
                fallback_tcp: false
            }
        );
        let c = v(&[("protocol", "rdma"), ("rdma_fallback_tcp", "true")]).unwrap();
        assert_eq!(
            c.data_protocol(),
            strata_rdma::Protocol::Rdma {
                device_name: None,
                fallback_tcp: true
            }
        );
        assert_eq!(v(&[]).unwrap().data_protocol(), strata_rdma::Protocol::Tcp);
    }

    #[test]
    fn a_cluster_node_off_this_host_must_not_be_on_loopback() {
        let etcd = ("metadata_server", "etcd://10.213.7.10:2379");
        let e = v(&[etcd]).unwrap_err();
        assert!(
            e.contains("binds 127.0.0.1") && e.contains("--bind") && e.contains("--advertise-host"),
            "{e}"
        );
        let e = v(&[etcd, ("bind", "0.0.0.0"), ("advertise_host", "127.0.0.1")]).unwrap_err();
        assert!(e.contains("advertises 127.0.0.1"), "{e}");
        let e = v(&[etcd, ("bind", "0.0.0.0"), ("advertise_host", "localhost")]).unwrap_err();
        assert!(e.contains("advertises localhost"), "{e}");
        let ok = [etcd, ("bind", "0.0.0.0"), ("advertise_host", "10.213.7.11")];
        assert!(v(&ok).is_ok());
        assert!(v(&[etcd, ("bind", "10.213.7.11")]).is_ok());
        // etcd on this host: nodes and clients may all be here too.
        assert!(v(&[("metadata_server", "etcd://127.0.0.1:2379")]).is_ok());
        assert!(v(&[("metadata_server", "etcd://localhost:2379,[::1]:2379")]).is_ok());
        let mixed = ("metadata_server", "etcd://127.0.0.1:2379,10.213.7.10:2379");
        assert!(v(&[mixed]).is_err());
    }

    #[test]
    fn tls_keys_fit_together() {
        let e = v(&[("port", "0")]).unwrap_err();
        assert!(e.contains("port: 0 turns the plaintext port off"), "{e}");
        let e = v(&[("tls_port", "7400")]).unwrap_err();
        assert!(
            e.contains("tls_port: needs tls_cert_file and tls_key_file"),
            "{e}"
        );
        let e = v(&[("tls_auth_clients", "yes")]).unwrap_err();
        assert!(
            e.contains("tls_auth_clients: yes needs tls_ca_cert_file"),
            "{e}"
        );
        let e = v(&[("tls_cluster", "yes")]).unwrap_err();
        assert!(e.contains("tls_cluster: needs tls_port"), "{e}");
        let e = v(&[("port", "0"), ("tls_port", "7400"), ("tls_cluster", "no")]).unwrap_err();
        assert!(e.contains("tls_cluster: no, but port is 0"), "{e}");
        let e = v(&[("tls_port", "7379")]).unwrap_err();
        assert!(e.contains("tls_port: 7379 is the same as port"), "{e}");
        let e = v(&[("etcd_password", "x")]).unwrap_err();
        assert!(e.contains("etcd_password: needs etcd_user"), "{e}");
        let e = v(&[("etcd_cert_file", "/x")]).unwrap_err();
        assert!(e.contains("etcd_cert_file: needs etcd_key_file"), "{e}");
        let ok = v(&[]).unwrap();
        assert_eq!(
            (ok.tls_auth_clients.as_str(), ok.tls_cluster),
            ("no", false)
        );
    }

    #[test]
    fn kv_event_keys() {
        let c = v(&[]).unwrap();
        assert_eq!(
            (c.kv_events_endpoint.as_str(), c.kv_events_queue),
            ("", 100_000)
        );
        let ok = v(&[
            ("kv_events_endpoint", "tcp://*:5557"),
            ("kv_events_replay_endpoint", "tcp://*:5558"),
            ("kv_events_queue", "10"),
            ("kv_events_block_size", "64"),
        ])
        .unwrap();
        assert_eq!((ok.kv_events_queue, ok.kv_events_block_size), (10, 64));
        let e = v(&[
            ("kv_events_endpoint", "udp://*:5557"),
            ("kv_events_queue", "0"),
            ("kv_events_block_size", "0"),
        ])
        .unwrap_err();
        for needle in [
            "kv_events_endpoint: \"udp://*:5557\" is not a ZMQ TCP endpoint",
            "kv_events_queue: 0 is out of range",
            "kv_events_block_size: 0 is out of range",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in:\n{e}");
        }
        let e = v(&[("kv_events_replay_endpoint", "tcp://*:5558")]).unwrap_err();
        assert!(e.contains("kv_events_endpoint is empty"), "{e}");
        let same = ("kv_events_endpoint", "tcp://*:5557");
        let e = v(&[same, ("kv_events_replay_endpoint", "tcp://*:5557")]).unwrap_err();
        assert!(e.contains("give each its own port"), "{e}");
    }

    #[test]
    fn cross_key_checks() {
        assert!(v(&[("max_value_size", "2GiB"), ("max_request_size", "1GiB")]).is_err());
        assert!(v(&[("metrics_port", "7379")]).is_err());
        assert!(v(&[("metrics_port", "0")]).is_ok());
    }
}
