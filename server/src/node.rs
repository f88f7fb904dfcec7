//! What every connection of a node shares: configuration, the store, the
//! metrics, and the bound on connections.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use strata_proto::Limits;
use strata_rdma::{DataPlane, Region, Transport};
use strata_tiering::{Store, StoreConfig};
use tokio::sync::Semaphore;

use crate::clock::now_ms;
use crate::cluster::peer::Peers;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::lease::{LeaseGuard, Leases, SWEEP_INTERVAL};
use crate::metrics::Metrics;
use crate::pubsub::keyspace::Event;

/// How long a cluster member remembers a delete.
const TOMBSTONE_MS: u64 = 10 * 60 * 1000;
/// Active expiry runs this often...
const EXPIRY_INTERVAL: Duration = Duration::from_millis(100);
/// ...and removes at most this many keys per run, so that a mass expiry
/// cannot hold the index lock for long; the rest waits for the next run.
const EXPIRY_BATCH_MAX: usize = 2000;

pub struct Node {
    pub cfg: Config,
    /// The arena as registered with the data plane. Declared before
    /// `store` so it is deregistered before the arena is unmapped.
    pub arena_region: Region,
    pub store: Store,
    /// The NVMe tier under `store`, if configured.
    pub spill: Option<Arc<strata_tiering::spill::Spill>>,
    /// Keeps the NVMe tier's directory (a temporary one is removed on drop).
    pub lower: Option<crate::tiers::Lower>,
    /// The data plane (TCP or RDMA, from `protocol`): serves reads of the
    /// arena, pulls PUT payloads.
    pub transport: Arc<DataPlane>,
    /// `tcp_congestion` as resolved for this host at start: the control
    /// set on every socket of the node, or `None` for the host's default.
    pub tcp_congestion: Option<String>,
    /// Cross-memory attach for same-host clients (`cma: auto`).
    pub cma: Option<Arc<crate::cma::Cma>>,
    pub leases: Arc<Leases>,
    /// Placement and routing.
    pub cluster: Cluster,
    /// RESP connections to other nodes.
    pub peers: Peers,
    pub metrics: Metrics,
    /// Busy polling of client connections (`busy_poll_us`).
    pub busy_poll: strata_rdma::spin::Spinner,
    /// Pub/sub channels and keyspace notifications.
    pub pubsub: crate::pubsub::Hub,
    /// The KV-event publisher (`kv_events_endpoint`), if on.
    pub kv_events: Option<crate::kv_events::KvEvents>,
    /// Framing limits derived from the config.
    pub limits: Limits,
    /// One permit per allowed client connection.
    pub conn_slots: Arc<Semaphore>,
    /// Request bytes buffered beyond each connection's first MiB, in KiB
    /// permits (`max_buffered_requests_size`).
    pub request_budget: Arc<Semaphore>,
    pub started: Instant,
    next_client_id: AtomicU64,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("cfg", &self.cfg).finish()
    }
}

impl Node {
    /// Maps the arena, starts the data plane and registers the arena with
    /// it; `commands` names the commands its metrics count (`cmd`'s table,
    /// which this module never imports). Must run inside the tokio runtime.
    pub async fn start(cfg: Config, commands: &[&str]) -> anyhow::Result<Node> {
        let gpu = if cfg.gpu_memory_pool_size == 0 {
            None
        } else {
            let dev =
                strata_tiering::gpu::open(cfg.gpu_device_id as usize, cfg.gpu_memory_pool_size)
                    .with_context(|| {
                        format!(
                            "gpu_memory_pool_size is {} bytes on gpu_device_id {}",
                            cfg.gpu_memory_pool_size, cfg.gpu_device_id
                        )
                    })?;
            tracing::info!(
                device = %dev.describe(),
                bytes = cfg.gpu_memory_pool_size,
                "GPU tier ready"
            );
            Some(dev)
        };
        let store = Store::with_gpu(
            StoreConfig {
                capacity_bytes: cfg.cpu_memory_pool_size,
                max_value_bytes: cfg.effective_max_value(),
                high_watermark: cfg.eviction_high_watermark,
                // Deletes are remembered in a cluster, long enough for any
                // repair or hand-off racing them to have finished.
                tombstone_ms: if cfg.standalone() { 0 } else { TOMBSTONE_MS },
            },
            gpu,
        )?;
        if cfg.cpu_memory_prefault {
            // Detached: it logs its end and stops by itself with the store.
            crate::prefault::spawn(store.arena_handle())
                .context("cannot start the thread that prefaults the DRAM arena")?;
        }
        let lower = crate::tiers::open(&cfg, &store).await?;
        let limits = Limits {
            max_bulk_len: cfg.effective_max_value(),
            max_request_len: cfg.max_request_size,
            ..Limits::default()
        };
        let tcp_congestion = cfg.tcp_congestion();
        let data_addr = std::net::SocketAddr::new(cfg.bind, cfg.data_port);
        // Descriptors name `advertise_host`, not the bind address: peers
        // cannot dial 0.0.0.0.
        let listen = strata_rdma::Listen {
            advertise_host: Some(cfg.advertise_host.clone()),
            tcp_congestion: tcp_congestion.clone(),
            stream_spin: cfg.stream_poll(),
            tls: crate::tls::data_plane(&cfg).context("data-plane TLS (tls_data_plane)")?,
        };
        let transport = DataPlane::start(data_addr, &cfg.data_protocol(), listen)
            .await
            .with_context(|| format!("cannot start the data plane on {data_addr} (data_port)"))?;
        let transport = Arc::new(transport);
        let leases = Arc::new(Leases::default());
        let (base, len) = store.region();
        // SAFETY: the arena stays mapped for as long as `store` lives, and
        // `arena_region` is dropped before `store` (field order). Reads are
        // only served for values pinned by a lease (LeaseGuard), and the
        // store never writes a committed value, so nothing writes the bytes
        // being sent. Over RDMA the NIC serves reads without asking the
        // guard: the lease is checked when GET hands out the descriptor
        // (docs/OPERATIONS.md, "RDMA and leases").
        let arena_region = unsafe {
            transport.register(base as u64, len, Some(Arc::new(LeaseGuard(leases.clone()))))
        }
        .context("cannot register the arena with the data plane")?;
        let me = strata_ring::NodeRecord {
            id: cfg.node_id.clone(),
            resp_addr: join_host_port(&cfg.advertise_host, cfg.advertised_port()),
            data_addr: transport.endpoint().to_string(),
            host: cfg.host_name.clone(),
            // Memory tiers weigh the ring: they serve at memory speed.
            capacity_bytes: cfg.cpu_memory_pool_size + cfg.gpu_memory_pool_size,
            tiers: Vec::new(),
            incarnation: incarnation(),
            process: None,
        };
        let cma = crate::cma::Cma::start(&cfg.cma, cfg.cma_lanes as usize).map(Arc::new);
        let mut me = me;
        me.process = cma.as_ref().map(|c| c.record());
        let cluster = Cluster::new(me, cfg.standalone(), Duration::from_millis(cfg.fence_ms));
        let kv_events = crate::kv_events::start(&cfg, media(&cfg, lower.is_some())).await?;
        Ok(Node {
            peers: Peers::new(
                cfg.requirepass.clone(),
                tcp_congestion.clone(),
                crate::tls::peer_config(&cfg).context("TLS (tls_cluster)")?,
            ),
            cluster,
            conn_slots: Arc::new(Semaphore::new(cfg.max_connections as usize)),
            request_budget: Arc::new(Semaphore::new(
                (cfg.max_buffered_requests_size / 1024) as usize,
            )),
            metrics: Metrics::new(commands),
            busy_poll: strata_rdma::spin::Spinner::quarter_of(runtime_threads(cfg.worker_threads)),
            pubsub: crate::pubsub::Hub::new(
                cfg.pubsub_output_buffer_limit,
                crate::pubsub::keyspace::Flags::parse(&cfg.notify_keyspace_events)
                    .map_err(anyhow::Error::msg)
                    .context("notify_keyspace_events")?,
            ),
            kv_events,
            limits,
            arena_region,
            store,
            spill: lower.as_ref().map(|l| l.spill.clone()),
            lower,
            transport,
            tcp_congestion,
            cma,
            leases,
            cfg,
            started: Instant::now(),
            next_client_id: AtomicU64::new(1),
        })
    }

    /// Every figure `/metrics` shows that the metrics do not count
    /// themselves.
    pub fn scrape(&self) -> crate::metrics::Scrape<'_> {
        let under = &self.cluster.under_replicated;
        crate::metrics::Scrape {
            store: self.store.stats(),
            connected_clients: self.connected_clients(),
            request_buffer_bytes: self.request_buffer_bytes(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            leases_out: self.leases.len() as u64,
            ring_nodes: self.cluster.ring().len() as u64,
            etcd_healthy: self.cluster.etcd_healthy.load(Relaxed),
            fenced: self.cluster.check_fence().is_err(),
            under_replicated_keys: under.len() as u64,
            under_replicated_writes: under.writes_total.load(Relaxed),
            transport: self.transport.stats(),
            cma: self.cma.as_deref(),
            spill: self.spill.as_ref().map(|s| s.stats()),
            pubsub: &self.pubsub,
            kv_events: self.kv_events.as_ref().map(|k| &*k.stats),
        }
    }

    /// Bytes of requests counted against `max_buffered_requests_size`.
    pub fn request_buffer_bytes(&self) -> u64 {
        let free = self.request_budget.available_permits() as u64 * 1024;
        (self.cfg.max_buffered_requests_size / 1024 * 1024).saturating_sub(free)
    }

    /// Offset of an arena address within the registered region.
    pub fn arena_offset(&self, addr: usize) -> u64 {
        addr as u64 - self.arena_region.addr()
    }

    /// Publishes a keyspace event, and the KV event it means for a block
    /// key, for a key this node owns. In a cluster only a key's primary
    /// publishes (a replica's copy is not news), so a subscriber to every
    /// node sees each event once. Callable with the store's locks held
    /// (tier events): only a write ([`Event::Set`], never a tier event)
    /// asks the store anything.
    pub fn notify_owned(&self, event: Event, key: &[u8]) {
        let keyspace = self.pubsub.keyspace.wants(event);
        let block = self
            .kv_events
            .as_ref()
            .filter(|_| crate::kv_events::concerns(event))
            .and_then(|kv| Some((kv, crate::kv_events::block_hash(key)?)));
        if !keyspace && block.is_none() {
            return;
        }
        if !self.cluster.standalone() {
            let ring = self.cluster.ring();
            let primary = ring.replicas(strata_ring::key_slot(key), 1);
            if primary.first().is_some_and(|n| n.id != self.cluster.me.id) {
                return;
            }
        }
        if keyspace {
            self.pubsub.notify(event, key);
        }
        if let Some((kv, hash)) = block {
            kv.on(event, hash, || self.written_to(key));
        }
    }

    /// Which medium a write of `key` landed in: DRAM, unless the GPU tier
    /// took it (a write goes up at once when it has room).
    fn written_to(&self, key: &[u8]) -> crate::kv_events::Medium {
        use crate::kv_events::Medium;
        if self.cfg.gpu_memory_pool_size == 0 {
            return Medium::Cpu;
        }
        match self.store.meta(key, now_ms()).map(|m| m.tier) {
            Some(strata_tiering::Tier::Gpu) => Medium::Gpu,
            _ => Medium::Cpu,
        }
    }

    /// Tells KV-event subscribers that every block left (`FLUSHALL`).
    pub fn kv_events_cleared(&self) {
        if let Some(kv) = &self.kv_events {
            kv.send(crate::kv_events::Change::Cleared);
        }
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Relaxed)
    }

    /// Connections open now.
    pub fn connected_clients(&self) -> u64 {
        (self.cfg.max_connections as usize - self.conn_slots.available_permits()) as u64
    }

    /// Tells the node's subscribers of evictions, tier moves and expiries
    /// inside the store (keyspace notifications). The store holds the
    /// observer, so it holds the node weakly.
    pub fn publish_tier_events(self: &Arc<Self>) {
        struct Events(std::sync::Weak<Node>);
        impl strata_tiering::Observer for Events {
            fn tier_event(&self, event: strata_tiering::TierEvent, key: &[u8]) {
                if let Some(node) = self.0.upgrade() {
                    node.notify_owned(Event::from_tier(event), key);
                }
            }
        }
        self.store.observe(Arc::new(Events(Arc::downgrade(self))));
    }

    /// Sends queued keyspace events (see `pubsub::keyspace::Keyspace`).
    pub fn spawn_event_publisher(self: &Arc<Self>) {
        let queue = self.pubsub.keyspace.queue.clone();
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                queue.ready.notified().await;
                let Some(node) = node.upgrade() else { return };
                node.pubsub.deliver_queued();
            }
        });
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
                // Values NVMe's reclaim dropped leave the index of keys
                // below (and are published as evicted).
                if let Some(spill) = &node.spill {
                    spill.reap_lost(&node.store, now_ms());
                }
            }
        });
    }
}

impl Node {
    /// Drops expired leases so their values can be evicted again.
    pub fn spawn_lease_sweeper(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            loop {
                tick.tick().await;
                let Some(node) = node.upgrade() else { return };
                node.leases.sweep(now_ms());
            }
        });
    }
}

/// The media this node's tiers are, for KV events.
fn media(cfg: &Config, nvme: bool) -> Vec<crate::kv_events::Medium> {
    use crate::kv_events::Medium;
    let gpu = (cfg.gpu_memory_pool_size > 0).then_some(Medium::Gpu);
    let storage = nvme.then_some(Medium::Storage);
    gpu.into_iter()
        .chain([Medium::Cpu])
        .chain(storage)
        .collect()
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// This process's incarnation for its node record: its start time in ms
/// (a restart takes far longer than a millisecond).
fn incarnation() -> u64 {
    now_ms()
}

/// Threads of the runtime `main` builds for `worker_threads` (tokio's
/// default is one per core).
fn runtime_threads(worker_threads: u32) -> usize {
    match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    }
}
