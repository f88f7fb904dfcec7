//! `CLUSTER SHARDS|SLOTS|NODES|INFO|KEYSLOT|MYID`: the ring described in
//! Redis Cluster's shapes, so unmodified cluster-aware clients (redis-cli
//! -c, redis-py RedisCluster) route by themselves. Every node is a
//! "master" of the slot ranges it owns; replicas of a slot are listed after
//! its owner.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};
use strata_ring::{key_slot, NodeRecord, SLOTS};

use super::{Ctx, Out};
use crate::cluster::{hex_id, split_addr};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let sub = args[1].to_ascii_uppercase();
    let c = &ctx.node.cluster;
    let ring = c.ring();
    let copies = ctx.node.cfg.replica_num as usize;
    // A fenced node's map may name itself for slots others now serve:
    // clients should learn the map elsewhere.
    if matches!(sub.as_slice(), b"SLOTS" | b"SHARDS" | b"NODES") {
        if let Err(e) = c.check_fence() {
            return e.into();
        }
    }
    match (sub.as_slice(), &args[2..]) {
        (b"KEYSLOT", [key]) => Reply::Int(i64::from(key_slot(key))).into(),
        (b"MYID", []) => Reply::text(&hex_id(&c.me.id)).into(),
        (b"INFO", []) => {
            let assigned: u32 = ring
                .slot_map()
                .iter()
                .map(|r| u32::from(r.end - r.start) + 1)
                .sum();
            let state = if assigned == u32::from(SLOTS) {
                "ok"
            } else {
                "fail"
            };
            let epoch = c.ring_version.load(std::sync::atomic::Ordering::Relaxed);
            Reply::Verbatim(format!(
                "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{assigned}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{}\r\ncluster_size:{}\r\ncluster_current_epoch:{epoch}\r\ncluster_my_epoch:{epoch}\r\n",
                ring.len(),
                ring.len()
            ))
            .into()
        }
        (b"SLOTS", []) => Reply::Array(
            replica_ranges(&ring, copies)
                .into_iter()
                .map(|(start, end, nodes)| {
                    let mut entry = vec![Reply::Int(i64::from(start)), Reply::Int(i64::from(end))];
                    entry.extend(nodes.into_iter().map(node_entry));
                    Reply::Array(entry)
                })
                .collect(),
        )
        .into(),
        (b"SHARDS", []) => Reply::Array(
            ring.nodes()
                .iter()
                .map(|n| {
                    let slots: Vec<Reply> = ring
                        .slot_map()
                        .iter()
                        .filter(|r| r.node.id == n.id)
                        .flat_map(|r| {
                            [Reply::Int(i64::from(r.start)), Reply::Int(i64::from(r.end))]
                        })
                        .collect();
                    Reply::Map(vec![
                        (Reply::text("slots"), Reply::Array(slots)),
                        (Reply::text("nodes"), Reply::Array(vec![shard_node(n)])),
                    ])
                })
                .collect(),
        )
        .into(),
        (b"NODES", []) => {
            let mut out = String::new();
            for n in ring.nodes() {
                let (host, port) = split_addr(&n.resp_addr);
                let me = if n.id == c.me.id {
                    "myself,master"
                } else {
                    "master"
                };
                out.push_str(&format!(
                    "{} {host}:{port}@{port},{} {me} - 0 0 1 connected",
                    hex_id(&n.id),
                    n.host
                ));
                for r in ring.slot_map().iter().filter(|r| r.node.id == n.id) {
                    if r.start == r.end {
                        out.push_str(&format!(" {}", r.start));
                    } else {
                        out.push_str(&format!(" {}-{}", r.start, r.end));
                    }
                }
                out.push('\n');
            }
            Reply::Verbatim(out).into()
        }
        (b"KEYSLOT" | b"MYID" | b"INFO" | b"SLOTS" | b"SHARDS" | b"NODES", _) => {
            CommandError::wrong_arity(&format!(
                "cluster|{}",
                String::from_utf8_lossy(&sub).to_lowercase()
            ))
            .into()
        }
        _ => CommandError::unknown_subcommand("CLUSTER", &args[1]).into(),
    }
}

/// Contiguous slot ranges with the same owner AND the same replicas: the
/// replica set can change inside one owner's range (another node's point
/// between two of the owner's), so ranges are split on either.
fn replica_ranges(ring: &strata_ring::Ring, copies: usize) -> Vec<(u16, u16, Vec<&NodeRecord>)> {
    let mut out: Vec<(u16, u16, Vec<&NodeRecord>)> = Vec::new();
    for slot in 0..SLOTS {
        let set = ring.replicas(slot, copies);
        if set.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((_, end, nodes))
                if *end + 1 == slot
                    && nodes.len() == set.len()
                    && nodes.iter().zip(&set).all(|(a, b)| a.id == b.id) =>
            {
                *end = slot;
            }
            _ => out.push((slot, slot, set)),
        }
    }
    out
}

/// `[ip, port, id]` as in CLUSTER SLOTS.
fn node_entry(n: &NodeRecord) -> Reply {
    let (host, port) = split_addr(&n.resp_addr);
    Reply::Array(vec![
        Reply::text(host),
        Reply::Int(i64::from(port)),
        Reply::text(&hex_id(&n.id)),
    ])
}

fn shard_node(n: &NodeRecord) -> Reply {
    let (host, port) = split_addr(&n.resp_addr);
    Reply::Map(vec![
        (Reply::text("id"), Reply::text(&hex_id(&n.id))),
        (Reply::text("port"), Reply::Int(i64::from(port))),
        (Reply::text("ip"), Reply::text(host)),
        (Reply::text("endpoint"), Reply::text(host)),
        (Reply::text("hostname"), Reply::text(&n.host)),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("replication-offset"), Reply::Int(0)),
        (Reply::text("health"), Reply::text("online")),
        (Reply::text("strata-id"), Reply::text(&n.id)),
        (Reply::text("data-endpoint"), Reply::text(&n.data_addr)),
    ])
}
