//! Cluster membership through etcd.
//!
//! Each node registers its [`NodeRecord`] as JSON under
//! `/strata/<cluster>/nodes/<id>`, attached to an etcd lease that it keeps
//! alive; a node that dies stops renewing, etcd deletes its record after
//! `node_ttl_s`, and every other node sees the delete on its watch and drops
//! it from the ring. Records are re-published with fresh usage figures every
//! [`USAGE_INTERVAL`] (never more often).
//!
//! When etcd cannot be reached the node keeps serving with the last ring it
//! knew, reports `etcd_healthy:0`, and reconnects with bounded backoff. If
//! its lease expired meanwhile it registers again under a new one.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use etcd_client::{Client, ConnectOptions, EventType, GetOptions, PutOptions, WatchOptions};
use strata_ring::{NodeRecord, Ring, TierUsage};

use crate::node::Node;

/// How often usage figures are re-published.
pub const USAGE_INTERVAL: Duration = Duration::from_secs(5);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// One etcd request may take this long before the session is considered
/// broken.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

pub fn prefix(cluster: &str) -> String {
    format!("/strata/{cluster}/nodes/")
}

/// Runs for the life of the node.
pub async fn run(node: Arc<Node>) {
    let mut backoff = BACKOFF_MIN;
    loop {
        match session(&node).await {
            Ok(()) => backoff = BACKOFF_MIN,
            Err(e) => {
                if node.cluster.etcd_healthy.swap(false, Relaxed) {
                    tracing::warn!("etcd unreachable, serving with the last known ring: {e:#}");
                } else {
                    tracing::debug!("etcd still unreachable: {e:#}");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn record(node: &Node) -> NodeRecord {
    let s = node.store.stats();
    let mut me = node.cluster.me.clone();
    me.tiers = vec![TierUsage {
        tier: "dram".into(),
        capacity_bytes: s.capacity_bytes,
        used_bytes: s.reserved_bytes,
    }];
    if s.gpu.capacity_bytes > 0 {
        me.tiers.insert(
            0,
            TierUsage {
                tier: "gpu".into(),
                capacity_bytes: s.gpu.capacity_bytes,
                used_bytes: s.gpu.used_bytes,
            },
        );
    }
    if let Some(spill) = &node.spill {
        let n = spill.stats().nvme;
        me.tiers.push(TierUsage {
            tier: "nvme".into(),
            capacity_bytes: n.capacity_bytes,
            used_bytes: n.used_bytes,
        });
    }
    me
}

/// One registration: lease, record, watch; returns on any etcd failure.
async fn session(node: &Arc<Node>) -> anyhow::Result<()> {
    let cfg = &node.cfg;
    let opts = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), REQUEST_TIMEOUT);
    let mut client = super::etcd_conn::connect(cfg, opts)
        .await
        .context("connect")?;
    let ttl = i64::from(cfg.node_ttl_s);
    let lease = client
        .lease_grant(ttl, None)
        .await
        .context("lease grant")?
        .id();
    let prefix = prefix(&cfg.cluster_name);
    let my_key = format!("{prefix}{}", node.cluster.me.id);
    let publish = |mut client: Client| {
        let body = serde_json::to_vec(&record(node));
        let key = my_key.clone();
        async move {
            let body = body.context("encode record")?;
            client
                .put(key, body, Some(PutOptions::new().with_lease(lease)))
                .await
                .context("put record")?;
            Ok::<(), anyhow::Error>(())
        }
    };
    publish(client.clone()).await?;
    let (mut keeper, mut keepalive) = client.lease_keep_alive(lease).await.context("keepalive")?;

    let initial = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .context("list nodes")?;
    let revision = initial.header().map_or(0, |h| h.revision());
    let mut members: BTreeMap<String, NodeRecord> = BTreeMap::new();
    for kv in initial.kvs() {
        apply_put(&mut members, kv.value());
    }
    install(node, &members);
    let mut events = client
        .watch(
            prefix.clone(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await
        .context("watch")?;
    node.cluster.etcd_healthy.store(true, Relaxed);
    node.cluster.etcd_sessions.fetch_add(1, Relaxed);
    tracing::info!(id = %node.cluster.me.id, nodes = members.len(), "joined the cluster");

    let mut renew = tokio::time::interval(Duration::from_millis(
        (u64::from(cfg.node_ttl_s) * 1000 / 3).max(100),
    ));
    let mut usage = tokio::time::interval(USAGE_INTERVAL);
    usage.tick().await;
    loop {
        tokio::select! {
            _ = renew.tick() => {
                tokio::time::timeout(REQUEST_TIMEOUT, keeper.keep_alive())
                    .await
                    .map_err(|_| anyhow!("keepalive timed out"))?
                    .context("keepalive")?;
                let resp = tokio::time::timeout(REQUEST_TIMEOUT, keepalive.message())
                    .await
                    .map_err(|_| anyhow!("keepalive reply timed out"))?
                    .context("keepalive reply")?
                    .ok_or_else(|| anyhow!("keepalive stream ended"))?;
                if resp.ttl() <= 0 {
                    return Err(anyhow!("lease expired; registering again"));
                }
            }
            _ = usage.tick() => {
                tokio::time::timeout(REQUEST_TIMEOUT, publish(client.clone()))
                    .await
                    .map_err(|_| anyhow!("publishing usage timed out"))??;
            }
            msg = events.message() => {
                let resp = msg.context("watch")?.ok_or_else(|| anyhow!("watch ended"))?;
                if resp.canceled() {
                    return Err(anyhow!("watch canceled"));
                }
                let mut changed = false;
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => changed |= apply_put(&mut members, kv.value()),
                        EventType::Delete => {
                            let key = String::from_utf8_lossy(kv.key());
                            if let Some(id) = key.strip_prefix(&prefix) {
                                changed |= members.remove(id).is_some();
                            }
                        }
                    }
                }
                if changed {
                    install(node, &members);
                }
            }
        }
    }
}

/// Adds or updates a member; returns whether placement-relevant fields
/// changed (usage updates alone do not rebuild the ring).
fn apply_put(members: &mut BTreeMap<String, NodeRecord>, value: &[u8]) -> bool {
    let rec: NodeRecord = match serde_json::from_slice(value) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("ignoring an unreadable node record: {e}");
            return false;
        }
    };
    let placement_changed = members.get(&rec.id).is_none_or(|old| {
        (
            &old.resp_addr,
            &old.data_addr,
            &old.host,
            old.capacity_bytes,
            old.incarnation,
        ) != (
            &rec.resp_addr,
            &rec.data_addr,
            &rec.host,
            rec.capacity_bytes,
            rec.incarnation,
        )
    });
    members.insert(rec.id.clone(), rec);
    placement_changed
}

fn install(node: &Arc<Node>, members: &BTreeMap<String, NodeRecord>) {
    let ring = Ring::new(members.values().cloned().collect());
    let ids: Vec<&str> = members.keys().map(String::as_str).collect();
    tracing::info!(nodes = ?ids, "ring changed");
    let wanted = node.cfg.replica_num as usize;
    if wanted > 1 && ring.hosts() < wanted.min(ring.len()) {
        // Copies still go to distinct nodes, but a host's loss can take
        // more than one of them: say so where an operator looks.
        tracing::warn!(
            replicas_wanted = wanted,
            failure_domains = ring.hosts(),
            "fewer hosts than replicas: some copies share a host (set distinct host_name per machine)"
        );
    }
    let old = node.cluster.set_ring(ring);
    super::repair::on_ring_change(node, &old);
}

/// Deletes this node's record so that others drop it at once (graceful
/// shutdown); bounded in time, best effort.
pub async fn leave(node: &Node) {
    let cfg = &node.cfg;
    let key = format!("{}{}", prefix(&cfg.cluster_name), node.cluster.me.id);
    let attempt = async {
        let mut client = super::etcd_conn::connect(cfg, ConnectOptions::new()).await?;
        client.delete(key, None).await?;
        Ok::<(), etcd_client::Error>(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
        Ok(Ok(())) => tracing::info!("left the cluster"),
        Ok(Err(e)) => tracing::warn!("could not leave the cluster cleanly: {e}"),
        Err(_) => tracing::warn!("could not leave the cluster cleanly: etcd timed out"),
    }
}
