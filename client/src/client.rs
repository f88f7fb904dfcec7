//! The client handle: connecting (the data-plane listener, the router over
//! one command connection per node, the health check), registering
//! buffers, and what the client can tell about the cluster and itself.
//! The operations on keys are in `ops/`, one file per family of commands.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use strata_rdma::tcp::TcpStats;
use strata_rdma::{DataPlane, Descriptor, Listen, Transport};
use strata_ring::key_slot;

use crate::config::ClientConfig;
use crate::conn::expect_bulk_or_nil;
use crate::router::Router;
use crate::{Buffer, Error, Result};

/// Most pairs in one MPUT and most GETs in one pipelined batch: the node's
/// MPUT limit, and a bound on leases one batch holds at once.
pub const BATCH_MAX: usize = 1024;

/// A client of a strata cluster (or of one node). Cheap to share
/// (`Arc<Client>`): commands from concurrent tasks to one node are
/// serialized on its command connection, data-plane reads run in parallel.
pub struct Client {
    // The three below are the operations' (`ops/`), which live beside the
    // handle rather than in it.
    pub(crate) cfg: ClientConfig,
    pub(crate) transport: Arc<DataPlane>,
    pub(crate) router: Arc<Router>,
    health: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(task) = &self.health {
            task.abort();
        }
    }
}

impl Client {
    /// A client seeded with one node.
    pub async fn connect(addr: impl Into<String>) -> Result<Self> {
        Self::connect_with(ClientConfig::new(addr)).await
    }

    /// Binds the data plane and learns the slot map from the first seed
    /// that answers (so wrong addresses fail here, not on first use).
    pub async fn connect_with(cfg: ClientConfig) -> Result<Self> {
        for (name, us) in [
            ("spin_us", cfg.spin_us),
            ("stream_spin_us", cfg.stream_spin_us),
            ("echo_spin_us", cfg.echo_spin_us),
        ] {
            if us > crate::SPIN_MAX.as_micros() as u64 {
                let max = crate::SPIN_MAX.as_micros();
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{name} {us} is out of range (allowed 0 ..= {max})"),
                )));
            }
        }
        let congestion = strata_rdma::sockopt::resolve(cfg.tcp_congestion.as_deref())
            .map_err(|e| Error::Io(std::io::Error::other(format!("tcp_congestion: {e}"))))?;
        let (data_bind, advertise_host) = crate::route::data_plane_addr(&cfg).await?;
        let listen = Listen {
            advertise_host,
            tcp_congestion: congestion.clone(),
            stream_spin: std::time::Duration::from_micros(cfg.stream_spin_us),
            tls: match &cfg.tls {
                Some(opts) => crate::conn::data_plane_tls(opts)?,
                None => Default::default(),
            },
        };
        let transport = DataPlane::start(data_bind, &cfg.protocol, listen)
            .await
            .map_err(|e| match e {
                strata_rdma::StartError::Transport(t) => Error::from(t),
                // No RDMA device, or RDMA not built in: a setup problem the
                // message explains.
                other => Error::Io(std::io::Error::other(other.to_string())),
            })?;
        let transport = Arc::new(transport);
        // The router's copy holds the resolved control: the name to set on
        // each connection, or `None` for the host's default. `config()`
        // keeps the caller's setting.
        let router = Router::connect(ClientConfig {
            tcp_congestion: congestion,
            ..cfg.clone()
        })
        .await?;
        let health = router.spawn_health_check();
        Ok(Self {
            cfg,
            transport,
            router,
            health,
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// RESP address of the node that owns `key` in the current slot map.
    pub fn owner_of(&self, key: &[u8]) -> Option<String> {
        self.router.slot_nodes(key_slot(key)).into_iter().next()
    }

    /// RESP addresses of every node in the current slot map.
    pub fn cluster_nodes(&self) -> Vec<String> {
        self.router.addrs()
    }

    /// `host:port` of this client's data-plane listener.
    pub fn data_endpoint(&self) -> &str {
        self.transport.endpoint()
    }

    /// Counters of this client's own cross-memory-attach reads (zero-copy
    /// GETs of values on nodes of this host); `None` when this process
    /// cannot use it. The nodes count the PUT payloads they read
    /// (`cma_reads`); these reads they cannot see.
    pub fn cma_stats(&self) -> Option<&strata_rdma::cma::CmaStats> {
        self.router.cma.as_ref().map(|l| l.reader.stats())
    }

    /// Counters of this client's data plane (reads the node made of its
    /// buffers).
    pub fn data_plane_stats(&self) -> &TcpStats {
        self.transport.stats()
    }

    /// Descriptor of `buf[range]` as a PUT would send it, for
    /// [`Client::put_desc`] or for handing to another process.
    pub fn descriptor(&self, buf: &Buffer, range: Range<usize>) -> Result<Descriptor> {
        self.describe(buf.region(), range)
    }

    /// Allocates `len` zeroed, page-aligned bytes registered for transfers.
    pub fn alloc(&self, len: usize) -> Result<Buffer> {
        Buffer::alloc(len, |addr, len| {
            // SAFETY: `Buffer` keeps the allocation alive until the region
            // is closed (see its Drop), and hands out `&mut` access only
            // while no transfer of it runs.
            Ok(unsafe { self.transport.register(addr, len, None) }?)
        })
    }

    /// Registers memory the caller owns (a tensor, an mmap) for transfers.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay valid for reads and writes until the
    /// returned buffer is closed ([`Buffer::close`]) or dropped and no read
    /// of it is being served; nothing may write it while a put from it runs
    /// or touch it while a get into it runs.
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize) -> Result<Buffer> {
        let ptr = NonNull::new(ptr).ok_or(Error::Invalid("null pointer"))?;
        if len == 0 {
            return Err(Error::Invalid("buffer length must be positive"));
        }
        // SAFETY: forwarded from this function's contract.
        let region = unsafe {
            self.transport
                .register(ptr.as_ptr() as u64, len as u64, None)
        }?;
        Ok(Buffer::foreign(ptr, len, region))
    }

    /// `INFO section` of the first node that answers, as text.
    pub async fn info(&self, section: &str) -> Result<String> {
        let reply = self
            .router
            .any_node_call(&[b"INFO", section.as_bytes()])
            .await?;
        let text = expect_bulk_or_nil(reply)?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&text).into_owned())
    }
}
