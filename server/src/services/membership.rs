//! Cluster membership through etcd.
//!
//! Each node registers its [`NodeRecord`] as JSON under
//! `/strata/<cluster>/nodes/<id>`, attached to an etcd lease that it keeps
//! alive; a node that dies stops renewing, etcd deletes its record after
//! `node_ttl_s`, and every other node sees the delete on its watch and drops
//! it from the ring. Records are re-published with fresh usage figures every
//! [`USAGE_INTERVAL`] (never more often).
//!
//! A ring that drops a member is installed only after the fence window
//! (`crate::cluster::fence`), so that the member has stopped serving first.
//!
//! When etcd cannot be reached the node keeps serving with the last ring it
//! knew while its proofs last (`crate::services::heartbeat`), reports
//! `etcd_healthy:0`, and reconnects with bounded backoff. If its record was
//! deleted meanwhile it drops its copies and registers again.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, WatchOptions,
};
use strata_ring::{NodeRecord, Ring, TierUsage};

use crate::cluster::fence::mono_ms;
use crate::node::Node;

/// How often usage figures are re-published.
pub const USAGE_INTERVAL: Duration = Duration::from_secs(5);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// One etcd request may take this long before the session is considered
/// broken.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a node kept out of the ring by a partition says so.
const REJOIN_WARN_EVERY: Duration = Duration::from_secs(5);

pub fn prefix(cluster: &str) -> String {
    format!("/strata/{cluster}/nodes/")
}

/// A client of the cluster's etcd whose requests time out after `timeout`.
pub async fn connect(cfg: &crate::config::Config, timeout: Duration) -> anyhow::Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(2), REQUEST_TIMEOUT);
    super::etcd_conn::connect(cfg, opts)
        .await
        .context("connect")
}

/// This node's record's key.
pub fn my_key(node: &Node) -> String {
    format!("{}{}", prefix(&node.cfg.cluster_name), node.cluster.me.id)
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
    me.incarnation = node.cluster.incarnation.load(Relaxed);
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
    let mut client = connect(cfg, REQUEST_TIMEOUT).await?;
    wait_for_peers(node, &mut client).await?;
    let ttl = i64::from(cfg.node_ttl_s);
    let sent = mono_ms();
    let lease = client
        .lease_grant(ttl, None)
        .await
        .context("lease grant")?
        .id();
    let fence = &node.cluster.fence;
    let prefix = prefix(&cfg.cluster_name);
    let my_key = my_key(node);
    let checked = mono_ms();
    register(node, &mut client, &my_key, lease).await?;
    // Only now, with copies that may be stale dropped: a node whose record
    // was deleted while it was away must not serve them in between.
    fence.lease_renewed(sent, Duration::from_secs(ttl as u64));
    fence.kept(checked, false);
    let (mut keeper, mut keepalive) = client.lease_keep_alive(lease).await.context("keepalive")?;

    let initial = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .context("list nodes")?;
    let revision = initial.header().map_or(0, |h| h.revision());
    let mut members: BTreeMap<String, NodeRecord> = BTreeMap::new();
    for kv in initial.kvs() {
        apply_put(node, &mut members, kv);
    }
    node.cluster
        .member_revisions
        .lock()
        .retain(|id, _| members.contains_key(id));
    let mut takeover = Takeover::default();
    takeover.changed(node, &members);
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
                let sent = mono_ms();
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
                    fence.revoke();
                    return Err(anyhow!("lease expired; registering again"));
                }
                fence.lease_renewed(sent, Duration::from_secs(resp.ttl() as u64));
            }
            _ = usage.tick() => {
                tokio::time::timeout(REQUEST_TIMEOUT, republish(node, client.clone(), &my_key, lease))
                    .await
                    .map_err(|_| anyhow!("publishing usage timed out"))??;
            }
            _ = takeover.due() => install(node, &members),
            msg = events.message() => {
                let resp = msg.context("watch")?.ok_or_else(|| anyhow!("watch ended"))?;
                if resp.canceled() {
                    return Err(anyhow!("watch canceled"));
                }
                let mut changed = false;
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => changed |= apply_put(node, &mut members, kv),
                        EventType::Delete => {
                            let key = String::from_utf8_lossy(kv.key());
                            if key == my_key {
                                fence.revoke();
                                return Err(anyhow!("this node's record was deleted (its peers found it unreachable, or its lease ran out)"));
                            }
                            if let Some(id) = key.strip_prefix(&prefix) {
                                node.cluster.member_revisions.lock().remove(id);
                                changed |= members.remove(id).is_some();
                            }
                        }
                    }
                }
                if changed {
                    takeover.changed(node, &members);
                }
            }
        }
    }
}

/// A ring that drops a member is installed only [`Fence::takeover_wait`]
/// after its record was seen gone (the member may still be serving on its
/// last proof until then); joins and updates are installed at once, unless
/// a removal is waiting, which they then join.
///
/// [`Fence::takeover_wait`]: crate::cluster::fence::Fence::takeover_wait
#[derive(Default)]
struct Takeover {
    at: Option<tokio::time::Instant>,
}

impl Takeover {
    fn changed(&mut self, node: &Arc<Node>, members: &BTreeMap<String, NodeRecord>) {
        let ring = node.cluster.ring();
        let drops = ring.nodes().iter().any(|n| !members.contains_key(&n.id));
        if drops && self.at.is_none() {
            let wait = node.cluster.fence.takeover_wait();
            tracing::info!(
                wait_ms = wait.as_millis() as u64,
                "a member left; taking over its slots after the fence window"
            );
            self.at = Some(tokio::time::Instant::now() + wait);
        }
        if self.at.is_none() {
            install(node, members);
        }
    }

    /// Resolves when a waiting takeover is due (never while none waits).
    async fn due(&mut self) {
        match self.at {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.at = None;
            }
            None => std::future::pending().await,
        }
    }
}

/// Returns once this node reaches at least half of the other members
/// registered in etcd (none registered: at once). A node cut off from its
/// peers but not from etcd thus stays out of the ring, fenced, until the
/// partition heals, instead of joining, being removed by the peers that
/// cannot reach it, and joining again. A member that died is waited for
/// only until its lease runs out and its record goes.
async fn wait_for_peers(node: &Node, client: &mut Client) -> anyhow::Result<()> {
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        let others = tokio::time::timeout(REQUEST_TIMEOUT, registered_others(node, client))
            .await
            .map_err(|_| anyhow!("listing members timed out"))??;
        let reached = super::detector::reachable(node, &others).await;
        if reached * 2 >= others.len() && (others.is_empty() || reached > 0) {
            return Ok(());
        }
        if warned.is_none_or(|at| at.elapsed() >= REJOIN_WARN_EVERY) {
            tracing::warn!(
                reached,
                members = others.len(),
                "not joining the ring yet: this node reaches fewer than half of the other members (a network partition between them?)"
            );
            warned = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(node.cluster.fence.window() / 5).await;
    }
}

/// The records of the other members in etcd.
async fn registered_others(node: &Node, client: &mut Client) -> anyhow::Result<Vec<NodeRecord>> {
    let got = client
        .get(
            prefix(&node.cfg.cluster_name),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .context("list nodes")?;
    let me = &node.cluster.me.id;
    Ok(got
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeRecord>(kv.value()).ok())
        .filter(|r| &r.id != me)
        .collect())
}

/// Puts this node's record under `lease` and learns its create revision.
///
/// A node whose record was deleted while it was away (its lease ran out,
/// or its peers found it unreachable) may hold copies that others have
/// since overwritten while they served its slots: it drops them all and
/// comes back as a new incarnation, which the others repair as a new
/// member (the replicas hold what was acknowledged). Whether the record is
/// still its own and the put are one transaction, so a delete can never
/// slip between them. A record still there (an etcd outage its lease
/// outlived, a reconnect) keeps its copies.
async fn register(node: &Node, client: &mut Client, key: &str, lease: i64) -> anyhow::Result<()> {
    let cl = &node.cluster;
    let mine = cl.my_revision.load(Relaxed);
    if mine == 0 || !put_record(node, client, key, lease, Some(mine)).await? {
        if mine != 0 {
            drop_copies(node);
        }
        put_record(node, client, key, lease, None).await?;
    }
    let got = client.get(key, None).await.context("read own record")?;
    let rev = got
        .kvs()
        .first()
        .map(|kv| kv.create_revision())
        .ok_or_else(|| anyhow!("own record vanished after its put"))?;
    cl.my_revision.store(rev, Relaxed);
    Ok(())
}

/// Puts this node's record, only over the one created at `only_over` if
/// given; whether it was put.
async fn put_record(
    node: &Node,
    client: &mut Client,
    key: &str,
    lease: i64,
    only_over: Option<i64>,
) -> anyhow::Result<bool> {
    let body = serde_json::to_vec(&record(node)).context("encode record")?;
    let put = TxnOp::put(key, body, Some(PutOptions::new().with_lease(lease)));
    let txn = match only_over {
        Some(rev) => Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then(vec![put]),
        None => Txn::new().and_then(vec![put]),
    };
    Ok(client.txn(txn).await.context("put record")?.succeeded())
}

/// Empties the store and takes a new incarnation (see [`register`]).
fn drop_copies(node: &Node) {
    let cl = &node.cluster;
    let keys = node.store.stats().keys;
    node.store.flush(crate::clock::now_ms());
    cl.my_revision.store(0, Relaxed);
    let next = cl.incarnation.load(Relaxed).max(crate::clock::now_ms()) + 1;
    cl.incarnation.store(next, Relaxed);
    tracing::warn!(
        dropped_keys = keys,
        "this node's record was deleted while it was away; its copies may be stale and were dropped"
    );
}

/// Re-publishes usage figures, only over this node's own record (a
/// deleted one is not brought back: the node registers anew).
async fn republish(node: &Node, mut client: Client, key: &str, lease: i64) -> anyhow::Result<()> {
    let body = serde_json::to_vec(&record(node)).context("encode record")?;
    let mine = node.cluster.my_revision.load(Relaxed);
    let txn = Txn::new()
        .when(vec![Compare::create_revision(key, CompareOp::Equal, mine)])
        .and_then(vec![TxnOp::put(
            key,
            body,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    if !client.txn(txn).await.context("put record")?.succeeded() {
        node.cluster.fence.revoke();
        return Err(anyhow!("this node's record was deleted; registering again"));
    }
    Ok(())
}

/// Adds or updates a member; returns whether placement-relevant fields
/// changed (usage updates alone do not rebuild the ring).
fn apply_put(node: &Node, members: &mut BTreeMap<String, NodeRecord>, kv: &KeyValue) -> bool {
    let rec: NodeRecord = match serde_json::from_slice(kv.value()) {
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
    node.cluster
        .member_revisions
        .lock()
        .insert(rec.id.clone(), kv.mod_revision());
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
    // Others take over once they see the record gone: stop first.
    node.cluster.fence.revoke();
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
