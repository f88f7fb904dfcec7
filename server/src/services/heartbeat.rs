//! Keeps this node's proof that nobody is deleting its record fresh (see
//! `crate::cluster::fence`): every quarter of `fence_ms`, a linearizable
//! read of its own record; when etcd does not answer, the word of a
//! majority of the other members that they can reach this node.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;

use crate::cluster::fence::mono_ms;
use crate::cluster::peer::Peers;
use crate::node::Node;
use crate::services::membership;

/// Runs for the life of a cluster member.
pub async fn run(node: Arc<Node>) {
    let window = node.cluster.fence.window();
    let every = window / 4;
    // A check that takes half the window is too late to be of use.
    let patience = window / 2;
    // Its own connections: a check never queues behind replication.
    let peers = node.peers.sibling();
    let mut etcd: Option<Client> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // While etcd is failing, the peers are asked at once beside it.
    let mut etcd_failing = false;
    loop {
        tick.tick().await;
        let mine = node.cluster.my_revision.load(Relaxed);
        if mine == 0 {
            continue;
        }
        let sent = mono_ms();
        let ask_peers = async {
            if etcd_failing {
                vouched(&node, &peers, patience).await
            } else {
                false
            }
        };
        let (read, by_peers) = tokio::join!(read_own_record(&node, &mut etcd, patience), ask_peers);
        etcd_failing = read.is_none();
        match read {
            Some(Some(rev)) if rev == mine => node.cluster.fence.kept(sent, false),
            // Gone, or a successor's: membership sees it and registers anew.
            Some(_) => node.cluster.fence.revoke(),
            None if by_peers => node.cluster.fence.kept(sent, true),
            None => {
                // The first failure: the peers now, timed from now.
                let sent = mono_ms();
                if vouched(&node, &peers, patience).await {
                    node.cluster.fence.kept(sent, true);
                }
            }
        }
    }
}

/// The create revision of this node's record (`Some(None)`: absent), or
/// `None` if etcd did not answer in time.
async fn read_own_record(
    node: &Node,
    etcd: &mut Option<Client>,
    patience: Duration,
) -> Option<Option<i64>> {
    let read = async {
        if etcd.is_none() {
            *etcd = Some(membership::connect(&node.cfg, patience).await?);
        }
        let client = etcd.as_mut().expect("connected above");
        let got = client.get(membership::my_key(node), None).await?;
        Ok::<_, anyhow::Error>(got.kvs().first().map(|kv| kv.create_revision()))
    };
    match tokio::time::timeout(patience, read).await {
        Ok(Ok(found)) => Some(found),
        _ => {
            *etcd = None;
            None
        }
    }
}

/// Whether more than half of the other members say they can reach this
/// node (`STRATA.VOUCH`), each within `patience`.
async fn vouched(node: &Node, peers: &Peers, patience: Duration) -> bool {
    let ring = node.cluster.ring();
    let me = &node.cluster.me.id;
    let others: Vec<_> = ring.nodes().iter().filter(|n| &n.id != me).collect();
    let asks = others.iter().map(|n| async move {
        let ask: [&[u8]; 2] = [b"STRATA.VOUCH", me.as_bytes()];
        matches!(
            tokio::time::timeout(patience, peers.call(&n.resp_addr, &ask)).await,
            Ok(Ok(redis_protocol::resp2::types::BytesFrame::Integer(1)))
        )
    });
    let yes = futures::future::join_all(asks)
        .await
        .into_iter()
        .filter(|y| *y)
        .count();
    yes * 2 > others.len()
}
