//! The client: command connection, data-plane transport, and the
//! operations built on them.

use std::net::SocketAddr;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::tcp::{TcpStats, TcpTransport};
use strata_rdma::{Descriptor, Region, Transport};
use tokio::sync::Mutex;

use crate::conn::{expect_bulk_or_nil, expect_int, expect_ok, unexpected, Conn};
use crate::{Buffer, Error, Result};

/// Most pairs in one MPUT and most GETs in one pipelined batch: the node's
/// MPUT limit, and a bound on leases one batch holds at once.
pub const BATCH_MAX: usize = 1024;

/// First retry waits this long; each further one doubles it.
const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Longest wait between two tries.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// How to reach a node and how hard to try.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// RESP address of the node, `host:port`.
    pub addr: String,
    /// Where this client's data-plane listener binds; nodes connect to it to
    /// pull PUT payloads, so it must be reachable from them.
    pub data_bind: SocketAddr,
    /// Extra tries after the first for idempotent failures (connection lost
    /// before a reply, `BUSY`, a stale read in `get_into`).
    pub retry_attempts: u32,
    /// Deadline for connecting, writing one request, and reading one reply.
    pub timeout: Duration,
}

impl ClientConfig {
    pub fn new(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            data_bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            retry_attempts: 3,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Whether a command may be sent again after its connection broke without
/// a reply: a second PUT of the same bytes is harmless, a second NX PUT
/// would report "exists" for the client's own first write.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idempotent {
    Yes,
    No,
}

/// A connection to one strata node. Cheap to share (`Arc<Client>`):
/// commands from concurrent tasks are serialized on the one command
/// connection, data-plane reads run in parallel.
pub struct Client {
    cfg: ClientConfig,
    transport: Arc<TcpTransport>,
    /// `None` until first use and after a connection broke.
    conn: Mutex<Option<Conn>>,
}

impl Client {
    pub async fn connect(addr: impl Into<String>) -> Result<Self> {
        Self::connect_with(ClientConfig::new(addr)).await
    }

    /// Binds the data plane and opens the command connection (so a wrong
    /// address fails here, not on first use).
    pub async fn connect_with(cfg: ClientConfig) -> Result<Self> {
        let transport = TcpTransport::bind(cfg.data_bind).await?;
        let conn = Conn::connect(&cfg.addr, cfg.timeout).await?;
        Ok(Self {
            cfg,
            transport,
            conn: Mutex::new(Some(conn)),
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// `host:port` of this client's data-plane listener.
    pub fn data_endpoint(&self) -> &str {
        self.transport.endpoint()
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

    /// Stores `buf[range]` under `key`; the node pulls the bytes.
    pub async fn put_from(&self, key: &[u8], buf: &Buffer, range: Range<usize>) -> Result<()> {
        let desc = self.describe(buf.region(), range)?;
        match self.put_desc(key, &desc, false).await? {
            true => Ok(()),
            false => Err(Error::Protocol("nil reply to PUT without NX".into())),
        }
    }

    /// Like [`Client::put_from`] but only if `key` is absent; `false` if it
    /// existed (nothing is transferred then).
    pub async fn put_from_nx(&self, key: &[u8], buf: &Buffer, range: Range<usize>) -> Result<bool> {
        let desc = self.describe(buf.region(), range)?;
        self.put_desc(key, &desc, true).await
    }

    /// `PUT key desc [NX]` with a descriptor the caller built: the low-level
    /// form of the puts, for memory registered elsewhere.
    pub async fn put_desc(&self, key: &[u8], desc: &Descriptor, nx: bool) -> Result<bool> {
        let desc = desc.to_string();
        let (args, idem): (&[&[u8]], _) = if nx {
            (&[b"PUT", key, desc.as_bytes(), b"NX"], Idempotent::No)
        } else {
            (&[b"PUT", key, desc.as_bytes()], Idempotent::Yes)
        };
        expect_ok(self.call(args, idem).await?)
    }

    /// Reads the value of `key` into `buf` at `offset`; returns its length.
    /// `NotFound` if absent, `TooLarge` if it does not fit from `offset` on.
    pub async fn get_into(&self, key: &[u8], buf: &mut Buffer, offset: usize) -> Result<usize> {
        let region = buf.region();
        let capacity = region_tail(region, offset)?;
        let mut attempt = 0;
        loop {
            let dst = self.describe(region, offset..offset + capacity)?;
            let dst = dst.to_string();
            let reply = self
                .call(&[b"GET", key, dst.as_bytes()], Idempotent::Yes)
                .await?;
            let lease = Lease::parse(reply)?;
            let read = self.pull(&lease, region, offset, capacity).await;
            self.release(&[lease.id]).await;
            match read {
                Err(Error::Stale(_)) if attempt < self.cfg.retry_attempts => {
                    attempt += 1;
                    backoff(attempt).await;
                }
                other => return other,
            }
        }
    }

    /// Puts every `(key, buffer, range)` with MPUT, up to [`BATCH_MAX`] pairs
    /// per round trip; one result per item, in order.
    pub async fn put_many<K: AsRef<[u8]>>(
        &self,
        items: &[(K, &Buffer, Range<usize>)],
    ) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks(BATCH_MAX) {
            results.extend(self.put_chunk(chunk).await);
        }
        // A pair refused as busy was not applied: try it alone, with retries.
        for (i, (key, buf, range)) in items.iter().enumerate() {
            if matches!(results[i], Err(Error::Busy(_))) {
                results[i] = self.put_from(key.as_ref(), buf, range.clone()).await;
            }
        }
        results
    }

    async fn put_chunk<K: AsRef<[u8]>>(
        &self,
        chunk: &[(K, &Buffer, Range<usize>)],
    ) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(chunk.len());
        let mut descs = Vec::with_capacity(chunk.len());
        for (_, buf, range) in chunk {
            match self.describe(buf.region(), range.clone()) {
                Ok(d) => {
                    descs.push(Some(d.to_string()));
                    results.push(Ok(()));
                }
                Err(e) => {
                    descs.push(None);
                    results.push(Err(e));
                }
            }
        }
        let mut args: Vec<&[u8]> = vec![b"MPUT"];
        let mut sent = Vec::new();
        for (i, ((key, _, _), desc)) in chunk.iter().zip(&descs).enumerate() {
            if let Some(desc) = desc {
                args.push(key.as_ref());
                args.push(desc.as_bytes());
                sent.push(i);
            }
        }
        if sent.is_empty() {
            return results;
        }
        let replies = match self.call(&args, Idempotent::Yes).await {
            Ok(BytesFrame::Array(replies)) if replies.len() == sent.len() => replies,
            Ok(other) => {
                let e = unexpected("one reply per MPUT pair", &other);
                return fail_all(results, &sent, &e);
            }
            Err(e) => return fail_all(results, &sent, &e),
        };
        for (i, reply) in sent.into_iter().zip(replies) {
            results[i] = match reply {
                BytesFrame::Error(text) => Err(Error::from_reply(&text)),
                other => expect_ok(other).and_then(|ok| match ok {
                    true => Ok(()),
                    false => Err(Error::Protocol("nil reply to an MPUT pair".into())),
                }),
            };
        }
        results
    }

    /// Reads every `(key, buffer, offset)`: the GETs of up to [`BATCH_MAX`]
    /// items go out in one write, their sources are read concurrently, and
    /// their leases are released by one RELEASE. One result per item.
    pub async fn get_many<K: AsRef<[u8]>>(
        &self,
        items: &mut [(K, &mut Buffer, usize)],
    ) -> Vec<Result<usize>> {
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks_mut(BATCH_MAX) {
            results.extend(self.get_chunk(chunk).await);
        }
        // Busy (lease limit) and stale reads were not served: retry alone.
        for (i, (key, buf, offset)) in items.iter_mut().enumerate() {
            if matches!(results[i], Err(Error::Busy(_) | Error::Stale(_))) {
                results[i] = self.get_into(key.as_ref(), buf, *offset).await;
            }
        }
        results
    }

    async fn get_chunk<K: AsRef<[u8]>>(
        &self,
        chunk: &[(K, &mut Buffer, usize)],
    ) -> Vec<Result<usize>> {
        let mut results: Vec<Result<usize>> = Vec::with_capacity(chunk.len());
        let mut dsts = Vec::with_capacity(chunk.len());
        for (_, buf, offset) in chunk {
            let dst = region_tail(buf.region(), *offset)
                .and_then(|cap| Ok((cap, self.describe(buf.region(), *offset..*offset + cap)?)));
            match dst {
                Ok((cap, d)) => {
                    dsts.push(Some((cap, d.to_string())));
                    results.push(Ok(0));
                }
                Err(e) => {
                    dsts.push(None);
                    results.push(Err(e));
                }
            }
        }
        let mut commands: Vec<[&[u8]; 3]> = Vec::with_capacity(chunk.len());
        let mut sent = Vec::new();
        for (i, ((key, _, _), dst)) in chunk.iter().zip(&dsts).enumerate() {
            if let Some((_, d)) = dst {
                commands.push([b"GET", key.as_ref(), d.as_bytes()]);
                sent.push(i);
            }
        }
        let commands: Vec<&[&[u8]]> = commands.iter().map(|c| &c[..]).collect();
        let replies = match self.exchange(&commands, Idempotent::Yes).await {
            Ok(replies) => replies,
            Err(e) => return fail_all(results, &sent, &e),
        };
        let mut leases = Vec::with_capacity(sent.len());
        for (&i, reply) in sent.iter().zip(replies) {
            match reply.and_then(Lease::parse) {
                Ok(lease) => leases.push((i, lease)),
                Err(e) => results[i] = Err(e),
            }
        }
        let reads = leases.iter().map(|(i, lease)| {
            let (_, buf, offset) = &chunk[*i];
            let capacity = dsts[*i].as_ref().map_or(0, |(cap, _)| *cap);
            self.pull(lease, buf.region(), *offset, capacity)
        });
        let outcomes = futures::future::join_all(reads).await;
        let ids: Vec<i64> = leases.iter().map(|(_, l)| l.id).collect();
        self.release(&ids).await;
        for ((i, _), outcome) in leases.iter().zip(outcomes) {
            results[*i] = outcome;
        }
        results
    }

    /// `PREFIX k1 ... kn`: how many keys, from the first, are all present.
    pub async fn prefix<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let n = keys.len();
        if n == 0 {
            return Ok(0);
        }
        // `... PIN <integer>` at the end would be read as the PIN option:
        // ask about all but the last key, then about the last one alone.
        let ambiguous = n >= 2
            && keys[n - 2].as_ref().eq_ignore_ascii_case(b"PIN")
            && std::str::from_utf8(keys[n - 1].as_ref()).is_ok_and(|s| s.parse::<i64>().is_ok());
        let asked = if ambiguous { n - 1 } else { n };
        let mut args: Vec<&[u8]> = vec![b"PREFIX"];
        args.extend(keys[..asked].iter().map(AsRef::as_ref));
        let present = count(expect_int(self.call(&args, Idempotent::Yes).await?)?)?;
        if ambiguous && present == asked && self.exists(keys[n - 1].as_ref()).await? {
            return Ok(n);
        }
        Ok(present)
    }

    /// Inline `SET key value`: the value crosses the command connection.
    pub async fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        match expect_ok(self.call(&[b"SET", key, value], Idempotent::Yes).await?)? {
            true => Ok(()),
            false => Err(Error::Protocol("nil reply to SET without NX".into())),
        }
    }

    /// Inline `GET key`.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        expect_bulk_or_nil(self.call(&[b"GET", key], Idempotent::Yes).await?)
    }

    /// `DEL key`: whether it existed. Not retried after a lost connection
    /// (a retry would report `false` for the client's own delete).
    pub async fn del(&self, key: &[u8]) -> Result<bool> {
        Ok(expect_int(self.call(&[b"DEL", key], Idempotent::No).await?)? > 0)
    }

    pub async fn exists(&self, key: &[u8]) -> Result<bool> {
        Ok(expect_int(self.call(&[b"EXISTS", key], Idempotent::Yes).await?)? > 0)
    }

    /// `INFO section` as text.
    pub async fn info(&self, section: &str) -> Result<String> {
        let reply = self
            .call(&[b"INFO", section.as_bytes()], Idempotent::Yes)
            .await?;
        let text = expect_bulk_or_nil(reply)?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    fn describe(&self, region: &Region, range: Range<usize>) -> Result<Descriptor> {
        if range.start > range.end {
            return Err(Error::Invalid("range start after its end"));
        }
        let len = (range.end - range.start) as u64;
        self.transport
            .describe(region, range.start as u64, len, None)
            .map_err(|_| Error::Invalid("range outside the buffer"))
    }

    /// Reads a leased source into `region` at `offset`.
    async fn pull(
        &self,
        lease: &Lease,
        region: &Region,
        offset: usize,
        capacity: usize,
    ) -> Result<usize> {
        let len = lease.len;
        if len > capacity as u64 {
            return Err(Error::TooLarge(format!(
                "value of {len} bytes does not fit the destination of {capacity} bytes"
            )));
        }
        if len > 0 {
            self.transport
                .read(&lease.src, region, offset as u64)
                .await?;
        }
        Ok(len as usize)
    }

    /// Hands leases back without waiting for the reply: a failure costs
    /// nothing, the leases also end with their connection or their TTL.
    async fn release(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        let mut args: Vec<&[u8]> = vec![b"RELEASE"];
        args.extend(ids.iter().map(String::as_bytes));
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_mut().filter(|c| !c.is_poisoned()) {
            if let Err(e) = conn.send_detached(&[&args]).await {
                tracing::debug!(error = %e, "RELEASE not sent; leases end with the connection");
                *slot = None;
            }
        }
    }

    /// One command, retried on `BUSY` and (if idempotent) on a lost
    /// connection.
    async fn call(&self, args: &[&[u8]], idem: Idempotent) -> Result<BytesFrame> {
        let mut attempt = 0;
        loop {
            let reply = self.exchange(&[args], idem).await?.pop();
            let reply = reply.ok_or_else(|| Error::Protocol("no reply".into()))?;
            match reply {
                Err(Error::Busy(_)) if attempt < self.cfg.retry_attempts => {
                    attempt += 1;
                    backoff(attempt).await;
                }
                other => return other,
            }
        }
    }

    /// Sends `commands` in one write and reads one reply each; retried as a
    /// whole if the connection is lost and the commands are idempotent.
    async fn exchange(
        &self,
        commands: &[&[&[u8]]],
        idem: Idempotent,
    ) -> Result<Vec<Result<BytesFrame>>> {
        let mut attempt = 0;
        loop {
            match self.exchange_once(commands).await {
                Err(Error::Io(e))
                    if idem == Idempotent::Yes && attempt < self.cfg.retry_attempts =>
                {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "command connection lost; reconnecting");
                    backoff(attempt).await;
                }
                other => return other,
            }
        }
    }

    async fn exchange_once(&self, commands: &[&[&[u8]]]) -> Result<Vec<Result<BytesFrame>>> {
        let mut slot = self.conn.lock().await;
        let conn = match slot.take() {
            Some(conn) if !conn.is_poisoned() => slot.insert(conn),
            _ => slot.insert(Conn::connect(&self.cfg.addr, self.cfg.timeout).await?),
        };
        let outcome = async {
            conn.send(commands).await?;
            let mut replies = Vec::with_capacity(commands.len());
            for _ in commands {
                match conn.recv().await {
                    Err(e) if e.breaks_connection() => return Err(e),
                    reply => replies.push(reply),
                }
            }
            Ok(replies)
        }
        .await;
        if outcome.is_err() {
            *slot = None;
        }
        outcome
    }
}

/// A GET's answer: where the value is, the lease pinning it, its length.
struct Lease {
    src: Descriptor,
    id: i64,
    len: u64,
}

impl Lease {
    fn parse(reply: BytesFrame) -> Result<Self> {
        let BytesFrame::Array(parts) = reply else {
            return Err(unexpected("[source, lease, len]", &reply));
        };
        let [src, id, len] = <[BytesFrame; 3]>::try_from(parts)
            .map_err(|parts| unexpected("[source, lease, len]", &BytesFrame::Array(parts)))?;
        let src = match src {
            BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Descriptor::parse(&b)
                .map_err(|e| Error::Protocol(format!("source descriptor: {e}")))?,
            other => return Err(unexpected("a source descriptor", &other)),
        };
        let id = expect_int(id)?;
        let len = expect_int(len)?;
        let len =
            u64::try_from(len).map_err(|_| Error::Protocol("negative value length".into()))?;
        if src.len != len {
            return Err(Error::Protocol(format!(
                "source descriptor of {} bytes for a value of {len}",
                src.len
            )));
        }
        Ok(Self { src, id, len })
    }
}

/// Bytes of `region` from `offset` to its end.
fn region_tail(region: &Region, offset: usize) -> Result<usize> {
    (region.len() as usize)
        .checked_sub(offset)
        .ok_or(Error::Invalid("offset past the end of the buffer"))
}

fn count(n: i64) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::Protocol(format!("negative count {n}")))
}

/// Copies a batch-wide failure onto every item that was sent.
fn fail_all<T>(mut results: Vec<Result<T>>, sent: &[usize], e: &Error) -> Vec<Result<T>> {
    for &i in sent {
        results[i] = Err(clone_error(e));
    }
    results
}

/// `Error` holds an `io::Error`, which is not `Clone`; keep kind and text.
fn clone_error(e: &Error) -> Error {
    match e {
        Error::NotFound => Error::NotFound,
        Error::TooLarge(m) => Error::TooLarge(m.clone()),
        Error::Stale(m) => Error::Stale(m.clone()),
        Error::BadDescriptor(m) => Error::BadDescriptor(m.clone()),
        Error::NoSpace(m) => Error::NoSpace(m.clone()),
        Error::Busy(m) => Error::Busy(m.clone()),
        Error::Io(io) => Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        Error::Protocol(m) => Error::Protocol(m.clone()),
        Error::Server { code, msg } => Error::Server {
            code: code.clone(),
            msg: msg.clone(),
        },
        Error::Invalid(m) => Error::Invalid(m),
    }
}

async fn backoff(attempt: u32) {
    let wait = BACKOFF_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(BACKOFF_MAX);
    tokio::time::sleep(wait).await;
}
