//! One node as the client sees it: its lazily opened command connections
//! and whether it failed recently. Knows nothing about slots.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::{Duration, Instant};

use redis_protocol::resp2::types::BytesFrame;
use tokio::sync::Mutex;

use crate::cma::{self, Link, Local};
use crate::conn::{Conn, Reply, Sink};
use crate::spin::{spun, InFlight, Windows};
use crate::{Error, Result};

/// A node that failed at the socket level gets no requests for this long
/// when another node can serve them; the health check probes it meanwhile.
const DOWN_HOLD: Duration = Duration::from_millis(250);

/// Command connections per node. Lane 0 carries everything and holds the
/// cross-memory attach set-up; lane 1 carries the second half of a large
/// single GET (see `ClientConfig::split_get_min`), over TCP only.
pub(crate) const LANES: usize = 2;

/// Whether a command may be sent again after its connection broke without
/// a reply: a second PUT of the same bytes is harmless, a second NX PUT
/// would report "exists" for the client's own first write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Idempotent {
    Yes,
    No,
}

pub(crate) struct Node {
    /// `host:port` as the slot map or a redirect names it.
    pub(crate) addr: String,
    /// One per lane; `None` until first use and after a connection broke.
    conns: [Mutex<Option<Conn>>; LANES],
    /// The node refused `GET ... RANGE` (an older version): single GETs
    /// to it go whole, over lane 0.
    range_refused: AtomicBool,
    /// When a request to it last failed at the socket level; cleared when
    /// it answers again.
    down_at: SyncMutex<Option<Instant>>,
    io_timeout: Duration,
    connect_timeout: Duration,
    /// This process's CMA side, when the client may use it.
    cma_local: Option<Arc<Local>>,
    /// CMA with this node on the current connection (set up on connect).
    cma: SyncMutex<Option<Link>>,
    /// The node could not read this process: PUTs go over the network.
    cma_put_refused: AtomicBool,
    /// The choice of data plane was logged.
    cma_logged: AtomicBool,
    /// Congestion control of the command connection (`None`: the host's).
    tcp_congestion: Option<String>,
    /// TLS to this node's RESP port (`ClientConfig::tls`).
    tls: Option<Arc<crate::conn::Tls>>,
    /// `ClientConfig::spin_us`, `stream_spin_us`, `echo_spin_us`.
    windows: Windows,
}

impl Node {
    pub(crate) fn new(
        addr: &str,
        io_timeout: Duration,
        connect_timeout: Duration,
        cma_local: Option<Arc<Local>>,
        tls: Option<Arc<crate::conn::Tls>>,
        tcp_congestion: Option<String>,
        windows: Windows,
    ) -> Self {
        Self {
            addr: addr.to_owned(),
            conns: std::array::from_fn(|_| Mutex::new(None)),
            range_refused: AtomicBool::new(false),
            down_at: SyncMutex::new(None),
            io_timeout,
            connect_timeout,
            cma_local,
            cma: SyncMutex::new(None),
            cma_put_refused: AtomicBool::new(false),
            cma_logged: AtomicBool::new(false),
            tcp_congestion,
            tls,
            windows,
        }
    }

    /// CMA with this node, if set up on its current connection (requests
    /// sent now may go out on a new one: the node answers `-NOCMA` if that
    /// one could not set it up, and callers fall back).
    pub(crate) fn cma_link(&self) -> Option<Link> {
        *self.cma.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether PUT payloads may be named by `cma` descriptors.
    pub(crate) fn cma_put(&self) -> bool {
        self.cma_link().is_some() && !self.cma_put_refused.load(Relaxed)
    }

    /// The node answered `-NOCMA` to a PUT: its reads of this process fail.
    pub(crate) fn refuse_cma_put(&self, why: &str) {
        if !self.cma_put_refused.swap(true, Relaxed) {
            tracing::info!(node = %self.addr, reason = why, "node cannot read this process; PUTs to it use the network data plane");
        }
    }

    /// Whether single GETs may be split into ranges.
    pub(crate) fn ranges(&self) -> bool {
        !self.range_refused.load(Relaxed)
    }

    /// The node answered a ranged GET with a syntax error.
    pub(crate) fn refuse_ranges(&self) {
        if !self.range_refused.swap(true, Relaxed) {
            tracing::info!(node = %self.addr, "node does not know GET ... RANGE (an older version?); its GETs go whole");
        }
    }

    /// Failed within the last `DOWN_HOLD`.
    pub(crate) fn down_recently(&self) -> bool {
        self.down_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < DOWN_HOLD)
    }

    /// Failed and has not answered since.
    pub(crate) fn is_down(&self) -> bool {
        self.down_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub(crate) fn mark_down(&self) {
        *self.down_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    fn mark_up(&self) {
        *self.down_at.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `commands` in one write, one reply each (error replies as `Err`).
    /// A pooled connection the node closed meanwhile is replaced once for
    /// idempotent commands; any other socket failure marks the node down.
    pub(crate) async fn exchange(
        &self,
        commands: &[&[&[u8]]],
        idem: Idempotent,
    ) -> Result<Vec<Result<BytesFrame>>> {
        let replies = self.exchange_placed(commands, &[], idem).await?;
        Ok(replies.into_iter().map(|r| r.map(Reply::frame)).collect())
    }

    /// [`Node::exchange`], where the bulk reply to command `k` is written
    /// into `sinks[k]` when there is one and it fits (`Reply::Placed`).
    pub(crate) async fn exchange_placed(
        &self,
        commands: &[&[&[u8]]],
        sinks: &[Option<Sink>],
        idem: Idempotent,
    ) -> Result<Vec<Result<Reply>>> {
        self.exchange_lane(0, commands, sinks, idem).await
    }

    /// [`Node::exchange_placed`] on connection `lane` (< [`LANES`]).
    async fn exchange_lane(
        &self,
        lane: usize,
        commands: &[&[&[u8]]],
        sinks: &[Option<Sink>],
        idem: Idempotent,
    ) -> Result<Vec<Result<Reply>>> {
        let mut slot = self.conns[lane].lock().await;
        let pooled = slot.as_ref().is_some_and(|c| !c.is_poisoned());
        let mut outcome = self.exchange_on(lane, &mut slot, commands, sinks).await;
        if pooled && idem == Idempotent::Yes && matches!(outcome, Err(Error::Io(_))) {
            outcome = self.exchange_on(lane, &mut slot, commands, sinks).await;
        }
        match &outcome {
            Err(e) if e.is_node_failure() => self.mark_down(),
            Err(_) => {}
            Ok(_) => self.mark_up(),
        }
        outcome
    }

    async fn exchange_on(
        &self,
        lane: usize,
        slot: &mut Option<Conn>,
        commands: &[&[&[u8]]],
        sinks: &[Option<Sink>],
    ) -> Result<Vec<Result<Reply>>> {
        let conn = match slot.take() {
            Some(conn) if !conn.is_poisoned() => slot.insert(conn),
            _ => {
                let connect = Conn::connect(
                    &self.addr,
                    self.io_timeout,
                    self.tcp_congestion.as_deref(),
                    self.tls.as_deref(),
                );
                let conn = tokio::time::timeout(self.connect_timeout, connect)
                    .await
                    .map_err(|_| {
                        Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("connect to {} timed out", self.addr),
                        ))
                    })??;
                let conn = slot.insert(conn);
                if let Some(local) = self.cma_local.as_ref().filter(|_| lane == 0) {
                    let link = cma::handshake(conn, local, &self.addr, &self.cma_logged).await;
                    let link = match link {
                        Ok(link) => link,
                        Err(e) => {
                            *slot = None;
                            return Err(e);
                        }
                    };
                    *self.cma.lock().unwrap_or_else(|e| e.into_inner()) = link;
                }
                slot.as_mut().expect("just inserted")
            }
        };
        // A caller that drops this call mid-exchange may write the memory a
        // PUT named at once, while the node is still pulling it: closing
        // the connection then tells the node to store nothing (it asks
        // before publishing a pulled value). Declared after `conn`'s lock,
        // so it runs while the connection is still in its slot.
        conn.begin_exchange();
        let cut = CloseIfDropped::new(conn);
        let w = self.windows;
        let in_flight = InFlight::enter();
        let outcome = async {
            // The write and the wait for the replies are spun apart: how
            // long the write took, and how much the replies may bring,
            // say how long to poll for them.
            let began = Instant::now();
            spun(std::pin::pin!(conn.send(commands)), w.spin, w.stream).await?;
            let expected: usize = sinks.iter().flatten().map(Sink::cap).sum();
            let wait = w.reply_wait(began.elapsed(), expected, in_flight.few());
            let replies = async {
                let mut replies = Vec::with_capacity(commands.len());
                for k in 0..commands.len() {
                    let sink = sinks.get(k).copied().flatten();
                    match conn.recv_into(sink).await {
                        Err(e) if e.breaks_connection() => return Err(e),
                        reply => replies.push(reply),
                    }
                }
                Ok(replies)
            };
            spun(std::pin::pin!(replies), wait, w.stream).await
        }
        .await;
        cut.disarm();
        conn.end_exchange();
        if outcome.is_err() {
            // Reset, not a close after what is queued: a request the caller
            // was told failed must not reach the node later, when a
            // partition heals and the kernel's retransmits get through
            // (it would overwrite writes acknowledged since).
            conn.reset_on_close();
            *slot = None;
        }
        outcome
    }

    /// One command, retried on `BUSY` up to `busy_retries` times.
    pub(crate) async fn call(
        &self,
        args: &[&[u8]],
        idem: Idempotent,
        busy_retries: u32,
    ) -> Result<BytesFrame> {
        self.call_placed(args, None, idem, busy_retries)
            .await
            .map(Reply::frame)
    }

    /// [`Node::call`], with a sink for a bulk reply (see
    /// [`Node::exchange_placed`]).
    pub(crate) async fn call_placed(
        &self,
        args: &[&[u8]],
        sink: Option<Sink>,
        idem: Idempotent,
        busy_retries: u32,
    ) -> Result<Reply> {
        self.call_lane(0, args, sink, idem, busy_retries).await
    }

    /// [`Node::call_placed`] on connection `lane` (< [`LANES`]).
    pub(crate) async fn call_lane(
        &self,
        lane: usize,
        args: &[&[u8]],
        sink: Option<Sink>,
        idem: Idempotent,
        busy_retries: u32,
    ) -> Result<Reply> {
        let mut attempt = 0;
        loop {
            let reply = self
                .exchange_lane(lane, &[args], &[sink], idem)
                .await?
                .pop();
            match reply.ok_or_else(|| Error::Protocol("no reply".into()))? {
                Err(Error::Busy(_)) if attempt < busy_retries => {
                    attempt += 1;
                    backoff(attempt).await;
                }
                other => return other,
            }
        }
    }

    /// Hands leases back and returns how many were still live (the values
    /// stayed pinned until now).
    pub(crate) async fn release_confirmed(&self, ids: &[i64]) -> Result<i64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        let mut args: Vec<&[u8]> = vec![b"RELEASE"];
        args.extend(ids.iter().map(String::as_bytes));
        match self.call(&args, Idempotent::Yes, 0).await? {
            BytesFrame::Integer(n) => Ok(n),
            other => Err(Error::Protocol(format!("RELEASE replied {other:?}"))),
        }
    }

    /// Hands leases back without waiting for the reply: a failure costs
    /// nothing, the leases also end with their connection or their TTL.
    pub(crate) async fn release(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        let mut args: Vec<&[u8]> = vec![b"RELEASE"];
        args.extend(ids.iter().map(String::as_bytes));
        let mut slot = self.conns[0].lock().await;
        if let Some(conn) = slot.as_mut().filter(|c| !c.is_poisoned()) {
            if let Err(e) = conn.send_detached(&[&args]).await {
                tracing::debug!(node = %self.addr, error = %e, "RELEASE not sent; leases end with the connection");
                *slot = None;
            }
        }
    }
}

/// First retry waits this long; each further one doubles it.
const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Longest wait between two tries.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

pub(crate) async fn backoff(attempt: u32) {
    let wait = BACKOFF_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(BACKOFF_MAX);
    tokio::time::sleep(wait).await;
}

/// Shuts a connection's socket down if dropped armed: the call using it
/// was abandoned mid-exchange (see `Node::exchange_on`).
struct CloseIfDropped(Option<std::os::fd::RawFd>);

impl CloseIfDropped {
    fn new(conn: &Conn) -> Self {
        Self(Some(conn.raw_fd()))
    }

    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CloseIfDropped {
    fn drop(&mut self) {
        use std::os::fd::FromRawFd;
        if let Some(fd) = self.0 {
            // SAFETY: the connection that owns `fd` is still in its slot
            // (this guard drops before the slot's lock is let go) and stays
            // its owner: `ManuallyDrop` keeps this handle from closing it.
            let s = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
            // The stream is poisoned or owes a reply either way; the next
            // call on this slot connects afresh.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
