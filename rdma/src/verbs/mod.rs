//! One-sided reads over RDMA verbs (RC queue pairs, RDMA READ).
//!
//! [`VerbsTransport`] registers memory with the NIC (the rkey in a
//! descriptor is the NIC's) and pulls bytes with RDMA READ work requests
//! posted straight into the destination region: no copy, no CPU on the
//! owner's side. Queue pairs are connected through a TCP side channel on
//! the data port ([`crate::handshake`]); the side channel stays open as the
//! queue pair's lifeline.
//!
//! A read is split into slices of [`SLICE_BYTES`], at most [`WINDOW`] in
//! flight per queue pair; a read of [`STRIPE_MIN_BYTES`] or more is striped
//! over up to [`QPS_PER_PEER`] queue pairs to the peer (as many as its pool
//! has free), and concurrent reads share that pool. Every read has a deadline; a read that
//! fails, times out or is cancelled moves its queue pair to ERROR before it
//! returns, so the NIC never writes into a destination its caller got back.
//!
//! The NIC serves reads of our regions without asking us, so the
//! [`ReadGuard`] of a region is not consulted per read: the store's lease
//! and epoch checks happen on the command path, before a descriptor is
//! handed out (see `docs/OPERATIONS.md`, "RDMA and leases").

mod completion;
#[cfg(feature = "cuda")]
pub mod gpu;
mod nic;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::timeout;

use self::completion::{Completions, WcStatus};
pub use self::nic::NoDevice;
use self::nic::{fail_qp, verbs_err, Nic};
use crate::handshake::{Hello, HELLO_LEN};
use crate::region::{HwKey, RegionTable};
use crate::tcp::TcpStats;
use crate::{Descriptor, ReadGuard, Region, TransferError, Transport, TransportKind};

/// Longest read one call may ask for; as for TCP.
pub const READ_LEN_MAX: u64 = crate::tcp::READ_LEN_MAX;
/// Bytes per RDMA READ work request. Large enough that per-request costs
/// vanish, small enough that a few in flight keep the link busy and a
/// failure wastes little.
pub const SLICE_BYTES: u64 = 1 << 20;
/// READ work requests in flight per queue pair (also its send-queue depth).
pub const WINDOW: usize = 16;
/// Reads of at least this many bytes are striped over several queue pairs
/// to the peer, so one large transfer can use NICs whose single queue pair
/// cannot fill the link.
pub const STRIPE_MIN_BYTES: u64 = 4 * SLICE_BYTES;
/// Queue pairs (and so concurrent reads) per peer endpoint.
pub const QPS_PER_PEER: usize = 4;
/// Outgoing queue pairs per transport, all peers together; with
/// [`WINDOW`] this sizes the shared completion queue so it cannot overrun.
pub const QPS_OUT_MAX: usize = 256;
/// Peers with pooled queue pairs at once; idle peers are evicted beyond it.
pub const PEERS_MAX: usize = 1024;
/// Queue pairs this transport serves for peers at once (one per accepted
/// side channel); further peers wait in the accept backlog.
pub const SERVED_QPS_MAX: usize = 256;
/// Deadline for connecting a side channel and exchanging hellos.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failure, how long a read waits for the NIC to flush its other
/// work requests before giving up on them.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// Completion queue entries: every outgoing work request that can be in
/// flight, so the queue can never overrun.
pub(crate) const CQ_DEPTH: u32 = (QPS_OUT_MAX * WINDOW) as u32;

/// Tunables; the defaults are the named constants above.
#[derive(Debug, Clone)]
pub struct VerbsConfig {
    /// RDMA device to use (`rxe0`, `mlx5_0`); `None` picks the first one
    /// with an active port that has a RoCEv2 GID.
    pub device_name: Option<String>,
    /// Whole-read deadline (handshake included).
    pub read_timeout: Duration,
    /// See [`QPS_PER_PEER`].
    pub qps_per_peer: usize,
    /// Host put in descriptors instead of the bound address.
    pub advertise_host: Option<String>,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            device_name: None,
            read_timeout: Duration::from_secs(30),
            qps_per_peer: QPS_PER_PEER,
            advertise_host: None,
        }
    }
}

/// The verbs transport: a side-channel listener, an opened NIC, pooled
/// queue pairs per peer, and the completion thread.
pub struct VerbsTransport {
    endpoint: String,
    config: VerbsConfig,
    nic: Arc<Nic>,
    regions: Arc<RegionTable>,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    out_slots: Arc<Semaphore>,
    done: Arc<Completions>,
    stats: Arc<TcpStats>,
    listener: AbortHandle,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        self.listener.abort();
        self.done.stop();
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
    }
}

/// Pooled queue pairs to one peer endpoint.
struct Peer {
    slots: Semaphore,
    idle: Mutex<Vec<Arc<Conn>>>,
}

/// One connected queue pair and its side channel.
struct Conn {
    qp: Mutex<BasicQueuePair>,
    /// Set once the QP is (or must be treated as) in ERROR.
    broken: AtomicBool,
    /// Watches the side channel; aborted (closing it) when this drops.
    lifeline: AbortHandle,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    /// Moves the QP to ERROR once: no more data is placed for it and its
    /// outstanding work requests complete as flushed.
    fn fail(&self) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            fail_qp(&mut self.qp.lock());
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.lifeline.abort();
    }
}

impl VerbsTransport {
    /// Opens the device and binds the side-channel listener. Must be called
    /// within a tokio runtime. Fails with a [`NoDevice`] text when no
    /// device can be used.
    pub async fn bind(addr: SocketAddr, config: VerbsConfig) -> Result<Arc<Self>, BindError> {
        let nic = Arc::new(Nic::open(config.device_name.as_deref())?);
        let listener = TcpListener::bind(addr).await.map_err(TransferError::from)?;
        let bound = listener.local_addr().map_err(TransferError::from)?;
        let endpoint = match &config.advertise_host {
            Some(host) if host.contains(':') => format!("[{host}]:{}", bound.port()),
            Some(host) => format!("{host}:{}", bound.port()),
            None => bound.to_string(),
        };
        let done = Arc::new(Completions::default());
        let poller = {
            let (nic, done) = (Arc::clone(&nic), Arc::clone(&done));
            std::thread::Builder::new()
                .name(format!("strata-cq-{}", nic.name))
                .spawn(move || completion::run(nic, done))
                .map_err(TransferError::from)?
        };
        let stats = Arc::new(TcpStats::default());
        let server = Server {
            nic: Arc::clone(&nic),
            stats: Arc::clone(&stats),
        };
        let listener = tokio::spawn(server.run(listener)).abort_handle();
        tracing::info!(device = %nic.name, gid = %nic.gid_text(), %endpoint, "rdma data plane ready");
        Ok(Arc::new(Self {
            endpoint,
            config,
            nic,
            regions: RegionTable::new(),
            peers: Mutex::new(HashMap::new()),
            out_slots: Arc::new(Semaphore::new(QPS_OUT_MAX)),
            done,
            stats,
            listener,
            poller: Some(poller),
        }))
    }

    /// Name of the RDMA device in use.
    pub fn device_name(&self) -> &str {
        &self.nic.name
    }

    /// Live counters: side channels opened and accepted, reads this side
    /// completed (`reads_served` counts our finished READs: the NIC serves
    /// peers' reads without us seeing them) and reads that failed.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// Registers GPU memory (exported as a dma-buf) so peers can READ it and
    /// reads can land in it, without host bounce buffers. The region keeps
    /// `mem` alive and is deregistered before it is freed.
    #[cfg(feature = "cuda")]
    pub fn register_gpu(&self, mem: Arc<gpu::GpuMemory>) -> Result<Region, TransferError> {
        use std::os::fd::AsRawFd;
        let (addr, len) = (mem.device_ptr(), mem.len());
        // SAFETY: the fd is a live dma-buf of exactly [0, len) of `mem`,
        // whose I/O address is its device pointer; `mem` is kept alive by
        // the region below for as long as the MR exists.
        let mr = unsafe {
            self.nic.pd.reg_dmabuf_mr(
                0,
                len as usize,
                addr,
                mem.dmabuf().as_raw_fd(),
                AccessFlags::LocalWrite | AccessFlags::RemoteRead,
            )
        }
        .map_err(|e| verbs_err("ibv_reg_dmabuf_mr", &e))?;
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        // Tuple fields drop in order: the MR before the GPU memory.
        let hw = HwKey {
            lkey,
            _mr: Box::new((mr, mem)),
        };
        // SAFETY: the memory lives as long as the region (held in `hw`);
        // the NIC, not the CPU, is the only one touching it through the
        // region.
        unsafe { self.regions.register_hw(addr, len, hw, rkey) }
    }

    fn peer(&self, endpoint: &str) -> Result<Arc<Peer>, TransferError> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(endpoint) {
            return Ok(Arc::clone(p));
        }
        if peers.len() >= PEERS_MAX {
            let all = self.config.qps_per_peer;
            peers.retain(|_, p| p.slots.available_permits() < all);
            if peers.len() >= PEERS_MAX {
                return Err(TransferError::Busy("too many peers with reads in flight"));
            }
        }
        let peer = Arc::new(Peer {
            slots: Semaphore::new(self.config.qps_per_peer),
            idle: Mutex::new(Vec::new()),
        });
        peers.insert(endpoint.to_owned(), Arc::clone(&peer));
        Ok(peer)
    }

    /// Opens a side channel to `endpoint` and connects a fresh QP over it.
    async fn connect(&self, endpoint: &str) -> Result<Arc<Conn>, TransferError> {
        let slot = match Arc::clone(&self.out_slots).try_acquire_owned() {
            Ok(slot) => slot,
            // Idle pooled queue pairs to other peers hold the slots: close
            // one rather than refuse (a node pulls from many clients).
            Err(_) if self.close_one_idle() => Arc::clone(&self.out_slots)
                .try_acquire_owned()
                .map_err(|_| TransferError::Busy("too many RDMA queue pairs open"))?,
            Err(_) => return Err(TransferError::Busy("too many RDMA queue pairs open")),
        };
        let addr = tokio::net::lookup_host(endpoint)
            .await?
            .next()
            .ok_or(TransferError::BadDescriptor("endpoint does not resolve"))?;
        let mut stream = timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| TransferError::Timeout)??;
        stream.set_nodelay(true)?;
        let mut qp = self.nic.create_qp()?;
        let psn = random_psn();
        let mine = self.nic.hello(&qp, psn);
        let theirs = timeout(HANDSHAKE_TIMEOUT, async {
            stream.write_all(&mine.encode()).await?;
            let mut buf = [0u8; HELLO_LEN];
            stream.read_exact(&mut buf).await?;
            Ok::<_, TransferError>(buf)
        })
        .await
        .map_err(|_| TransferError::Timeout)??;
        let theirs = Hello::decode(&theirs)
            .map_err(|_| TransferError::Protocol("peer did not answer with a verbs hello"))?;
        self.nic.connect_qp(&mut qp, &theirs, psn)?;
        self.stats
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<Conn>| {
            let me = me.clone();
            // The owner closing the side channel means its QP is gone:
            // fail ours at once rather than after the retry timeouts.
            let lifeline = tokio::spawn(async move {
                let mut byte = [0u8; 1];
                let _ = stream.read(&mut byte).await;
                if let Some(conn) = me.upgrade() {
                    conn.fail();
                }
            })
            .abort_handle();
            Conn {
                qp: Mutex::new(qp),
                broken: AtomicBool::new(false),
                lifeline,
                _slot: slot,
            }
        }))
    }

    /// Closes one idle pooled queue pair, if any; true if one was closed.
    fn close_one_idle(&self) -> bool {
        let peers = self.peers.lock();
        let idle = peers.values().find_map(|p| p.idle.lock().pop());
        drop(peers);
        idle.is_some()
    }

    /// A pooled queue pair to `endpoint` that is not broken, or a fresh one.
    async fn take_conn(&self, peer: &Peer, endpoint: &str) -> Result<Arc<Conn>, TransferError> {
        let pooled = loop {
            match peer.idle.lock().pop() {
                Some(c) if c.broken.load(Ordering::Acquire) => continue,
                other => break other,
            }
        };
        match pooled {
            Some(c) => Ok(c),
            None => self.connect(endpoint).await,
        }
    }

    /// Runs one read: on one queue pair, or striped slice by slice over up
    /// to `qps_per_peer` of them when it is large and the peer's pool has
    /// room (never waiting for more than the first).
    async fn pull(&self, src: &Descriptor, local: u64, lkey: u32) -> Result<(), TransferError> {
        let peer = self.peer(&src.endpoint)?;
        let first = peer
            .slots
            .acquire()
            .await
            .map_err(|_| TransferError::Busy("peer pool closed"))?;
        let mut lanes = vec![(first, self.take_conn(&peer, &src.endpoint).await?)];
        if src.len >= STRIPE_MIN_BYTES {
            let want = (src.len.div_ceil(SLICE_BYTES) as usize).min(self.config.qps_per_peer);
            while lanes.len() < want {
                let Ok(slot) = peer.slots.try_acquire() else {
                    break;
                };
                match self.take_conn(&peer, &src.endpoint).await {
                    Ok(conn) => lanes.push((slot, conn)),
                    Err(e) => {
                        tracing::debug!(error = %e, "no extra queue pair to stripe over");
                        break;
                    }
                }
            }
        }
        let count = lanes.len() as u64;
        let runs = lanes.iter().enumerate().map(|(lane, (_, conn))| {
            let mut xfer = Transfer {
                conn,
                done: &self.done,
                inflight: Vec::with_capacity(WINDOW),
            };
            async move { xfer.run(src, local, lkey, lane as u64, count).await }
        });
        // The first failure drops the other lanes' transfers, which fail
        // their queue pairs: none of them is pooled again.
        let result = futures::future::try_join_all(runs).await.map(drop);
        match &result {
            Ok(()) => {
                self.stats.reads_served.fetch_add(1, Ordering::Relaxed);
                peer.idle
                    .lock()
                    .extend(lanes.into_iter().map(|(_, conn)| conn));
            }
            Err(_) => {
                self.stats.reads_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

/// One read's work requests on one QP. Dropped with requests still in
/// flight (error, timeout, cancellation), it fails the QP so the NIC stops
/// writing into the destination.
struct Transfer<'a> {
    conn: &'a Conn,
    done: &'a Completions,
    inflight: Vec<(u64, oneshot::Receiver<WcStatus>)>,
}

impl Transfer<'_> {
    /// Reads slices `lane`, `lane + lanes`, ... of `src`.
    async fn run(
        &mut self,
        src: &Descriptor,
        local: u64,
        lkey: u32,
        lane: u64,
        lanes: u64,
    ) -> Result<(), TransferError> {
        let mut offset = lane * SLICE_BYTES;
        while offset < src.len {
            if self.inflight.len() == WINDOW {
                self.reap_one().await?;
            }
            let len = (src.len - offset).min(SLICE_BYTES);
            self.post(
                src.rkey,
                src.addr + offset,
                local + offset,
                lkey,
                len as u32,
            )?;
            offset += lanes * SLICE_BYTES;
        }
        while !self.inflight.is_empty() {
            self.reap_one().await?;
        }
        Ok(())
    }

    fn post(
        &mut self,
        rkey: u32,
        remote: u64,
        local: u64,
        lkey: u32,
        len: u32,
    ) -> Result<(), TransferError> {
        if self.conn.broken.load(Ordering::Acquire) {
            return Err(TransferError::PeerClosed);
        }
        let (id, rx) = self.done.expect();
        let posted = {
            let mut qp = self.conn.qp.lock();
            let mut guard = qp.start_post_send();
            let wr = guard
                .construct_wr(id, WorkRequestFlags::Signaled)
                .setup_read(rkey, remote);
            // SAFETY: [local, local + len) lies inside the destination
            // region (checked by `read`), which is registered under `lkey`
            // and, by the registration contract, untouched by anyone else
            // until this read returns; the Transfer fails the QP before
            // returning on any path that leaves this request in flight.
            unsafe { wr.setup_sge(lkey, local, len) };
            guard.post()
        };
        match posted {
            Ok(()) => {
                self.inflight.push((id, rx));
                Ok(())
            }
            Err(e) => {
                self.done.forget(id);
                Err(verbs_err("ibv_post_send", &e))
            }
        }
    }

    /// Waits for the oldest request; on a failed one, fails the QP and
    /// waits (bounded) for the others to be flushed.
    async fn reap_one(&mut self) -> Result<(), TransferError> {
        let (_, rx) = self.inflight.remove(0);
        let status = rx
            .await
            .map_err(|_| TransferError::Busy("completion dispatcher stopped"))?;
        if status == 0 {
            return Ok(());
        }
        self.conn.fail();
        let rest = std::mem::take(&mut self.inflight);
        let _ = timeout(FLUSH_WAIT, async {
            for (_, rx) in rest {
                let _ = rx.await;
            }
        })
        .await;
        Err(wc_error(status))
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        if !self.inflight.is_empty() {
            self.conn.fail();
            for (id, _) in self.inflight.drain(..) {
                self.done.forget(id);
            }
        }
    }
}

/// Maps a failed completion to the error callers branch on.
fn wc_error(status: WcStatus) -> TransferError {
    // ibv_wc_status values (verbs.h); stable across rdma-core releases.
    match status {
        4 => TransferError::BadDescriptor("local protection error: destination not registered"),
        5 => TransferError::PeerClosed,
        9 => TransferError::BadDescriptor("peer refused the read request"),
        10 => TransferError::BadDescriptor(
            "remote access error: rkey unknown or range outside the peer's region",
        ),
        12 | 13 => TransferError::PeerClosed,
        other => TransferError::Io(std::io::Error::other(format!(
            "RDMA READ failed with completion status {other}"
        ))),
    }
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() as u32) & 0x00ff_ffff
}

impl Transport for VerbsTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        _guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(TransferError::BadDescriptor(
                "region is null, empty or wraps the address space",
            ));
        }
        // SAFETY: the caller guarantees the memory stays valid until the
        // returned Region (which owns the MR) is dropped; the NIC pins the
        // pages for the MR's lifetime.
        let mr = unsafe {
            self.nic.pd.reg_mr(
                addr as usize,
                len as usize,
                AccessFlags::LocalWrite | AccessFlags::RemoteRead,
            )
        }
        .map_err(|e| verbs_err("ibv_reg_mr", &e))?;
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let hw = HwKey {
            lkey,
            _mr: Box::new(mr),
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.regions.register_hw(addr, len, hw, rkey) }
    }

    async fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), TransferError> {
        if src.transport != TransportKind::Rdma {
            return Err(TransferError::BadDescriptor("not an rdma descriptor"));
        }
        if src.len > READ_LEN_MAX {
            return Err(TransferError::TooLarge {
                len: src.len,
                max: READ_LEN_MAX,
            });
        }
        let start = dst.slice_ptr(dst_offset, src.len)? as u64;
        let lkey = dst.lkey().ok_or(TransferError::BadDescriptor(
            "destination was not registered with this verbs transport",
        ))?;
        if src.len == 0 {
            return Ok(());
        }
        timeout(self.config.read_timeout, self.pull(src, start, lkey))
            .await
            .map_err(|_| TransferError::Timeout)?
    }
}

/// Why [`VerbsTransport::bind`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(transparent)]
    NoDevice(#[from] NoDevice),
    #[error("{0}")]
    Transport(#[from] TransferError),
}

/// The serving half: answers hellos, keeps each served QP alive while its
/// side channel is open.
struct Server {
    nic: Arc<Nic>,
    stats: Arc<TcpStats>,
}

impl Server {
    async fn run(self, listener: TcpListener) {
        let this = Arc::new(self);
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                Some(_) = conns.join_next() => {}
                accepted = listener.accept(), if conns.len() < SERVED_QPS_MAX => match accepted {
                    Ok((stream, peer)) => {
                        this.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                        conns.spawn(Arc::clone(&this).serve(stream, peer));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "rdma side-channel accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr) {
        let qp = match timeout(HANDSHAKE_TIMEOUT, self.accept(&mut stream)).await {
            Ok(Ok(qp)) => qp,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "rdma handshake refused");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "rdma handshake timed out");
                return;
            }
        };
        // The QP lives until the reader closes the side channel (or sends
        // anything, which the protocol does not allow).
        let mut byte = [0u8; 1];
        let _ = stream.read(&mut byte).await;
        drop(qp);
    }

    async fn accept(&self, stream: &mut TcpStream) -> Result<BasicQueuePair, TransferError> {
        stream.set_nodelay(true)?;
        let mut buf = [0u8; HELLO_LEN];
        stream.read_exact(&mut buf).await?;
        let theirs =
            Hello::decode(&buf).map_err(|_| TransferError::Protocol("not a verbs hello"))?;
        let mut qp = self.nic.create_qp()?;
        let psn = random_psn();
        self.nic.connect_qp(&mut qp, &theirs, psn)?;
        stream.write_all(&self.nic.hello(&qp, psn).encode()).await?;
        Ok(qp)
    }
}
