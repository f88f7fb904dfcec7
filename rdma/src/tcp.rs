//! One-sided reads emulated over TCP.
//!
//! Each [`TcpTransport`] runs a data-plane listener that serves reads of its
//! registered regions (checked by rkey, bounds and guard) and keeps a bounded
//! pool of connections per peer for its own reads. Payload bytes go straight
//! between region memory and the socket: no staging buffer on either side.
//! Wire format: `docs/transport-tcp.md`.
//!
//! A connection whose state is unknown (a read failed or timed out mid-way)
//! is dropped, never returned to the pool.
//!
//! With [`TcpTls`] the listener speaks TLS (its descriptors say `tls`) and
//! `tls` descriptors are read over TLS; the frames inside are the same. A
//! plaintext reader on a TLS listener is answered `NEEDS_TLS` and closed,
//! and every handshake is bounded by [`crate::tls::HANDSHAKE_TIMEOUT`].

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::timeout;

use crate::region::RegionTable;
use crate::tls::{self, AcceptError, Stream};
use crate::wire::{Request, Response, Status, REQUEST_LEN, RESPONSE_LEN};
use crate::{Descriptor, ReadGuard, ReadOp, Region, TransferError, Transport, TransportKind};

/// Longest read one request may ask for. Values are at most a few tens of
/// MiB; 1 GiB leaves room for batched arenas while bounding how long one
/// request can hold a connection and a pin.
pub const READ_LEN_MAX: u64 = 1 << 30;

/// Connections (and so reads in flight) per peer endpoint. Enough to fill a
/// 100 Gb/s link from one peer without letting one reader hog a server.
pub const CONNS_PER_PEER_MAX: usize = 4;

/// Peers with pooled connections at once; idle peers are evicted beyond it.
pub const PEERS_MAX: usize = 1024;

/// Connections the listener serves at once; further peers wait in the
/// accept backlog until one closes.
pub const SERVED_CONNS_MAX: usize = 256;

/// A batch of reads to one peer is spread over several connections only
/// when each then carries at least this many bytes: small reads go best
/// pipelined on one connection, large ones need more than one stream to
/// fill a fast link.
pub const BATCH_BYTES_PER_CONN: u64 = 1 << 20;

/// A single read of at least twice this is split into pieces of at least
/// this many bytes (up to one per pooled connection): on loopback a 1 MiB
/// read in two pieces beat one, since under BBR one stream is paced in
/// bursts that two streams overlap (docs/bench-notes/ranged-gets.md).
pub const SPLIT_PIECE_BYTES_MIN: u64 = 512 * 1024;

/// Accept backlog of the listener.
const LISTEN_BACKLOG: u32 = 1024;

/// `SO_SNDBUF`/`SO_RCVBUF` for data-plane sockets: large enough for a
/// multi-MiB value to be in flight without waiting on window updates.
pub const SOCKET_BUFFER_BYTES: u32 = 4 << 20;

/// Tunables; the defaults are the named constants above.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Whole-request deadline for a read (connect, request, payload). A
    /// 1 GiB read needs about 1 s at 10 GB/s; 30 s catches dead peers while
    /// tolerating a congested one.
    pub read_timeout: Duration,
    /// How long the listener keeps a connection with no request, and how
    /// long it may take to write one response.
    pub serve_timeout: Duration,
    /// See [`CONNS_PER_PEER_MAX`].
    pub conns_per_peer: usize,
    /// See [`SERVED_CONNS_MAX`].
    pub served_conns_max: usize,
    /// Host put in this transport's descriptors instead of the bound
    /// address: needed when binding `0.0.0.0`, which peers cannot dial.
    pub advertise_host: Option<String>,
    /// Congestion control of this transport's sockets (see
    /// [`crate::sockopt`]); `None`: the host's default.
    pub congestion: Option<String>,
    /// Once the first bytes of a read's responses have arrived, the read
    /// polls for the rest instead of sleeping between bursts until this
    /// long passes with nothing arriving (see [`crate::spin`]; the node's
    /// `stream_poll_us`, the client's `stream_spin_us`). Zero: off.
    pub stream_spin: Duration,
    /// TLS of the listener and of reads; default: none.
    pub tls: TcpTls,
}

/// TLS on the TCP data plane.
#[derive(Debug, Clone, Default)]
pub struct TcpTls {
    /// What the listener speaks.
    pub listen: TlsListen,
    /// How `tls` descriptors are read: the owner's certificate checked
    /// against this configuration's CA, this side's own certificate shown
    /// where the owner asks for one. `None`: they are refused.
    pub dial: Option<Arc<tls::ClientConfig>>,
    /// The name owners' certificates must carry; `None`: the host of each
    /// descriptor's endpoint.
    pub server_name: Option<ServerName<'static>>,
}

/// What a data-plane listener speaks.
#[derive(Debug, Clone, Default)]
pub enum TlsListen {
    /// Plain TCP; descriptors say `tcp`.
    #[default]
    Plain,
    /// TLS with this configuration; descriptors say `tls`.
    Tls(Arc<tls::ServerConfig>),
    /// Nothing: every connection is closed unanswered. A TLS party with no
    /// certificate to serve with (an SDK client without one), whose
    /// memory must not be readable in plaintext.
    Closed,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(30),
            serve_timeout: Duration::from_secs(60),
            conns_per_peer: CONNS_PER_PEER_MAX,
            served_conns_max: SERVED_CONNS_MAX,
            advertise_host: None,
            congestion: None,
            stream_spin: Duration::from_micros(crate::spin::STREAM_US_DEFAULT),
            tls: TcpTls::default(),
        }
    }
}

/// Counters for tests and metrics.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Outgoing connections opened by the pool.
    pub connections_opened: AtomicU64,
    /// Incoming connections accepted by the listener.
    pub connections_accepted: AtomicU64,
    /// Reads the listener completed successfully.
    pub reads_served: AtomicU64,
    /// Reads the listener refused (bad rkey, range, epoch, length).
    pub reads_refused: AtomicU64,
    /// Reads the listener is serving now: admitted, last byte not yet
    /// handed to the socket.
    pub reads_in_progress: AtomicU64,
    /// Incoming connections dropped for TLS: a plaintext reader on a TLS
    /// listener, a failed or timed-out handshake.
    pub tls_refused: AtomicU64,
}

/// Counts one read in [`TcpStats::reads_in_progress`] while it lives, so
/// that a read ended by an error or a dropped task is counted out too.
struct InProgress<'a>(&'a AtomicU64);

impl<'a> InProgress<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The TCP transport: a data-plane listener plus a pooled reader.
pub struct TcpTransport {
    endpoint: String,
    config: TcpConfig,
    regions: Arc<RegionTable>,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    next_id: AtomicU64,
    stats: Arc<TcpStats>,
    /// Accept loop; aborting it also aborts every connection it serves.
    listener: AbortHandle,
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Pooled connections to one peer endpoint.
struct Peer {
    /// One permit per connection that may exist to this peer.
    slots: Arc<Semaphore>,
    idle: Mutex<Vec<Stream>>,
}

impl Peer {
    /// An idle connection of the kind `tls` asks for; one of the other
    /// kind (the same endpoint named by both schemes) is dropped.
    fn pooled(&self, tls: bool) -> Option<Stream> {
        self.idle.lock().pop().filter(|c| c.is_tls() == tls)
    }
}

impl TcpTransport {
    /// Binds the data-plane listener with default limits. Must be called
    /// within a tokio runtime.
    pub async fn bind(addr: SocketAddr) -> Result<Arc<Self>, TransferError> {
        Self::bind_with(addr, TcpConfig::default()).await
    }

    /// Binds the data-plane listener with explicit limits.
    pub async fn bind_with(
        addr: SocketAddr,
        config: TcpConfig,
    ) -> Result<Arc<Self>, TransferError> {
        let socket = new_socket(addr, config.congestion.as_deref())?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(LISTEN_BACKLOG)?;
        let bound = listener.local_addr()?;
        let endpoint = match &config.advertise_host {
            Some(host) if host.contains(':') => format!("[{host}]:{}", bound.port()),
            Some(host) => format!("{host}:{}", bound.port()),
            None => bound.to_string(),
        };
        let regions = RegionTable::new();
        let stats = Arc::new(TcpStats::default());
        let server = Server {
            regions: Arc::clone(&regions),
            stats: Arc::clone(&stats),
            serve_timeout: config.serve_timeout,
            tls: match &config.tls.listen {
                TlsListen::Plain => Listening::Plain,
                TlsListen::Tls(c) => Listening::Tls(tokio_rustls::TlsAcceptor::from(c.clone())),
                TlsListen::Closed => Listening::Closed,
            },
        };
        let listener = tokio::spawn(server.run(listener, config.served_conns_max)).abort_handle();
        tracing::debug!(%endpoint, "tcp data plane listening");
        Ok(Arc::new(Self {
            endpoint,
            config,
            regions,
            peers: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stats,
            listener,
        }))
    }

    /// Live counters of this transport.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// Runs a read, polling for the rest of its responses once their first
    /// bytes woke it (`TcpConfig::stream_spin`).
    async fn streamed<F: std::future::Future + ?Sized>(
        &self,
        read: std::pin::Pin<&mut F>,
    ) -> F::Output {
        crate::spin::shared()
            .run(read, Duration::ZERO, self.config.stream_spin, || {})
            .await
            .0
    }

    fn peer(&self, endpoint: &str) -> Result<Arc<Peer>, TransferError> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(endpoint) {
            return Ok(Arc::clone(p));
        }
        if peers.len() >= PEERS_MAX {
            // Evict peers nobody is reading from; their idle connections
            // close on drop.
            let all = self.config.conns_per_peer;
            peers.retain(|_, p| p.slots.available_permits() < all);
            if peers.len() >= PEERS_MAX {
                return Err(TransferError::Busy("too many peers with reads in flight"));
            }
        }
        let peer = Arc::new(Peer {
            slots: Arc::new(Semaphore::new(self.config.conns_per_peer)),
            idle: Mutex::new(Vec::with_capacity(self.config.conns_per_peer)),
        });
        peers.insert(endpoint.to_owned(), Arc::clone(&peer));
        Ok(peer)
    }

    /// A fresh connection to `endpoint`, TLS when `kind` says so.
    async fn connect(&self, endpoint: &str, kind: TransportKind) -> Result<Stream, TransferError> {
        let dial = match kind {
            TransportKind::Tls => Some(self.config.tls.dial.as_ref().ok_or(
                TransferError::BadDescriptor(
                    "a tls descriptor, and this side has no TLS CA to check its owner with",
                ),
            )?),
            _ => None,
        };
        let sock = self.connect_tcp(endpoint).await?;
        let Some(config) = dial else {
            return Ok(Stream::Plain(sock));
        };
        let name = match &self.config.tls.server_name {
            Some(name) => name.clone(),
            None => tls::server_name(endpoint)
                .map_err(|_| TransferError::BadDescriptor("endpoint host is not a TLS name"))?,
        };
        tls::connect(config, name, sock, tls::HANDSHAKE_TIMEOUT)
            .await
            .map_err(|e| handshake_error(endpoint, e))
    }

    async fn connect_tcp(&self, endpoint: &str) -> Result<TcpStream, TransferError> {
        let addr = tokio::net::lookup_host(endpoint)
            .await?
            .next()
            .ok_or(TransferError::BadDescriptor("endpoint does not resolve"))?;
        let socket = new_socket(addr, self.config.congestion.as_deref())?;
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        self.stats
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        Ok(stream)
    }

    /// Runs one read on a pooled or fresh connection. A pooled connection
    /// may have been closed by the peer while idle, so a failure before any
    /// response byte arrived is retried once on a fresh connection: nothing
    /// was written to `dst` yet, and reads are idempotent.
    async fn pull(&self, src: &Descriptor, dst: &mut [u8]) -> Result<(), TransferError> {
        let peer = self.peer(&src.endpoint)?;
        let _slot = peer
            .slots
            .acquire()
            .await
            .map_err(|_| TransferError::Busy("peer pool closed"))?;
        let pooled = peer.pooled(src.transport == TransportKind::Tls);
        let (mut conn, reused) = match pooled {
            Some(conn) => (conn, true),
            None => (self.connect(&src.endpoint, src.transport).await?, false),
        };
        let outcome = match self.exchange(&mut conn, src, dst).await {
            Err(Broken::BeforeResponse(_)) if reused => {
                conn = self.connect(&src.endpoint, src.transport).await?;
                self.exchange(&mut conn, src, dst).await
            }
            other => other,
        };
        match outcome {
            Ok(result) => {
                peer.idle.lock().push(conn);
                result
            }
            Err(Broken::BeforeResponse(e) | Broken::MidResponse(e)) => Err(e),
        }
    }

    /// One request/response. `Ok` means the connection is in a known state
    /// (the inner result is the peer's answer); `Err` means it must be
    /// dropped.
    async fn exchange(
        &self,
        conn: &mut Stream,
        src: &Descriptor,
        dst: &mut [u8],
    ) -> Result<Result<(), TransferError>, Broken> {
        let request = Request {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            addr: src.addr,
            len: src.len,
            rkey: src.rkey,
            epoch: src.epoch,
        };
        let mut head = [0u8; RESPONSE_LEN];
        let sent = async {
            conn.write_all(&request.encode()).await?;
            // TLS may hold the last record back until flushed.
            conn.flush().await?;
            conn.read_exact(&mut head).await
        };
        sent.await.map_err(|e| Broken::BeforeResponse(e.into()))?;
        let response = Response::decode(&head).map_err(Broken::MidResponse)?;
        // An owner that could not read the frame answers BAD_REQUEST or
        // NEEDS_TLS with id 0: report that, not an id mismatch.
        let rejected = response.status.closes();
        if response.id != request.id && !(rejected && response.id == 0) {
            return Err(Broken::MidResponse(TransferError::Protocol(
                "response id does not match the request",
            )));
        }
        if let Some(refused) = response.status.to_error(src.len, READ_LEN_MAX) {
            // The owner closes the connection after these: drop it.
            if rejected {
                return Err(Broken::MidResponse(refused));
            }
            return Ok(Err(refused));
        }
        if response.len != src.len {
            return Err(Broken::MidResponse(TransferError::LengthMismatch {
                want: src.len,
                got: response.len,
            }));
        }
        conn.read_exact(dst)
            .await
            .map_err(|e| Broken::MidResponse(e.into()))?;
        Ok(Ok(()))
    }
}

/// One read of a batch, checked, with its destination bytes.
struct Item<'a> {
    /// Position in the caller's batch.
    idx: usize,
    src: &'a Descriptor,
    dst: &'a mut [u8],
}

impl TcpTransport {
    /// Checks a read and returns the destination bytes it will fill.
    // A `Region` stands for memory registered for transfers into it: its
    // registration contract (not `&mut`) makes this read the range's only
    // user while it is in flight, as for `read` itself.
    #[allow(clippy::mut_from_ref)]
    fn destination<'a>(
        &self,
        src: &Descriptor,
        dst: &'a Region,
        dst_offset: u64,
    ) -> Result<&'a mut [u8], TransferError> {
        if !src.transport.over_tcp() {
            return Err(TransferError::BadDescriptor("not a tcp or tls descriptor"));
        }
        if src.len > READ_LEN_MAX {
            return Err(TransferError::TooLarge {
                len: src.len,
                max: READ_LEN_MAX,
            });
        }
        if dst.lkey().is_some() {
            // A NIC registration may name memory the CPU cannot address
            // (GPU memory); only the transport that made it may use it.
            return Err(TransferError::BadDescriptor(
                "destination was registered with the verbs transport",
            ));
        }
        let start = dst.slice_ptr(dst_offset, src.len)?;
        // SAFETY: `dst` outlives the returned slice ('a), so by the
        // registration contract its memory is valid for writes and no one
        // else touches this range while the transfer is in flight;
        // `slice_ptr` checked the range lies inside the region, and
        // `src.len <= READ_LEN_MAX` fits in usize on the 64-bit targets
        // strata supports.
        Ok(unsafe { std::slice::from_raw_parts_mut(start, src.len as usize) })
    }

    /// One large read as `pieces` reads of consecutive sub-ranges, each on
    /// its own connection: one stream cannot fill a fast link. The owner
    /// checks each sub-range against the same registration and lease.
    async fn read_split(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
        pieces: u64,
    ) -> Result<(), TransferError> {
        // Checked whole first, so a bad read fails as one.
        self.destination(src, dst, dst_offset)?;
        let share = src.len.div_ceil(pieces);
        let parts: Vec<Descriptor> = (0..pieces)
            .map(|i| i * share)
            .take_while(|&off| off < src.len)
            .map(|off| Descriptor {
                addr: src.addr + off,
                len: share.min(src.len - off),
                ..src.clone()
            })
            .collect();
        let ops: Vec<ReadOp<'_>> = parts
            .iter()
            .map(|part| ReadOp {
                src: part,
                dst,
                dst_offset: dst_offset + (part.addr - src.addr),
            })
            .collect();
        self.read_batch(&ops, SPLIT_PIECE_BYTES_MIN)
            .await
            .into_iter()
            .collect()
    }

    /// The reads of `ops`, each peer's over as many connections as give
    /// each at least `per_conn_min` bytes.
    async fn read_batch<'a>(
        &'a self,
        ops: &'a [ReadOp<'a>],
        per_conn_min: u64,
    ) -> Vec<Result<(), TransferError>> {
        let mut results: Vec<Result<(), TransferError>> = ops.iter().map(|_| Ok(())).collect();
        // Per peer, in the caller's order (a batch names few peers).
        let mut groups: Vec<((&str, TransportKind), Vec<Item<'a>>)> = Vec::new();
        for (idx, op) in ops.iter().enumerate() {
            match self.destination(op.src, op.dst, op.dst_offset) {
                Ok(dst) => {
                    let item = Item {
                        idx,
                        src: op.src,
                        dst,
                    };
                    let key = (op.src.endpoint.as_str(), op.src.transport);
                    match groups.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, items)) => items.push(item),
                        None => groups.push((key, vec![item])),
                    }
                }
                Err(e) => results[idx] = Err(e),
            }
        }
        let mut runs: Vec<Vec<Item<'a>>> = groups
            .into_iter()
            .flat_map(|(_, items)| split(items, self.config.conns_per_peer, per_conn_min))
            .collect();
        while !runs.is_empty() {
            runs = self.send_and_finish(runs, &mut results).await;
        }
        results
    }

    /// Sends every run that gets a connection now, then reads their
    /// responses; returns the runs that found their peer's pool full (for
    /// another round, once this one has given its connections back).
    async fn send_and_finish<'a>(
        &'a self,
        runs: Vec<Vec<Item<'a>>>,
        results: &mut [Result<(), TransferError>],
    ) -> Vec<Vec<Item<'a>>> {
        // Every run's requests go out before any response is read: on a
        // fast link a run whose payload is already in the socket buffer
        // would otherwise finish (and free its connection for the next
        // run) before the next run sent anything, one connection at a time.
        let mut sent: Vec<Run<'a>> = Vec::with_capacity(runs.len());
        let mut later = Vec::new();
        for run in runs {
            let idx: Vec<usize> = run.iter().map(|it| it.idx).collect();
            // Only a round holding no connection may wait for one: waiting
            // while holding some could deadlock with another batch.
            let wait = sent.is_empty();
            match timeout(self.config.read_timeout, self.send_run(run, wait)).await {
                Ok(Sending::Sent(run)) => sent.push(run),
                Ok(Sending::PoolFull(run)) => later.push(run),
                Ok(Sending::Failed(e)) => {
                    for i in idx {
                        results[i] = Err(e.duplicate());
                    }
                }
                Err(_) => {
                    for i in idx {
                        results[i] = Err(TransferError::Timeout);
                    }
                }
            }
        }
        let done = futures::future::join_all(sent.into_iter().map(|run| async move {
            let idx: Vec<usize> = run.items.iter().map(|it| it.idx).collect();
            // Dropping the future on timeout drops the connection with it.
            let out = match timeout(self.config.read_timeout, self.finish_run(run)).await {
                Ok(out) => out,
                Err(_) => idx.iter().map(|_| Err(TransferError::Timeout)).collect(),
            };
            (idx, out)
        }))
        .await;
        for (idx, out) in done {
            for (i, r) in idx.into_iter().zip(out) {
                results[i] = r;
            }
        }
        later
    }

    /// Takes a connection to the run's peer (pooled or fresh; waiting for
    /// a free slot only with `wait`) and writes all its requests.
    async fn send_run<'a>(&self, items: Vec<Item<'a>>, wait: bool) -> Sending<'a> {
        let endpoint = items[0].src.endpoint.clone();
        let kind = items[0].src.transport;
        let peer = match self.peer(&endpoint) {
            Ok(p) => p,
            Err(e) => return Sending::Failed(e),
        };
        let slots = Arc::clone(&peer.slots);
        let permit = if wait {
            slots.acquire_owned().await.ok()
        } else {
            match slots.try_acquire_owned() {
                Ok(p) => Some(p),
                Err(tokio::sync::TryAcquireError::NoPermits) => return Sending::PoolFull(items),
                Err(tokio::sync::TryAcquireError::Closed) => None,
            }
        };
        let Some(permit) = permit else {
            return Sending::Failed(TransferError::Busy("peer pool closed"));
        };
        let pooled = peer.pooled(kind == TransportKind::Tls);
        let (conn, reused) = match pooled {
            Some(conn) => (conn, true),
            None => match self.connect(&endpoint, kind).await {
                Ok(c) => (c, false),
                Err(e) => return Sending::Failed(e),
            },
        };
        let mut run = Run {
            endpoint,
            kind,
            peer,
            _permit: permit,
            conn,
            reused,
            first: 0,
            items,
            send_failed: None,
        };
        if let Err(e) = run.send(&self.next_id).await {
            // Retried on a fresh connection in `finish_run` when pooled.
            run.send_failed = Some(e);
        }
        Sending::Sent(run)
    }

    /// Reads a sent run's responses. A pooled connection that fails before
    /// the first response byte is replaced and the run sent again (as
    /// [`TcpTransport::pull`] does for one read).
    async fn finish_run(&self, mut run: Run<'_>) -> Vec<Result<(), TransferError>> {
        let fail_all = |n: usize, e: &TransferError| (0..n).map(|_| Err(e.duplicate())).collect();
        let (mut results, mut broken) = match run.send_failed.take() {
            Some(e) => (Vec::new(), Some(Broken::BeforeResponse(e))),
            None => run.receive().await,
        };
        if run.reused && results.is_empty() && matches!(broken, Some(Broken::BeforeResponse(_))) {
            match self.connect(&run.endpoint, run.kind).await {
                Ok(fresh) => {
                    run.conn = fresh;
                    (results, broken) = match run.send(&self.next_id).await {
                        Ok(()) => run.receive().await,
                        Err(e) => (Vec::new(), Some(Broken::BeforeResponse(e))),
                    };
                }
                Err(e) => return fail_all(run.items.len(), &e),
            }
        }
        match broken {
            None => run.peer.idle.lock().push(run.conn),
            Some(Broken::BeforeResponse(e) | Broken::MidResponse(e)) => {
                // The read that broke the connection and every later one.
                results.extend(fail_all(run.items.len() - results.len(), &e));
            }
        }
        results
    }
}

enum Sending<'a> {
    Sent(Run<'a>),
    /// Every connection to the peer is busy: send in a later round.
    PoolFull(Vec<Item<'a>>),
    /// Every read of the run failed so.
    Failed(TransferError),
}

/// One peer's share of a batch on one connection.
struct Run<'a> {
    endpoint: String,
    kind: TransportKind,
    peer: Arc<Peer>,
    /// The connection's slot in the peer's pool, held until the run ends.
    _permit: OwnedSemaphorePermit,
    conn: Stream,
    reused: bool,
    /// Request id of the first item; the others follow in order.
    first: u64,
    items: Vec<Item<'a>>,
    send_failed: Option<TransferError>,
}

impl Run<'_> {
    /// Writes every request of the run in one write.
    async fn send(&mut self, next_id: &AtomicU64) -> Result<(), TransferError> {
        self.first = next_id.fetch_add(self.items.len() as u64, Ordering::Relaxed);
        let mut frames = Vec::with_capacity(self.items.len() * REQUEST_LEN);
        for (k, item) in self.items.iter().enumerate() {
            let request = Request {
                id: self.first + k as u64,
                addr: item.src.addr,
                len: item.src.len,
                rkey: item.src.rkey,
                epoch: item.src.epoch,
            };
            frames.extend_from_slice(&request.encode());
        }
        self.conn.write_all(&frames).await?;
        // TLS may hold the last record back until flushed.
        self.conn.flush().await.map_err(Into::into)
    }

    /// Reads the responses in order. Returns the results of the reads
    /// answered before the connection broke (all of them when it did not),
    /// and why it broke.
    async fn receive(&mut self) -> (Vec<Result<(), TransferError>>, Option<Broken>) {
        let mut results = Vec::with_capacity(self.items.len());
        for (k, item) in self.items.iter_mut().enumerate() {
            let mut head = [0u8; RESPONSE_LEN];
            if let Err(e) = self.conn.read_exact(&mut head).await {
                let broken = if k == 0 {
                    Broken::BeforeResponse(e.into())
                } else {
                    Broken::MidResponse(e.into())
                };
                return (results, Some(broken));
            }
            let response = match Response::decode(&head) {
                Ok(r) => r,
                Err(e) => return (results, Some(Broken::MidResponse(e))),
            };
            let id = self.first + k as u64;
            let rejected = response.status.closes();
            if response.id != id && !(rejected && response.id == 0) {
                let e = TransferError::Protocol("response id does not match the request");
                return (results, Some(Broken::MidResponse(e)));
            }
            if let Some(refused) = response.status.to_error(item.src.len, READ_LEN_MAX) {
                // The owner closes the connection after these.
                if rejected {
                    return (results, Some(Broken::MidResponse(refused)));
                }
                results.push(Err(refused));
                continue;
            }
            if response.len != item.src.len {
                let e = TransferError::LengthMismatch {
                    want: item.src.len,
                    got: response.len,
                };
                return (results, Some(Broken::MidResponse(e)));
            }
            if let Err(e) = self.conn.read_exact(item.dst).await {
                return (results, Some(Broken::MidResponse(e.into())));
            }
            results.push(Ok(()));
        }
        (results, None)
    }
}

/// Splits one peer's reads into at most `conns` runs, in order, of about
/// equal bytes, none under `per_conn_min` (so small reads stay on one
/// connection).
fn split(items: Vec<Item<'_>>, conns: usize, per_conn_min: u64) -> Vec<Vec<Item<'_>>> {
    let total: u64 = items.iter().map(|it| it.src.len).sum();
    let runs = (total / per_conn_min)
        .clamp(1, conns.max(1) as u64)
        .min(items.len() as u64);
    let share = total.div_ceil(runs);
    let mut out: Vec<Vec<Item<'_>>> = Vec::with_capacity(runs as usize);
    let mut current = Vec::new();
    let mut bytes = 0;
    for item in items {
        bytes += item.src.len;
        current.push(item);
        if bytes >= share && (out.len() as u64) + 1 < runs {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// A failure that leaves the connection unusable.
enum Broken {
    /// Nothing of the response was received; safe to retry elsewhere.
    BeforeResponse(TransferError),
    /// Some of the response was received or it made no sense.
    MidResponse(TransferError),
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        match self.config.tls.listen {
            TlsListen::Plain => TransportKind::Tcp,
            TlsListen::Tls(_) | TlsListen::Closed => TransportKind::Tls,
        }
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        // SAFETY: the caller upholds this function's contract, which is the
        // table's contract word for word.
        unsafe { self.regions.register(addr, len, guard) }
    }

    async fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), TransferError> {
        let read = async {
            let pieces = (src.len / SPLIT_PIECE_BYTES_MIN).min(self.config.conns_per_peer as u64);
            if pieces >= 2 {
                return self.read_split(src, dst, dst_offset, pieces).await;
            }
            let dst = self.destination(src, dst, dst_offset)?;
            // Dropping the future on timeout drops the connection with it.
            timeout(self.config.read_timeout, self.pull(src, dst))
                .await
                .map_err(|_| TransferError::Timeout)?
        };
        self.streamed(std::pin::pin!(read)).await
    }

    async fn read_many<'a>(&'a self, ops: &'a [ReadOp<'a>]) -> Vec<Result<(), TransferError>> {
        let read = self.read_batch(ops, BATCH_BYTES_PER_CONN);
        self.streamed(std::pin::pin!(read)).await
    }
}

fn new_socket(addr: SocketAddr, congestion: Option<&str>) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_send_buffer_size(SOCKET_BUFFER_BYTES)?;
    socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES)?;
    if let Some(name) = congestion {
        crate::sockopt::set_congestion(&socket, name)?;
    }
    Ok(socket)
}

/// The serving half: owns nothing but the region table and counters, so
/// dropping the transport (which aborts this) really stops serving.
struct Server {
    regions: Arc<RegionTable>,
    stats: Arc<TcpStats>,
    serve_timeout: Duration,
    tls: Listening,
}

/// [`TlsListen`], ready to accept with.
enum Listening {
    Plain,
    Tls(tokio_rustls::TlsAcceptor),
    Closed,
}

/// What a failed TLS handshake with `endpoint` is reported as: a peer
/// that answered with something other than TLS is most likely a
/// plaintext data plane, and the message says so.
fn handshake_error(endpoint: &str, e: io::Error) -> TransferError {
    let not_tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| matches!(r, rustls::Error::InvalidMessage(_)));
    if not_tls {
        return TransferError::Tls(format!(
            "the data plane at {endpoint} does not speak TLS (a plaintext tcp data plane?): {e}"
        ));
    }
    TransferError::Tls(format!("handshake with the data plane at {endpoint}: {e}"))
}

impl Server {
    async fn run(self, listener: TcpListener, conns_max: usize) {
        let this = Arc::new(self);
        // Dropping the set (when this task is aborted) aborts every
        // connection task in it.
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                Some(done) = conns.join_next() => {
                    if let Err(e) = done {
                        if e.is_panic() {
                            tracing::error!(error = %e, "data-plane connection task panicked");
                        }
                    }
                }
                accepted = listener.accept(), if conns.len() < conns_max => match accepted {
                    Ok((stream, peer)) => {
                        this.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                        conns.spawn(Arc::clone(&this).serve(stream, peer));
                    }
                    Err(e) => {
                        // Usually EMFILE; back off instead of spinning.
                        tracing::warn!(error = %e, "data-plane accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }

    async fn serve(self: Arc<Self>, sock: TcpStream, peer: SocketAddr) {
        if let Err(e) = sock.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "set_nodelay failed");
        }
        let Some(mut stream) = self.open(sock, peer).await else {
            return;
        };
        loop {
            let mut head = [0u8; REQUEST_LEN];
            match timeout(self.serve_timeout, stream.read_exact(&mut head)).await {
                Ok(Ok(_)) => {}
                // Peer closed, reset, or idle too long: all normal ends.
                Ok(Err(_)) | Err(_) => return,
            }
            let served = timeout(self.serve_timeout, self.answer(&mut stream, &head)).await;
            match served {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "data-plane write failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "data-plane write timed out");
                    return;
                }
            }
        }
    }

    /// The connection as this listener speaks it, after the TLS handshake
    /// where there is one; `None`: it is refused (and closed).
    async fn open(&self, sock: TcpStream, peer: SocketAddr) -> Option<Stream> {
        let acceptor = match &self.tls {
            Listening::Plain => return Some(Stream::Plain(sock)),
            Listening::Closed => return None,
            Listening::Tls(acceptor) => acceptor,
        };
        let refused = match tls::accept(acceptor, sock, tls::HANDSHAKE_TIMEOUT).await {
            Ok(stream) => return Some(stream),
            Err(AcceptError::Plaintext(mut sock)) => {
                let head = Response {
                    status: Status::NeedsTls,
                    id: 0,
                    len: 0,
                }
                .encode();
                // Best effort: the reader learns why, if it still listens.
                let _ = timeout(self.serve_timeout, sock.write_all(&head)).await;
                AcceptError::Plaintext(sock)
            }
            Err(e) => e,
        };
        self.stats.tls_refused.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, error = %refused, "data-plane TLS refused");
        None
    }

    /// Answers one request. `Ok(false)`: the frame was malformed, the
    /// connection must close after the refusal.
    async fn answer(&self, stream: &mut Stream, head: &[u8; REQUEST_LEN]) -> io::Result<bool> {
        let request = match Request::decode(head) {
            Ok(r) => r,
            Err(status) => {
                self.refuse(stream, status, 0).await?;
                return Ok(false);
            }
        };
        if request.len > READ_LEN_MAX {
            self.refuse(stream, Status::TooLarge, request.id).await?;
            return Ok(true);
        }
        let ticket =
            match self
                .regions
                .admit(request.addr, request.len, request.rkey, request.epoch)
            {
                Ok(t) => t,
                Err(denied) => {
                    self.refuse(stream, denied.into(), request.id).await?;
                    return Ok(true);
                }
            };
        let in_progress = InProgress::new(&self.stats.reads_in_progress);
        // SAFETY: `admit` checked that [addr, addr + len) lies inside a live
        // registered region and counted this read as being served, so by the
        // registration contract the memory stays valid and unmodified until
        // `ticket` drops below, after the last byte is written; len fits in
        // usize (<= READ_LEN_MAX).
        let payload =
            unsafe { std::slice::from_raw_parts(request.addr as *const u8, request.len as usize) };
        let head = Response {
            status: Status::Ok,
            id: request.id,
            len: request.len,
        }
        .encode();
        write_all2(stream, &head, payload).await?;
        drop(ticket);
        drop(in_progress);
        self.stats.reads_served.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    async fn refuse(&self, stream: &mut Stream, status: Status, id: u64) -> io::Result<()> {
        self.stats.reads_refused.fetch_add(1, Ordering::Relaxed);
        let head = Response { status, id, len: 0 }.encode();
        stream.write_all(&head).await?;
        stream.flush().await
    }
}

/// Writes header and payload with as few syscalls as possible (one, for
/// small values), straight from region memory.
async fn write_all2(stream: &mut Stream, head: &[u8], payload: &[u8]) -> io::Result<()> {
    let mut slices = [IoSlice::new(head), IoSlice::new(payload)];
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let n = stream.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    // TLS may hold the last record back until flushed.
    stream.flush().await
}
