//! KV events in vLLM's format (`vllm.distributed.kv_events`): an opt-in
//! ZMQ publisher per node (`kv_events_endpoint`) telling KV-aware routers
//! (llm-d's KV-cache manager, Dynamo's KV router, anything that decodes
//! vLLM's `KVEventBatch`) which blocks this node holds and in which tier:
//! `BlockStored` when a block's key is written or moves into a tier,
//! `BlockRemoved` when it leaves one (eviction, delete, expiry, a copy
//! NVMe dropped, a move to another tier), `AllBlocksCleared` on FLUSHALL.
//!
//! Only keys in the engine adapters' format have events ([`block_hash`]);
//! the block hash a router gets is the last 8 bytes of the key's chained
//! SHA-256, as vLLM's own int block hashes are (docs/OPERATIONS.md, "KV
//! events").
//!
//! The store's hot path only queues a 16-byte [`Change`] on a bounded
//! channel (`kv_events_queue`) and never waits: a full queue drops the
//! change and counts it. With the publisher off nothing is queued or
//! allocated. The encoding ([`wire`]) and the sockets ([`publisher`]) run
//! on the publisher's own task, never under a store lock.

pub mod endpoint;
pub mod publisher;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::pubsub::keyspace::Event;
pub use wire::{Change, Medium};

/// Hex digits of a SHA-256 digest.
const DIGEST_HEX: usize = 64;

/// The block hash in a key written by the engine adapters, or `None` for
/// any other key: the key's last colon-separated field, or the one before
/// it, is 64 lowercase hex digits (the chained SHA-256 of
/// `strata.keys.chunk_hashes`):
///
/// * vLLM connector: `{ns}:{model}:{rank}:{geometry}:{hash}:{layer}`;
/// * SGLang HiCache: `{prefix}:{shard}:{layout}-{dtype}:{hash}:{component}`;
/// * SDK `chunk_keys`: `{ns}:{model}:{rank}:{hash}`.
///
/// The hash is the digest's last 8 bytes as a big-endian integer, which
/// is what vLLM's `maybe_convert_block_hash` makes of a block's digest
/// (`int.from_bytes(digest, "big") & (2**64 - 1)`).
pub fn block_hash(key: &[u8]) -> Option<u64> {
    let mut fields = key.rsplitn(4, |&b| b == b':');
    let last = fields.next()?;
    let before = fields.next()?;
    // At least one more field: a bare digest is nobody's block key.
    fields.next()?;
    let hex = if is_digest(last) {
        last
    } else if is_digest(before) {
        before
    } else {
        return None;
    };
    let tail = std::str::from_utf8(&hex[DIGEST_HEX - 16..]).ok()?;
    u64::from_str_radix(tail, 16).ok()
}

fn is_digest(field: &[u8]) -> bool {
    field.len() == DIGEST_HEX && field.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether keyspace `event` changes where a block is (a miss or a TTL set
/// does not).
pub fn concerns(event: Event) -> bool {
    !matches!(event, Event::Expire | Event::KeyMiss)
}

/// Figures for INFO and `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Changes dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Batches published (the next batch's sequence number).
    pub batches: AtomicU64,
    /// Events published, by type.
    pub stored: AtomicU64,
    pub removed: AtomicU64,
    pub cleared: AtomicU64,
    /// Subscribers' replay requests served.
    pub replays: AtomicU64,
}

/// The node's side of the publisher: where changes are queued.
#[derive(Debug)]
pub struct KvEvents {
    tx: mpsc::Sender<Change>,
    pub stats: Arc<Stats>,
    /// The PUB socket as bound (port 0 resolved) or connected to.
    pub endpoint: String,
    /// The replay ROUTER as bound; empty when off.
    pub replay_endpoint: String,
}

impl KvEvents {
    /// Queues `change`; never waits. A full queue drops it and counts it.
    pub fn send(&self, change: Change) {
        if self.tx.try_send(change).is_err() {
            self.stats.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Queues what keyspace `event` on block `hash` means for routers.
    /// `written` says which medium a fresh write landed in (asked only for
    /// writes: tier events come with the store's index lock held).
    pub fn on(&self, event: Event, hash: u64, written: impl FnOnce() -> Medium) {
        match event {
            Event::Set => self.send(Change::Stored(written(), hash)),
            // Each of these leaves no copy on this node.
            Event::Del | Event::Expired | Event::Evicted => self.send(Change::Gone(hash)),
            Event::Spilled => {
                self.send(Change::Removed(Medium::Cpu, hash));
                self.send(Change::Stored(Medium::Storage, hash));
            }
            // The NVMe copy is kept beside the DRAM one.
            Event::Promoted => self.send(Change::Stored(Medium::Cpu, hash)),
            Event::Demoted => {
                self.send(Change::Removed(Medium::Gpu, hash));
                self.send(Change::Stored(Medium::Cpu, hash));
            }
            Event::Expire | Event::KeyMiss => {}
        }
    }
}

/// Starts the publisher if `kv_events_endpoint` is set: binds its sockets
/// (a failure is the node's start failing, naming the key) and spawns its
/// tasks. `media` are the tiers this node has. Must run inside the tokio
/// runtime.
pub async fn start(
    cfg: &crate::config::Config,
    media: Vec<Medium>,
) -> anyhow::Result<Option<KvEvents>> {
    if cfg.kv_events_endpoint.is_empty() {
        return Ok(None);
    }
    let (tx, rx) = mpsc::channel(cfg.kv_events_queue as usize);
    let stats = Arc::new(Stats::default());
    let settings = publisher::Settings {
        endpoint: endpoint::parse(&cfg.kv_events_endpoint).map_err(anyhow::Error::msg)?,
        replay: match cfg.kv_events_replay_endpoint.as_str() {
            "" => None,
            e => Some(endpoint::parse_bind(e).map_err(anyhow::Error::msg)?),
        },
        topic: cfg.kv_events_topic.clone(),
        media,
        block_size: cfg.kv_events_block_size,
    };
    let (endpoint, replay_endpoint) = publisher::spawn(settings, rx, stats.clone()).await?;
    tracing::info!(
        endpoint = %endpoint,
        replay = %replay_endpoint,
        queue = cfg.kv_events_queue,
        "KV events published"
    );
    Ok(Some(KvEvents {
        tx,
        stats,
        endpoint,
        replay_endpoint,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn adapter_keys_give_the_digest_tail() {
        let want = Some(0xd15d_6c15_b0f0_0a08);
        let vllm = format!("vllm:opt-125m:tp0of1:bfloat16.8x128:{H}:model.layers.0.attn");
        let sglang = format!("sglang:llama:tp0of2:page_first-bfloat16:{H}:k");
        let sdk = format!("strata:llama:0of1:{H}");
        for key in [vllm, sglang, sdk] {
            assert_eq!(block_hash(key.as_bytes()), want, "{key}");
        }
    }

    #[test]
    fn other_keys_have_no_block() {
        let upper = H.to_uppercase();
        for key in [
            "foo".to_string(),
            "a:b:c:d".to_string(),
            H.to_string(),
            format!("x:{H}"),
            format!("a:b:{}:layer", &H[1..]),
            format!("a:b:{upper}:k"),
            format!("a:b:{H}x:k"),
            format!("a:b:{H}:k:extra"),
            format!("fmt@model@1@0@{H}"),
        ] {
            assert_eq!(block_hash(key.as_bytes()), None, "{key}");
        }
    }
}
