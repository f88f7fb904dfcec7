//! `INFO [section ...]`: the node's figures in Redis' `# Section` /
//! `key:value` text. The numbers are the same atomics `/metrics` exports.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out, COMMANDS};
use crate::node::Node;

const SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "stats",
    "tiers",
    "cluster",
    "keyspace",
    "commandstats",
];
/// Sections shown by a plain `INFO` (Redis leaves commandstats out too).
const DEFAULT: &[&str] = &[
    "server", "clients", "memory", "stats", "tiers", "cluster", "keyspace",
];

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let wanted: Vec<String> = args[1..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let pick = |s: &str| {
        if wanted.is_empty() || wanted.iter().any(|w| w == "default") {
            DEFAULT.contains(&s)
        } else {
            wanted
                .iter()
                .any(|w| w == s || w == "all" || w == "everything")
        }
    };
    let mut out = String::new();
    for section in SECTIONS.iter().filter(|s| pick(s)) {
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        render(ctx.node, section, &mut out);
    }
    Reply::Verbatim(out).into()
}

fn render(node: &Node, section: &str, out: &mut String) {
    let s = node.store.stats();
    let c = &node.metrics.counters;
    match section {
        "server" => {
            out.push_str("# Server\r\n");
            line(out, "strata_version", env!("CARGO_PKG_VERSION"));
            // Some clients check this; strata speaks the 7.0 command subset
            // documented in docs/PROTOCOL.md.
            line(out, "redis_version", "7.0.0");
            line(out, "redis_mode", "standalone");
            line(out, "os", std::env::consts::OS);
            line(out, "arch_bits", usize::BITS);
            line(out, "process_id", std::process::id());
            line(out, "tcp_port", node.cfg.port);
            line(out, "uptime_in_seconds", node.started.elapsed().as_secs());
            line(
                out,
                "metadata_server",
                if node.cfg.standalone() {
                    "standalone".to_string()
                } else {
                    node.cfg.metadata_server.join(",")
                },
            );
            line(out, "protocol", &node.cfg.protocol);
        }
        "clients" => {
            out.push_str("# Clients\r\n");
            line(out, "connected_clients", node.connected_clients());
            line(out, "maxclients", node.cfg.max_connections);
        }
        "memory" => {
            out.push_str("# Memory\r\n");
            line(out, "used_memory", s.used_bytes);
            line(out, "maxmemory", s.capacity_bytes);
            line(out, "maxmemory_policy", "allkeys-lru");
        }
        "stats" => {
            out.push_str("# Stats\r\n");
            let total: u64 = node
                .metrics
                .commands
                .iter()
                .map(|c| c.calls.load(Relaxed))
                .sum();
            line(
                out,
                "total_connections_received",
                c.connections_total.load(Relaxed),
            );
            line(out, "total_commands_processed", total);
            line(
                out,
                "rejected_connections",
                c.rejected_connections_total.load(Relaxed),
            );
            line(
                out,
                "tls_handshake_failures",
                c.tls_handshake_failures_total.load(Relaxed),
            );
            line(
                out,
                "total_net_input_bytes",
                c.net_input_bytes_total.load(Relaxed),
            );
            line(
                out,
                "total_net_output_bytes",
                c.net_output_bytes_total.load(Relaxed),
            );
            line(
                out,
                "protocol_errors",
                c.protocol_errors_total.load(Relaxed),
            );
            line(out, "too_large_requests", c.too_large_total.load(Relaxed));
            line(
                out,
                "request_buffer_busy",
                c.buffer_busy_total.load(Relaxed),
            );
            line(out, "request_buffer_bytes", node.request_buffer_bytes());
            line(out, "keyspace_hits", s.hits);
            line(out, "keyspace_misses", s.misses);
            line(out, "evicted_keys", s.evictions);
            line(out, "expired_keys", s.expired);
            line(out, "leases_out", node.leases.len());
            let ts = node.transport.stats();
            line(out, "data_reads_served", ts.reads_served.load(Relaxed));
            line(out, "data_reads_refused", ts.reads_refused.load(Relaxed));
            line(
                out,
                "data_reads_in_progress",
                ts.reads_in_progress.load(Relaxed),
            );
            match &node.cma {
                Some(c) => {
                    let r = c.reader.stats();
                    line(out, "cma_enabled", 1);
                    line(out, "cma_sessions", c.sessions.load(Relaxed));
                    line(out, "cma_refused", c.refused.load(Relaxed));
                    line(out, "cma_reads", r.reads.load(Relaxed));
                    line(out, "cma_read_bytes", r.bytes.load(Relaxed));
                    line(out, "cma_read_errors", r.errors.load(Relaxed));
                    line(out, "cma_lane_pieces", r.lane_pieces.load(Relaxed));
                    line(out, "cma_misaligned_reads", r.misaligned.load(Relaxed));
                }
                None => line(out, "cma_enabled", 0),
            }
            line(out, "busy_poll_hits", c.busy_poll_hits_total.load(Relaxed));
            line(
                out,
                "busy_poll_misses",
                c.busy_poll_misses_total.load(Relaxed),
            );
            line(out, "echo_poll_hits", c.echo_poll_hits_total.load(Relaxed));
            line(
                out,
                "echo_poll_misses",
                c.echo_poll_misses_total.load(Relaxed),
            );
            line(out, "puts_abandoned", c.puts_abandoned_total.load(Relaxed));
            let nvme_hits = c.nvme_hits_total.load(Relaxed);
            line(out, "keyspace_hits_gpu", s.gpu.hits);
            line(out, "keyspace_hits_nvme", nvme_hits);
            line(
                out,
                "keyspace_hits_dram",
                s.hits.saturating_sub(s.gpu.hits + nvme_hits),
            );
            let p = &node.metrics.prefixes;
            line(out, "prefix_lookups", p.lookups.load(Relaxed));
            line(out, "prefix_blocks_requested", p.requested.load(Relaxed));
            line(out, "prefix_blocks_found", p.found.load(Relaxed));
            for f in node.metrics.transfers.flows() {
                let name = format!("transfer_{}_{}", f.direction.as_str(), f.transport);
                line(out, &format!("{name}_count"), f.transfers.load(Relaxed));
                line(out, &format!("{name}_bytes"), f.bytes.load(Relaxed));
                line(out, &format!("{name}_usec"), f.usec.load(Relaxed));
            }
            let hub = &node.pubsub;
            line(out, "pubsub_channels", hub.channel_count());
            line(out, "pubsub_patterns", hub.pattern_count());
            line(out, "pubsub_subscribers", hub.subscribers());
            line(out, "pubsub_messages", hub.stats.messages.load(Relaxed));
            line(out, "pubsub_dropped", hub.stats.dropped.load(Relaxed));
            line(
                out,
                "pubsub_disconnected",
                hub.stats.disconnected.load(Relaxed),
            );
            line(out, "notify_keyspace_events", hub.keyspace.flags());
            line(
                out,
                "keyspace_events_dropped",
                hub.keyspace.queue.dropped.load(Relaxed),
            );
            for (e, n) in crate::pubsub::keyspace::Event::ALL
                .iter()
                .zip(&hub.keyspace.published)
            {
                line(
                    out,
                    &format!("keyspace_events_{}", e.name()),
                    n.load(Relaxed),
                );
            }
            kv_events(out, node.kv_events.as_ref());
        }
        "tiers" => {
            out.push_str("# Tiers\r\n");
            match node.store.gpu_device() {
                None => line(out, "gpu_enabled", 0),
                Some(device) => {
                    let g = &s.gpu;
                    line(out, "gpu_enabled", 1);
                    line(out, "gpu_device", device);
                    line(out, "gpu_capacity_bytes", g.capacity_bytes);
                    line(out, "gpu_used_bytes", g.used_bytes);
                    line(out, "gpu_value_bytes", g.value_bytes);
                    line(out, "gpu_keys", g.keys);
                    line(out, "gpu_uploads", g.uploads);
                    line(out, "gpu_demotions", g.demotions);
                    line(out, "gpu_staged_reads", g.staged_reads);
                    line(out, "gpu_full", g.full);
                    line(out, "gpu_errors", g.errors);
                }
            }
            line(out, "dram_capacity_bytes", s.capacity_bytes);
            line(out, "dram_used_bytes", s.used_bytes);
            line(out, "dram_reserved_bytes", s.reserved_bytes);
            line(out, "dram_value_bytes", s.value_bytes);
            line(out, "dram_keys", s.keys - s.gpu.keys);
            line(out, "dram_evictions", s.evictions);
            line(out, "dram_evicted_bytes", s.evicted_bytes);
            let Some(spill) = &node.spill else {
                line(out, "nvme_enabled", 0);
                return;
            };
            let n = spill.stats();
            line(out, "nvme_enabled", 1);
            if let Some(lower) = &node.lower {
                line(out, "nvme_path", lower.path.display());
            }
            line(out, "nvme_capacity_bytes", n.nvme.capacity_bytes);
            line(out, "nvme_used_bytes", n.nvme.used_bytes);
            line(out, "nvme_block_bytes", n.nvme.block_bytes);
            line(out, "nvme_entries", n.nvme.entries);
            line(out, "nvme_evicted_blocks", n.nvme.evicted_blocks);
            line(out, "nvme_reclaim_copied", n.nvme.reinserted);
            line(out, "nvme_evictions", n.nvme.reclaim_dropped);
            line(out, "nvme_spill_queued", n.queued);
            line(out, "nvme_spill_queued_bytes", n.queued_bytes);
            line(out, "nvme_spilled", n.spilled);
            line(out, "nvme_spilled_bytes", n.spilled_bytes);
            line(out, "nvme_spill_dropped", n.dropped);
            line(out, "nvme_spill_kept", n.kept);
            line(out, "nvme_spill_too_large", n.too_large);
            line(out, "nvme_write_errors", n.write_errors);
            line(out, "nvme_promoted", n.promoted);
            line(out, "nvme_promoted_bytes", n.promoted_bytes);
            line(out, "nvme_read_errors", n.read_errors);
        }
        "cluster" => {
            out.push_str("# Cluster\r\n");
            let cl = &node.cluster;
            let ring = cl.ring();
            line(out, "cluster_enabled", u8::from(!cl.standalone()));
            line(out, "node_id", &cl.me.id);
            line(out, "ring_nodes", ring.len());
            line(out, "ring_version", cl.ring_version.load(Relaxed));
            line(out, "replica_num", node.cfg.replica_num);
            // Copies a slot can have now, and over how many failure domains:
            // hosts first, then distinct nodes of a shared host.
            let wanted = node.cfg.replica_num as usize;
            line(out, "replicas_wanted", wanted);
            line(out, "replicas_placeable", wanted.min(ring.len()));
            line(out, "failure_domains", ring.hosts());
            // A standalone node has no etcd: neither healthy nor not.
            if !cl.standalone() {
                line(out, "etcd_healthy", u8::from(cl.etcd_healthy.load(Relaxed)));
                line(out, "etcd_sessions", cl.etcd_sessions.load(Relaxed));
                line(out, "fenced", u8::from(!cl.fence.serving()));
                line(out, "fence_remaining_ms", cl.fence.remaining_ms());
                line(out, "suspected_members", cl.suspects.lock().len());
            }
            let under = &cl.under_replicated;
            line(out, "under_replicated_keys", under.len());
            line(
                out,
                "under_replicated_keys_overflowed",
                u8::from(under.overflowed()),
            );
            line(
                out,
                "under_replicated_writes",
                under.writes_total.load(Relaxed),
            );
            line(out, "replica_pushes", c.replica_pushes_total.load(Relaxed));
            line(
                out,
                "replica_push_errors",
                c.replica_push_errors_total.load(Relaxed),
            );
            line(out, "repair_runs", c.repair_runs_total.load(Relaxed));
            line(out, "repair_pushes", c.repair_pushes_total.load(Relaxed));
            line(out, "repair_shed", c.repair_shed_total.load(Relaxed));
        }
        "keyspace" => {
            out.push_str("# Keyspace\r\n");
            // Every tier, as DBSIZE counts (`expires` counts DRAM and GPU).
            let keys = node.store.len();
            if keys > 0 {
                let _ = write!(
                    out,
                    "db0:keys={},expires={},avg_ttl=0\r\n",
                    keys, s.expiring_keys
                );
            }
        }
        "commandstats" => {
            out.push_str("# Commandstats\r\n");
            for (spec, st) in COMMANDS.iter().zip(&node.metrics.commands) {
                let calls = st.calls.load(Relaxed);
                if calls == 0 {
                    continue;
                }
                let usec = st.usec.load(Relaxed);
                let name = format!("cmdstat_{}", spec.name.to_ascii_lowercase());
                let per_call = usec as f64 / calls as f64;
                let failed = st.errors.load(Relaxed);
                let stats = format!(
                    "calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls=0,failed_calls={failed}"
                );
                line(out, &name, stats);
            }
        }
        _ => {}
    }
}

fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = write!(out, "{key}:{value}\r\n");
}

/// The KV-event publisher's lines of `# Stats` (`kv_events_enabled:0`
/// alone when it is off).
fn kv_events(out: &mut String, kv: Option<&crate::kv_events::KvEvents>) {
    let Some(kv) = kv else {
        line(out, "kv_events_enabled", 0);
        return;
    };
    let s = &kv.stats;
    line(out, "kv_events_enabled", 1);
    line(out, "kv_events_endpoint", &kv.endpoint);
    line(out, "kv_events_replay_endpoint", &kv.replay_endpoint);
    line(out, "kv_events_batches", s.batches.load(Relaxed));
    line(out, "kv_events_stored", s.stored.load(Relaxed));
    line(out, "kv_events_removed", s.removed.load(Relaxed));
    line(out, "kv_events_cleared", s.cleared.load(Relaxed));
    line(out, "kv_events_dropped", s.dropped.load(Relaxed));
    line(out, "kv_events_replays", s.replays.load(Relaxed));
}
