//! Copies of values on other nodes.
//!
//! After a write is committed, the node that accepted it asks each other
//! member of the key's replica set to pull the value from it: it leases the
//! value, sends `STRATA.REPLICATE key source-desc version expire_at`, and
//! the replica reads the bytes with a one-sided read from this node's data
//! plane — payloads never go back through the client. A replica keeps a
//! copy only if it is newer (by version) than what it has, so repeated or
//! reordered pushes are harmless. Deletes and TTL changes are forwarded as
//! `STRATA.APPLY <command> ...`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};
use strata_rdma::Transport;
use strata_ring::{key_slot, NodeRecord};
use strata_tiering::Value;

use crate::clock::now_ms;
use crate::node::Node;

/// An internal lease covers the replica's pull of even a 512 MiB value.
const PUSH_LEASE_MS: u64 = 60_000;

/// The other members of `key`'s replica set with `copies` copies.
pub fn targets(node: &Node, key: &[u8], copies: usize) -> Vec<NodeRecord> {
    if node.cluster.standalone() || copies <= 1 {
        return Vec::new();
    }
    let ring = node.cluster.ring();
    ring.replicas(key_slot(key), copies)
        .into_iter()
        .filter(|n| n.id != node.cluster.me.id)
        .cloned()
        .collect()
}

/// Pushes `value` to `targets` concurrently; returns how many now hold it.
pub async fn push(
    node: &Arc<Node>,
    key: Bytes,
    value: Value,
    expire_at_ms: Option<u64>,
    targets: Vec<NodeRecord>,
) -> usize {
    if targets.is_empty() {
        return 0;
    }
    let (offset, len) = (node.arena_offset(value.addr()), value.len());
    let version = value.version().to_string();
    let expire = expire_at_ms.unwrap_or(0).to_string();
    let (lease, tokens) = node.leases.grant(vec![value], now_ms() + PUSH_LEASE_MS);
    let src = match node
        .transport
        .describe(&node.arena_region, offset, len, Some(tokens[0]))
    {
        Ok(d) => d.to_string(),
        Err(e) => {
            node.leases.release(lease);
            tracing::warn!("cannot describe a value for replication: {e}");
            return 0;
        }
    };
    // A peer on this host (by its ring record) may copy the value out of
    // this process by cross-memory attach instead; the network descriptor
    // stays its fallback.
    let same_host = node.cma.as_ref().map(|c| {
        let d = strata_rdma::cma::describe(
            &c.me,
            node.arena_region.addr() + offset,
            len,
            node.arena_region.rkey(),
            Some(tokens[0]),
        );
        (c.clone(), d.to_string())
    });
    let mut calls = Vec::with_capacity(targets.len());
    for t in targets {
        let node = node.clone();
        let (key, src, version, expire) =
            (key.clone(), src.clone(), version.clone(), expire.clone());
        let cma_src = same_host
            .as_ref()
            .filter(|(c, _)| t.process.as_ref().is_some_and(|p| c.can_read(p)))
            .map(|(_, d)| d.clone());
        calls.push(tokio::spawn(async move {
            let mut args: Vec<&[u8]> = vec![
                b"STRATA.REPLICATE",
                &key,
                src.as_bytes(),
                version.as_bytes(),
                expire.as_bytes(),
            ];
            if let Some(c) = &cma_src {
                args.push(c.as_bytes());
            }
            node.peers.call(&t.resp_addr, &args).await
        }));
    }
    let mut ok = 0;
    for c in calls {
        match c.await {
            Ok(Ok(_)) => {
                ok += 1;
                node.metrics
                    .counters
                    .replica_pushes_total
                    .fetch_add(1, Relaxed);
            }
            Ok(Err(e)) => {
                node.metrics
                    .counters
                    .replica_push_errors_total
                    .fetch_add(1, Relaxed);
                tracing::debug!("replication: {e}");
            }
            Err(e) => tracing::warn!("replication task failed: {e}"),
        }
    }
    node.leases.release(lease);
    ok
}

/// Pushes a client's write of `key` to its replicas and records how many
/// copies it has (`wanted` asked, the local one included); whether every
/// replica took it.
pub async fn push_write(
    node: &Arc<Node>,
    key: Bytes,
    value: Value,
    expire_at_ms: Option<u64>,
    targets: Vec<NodeRecord>,
    wanted: usize,
) -> bool {
    let asked = targets.len();
    // A node fenced meanwhile acknowledges nothing: answer at once rather
    // than wait for a replica it may never reach (the pushes go on).
    let pushing = {
        let (node, key) = (node.clone(), key.clone());
        tokio::spawn(async move { push(&node, key, value, expire_at_ms, targets).await })
    };
    let ok = tokio::select! {
        ok = pushing => ok.unwrap_or(0),
        () = fenced(node) => return false,
    };
    node.cluster
        .under_replicated
        .note_write(&key, wanted, 1 + ok);
    ok == asked
}

/// Resolves once this node is fenced (checked every tenth of the window).
async fn fenced(node: &Node) {
    let every = node.cluster.fence.window() / 10;
    while node.cluster.check_fence().is_ok() {
        tokio::time::sleep(every).await;
    }
}

/// The answer to a client's write once its copies were pushed: `ok` with
/// every copy made and this node still serving its slots; else why the
/// write is not acknowledged (it may be stored: a retry is safe).
pub fn write_reply(node: &Node, all_copies: bool, ok: Reply) -> Reply {
    if let Err(e) = node.cluster.check_fence() {
        return e.into();
    }
    if !all_copies {
        node.metrics
            .counters
            .writes_short_of_copies_total
            .fetch_add(1, Relaxed);
        return CommandError::new(
            ErrorCode::NoReplicas,
            "stored here but not on every replica (one is unreachable); not acknowledged, retry",
        )
        .into();
    }
    ok
}

/// Forwards a delete or TTL change to `targets`; best effort (repair and
/// versions cover a replica that missed it).
pub async fn forward(node: &Arc<Node>, targets: Vec<NodeRecord>, args: Vec<Bytes>) {
    let mut full: Vec<&[u8]> = vec![b"STRATA.APPLY"];
    full.extend(args.iter().map(|a| &a[..]));
    for t in targets {
        if let Err(e) = node.peers.call(&t.resp_addr, &full).await {
            node.metrics
                .counters
                .replica_push_errors_total
                .fetch_add(1, Relaxed);
            tracing::debug!("forwarding to {}: {e}", t.id);
        }
    }
}

/// How often under-replicated keys are pushed again.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Pushes under-replicated keys again, every few seconds, for as long as
/// the node runs.
pub async fn retry_loop(node: Arc<Node>) {
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        retry_once(&node).await;
    }
}

/// One pass over a batch of the tracked keys (`UnderReplicated::batch`).
async fn retry_once(node: &Arc<Node>) {
    let tracked = &node.cluster.under_replicated;
    let wanted = node.cfg.replica_num as usize;
    for key in tracked.batch() {
        let (value, expire) = match node.store.peek_with_expiry(&key, now_ms()) {
            Ok(Some(found)) => found,
            // Gone (deleted, expired, evicted): nothing left to copy.
            Ok(None) => {
                tracked.forget(&key);
                continue;
            }
            Err(_) => continue,
        };
        // The key's replica set under the current ring; this node's own copy
        // counts only while it is a member (repair moves it otherwise).
        let ring = node.cluster.ring();
        let set = ring.replicas(strata_ring::key_slot(&key), wanted);
        let mine = usize::from(set.iter().any(|n| n.id == node.cluster.me.id));
        let targets: Vec<_> = set
            .into_iter()
            .filter(|n| n.id != node.cluster.me.id)
            .cloned()
            .collect();
        let ok = push(node, key.clone(), value, expire, targets).await;
        tracked.note(&key, wanted, mine + ok);
    }
}
