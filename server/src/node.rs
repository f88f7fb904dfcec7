//! What every connection of a node shares: configuration, the store, the
//! metrics, and the bound on connections.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use strata_proto::Limits;
use strata_tiering::{Store, StoreConfig};
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::metrics::Metrics;

/// Latency samples are folded into histograms this often.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Active expiry runs this often...
const EXPIRY_INTERVAL: Duration = Duration::from_millis(100);
/// ...and removes at most this many keys per run, so that a mass expiry
/// cannot hold the index lock for long; the rest waits for the next run.
const EXPIRY_BATCH_MAX: usize = 2000;

pub struct Node {
    pub cfg: Config,
    pub store: Store,
    pub metrics: Metrics,
    /// Framing limits derived from the config.
    pub limits: Limits,
    /// One permit per allowed client connection.
    pub conn_slots: Arc<Semaphore>,
    pub started: Instant,
    next_client_id: AtomicU64,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("cfg", &self.cfg).finish()
    }
}

impl Node {
    pub fn new(cfg: Config) -> anyhow::Result<Node> {
        let store = Store::new(StoreConfig {
            capacity_bytes: cfg.cpu_memory_pool_size,
            max_value_bytes: cfg.effective_max_value(),
            high_watermark: cfg.eviction_high_watermark,
        })?;
        let limits = Limits {
            max_bulk_len: cfg.effective_max_value(),
            max_request_len: cfg.max_request_size,
            ..Limits::default()
        };
        Ok(Node {
            conn_slots: Arc::new(Semaphore::new(cfg.max_connections as usize)),
            metrics: Metrics::new(),
            limits,
            store,
            cfg,
            started: Instant::now(),
            next_client_id: AtomicU64::new(1),
        })
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Relaxed)
    }

    /// Connections open now.
    pub fn connected_clients(&self) -> u64 {
        (self.cfg.max_connections as usize - self.conn_slots.available_permits()) as u64
    }

    /// Removes expired keys that nobody reads, in bounded batches.
    pub fn spawn_expiry(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRY_INTERVAL);
            loop {
                tick.tick().await;
                let Some(node) = node.upgrade() else { return };
                node.store.expire_some(now_ms(), EXPIRY_BATCH_MAX);
            }
        });
    }
}

impl Node {
    /// Keeps the metrics recorder's memory bounded.
    pub fn spawn_metrics_upkeep(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
            loop {
                tick.tick().await;
                let Some(node) = node.upgrade() else { return };
                node.metrics.upkeep();
            }
        });
    }
}

/// Wall-clock milliseconds since the Unix epoch; TTLs are absolute times,
/// as in Redis.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
