//! Every figure the node exports, declared in one place.
//!
//! The source of truth is plain atomics (and the store's own counters), so
//! that `INFO` and `/metrics` read the very same numbers. At each scrape the
//! Prometheus counters and gauges are set from them; histograms are
//! counts per bucket kept here ([`histogram`]) and rendered after the
//! exporter's output. Names carry units; labels are few and
//! bounded (the command name comes from the fixed command table, never
//! from client input).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use metrics::{Counter, Gauge, Key, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use strata_rdma::tcp::TcpStats;
use strata_tiering::spill::SpillStats;
use strata_tiering::StoreStats;

use crate::cma::Cma;
use crate::pubsub::Hub;

mod flows;
pub mod histogram;
pub use flows::{Direction, Prefixes, Transfers};
use histogram::{Family, Histogram};

/// What a scrape reads beyond these metrics' own atomics: the figures of
/// the parts the node is made of, gathered by the node.
pub struct Scrape<'a> {
    pub store: StoreStats,
    pub connected_clients: u64,
    pub request_buffer_bytes: u64,
    pub uptime_seconds: f64,
    pub leases_out: u64,
    pub ring_nodes: u64,
    pub etcd_healthy: bool,
    pub fenced: bool,
    pub under_replicated_keys: u64,
    pub under_replicated_writes: u64,
    pub transport: &'a TcpStats,
    pub cma: Option<&'a Cma>,
    pub spill: Option<SpillStats>,
    pub pubsub: &'a Hub,
    /// The KV-event publisher's figures; `None` when it is off (zeros).
    pub kv_events: Option<&'a crate::kv_events::Stats>,
}

/// Per-command figures, in the order of the names the metrics were made
/// with (`cmd::COMMANDS`).
#[derive(Debug)]
pub struct CommandStats {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub usec: AtomicU64,
    latency: Histogram,
    calls_out: Counter,
    errors_out: Counter,
}

impl CommandStats {
    pub fn record(&self, elapsed: Duration, error: bool) {
        self.calls.fetch_add(1, Relaxed);
        self.usec.fetch_add(elapsed.as_micros() as u64, Relaxed);
        if error {
            self.errors.fetch_add(1, Relaxed);
        }
        self.latency.record_duration(elapsed);
    }
}

/// Node-wide counters kept by the connection code.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections_total: AtomicU64,
    pub rejected_connections_total: AtomicU64,
    /// TLS handshakes on the TLS port that failed or timed out (a
    /// plaintext client there counts too).
    pub tls_handshake_failures_total: AtomicU64,
    pub protocol_errors_total: AtomicU64,
    /// Requests refused with BUSY because the node-wide request buffer
    /// budget stayed exhausted.
    pub buffer_busy_total: AtomicU64,
    pub too_large_total: AtomicU64,
    pub net_input_bytes_total: AtomicU64,
    pub net_output_bytes_total: AtomicU64,
    pub replica_pushes_total: AtomicU64,
    pub replica_push_errors_total: AtomicU64,
    pub members_removed_total: AtomicU64,
    pub writes_short_of_copies_total: AtomicU64,
    pub repair_pushes_total: AtomicU64,
    pub repair_shed_total: AtomicU64,
    pub repair_runs_total: AtomicU64,
    /// Reads whose value was brought back from NVMe to serve them.
    pub nvme_hits_total: AtomicU64,
    /// Busy polls (`busy_poll_us`) that found the next request, and those
    /// that ran out and slept.
    pub busy_poll_hits_total: AtomicU64,
    pub busy_poll_misses_total: AtomicU64,
    /// Polls after a long request (`echo_poll_us`) that found the next
    /// request without sleeping, and those that ran out and slept.
    pub echo_poll_hits_total: AtomicU64,
    pub echo_poll_misses_total: AtomicU64,
    /// Pulled values not published because their client had gone (see
    /// `crate::peer`).
    pub puts_abandoned_total: AtomicU64,
}

/// Handles for figures copied from the atomics at scrape time.
struct Exported {
    connected_clients: Gauge,
    connections_total: Counter,
    rejected_connections_total: Counter,
    tls_handshake_failures_total: Counter,
    protocol_errors_total: Counter,
    too_large_total: Counter,
    buffer_busy_total: Counter,
    request_buffer_bytes: Gauge,
    net_input_bytes_total: Counter,
    net_output_bytes_total: Counter,
    keys: Gauge,
    expiring_keys: Gauge,
    capacity_bytes: Gauge,
    used_bytes: Gauge,
    reserved_bytes: Gauge,
    value_bytes: Gauge,
    hits_total: Counter,
    gpu_hits_total: Counter,
    nvme_hits_total: Counter,
    busy_poll_hits_total: Counter,
    busy_poll_misses_total: Counter,
    echo_poll_hits_total: Counter,
    echo_poll_misses_total: Counter,
    puts_abandoned_total: Counter,
    misses_total: Counter,
    evictions_total: Counter,
    evicted_bytes_total: Counter,
    expired_keys_total: Counter,
    uptime_seconds: Gauge,
    leases_out: Gauge,
    ring_nodes: Gauge,
    etcd_healthy: Gauge,
    fenced: Gauge,
    members_removed_total: Counter,
    writes_short_of_copies_total: Counter,
    under_replicated_keys: Gauge,
    under_replicated_writes_total: Counter,
    replica_pushes_total: Counter,
    replica_push_errors_total: Counter,
    repair_runs_total: Counter,
    repair_pushes_total: Counter,
    repair_shed_total: Counter,
    data_reads_served_total: Counter,
    data_reads_refused_total: Counter,
    data_reads_in_progress: Gauge,
    cma_sessions_total: Counter,
    cma_refused_total: Counter,
    cma_reads_total: Counter,
    cma_read_bytes_total: Counter,
    cma_read_errors_total: Counter,
    cma_lane_pieces_total: Counter,
    cma_misaligned_reads_total: Counter,
    pubsub_subscribers: Gauge,
    pubsub_channels: Gauge,
    pubsub_patterns: Gauge,
    pubsub_messages_total: Counter,
    pubsub_dropped_total: Counter,
    pubsub_disconnected_total: Counter,
    keyspace_events_total: Vec<Counter>,
    keyspace_events_dropped_total: Counter,
    /// Per type: stored, removed, cleared.
    kv_events_total: [Counter; 3],
    kv_events_dropped_total: Counter,
    kv_event_batches_total: Counter,
    kv_event_replays_total: Counter,
    nvme: NvmeExported,
    gpu: GpuExported,
}

/// The GPU tier's figures (zeros when it is off).
struct GpuExported {
    capacity_bytes: Gauge,
    used_bytes: Gauge,
    value_bytes: Gauge,
    keys: Gauge,
    uploads_total: Counter,
    demotions_total: Counter,
    staged_reads_total: Counter,
    full_total: Counter,
    errors_total: Counter,
}

/// The NVMe tier's figures (zeros when it is off).
struct NvmeExported {
    capacity_bytes: Gauge,
    used_bytes: Gauge,
    entries: Gauge,
    evicted_blocks_total: Counter,
    reclaim_copied_total: Counter,
    evictions_total: Counter,
    spill_queue_bytes: Gauge,
    spilled_total: Counter,
    spilled_bytes_total: Counter,
    spill_dropped_total: Counter,
    spill_kept_total: Counter,
    promoted_total: Counter,
    promoted_bytes_total: Counter,
    write_errors_total: Counter,
    read_errors_total: Counter,
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pub commands: Vec<CommandStats>,
    pub counters: Counters,
    pub transfers: Transfers,
    pub prefixes: Prefixes,
    exported: Exported,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Latency buckets from 10 µs to 10 s: inline commands sit at the low end,
/// 512 MiB values at the high end.
const LATENCY_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// `strata_command_seconds`, one series per command.
static COMMAND_SECONDS: Family = Family::new(
    "strata_command_seconds",
    "Time to execute a command (excluding network), by command.",
    LATENCY_BUCKETS,
    1e9,
);

pub(crate) static META: Metadata<'static> =
    Metadata::new("strata", Level::INFO, Some(module_path!()));

impl Metrics {
    /// The node's figures; `commands` names the commands it counts, in
    /// the order their [`CommandStats`] are indexed.
    pub fn new(commands: &[&str]) -> Metrics {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let r = &recorder;
        let counter = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_counter(name.into(), Some(unit), help.into());
            r.register_counter(&Key::from_name(name), &META)
        };
        let gauge = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_gauge(name.into(), Some(unit), help.into());
            r.register_gauge(&Key::from_name(name), &META)
        };
        let dram = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_gauge(name.into(), Some(unit), help.into());
            r.register_gauge(
                &Key::from_parts(name, vec![Label::new("tier", "dram")]),
                &META,
            )
        };
        let dram_counter = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_counter(name.into(), Some(unit), help.into());
            r.register_counter(
                &Key::from_parts(name, vec![Label::new("tier", "dram")]),
                &META,
            )
        };
        let nvme = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_gauge(name.into(), Some(unit), help.into());
            r.register_gauge(
                &Key::from_parts(name, vec![Label::new("tier", "nvme")]),
                &META,
            )
        };
        let nvme_errors = |op: &'static str| {
            r.register_counter(
                &Key::from_parts("strata_nvme_errors_total", vec![Label::new("op", op)]),
                &META,
            )
        };
        r.describe_counter(
            "strata_nvme_errors_total".into(),
            Some(Unit::Count),
            "NVMe tier operations that failed (I/O or checksum), by op.".into(),
        );
        let gpu = |name: &'static str, unit: Unit, help: &'static str| {
            r.describe_gauge(name.into(), Some(unit), help.into());
            r.register_gauge(
                &Key::from_parts(name, vec![Label::new("tier", "gpu")]),
                &META,
            )
        };
        let gpu_exported = GpuExported {
            capacity_bytes: gpu(
                "strata_tier_capacity_bytes",
                Unit::Bytes,
                "Capacity of a tier.",
            ),
            used_bytes: gpu(
                "strata_tier_used_bytes",
                Unit::Bytes,
                "Bytes of a tier allocated to values (size-class rounded).",
            ),
            value_bytes: gpu(
                "strata_tier_value_bytes",
                Unit::Bytes,
                "Sum of the lengths of values in a tier.",
            ),
            keys: gauge(
                "strata_gpu_keys",
                Unit::Count,
                "Values whose bytes are in GPU memory.",
            ),
            uploads_total: counter(
                "strata_gpu_uploads_total",
                Unit::Count,
                "Values moved up to the GPU tier when written.",
            ),
            demotions_total: {
                r.describe_counter(
                    "strata_evictions_total".into(),
                    Some(Unit::Count),
                    "Values evicted to make room, by tier.".into(),
                );
                r.register_counter(
                    &Key::from_parts("strata_evictions_total", vec![Label::new("tier", "gpu")]),
                    &META,
                )
            },
            staged_reads_total: counter(
                "strata_gpu_staged_reads_total",
                Unit::Count,
                "Reads of GPU values, each served from a DRAM copy.",
            ),
            full_total: counter(
                "strata_gpu_full_total",
                Unit::Count,
                "Written values that stayed in DRAM because the GPU tier had no room it could free.",
            ),
            errors_total: counter(
                "strata_gpu_errors_total",
                Unit::Count,
                "Failed copies to or from GPU memory (the log says which).",
            ),
        };
        let nvme_exported = NvmeExported {
            capacity_bytes: nvme(
                "strata_tier_capacity_bytes",
                Unit::Bytes,
                "Capacity of a tier.",
            ),
            used_bytes: nvme(
                "strata_tier_used_bytes",
                Unit::Bytes,
                "Bytes of a tier allocated to values (size-class rounded).",
            ),
            entries: gauge(
                "strata_nvme_entries",
                Unit::Count,
                "Values written to the NVMe tier by this process and not removed (recovered ones are not counted).",
            ),
            evicted_blocks_total: counter(
                "strata_nvme_evicted_blocks_total",
                Unit::Count,
                "NVMe blocks reclaimed when the tier was full (their live values are copied forward, within a budget).",
            ),
            reclaim_copied_total: counter(
                "strata_nvme_reclaim_copied_total",
                Unit::Count,
                "Live values copied forward out of reclaimed NVMe blocks.",
            ),
            evictions_total: counter(
                "strata_nvme_evictions_total",
                Unit::Count,
                "Live values the NVMe tier dropped when it reclaimed their block (copying them forward was over budget).",
            ),
            spill_queue_bytes: gauge(
                "strata_spill_queue_bytes",
                Unit::Bytes,
                "Bytes of evicted values waiting to be written to NVMe.",
            ),
            spilled_total: counter(
                "strata_spilled_total",
                Unit::Count,
                "Values evicted from DRAM and written to NVMe.",
            ),
            spilled_bytes_total: counter(
                "strata_spilled_bytes_total",
                Unit::Bytes,
                "Bytes written to NVMe by spills (with 32-byte headers).",
            ),
            spill_dropped_total: counter(
                "strata_spill_dropped_total",
                Unit::Count,
                "Evicted values not kept on NVMe (queue full, or above ssd_max_value_size).",
            ),
            spill_kept_total: counter(
                "strata_spill_kept_total",
                Unit::Count,
                "Evictions of values read back from NVMe and unchanged: their NVMe copy served, nothing was written.",
            ),
            promoted_total: counter(
                "strata_promoted_total",
                Unit::Count,
                "Values read from NVMe back into DRAM.",
            ),
            promoted_bytes_total: counter(
                "strata_promoted_bytes_total",
                Unit::Bytes,
                "Bytes read from NVMe back into DRAM.",
            ),
            write_errors_total: nvme_errors("write"),
            read_errors_total: nvme_errors("read"),
        };
        r.describe_counter(
            "strata_commands_total".into(),
            Some(Unit::Count),
            "Commands executed, by command.".into(),
        );
        r.describe_counter(
            "strata_command_errors_total".into(),
            Some(Unit::Count),
            "Commands that replied with an error, by command.".into(),
        );
        let commands = commands
            .iter()
            .map(|name| {
                let labels = || vec![Label::new("cmd", name.to_ascii_lowercase())];
                CommandStats {
                    calls: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    usec: AtomicU64::new(0),
                    latency: COMMAND_SECONDS
                        .series(format!("cmd=\"{}\",", name.to_ascii_lowercase())),
                    calls_out: r.register_counter(
                        &Key::from_parts("strata_commands_total", labels()),
                        &META,
                    ),
                    errors_out: r.register_counter(
                        &Key::from_parts("strata_command_errors_total", labels()),
                        &META,
                    ),
                }
            })
            .collect();
        let exported = Exported {
            connected_clients: gauge(
                "strata_connected_clients",
                Unit::Count,
                "Client connections open now.",
            ),
            connections_total: counter(
                "strata_connections_total",
                Unit::Count,
                "Client connections accepted.",
            ),
            rejected_connections_total: counter(
                "strata_rejected_connections_total",
                Unit::Count,
                "Connections refused because max_connections was reached.",
            ),
            tls_handshake_failures_total: counter(
                "strata_tls_handshake_failures_total",
                Unit::Count,
                "Connections to the TLS port dropped before their handshake completed (failed, timed out, or plaintext).",
            ),
            protocol_errors_total: counter(
                "strata_protocol_errors_total",
                Unit::Count,
                "Connections closed for malformed RESP.",
            ),
            too_large_total: counter(
                "strata_too_large_total",
                Unit::Count,
                "Requests refused for exceeding max_value_size or max_request_size.",
            ),
            buffer_busy_total: counter(
                "strata_request_buffer_busy_total",
                Unit::Count,
                "Requests refused with BUSY: max_buffered_requests_size stayed in use too long.",
            ),
            request_buffer_bytes: gauge(
                "strata_request_buffer_bytes",
                Unit::Bytes,
                "Bytes of large partly received requests counted against max_buffered_requests_size.",
            ),
            net_input_bytes_total: counter(
                "strata_net_input_bytes_total",
                Unit::Bytes,
                "Bytes read from client connections.",
            ),
            net_output_bytes_total: counter(
                "strata_net_output_bytes_total",
                Unit::Bytes,
                "Bytes written to client connections.",
            ),
            keys: gauge("strata_keys", Unit::Count, "Keys stored."),
            expiring_keys: gauge("strata_expiring_keys", Unit::Count, "Keys with a TTL."),
            capacity_bytes: dram(
                "strata_tier_capacity_bytes",
                Unit::Bytes,
                "Capacity of a tier.",
            ),
            used_bytes: dram(
                "strata_tier_used_bytes",
                Unit::Bytes,
                "Bytes of a tier allocated to values (size-class rounded).",
            ),
            reserved_bytes: dram(
                "strata_tier_reserved_bytes",
                Unit::Bytes,
                "Bytes of a tier not free, including partly used slabs.",
            ),
            value_bytes: dram(
                "strata_tier_value_bytes",
                Unit::Bytes,
                "Sum of the lengths of values in a tier.",
            ),
            hits_total: dram_counter(
                "strata_hits_total",
                Unit::Count,
                "Reads that found their key, by the tier that served them (nvme: brought back to DRAM to serve the read).",
            ),
            gpu_hits_total: r.register_counter(
                &Key::from_parts("strata_hits_total", vec![Label::new("tier", "gpu")]),
                &META,
            ),
            nvme_hits_total: r.register_counter(
                &Key::from_parts("strata_hits_total", vec![Label::new("tier", "nvme")]),
                &META,
            ),
            busy_poll_hits_total: counter(
                "strata_busy_poll_hits_total",
                Unit::Count,
                "Busy polls of a client connection (busy_poll_us) that found its next request without sleeping.",
            ),
            busy_poll_misses_total: counter(
                "strata_busy_poll_misses_total",
                Unit::Count,
                "Busy polls of a client connection (busy_poll_us) that ran out and slept.",
            ),
            echo_poll_hits_total: counter(
                "strata_echo_poll_hits_total",
                Unit::Count,
                "Polls of a client connection after a long request (echo_poll_us) that found its next request without sleeping.",
            ),
            echo_poll_misses_total: counter(
                "strata_echo_poll_misses_total",
                Unit::Count,
                "Polls of a client connection after a long request (echo_poll_us) that ran out and slept.",
            ),
            puts_abandoned_total: counter(
                "strata_puts_abandoned_total",
                Unit::Count,
                "Zero-copy PUT values pulled but not stored because their client closed the connection meanwhile.",
            ),
            misses_total: counter(
                "strata_misses_total",
                Unit::Count,
                "Reads that did not find their key.",
            ),
            evictions_total: dram_counter(
                "strata_evictions_total",
                Unit::Count,
                "Values evicted to make room, by tier.",
            ),
            evicted_bytes_total: dram_counter(
                "strata_evicted_bytes_total",
                Unit::Bytes,
                "Bytes of values evicted, by tier.",
            ),
            expired_keys_total: counter(
                "strata_expired_keys_total",
                Unit::Count,
                "Keys removed because their TTL passed.",
            ),
            uptime_seconds: gauge(
                "strata_uptime_seconds",
                Unit::Seconds,
                "Seconds since the node started.",
            ),
            ring_nodes: gauge(
                "strata_ring_nodes",
                Unit::Count,
                "Nodes on this node's ring.",
            ),
            etcd_healthy: gauge(
                "strata_etcd_healthy",
                Unit::Count,
                "1 when the last exchange with etcd succeeded (always 1 standalone).",
            ),
            fenced: gauge(
                "strata_fenced",
                Unit::Count,
                "1 while this node refuses key commands: it cannot prove that no other node serves its slots.",
            ),
            members_removed_total: counter(
                "strata_members_removed_total",
                Unit::Count,
                "Unreachable members whose records this node deleted (with a majority agreeing).",
            ),
            writes_short_of_copies_total: counter(
                "strata_writes_short_of_copies_total",
                Unit::Count,
                "Writes answered -NOREPLICAS: stored, but on fewer nodes than replica_num.",
            ),
            under_replicated_keys: gauge(
                "strata_under_replicated_keys",
                Unit::Count,
                "Keys held here with fewer copies than replica_num (pushed again every 5 s).",
            ),
            under_replicated_writes_total: counter(
                "strata_under_replicated_writes_total",
                Unit::Count,
                "Acknowledged writes that had fewer copies than asked.",
            ),
            replica_pushes_total: counter(
                "strata_replica_pushes_total",
                Unit::Count,
                "Copies pushed to replicas (writes and repair).",
            ),
            replica_push_errors_total: counter(
                "strata_replica_push_errors_total",
                Unit::Count,
                "Pushes to replicas that failed.",
            ),
            repair_runs_total: counter(
                "strata_repair_runs_total",
                Unit::Count,
                "Completed repairs after ring changes.",
            ),
            repair_pushes_total: counter(
                "strata_repair_pushes_total",
                Unit::Count,
                "Copies pushed by repair.",
            ),
            repair_shed_total: counter(
                "strata_repair_shed_total",
                Unit::Count,
                "Copies dropped after hand-off because this node no longer holds their slot.",
            ),
            leases_out: gauge(
                "strata_leases_out",
                Unit::Count,
                "Leases pinning values for remote readers.",
            ),
            data_reads_served_total: counter(
                "strata_data_reads_served_total",
                Unit::Count,
                "One-sided reads of this node's memory served by its data plane.",
            ),
            data_reads_refused_total: counter(
                "strata_data_reads_refused_total",
                Unit::Count,
                "Data-plane reads refused (bad rkey, range, stale epoch).",
            ),
            data_reads_in_progress: gauge(
                "strata_data_reads_in_progress",
                Unit::Count,
                "Reads of this node's memory its TCP data plane is sending now.",
            ),
            cma_sessions_total: counter(
                "strata_cma_sessions_total",
                Unit::Count,
                "Connections whose client proved itself for cross-memory attach.",
            ),
            cma_refused_total: counter(
                "strata_cma_refused_total",
                Unit::Count,
                "Cross-memory attach proofs refused (another user, read not permitted, wrong bytes).",
            ),
            cma_reads_total: counter(
                "strata_cma_reads_total",
                Unit::Count,
                "PUT payloads copied out of client processes by cross-memory attach.",
            ),
            cma_read_bytes_total: counter(
                "strata_cma_read_bytes_total",
                Unit::Bytes,
                "Bytes copied out of client processes by cross-memory attach.",
            ),
            cma_read_errors_total: counter(
                "strata_cma_read_errors_total",
                Unit::Count,
                "Cross-memory attach reads that failed (nothing was stored).",
            ),
            cma_lane_pieces_total: counter(
                "strata_cma_lane_pieces_total",
                Unit::Count,
                "Pieces of long cross-memory reads that helper threads copied (cma_lanes).",
            ),
            cma_misaligned_reads_total: counter(
                "strata_cma_misaligned_reads_total",
                Unit::Count,
                "Cross-memory reads of 64 KiB or more from client buffers not aligned like the arena modulo 64 bytes (the kernel copies them at half speed or less).",
            ),
            pubsub_subscribers: gauge(
                "strata_pubsub_subscribers",
                Unit::Count,
                "Connections subscribed to at least one channel or pattern.",
            ),
            pubsub_channels: gauge(
                "strata_pubsub_channels",
                Unit::Count,
                "Channels with at least one subscriber.",
            ),
            pubsub_patterns: gauge(
                "strata_pubsub_patterns",
                Unit::Count,
                "Patterns with at least one subscriber.",
            ),
            pubsub_messages_total: counter(
                "strata_pubsub_messages_total",
                Unit::Count,
                "Messages queued for subscribers (one per receiving connection).",
            ),
            pubsub_dropped_total: counter(
                "strata_pubsub_dropped_total",
                Unit::Count,
                "Messages dropped because their subscriber was over pubsub_output_buffer_limit.",
            ),
            pubsub_disconnected_total: counter(
                "strata_pubsub_disconnected_total",
                Unit::Count,
                "Subscribers disconnected at pubsub_output_buffer_limit.",
            ),
            keyspace_events_dropped_total: counter(
                "strata_keyspace_events_dropped_total",
                Unit::Count,
                "Keyspace events dropped because the node's event queue was full.",
            ),
            keyspace_events_total: {
                r.describe_counter(
                    "strata_keyspace_events_total".into(),
                    Some(Unit::Count),
                    "Keyspace events published (notify_keyspace_events), by event.".into(),
                );
                crate::pubsub::keyspace::Event::ALL
                    .iter()
                    .map(|e| {
                        r.register_counter(
                            &Key::from_parts(
                                "strata_keyspace_events_total",
                                vec![Label::new("event", e.name())],
                            ),
                            &META,
                        )
                    })
                    .collect()
            },
            kv_events_total: {
                r.describe_counter(
                    "strata_kv_events_total".into(),
                    Some(Unit::Count),
                    "KV events published (kv_events_endpoint), by type.".into(),
                );
                ["BlockStored", "BlockRemoved", "AllBlocksCleared"].map(|t| {
                    r.register_counter(
                        &Key::from_parts("strata_kv_events_total", vec![Label::new("type", t)]),
                        &META,
                    )
                })
            },
            kv_events_dropped_total: counter(
                "strata_kv_events_dropped_total",
                Unit::Count,
                "Block changes dropped because the KV-event queue (kv_events_queue) was full.",
            ),
            kv_event_batches_total: counter(
                "strata_kv_event_batches_total",
                Unit::Count,
                "KV-event batches published; the next batch's sequence number.",
            ),
            kv_event_replays_total: counter(
                "strata_kv_event_replays_total",
                Unit::Count,
                "Replay requests served on kv_events_replay_endpoint.",
            ),
            nvme: nvme_exported,
            gpu: gpu_exported,
        };
        let transfers = Transfers::register(r);
        let prefixes = Prefixes::register(r);
        Metrics {
            recorder,
            handle,
            commands,
            counters: Counters::default(),
            transfers,
            prefixes,
            exported,
        }
    }

    /// The Prometheus text exposition, with every figure brought up to date.
    pub fn render(&self, x: &Scrape<'_>) -> String {
        let e = &self.exported;
        let c = &self.counters;
        let s = &x.store;
        e.connected_clients.set(x.connected_clients as f64);
        e.connections_total
            .absolute(c.connections_total.load(Relaxed));
        e.rejected_connections_total
            .absolute(c.rejected_connections_total.load(Relaxed));
        e.tls_handshake_failures_total
            .absolute(c.tls_handshake_failures_total.load(Relaxed));
        e.protocol_errors_total
            .absolute(c.protocol_errors_total.load(Relaxed));
        e.too_large_total.absolute(c.too_large_total.load(Relaxed));
        e.buffer_busy_total
            .absolute(c.buffer_busy_total.load(Relaxed));
        e.request_buffer_bytes.set(x.request_buffer_bytes as f64);
        e.net_input_bytes_total
            .absolute(c.net_input_bytes_total.load(Relaxed));
        e.net_output_bytes_total
            .absolute(c.net_output_bytes_total.load(Relaxed));
        e.keys.set(s.keys as f64);
        e.expiring_keys.set(s.expiring_keys as f64);
        e.capacity_bytes.set(s.capacity_bytes as f64);
        e.used_bytes.set(s.used_bytes as f64);
        e.reserved_bytes.set(s.reserved_bytes as f64);
        e.value_bytes.set(s.value_bytes as f64);
        let nvme_hits = c.nvme_hits_total.load(Relaxed);
        e.busy_poll_hits_total
            .absolute(c.busy_poll_hits_total.load(Relaxed));
        e.busy_poll_misses_total
            .absolute(c.busy_poll_misses_total.load(Relaxed));
        e.echo_poll_hits_total
            .absolute(c.echo_poll_hits_total.load(Relaxed));
        e.echo_poll_misses_total
            .absolute(c.echo_poll_misses_total.load(Relaxed));
        e.puts_abandoned_total
            .absolute(c.puts_abandoned_total.load(Relaxed));
        // A read served from NVMe or the GPU is counted once, there.
        e.hits_total
            .absolute(s.hits.saturating_sub(s.gpu.hits + nvme_hits));
        e.gpu_hits_total.absolute(s.gpu.hits);
        e.nvme_hits_total.absolute(nvme_hits);
        e.misses_total.absolute(s.misses);
        e.evictions_total.absolute(s.evictions);
        e.evicted_bytes_total.absolute(s.evicted_bytes);
        e.expired_keys_total.absolute(s.expired);
        e.uptime_seconds.set(x.uptime_seconds);
        e.leases_out.set(x.leases_out as f64);
        e.ring_nodes.set(x.ring_nodes as f64);
        e.etcd_healthy.set(f64::from(u8::from(x.etcd_healthy)));
        e.fenced.set(f64::from(u8::from(x.fenced)));
        e.members_removed_total
            .absolute(c.members_removed_total.load(Relaxed));
        e.writes_short_of_copies_total
            .absolute(c.writes_short_of_copies_total.load(Relaxed));
        e.under_replicated_keys.set(x.under_replicated_keys as f64);
        e.under_replicated_writes_total
            .absolute(x.under_replicated_writes);
        e.replica_pushes_total
            .absolute(c.replica_pushes_total.load(Relaxed));
        e.replica_push_errors_total
            .absolute(c.replica_push_errors_total.load(Relaxed));
        e.repair_runs_total
            .absolute(c.repair_runs_total.load(Relaxed));
        e.repair_pushes_total
            .absolute(c.repair_pushes_total.load(Relaxed));
        e.repair_shed_total
            .absolute(c.repair_shed_total.load(Relaxed));
        let ts = x.transport;
        e.data_reads_served_total
            .absolute(ts.reads_served.load(Relaxed));
        e.data_reads_refused_total
            .absolute(ts.reads_refused.load(Relaxed));
        e.data_reads_in_progress
            .set(ts.reads_in_progress.load(Relaxed) as f64);
        if let Some(cma) = x.cma {
            let r = cma.reader.stats();
            e.cma_sessions_total.absolute(cma.sessions.load(Relaxed));
            e.cma_refused_total.absolute(cma.refused.load(Relaxed));
            e.cma_reads_total.absolute(r.reads.load(Relaxed));
            e.cma_read_bytes_total.absolute(r.bytes.load(Relaxed));
            e.cma_read_errors_total.absolute(r.errors.load(Relaxed));
            e.cma_lane_pieces_total
                .absolute(r.lane_pieces.load(Relaxed));
            e.cma_misaligned_reads_total
                .absolute(r.misaligned.load(Relaxed));
        }
        {
            let (g, x) = (&s.gpu, &e.gpu);
            x.capacity_bytes.set(g.capacity_bytes as f64);
            x.used_bytes.set(g.used_bytes as f64);
            x.value_bytes.set(g.value_bytes as f64);
            x.keys.set(g.keys as f64);
            x.uploads_total.absolute(g.uploads);
            x.demotions_total.absolute(g.demotions);
            x.staged_reads_total.absolute(g.staged_reads);
            x.full_total.absolute(g.full);
            x.errors_total.absolute(g.errors);
        }
        if let Some(n) = &x.spill {
            let x = &e.nvme;
            x.capacity_bytes.set(n.nvme.capacity_bytes as f64);
            x.used_bytes.set(n.nvme.used_bytes as f64);
            x.entries.set(n.nvme.entries as f64);
            x.evicted_blocks_total.absolute(n.nvme.evicted_blocks);
            x.reclaim_copied_total.absolute(n.nvme.reinserted);
            x.evictions_total.absolute(n.nvme.reclaim_dropped);
            x.spill_queue_bytes.set(n.queued_bytes as f64);
            x.spilled_total.absolute(n.spilled);
            x.spilled_bytes_total.absolute(n.spilled_bytes);
            x.spill_dropped_total.absolute(n.dropped + n.too_large);
            x.spill_kept_total.absolute(n.kept);
            x.promoted_total.absolute(n.promoted);
            x.promoted_bytes_total.absolute(n.promoted_bytes);
            x.write_errors_total.absolute(n.write_errors);
            x.read_errors_total.absolute(n.read_errors);
        }
        let hub = x.pubsub;
        e.pubsub_subscribers.set(hub.subscribers() as f64);
        e.pubsub_channels.set(hub.channel_count() as f64);
        e.pubsub_patterns.set(hub.pattern_count() as f64);
        e.pubsub_messages_total
            .absolute(hub.stats.messages.load(Relaxed));
        e.pubsub_dropped_total
            .absolute(hub.stats.dropped.load(Relaxed));
        e.pubsub_disconnected_total
            .absolute(hub.stats.disconnected.load(Relaxed));
        for (c, n) in e.keyspace_events_total.iter().zip(&hub.keyspace.published) {
            c.absolute(n.load(Relaxed));
        }
        e.keyspace_events_dropped_total
            .absolute(hub.keyspace.queue.dropped.load(Relaxed));
        if let Some(kv) = x.kv_events {
            for (c, n) in e
                .kv_events_total
                .iter()
                .zip([&kv.stored, &kv.removed, &kv.cleared])
            {
                c.absolute(n.load(Relaxed));
            }
            e.kv_events_dropped_total.absolute(kv.dropped.load(Relaxed));
            e.kv_event_batches_total.absolute(kv.batches.load(Relaxed));
            e.kv_event_replays_total.absolute(kv.replays.load(Relaxed));
        }
        self.transfers.export();
        self.prefixes.export();
        for cmd in &self.commands {
            cmd.calls_out.absolute(cmd.calls.load(Relaxed));
            cmd.errors_out.absolute(cmd.errors.load(Relaxed));
        }
        self.exposition()
    }

    /// The text exposition of the figures as they now stand.
    fn exposition(&self) -> String {
        // Keep the recorder alive for as long as the handles are used.
        let _ = &self.recorder;
        let mut out = self.handle.render();
        COMMAND_SECONDS.render(&mut out, self.commands.iter().map(|c| &c.latency));
        self.transfers.render(&mut out);
        self.prefixes.render(&mut out);
        out
    }

    /// The name of every metric the node exports (each `# TYPE` line of a
    /// scrape), for checks that the docs list them all.
    pub fn names(&self) -> Vec<String> {
        self.exposition()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect()
    }
}
