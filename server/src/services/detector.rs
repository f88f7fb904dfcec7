//! Finds dead or cut-off members fast, without waiting for their etcd
//! lease to run out.
//!
//! Every fifth of `fence_ms` this node pings each other member on a
//! connection of its own; a ping unanswered within that fifth has failed.
//! A member whose pings have failed for half of `fence_ms` (or that
//! refused the connection twice) is suspected. When a
//! majority of the other members suspect it too (`STRATA.VOUCH` answers
//! 0), this node deletes its record in etcd — only the version of it that
//! it last saw (a restarted member's new one stays) — and every node then takes over its slots after the
//! fence window (`crate::services::membership`), by which time the member,
//! whether dead or only cut off, has stopped serving
//! (`crate::cluster::fence`).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use redis_protocol::resp2::types::BytesFrame;
use strata_ring::NodeRecord;

use crate::cluster::fence::mono_ms;
use crate::cluster::peer::{PeerError, Peers};
use crate::node::Node;
use crate::services::membership;

/// One member's recent answers.
#[derive(Default)]
struct Health {
    /// When it first failed since it last answered (monotonic ms; 0: it
    /// answered last time).
    failing_since: u64,
    refused: u32,
    /// The record version this node already deleted (never twice).
    deleted: i64,
}

/// Runs for the life of a cluster member.
pub async fn run(node: Arc<Node>) {
    let window = node.cluster.fence.window();
    // A ping answers in well under a millisecond on a LAN: one that takes
    // a probe interval counts as failed, and failures must last half the
    // window before a member is suspected.
    let patience = window / 5;
    let peers = node.peers.sibling();
    let mut health: HashMap<String, Health> = HashMap::new();
    let mut etcd: Option<Client> = None;
    let mut tick = tokio::time::interval(window / 5);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let others = others(&node);
        health.retain(|id, _| others.iter().any(|n| &n.id == id));
        node.cluster
            .suspects
            .lock()
            .retain(|id| others.iter().any(|n| &n.id == id));
        let sent = mono_ms();
        let answers =
            futures::future::join_all(others.iter().map(|n| ping(&peers, &n.resp_addr, patience)))
                .await;
        for (n, answer) in others.iter().zip(answers) {
            let h = health.entry(n.id.clone()).or_default();
            if suspect(h, answer, sent, window) {
                node.cluster.suspects.lock().insert(n.id.clone());
            } else {
                node.cluster.suspects.lock().remove(&n.id);
            }
        }
        let suspects: Vec<NodeRecord> = {
            let s = node.cluster.suspects.lock();
            others.into_iter().filter(|n| s.contains(&n.id)).collect()
        };
        for n in suspects {
            let rev = node.cluster.member_revisions.lock().get(&n.id).copied();
            let Some(rev) = rev else { continue };
            let h = health.entry(n.id.clone()).or_default();
            if h.deleted == rev || !confirmed(&node, &peers, &n, patience).await {
                continue;
            }
            if delete_record(&node, &mut etcd, &n.id, rev, patience).await {
                h.deleted = rev;
                node.metrics
                    .counters
                    .members_removed_total
                    .fetch_add(1, Relaxed);
                tracing::warn!(member = %n.id, "removed an unreachable member from the cluster");
            }
        }
    }
}

/// The ring's members other than this node.
fn others(node: &Node) -> Vec<NodeRecord> {
    let me = &node.cluster.me.id;
    let ring = node.cluster.ring();
    ring.nodes()
        .iter()
        .filter(|n| &n.id != me)
        .cloned()
        .collect()
}

/// How many of `members` answer a ping within a fifth of the fence window.
pub async fn reachable(node: &Node, members: &[NodeRecord]) -> usize {
    let patience = node.cluster.fence.window() / 5;
    let answers = futures::future::join_all(
        members
            .iter()
            .map(|n| ping(&node.peers, &n.resp_addr, patience)),
    )
    .await;
    answers.into_iter().filter(|a| *a == Ok(true)).count()
}

/// `Ok(true)`: answered; `Ok(false)`: refused the connection; `Err`: no
/// answer in time.
async fn ping(peers: &Peers, addr: &str, patience: Duration) -> Result<bool, ()> {
    match tokio::time::timeout(patience, peers.call(addr, &[b"PING"])).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(PeerError::Io(_, e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Ok(false)
        }
        Ok(Err(PeerError::Refused(..))) => Ok(true),
        _ => Err(()),
    }
}

/// Updates a member's health with the outcome of one ping sent at `sent`;
/// whether it is now suspected.
fn suspect(h: &mut Health, answer: Result<bool, ()>, sent: u64, window: Duration) -> bool {
    match answer {
        Ok(true) => {
            h.failing_since = 0;
            h.refused = 0;
            return false;
        }
        Ok(false) => h.refused += 1,
        Err(()) => {}
    }
    if h.failing_since == 0 {
        h.failing_since = sent;
    }
    h.refused >= 2 || mono_ms() - h.failing_since >= window.as_millis() as u64 / 2
}

/// Whether, with this node, more than half of the members other than `n`
/// suspect it.
async fn confirmed(node: &Node, peers: &Peers, n: &NodeRecord, patience: Duration) -> bool {
    let voters: Vec<NodeRecord> = others(node).into_iter().filter(|o| o.id != n.id).collect();
    let asks = voters.iter().map(|v| async move {
        let ask: [&[u8]; 2] = [b"STRATA.VOUCH", n.id.as_bytes()];
        matches!(
            tokio::time::timeout(patience, peers.call(&v.resp_addr, &ask)).await,
            Ok(Ok(BytesFrame::Integer(0)))
        )
    });
    let agree = 1 + futures::future::join_all(asks)
        .await
        .into_iter()
        .filter(|a| *a)
        .count();
    agree * 2 > voters.len() + 1
}

/// Deletes member `id`'s record if it is still the version put at `rev`.
async fn delete_record(
    node: &Node,
    etcd: &mut Option<Client>,
    id: &str,
    rev: i64,
    patience: Duration,
) -> bool {
    let key = format!("{}{id}", membership::prefix(&node.cfg.cluster_name));
    let attempt = async {
        if etcd.is_none() {
            *etcd = Some(membership::connect(&node.cfg, patience).await?);
        }
        let client = etcd.as_mut().expect("connected above");
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then(vec![TxnOp::delete(key.as_str(), None)]);
        Ok::<_, anyhow::Error>(client.txn(txn).await?.succeeded())
    };
    match tokio::time::timeout(patience * 2, attempt).await {
        Ok(Ok(done)) => done,
        _ => {
            *etcd = None;
            false
        }
    }
}
