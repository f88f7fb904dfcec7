//! Repair after the ring changed: every key whose slot got a different
//! replica set is pushed by the nodes that hold it to the members that
//! should; a node holding a key outside the key's set (whenever it got it)
//! hands its copy off and then drops it (sheds). Versions make every push idempotent, so overlapping
//! repairs and concurrent writes never lose the newest value.
//!
//! Runs in the background, one key at a time (each push to its targets
//! concurrently), and stops early when a newer ring arrives; the next run
//! diffs against the last ring that was fully repaired, so nothing is
//! skipped.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use strata_ring::{key_slot, Ring, SLOTS};

use super::replicate;
use crate::clock::now_ms;
use crate::node::Node;

/// Nodes beyond the replica set asked during a read-through.
const FETCH_EXTRA_HOLDERS: usize = 2;
/// Keys looked at per scan step.
const SCAN_BATCH: usize = 256;

/// Slots whose replica set differs between the two rings. A member that
/// restarted (same id, new incarnation) counts as a new member: a `kill -9`
/// took what it held only in memory, so its slots are pushed to it again.
fn changed_slots(old: &Ring, new: &Ring, copies: usize) -> Vec<bool> {
    (0..SLOTS)
        .map(|s| {
            let a: Vec<(&str, u64)> = old
                .replicas(s, copies)
                .iter()
                .map(|n| (n.id.as_str(), n.incarnation))
                .collect();
            let b: Vec<(&str, u64)> = new
                .replicas(s, copies)
                .iter()
                .map(|n| (n.id.as_str(), n.incarnation))
                .collect();
            a != b
        })
        .collect()
}

/// How a repair run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every key was pushed to its whole replica set.
    Done,
    /// A newer ring arrived; its repair takes over.
    Superseded,
    /// Some pushes failed (a target busy or briefly unreachable): run again.
    Incomplete { failed: u64 },
}

/// A repair that left copies missing runs again after this, doubling up
/// to the max, until it completes or a newer ring takes over.
const REPAIR_RETRY_FIRST: Duration = Duration::from_millis(500);
const REPAIR_RETRY_MAX: Duration = Duration::from_secs(10);
/// How often a cluster member looks for copies it should not hold.
const ANTI_ENTROPY_INTERVAL: Duration = Duration::from_secs(10);

/// Called by membership after the ring changed: starts a repair from the
/// last fully repaired ring (any repair still running stops).
pub fn on_ring_change(node: &Arc<Node>, old: &Ring) {
    let ring = node.cluster.ring();
    let moved = Ring::moved_slots(old, &ring).len();
    tracing::info!(moved_slots = moved, nodes = ring.len(), "placement changed");
    let (generation, base) = node.cluster.start_repair(now_ms());
    let node = node.clone();
    tokio::spawn(async move {
        // Pushes that failed (a peer overloaded or restarting) are retried
        // by running the repair again: versions make the pushes that did
        // land no-ops.
        let mut backoff = REPAIR_RETRY_FIRST;
        loop {
            match run(node.clone(), base.clone(), ring.clone(), generation).await {
                Outcome::Done => {
                    node.cluster.repaired(ring);
                    return;
                }
                Outcome::Superseded => return,
                Outcome::Incomplete { failed } => {
                    tracing::warn!(failed, retry_in = ?backoff, "repair left copies missing; running it again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(REPAIR_RETRY_MAX);
                    if node.cluster.repair_generation() != generation {
                        return;
                    }
                }
            }
        }
    });
}

/// Anti-entropy: every [`ANTI_ENTROPY_INTERVAL`], unless a repair is
/// running, re-checks every local key against the current ring and hands
/// back and sheds copies this node should not hold. Ring-change repairs
/// cover the common case; this catches copies that a write racing a ring
/// change left behind.
pub fn spawn_sweeper(node: &Arc<Node>) {
    if node.cluster.standalone() {
        return;
    }
    let node = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(ANTI_ENTROPY_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else { return };
            let ring = node.cluster.ring();
            if !Arc::ptr_eq(&node.cluster.repaired_ring(), &ring) {
                continue;
            }
            let generation = node.cluster.repair_generation();
            run(node.clone(), ring.clone(), ring, generation).await;
        }
    });
}

/// Repairs from `base` (the last fully repaired ring) to the current ring.
pub async fn run(node: Arc<Node>, base: Arc<Ring>, ring: Arc<Ring>, generation: u64) -> Outcome {
    let copies = node.cfg.replica_num as usize;
    let changed = changed_slots(&base, &ring, copies);
    let me = node.cluster.me.id.clone();
    let mut cursor = 0u64;
    let mut tally = Tally::default();
    loop {
        let (next, keys) = node.store.scan(cursor, SCAN_BATCH, now_ms(), |k| {
            changed[usize::from(key_slot(k))]
        });
        for key in keys {
            if node.cluster.repair_generation() != generation {
                return Outcome::Superseded;
            }
            repair_key(&node, &ring, &changed, copies, &me, key, &mut tally).await;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // Keys on NVMe (those this process put there): each is read back into
    // DRAM, then pushed like the others. Keys also in DRAM were just done.
    if let Some(spill) = node.spill.clone() {
        let below = spill.keys_below(|k| changed[usize::from(key_slot(k))]);
        for key in below {
            if node.cluster.repair_generation() != generation {
                return Outcome::Superseded;
            }
            if node.store.exists(&key, now_ms()) {
                continue;
            }
            match crate::tiers::promote(&node.store, &spill, vec![key.clone()], now_ms()).await {
                Ok(found) => {
                    node.metrics
                        .counters
                        .nvme_hits_total
                        .fetch_add(found, Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "repair: cannot read a value back from NVMe");
                    tally.failed += 1;
                    continue;
                }
            }
            repair_key(&node, &ring, &changed, copies, &me, key, &mut tally).await;
        }
    }
    let Tally {
        pushed,
        shed,
        failed,
    } = tally;
    let c = &node.metrics.counters;
    c.repair_pushes_total.fetch_add(pushed, Relaxed);
    c.repair_shed_total.fetch_add(shed, Relaxed);
    c.repair_runs_total.fetch_add(1, Relaxed);
    if pushed > 0 || shed > 0 || failed > 0 || !Arc::ptr_eq(&base, &ring) {
        tracing::info!(pushed, shed, failed, "repair done");
    }
    if failed > 0 {
        Outcome::Incomplete { failed }
    } else {
        Outcome::Done
    }
}

#[derive(Default)]
struct Tally {
    pushed: u64,
    shed: u64,
    failed: u64,
}

/// Pushes one local key to the members of its replica set under `ring`
/// (when its slot changed or this node is no longer in the set), and sheds
/// the local copy once every member has it if this node is not one.
async fn repair_key(
    node: &Arc<Node>,
    ring: &Ring,
    changed: &[bool],
    copies: usize,
    me: &str,
    key: bytes::Bytes,
    tally: &mut Tally,
) {
    let (value, expire) = match node.store.peek_with_expiry(&key, now_ms()) {
        Ok(Some(found)) => found,
        Ok(None) => return,
        Err(e) => {
            // Counted as a failure: the repair runs again later.
            tracing::warn!(error = %e, "repair cannot read a value");
            tally.failed += 1;
            return;
        }
    };
    let slot = key_slot(&key);
    let set = ring.replicas(slot, copies);
    let mine = set.iter().any(|n| n.id == me);
    if mine && !changed[usize::from(slot)] {
        return;
    }
    let targets: Vec<_> = set.into_iter().filter(|n| n.id != me).cloned().collect();
    let want = targets.len();
    let version = value.version();
    let ok = replicate::push(node, key.clone(), value, expire, targets).await;
    node.cluster
        .under_replicated
        .note(&key, copies, ok + usize::from(mine));
    tally.pushed += ok as u64;
    tally.failed += (want - ok) as u64;
    if !mine && ok == want && want > 0 && node.store.delete_version(&key, version, now_ms()) {
        tally.shed += 1;
    }
}

/// Read-through during a transition: asks the holders of each key under the
/// last repaired ring to push it here now (`STRATA.HANDOFF`). Bounded by the
/// peer call timeout; a key nobody has stays missing.
pub async fn fetch(node: &Arc<Node>, keys: Vec<bytes::Bytes>) {
    let before = node.cluster.repaired_ring();
    let now = node.cluster.ring();
    let copies = node.cfg.replica_num as usize;
    let me = node.cluster.me.id.clone();
    for key in keys {
        // The holders under the last repaired ring, then the current
        // replica set and the next nodes clockwise: a node that just
        // (re)started has no previous ring, and its key's other copy is on
        // a current replica or on the node that held the slot meanwhile.
        let slot = key_slot(&key);
        let mut holders: Vec<strata_ring::NodeRecord> = Vec::new();
        for n in before
            .replicas(slot, copies)
            .into_iter()
            .chain(now.replicas(slot, copies + FETCH_EXTRA_HOLDERS))
        {
            if n.id != me && !holders.iter().any(|h| h.id == n.id) {
                holders.push(n.clone());
            }
        }
        for holder in holders {
            let args: [&[u8]; 3] = [b"STRATA.HANDOFF", &key, me.as_bytes()];
            if node.peers.call(&holder.resp_addr, &args).await.is_ok() {
                break;
            }
        }
    }
}
