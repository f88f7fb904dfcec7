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

use strata_ring::{key_slot, Ring, SLOTS};

use super::replicate;
use crate::node::{now_ms, Node};

/// Nodes beyond the replica set asked during a read-through.
const FETCH_EXTRA_HOLDERS: usize = 2;
/// Keys looked at per scan step.
const SCAN_BATCH: usize = 256;

/// Slots whose replica set differs between the two rings.
fn changed_slots(old: &Ring, new: &Ring, copies: usize) -> Vec<bool> {
    (0..SLOTS)
        .map(|s| {
            let a: Vec<&str> = old
                .replicas(s, copies)
                .iter()
                .map(|n| n.id.as_str())
                .collect();
            let b: Vec<&str> = new
                .replicas(s, copies)
                .iter()
                .map(|n| n.id.as_str())
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

/// Repairs from `base` (the last fully repaired ring) to the current ring.
pub async fn run(node: Arc<Node>, base: Arc<Ring>, ring: Arc<Ring>, generation: u64) -> Outcome {
    let copies = node.cfg.replica_num as usize;
    let changed = changed_slots(&base, &ring, copies);
    let me = node.cluster.me.id.clone();
    let mut cursor = 0u64;
    let (mut pushed, mut shed, mut failed) = (0u64, 0u64, 0u64);
    loop {
        let (next, keys) = node.store.scan(cursor, SCAN_BATCH, now_ms(), |k| {
            changed[usize::from(key_slot(k))]
        });
        for key in keys {
            if node.repair_generation() != generation {
                return Outcome::Superseded;
            }
            let Some((value, expire)) = node.store.peek_with_expiry(&key, now_ms()) else {
                continue;
            };
            let slot = key_slot(&key);
            let set = ring.replicas(slot, copies);
            let mine = set.iter().any(|n| n.id == me);
            if mine && !changed[usize::from(slot)] {
                continue;
            }
            let targets: Vec<_> = set.into_iter().filter(|n| n.id != me).cloned().collect();
            let want = targets.len();
            let version = value.version();
            let ok = replicate::push(&node, key.clone(), value, expire, targets).await;
            pushed += ok as u64;
            failed += (want - ok) as u64;
            if !mine && ok == want && want > 0 && node.store.delete_version(&key, version, now_ms())
            {
                shed += 1;
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
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

/// Read-through during a transition: asks the holders of each key under the
/// last repaired ring to push it here now (`STRATA.HANDOFF`). Bounded by the
/// peer call timeout; a key nobody has stays missing.
pub async fn fetch(node: &Arc<Node>, keys: Vec<bytes::Bytes>) {
    let before = node.repaired_ring();
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
