//! One RESP2 command connection: requests out as arrays of bulk strings,
//! replies in through `redis-protocol`'s decoder.
//!
//! The connection counts replies it owes: a caller whose future was
//! dropped after sending leaves its replies behind, and the next caller
//! skips them before reading its own. A write cut half-way leaves the
//! stream unusable, which `poisoned` records.
//!
//! A bulk reply may be *placed*: read from the socket straight into memory
//! the caller lent to the request (a zero-copy GET's destination, when the
//! value comes back inline), not through the read buffer.

use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::tls::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Error, Result};

/// Arguments at least this long are written straight from the caller's
/// memory instead of being copied into the request buffer.
const DIRECT_ARG_BYTES: usize = 64 * 1024;
/// Read granularity for replies; large bulk replies reserve their full size.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// A read buffer grown by a huge reply is dropped when idle and above this.
const READ_BUF_KEEP_BYTES: usize = 1 << 20;
/// While a placed reply is awaited, reads into the read buffer take at
/// most this much, so that most of a large value lands in its destination
/// directly; and a placed payload is read together with up to this many
/// following bytes (the next reply's header) in one `readv`. A 64 KiB
/// value and its header fit: one read and a copy beat a 16 KiB head read
/// and a `readv` for the rest at 16-64 KiB, at a small cost to larger
/// values (docs/bench-notes/inline-or-data-plane.md).
const PLACED_HEAD_BYTES: usize = 64 * 1024 + 64;

/// Memory a bulk reply may be written into straight from the socket: the
/// destination a caller lent to one request, outside every buffer of the
/// connection.
#[derive(Clone, Copy)]
pub(crate) struct Sink {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: a `Sink` is an address and a length; `Sink::new`'s contract makes
// the memory the request's alone, whichever thread writes it.
unsafe impl Send for Sink {}
// SAFETY: as for `Send`: sharing the address gives no access by itself.
unsafe impl Sync for Sink {}

impl Sink {
    /// # Safety
    /// `[ptr, ptr + cap)` must be valid for writes, and nothing else may
    /// read or write it, until the exchange given this sink returns or is
    /// dropped.
    pub(crate) unsafe fn new(ptr: *mut u8, cap: usize) -> Self {
        Self { ptr, cap }
    }

    /// Bytes the reply may write here.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }
}

/// A reply, or the length of a bulk reply written into the request's sink.
#[derive(Debug)]
pub(crate) enum Reply {
    Frame(BytesFrame),
    Placed(usize),
    /// A range of a value (`[version, value length, bulk]`, the reply to
    /// `GET key desc INLINE n RANGE off len`) whose bytes, `len` of them,
    /// were written into the sink.
    PlacedRange {
        version: u64,
        total: u64,
        len: usize,
    },
}

impl Reply {
    /// The frame of an exchange that had no sink, so placed nothing.
    pub(crate) fn frame(self) -> BytesFrame {
        match self {
            Reply::Frame(frame) => frame,
            Reply::Placed(_) | Reply::PlacedRange { .. } => {
                unreachable!("no sink, nothing placed")
            }
        }
    }
}

/// How the read buffer starts, for a placed reply.
enum Head {
    /// A bulk string of `len` bytes whose payload starts at `at`.
    Bulk { len: usize, at: usize },
    /// A range reply whose bulk of `len` bytes starts at `at`.
    Range {
        version: u64,
        total: u64,
        len: usize,
        at: usize,
    },
    /// Not enough bytes yet to tell.
    Incomplete,
    /// Anything else (an array, an error, nil, a malformed header): decoded
    /// as usual.
    Other,
}

/// `ClientConfig::tls`, loaded once per client.
#[derive(Debug)]
pub(crate) struct Tls {
    config: Arc<strata_rdma::tls::ClientConfig>,
    server_name: Option<String>,
}

fn pem<'a>(what: &'static str, path: &'a std::path::Path) -> strata_rdma::tls::PemFile<'a> {
    strata_rdma::tls::PemFile { what, path }
}

impl Tls {
    pub(crate) fn load(opts: &crate::TlsOptions) -> Result<Self> {
        use strata_rdma::tls::ClientFiles;
        let identity = match (&opts.cert_file, &opts.key_file) {
            (Some(c), Some(k)) => Some((pem("tls cert_file", c), pem("tls key_file", k))),
            (None, None) => None,
            _ => return Err(Error::Invalid("tls: cert_file and key_file go together")),
        };
        let files = ClientFiles {
            ca: pem("tls ca_file", &opts.ca_file),
            identity,
        };
        let config = strata_rdma::tls::client_config(files)
            .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
        Ok(Self {
            config,
            server_name: opts.server_name.clone(),
        })
    }

    async fn handshake(&self, addr: &str, sock: TcpStream, timeout: Duration) -> Result<Stream> {
        let name = strata_rdma::tls::server_name(self.server_name.as_deref().unwrap_or(addr))?;
        Ok(strata_rdma::tls::connect(&self.config, name, sock, timeout).await?)
    }
}

/// TLS of this client's data plane (`ClientConfig::tls`): nodes' `tls`
/// descriptors are read with the CA and the client's certificate, and the
/// listener the nodes pull PUT payloads from speaks TLS with that
/// certificate, asking them for theirs. Without a certificate it serves
/// nothing and every PUT goes inline (`Client::inline_put`).
pub(crate) fn data_plane_tls(opts: &crate::TlsOptions) -> Result<strata_rdma::tcp::TcpTls> {
    use strata_rdma::tcp::{TcpTls, TlsListen};
    use strata_rdma::tls::{ClientAuth, ServerFiles};
    let invalid = |e: strata_rdma::tls::TlsError| Error::Io(std::io::Error::other(e.to_string()));
    let listen = match (&opts.cert_file, &opts.key_file) {
        (Some(c), Some(k)) => TlsListen::Tls(
            strata_rdma::tls::server_config(ServerFiles {
                cert: pem("tls cert_file", c),
                key: pem("tls key_file", k),
                ca: Some(pem("tls ca_file", &opts.ca_file)),
                auth: ClientAuth::Required,
            })
            .map_err(invalid)?,
        ),
        _ => TlsListen::Closed,
    };
    let server_name = match &opts.server_name {
        Some(n) => Some(strata_rdma::tls::server_name(n)?),
        None => None,
    };
    Ok(TcpTls {
        listen,
        dial: Some(Tls::load(opts)?.config),
        server_name,
    })
}

pub(crate) struct Conn {
    /// Plain TCP, or TLS (`ClientConfig::tls`).
    stream: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Bytes read past a placed payload, before they join `rbuf`.
    spill: Box<[u8]>,
    /// Replies sent for but not yet read.
    owed: usize,
    /// A write was interrupted: the stream holds a partial request.
    poisoned: bool,
    /// An exchange began and has not ended: if it stays set, its caller
    /// gave up mid-way and the socket was shut down (`Node::exchange_on`).
    exchanging: bool,
    timeout: Duration,
}

impl Conn {
    /// Connects to `addr`, with congestion control `congestion` when named
    /// (a SET's payload is this connection's bulk send).
    pub(crate) async fn connect(
        addr: &str,
        timeout: Duration,
        congestion: Option<&str>,
        tls: Option<&Tls>,
    ) -> Result<Self> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        stream.set_nodelay(true)?;
        if let Some(name) = congestion {
            strata_rdma::sockopt::set_congestion(&stream, name)?;
        }
        let stream = match tls {
            Some(tls) => tls.handshake(addr, stream, timeout).await?,
            None => Stream::Plain(stream),
        };
        Ok(Self {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            wbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            spill: vec![0; PLACED_HEAD_BYTES].into_boxed_slice(),
            owed: 0,
            poisoned: false,
            exchanging: false,
            timeout,
        })
    }

    /// The socket, for a shutdown by a caller that gave up on it.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.stream)
    }

    /// See [`strata_rdma::sockopt::reset_on_close`].
    pub(crate) fn reset_on_close(&self) {
        strata_rdma::sockopt::reset_on_close(&self.stream);
    }

    /// Whether a dropped caller left the stream mid-request, or gave up on
    /// an exchange (whose socket is then shut down).
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned || self.exchanging
    }

    /// Marks an exchange as running, until [`Conn::end_exchange`].
    pub(crate) fn begin_exchange(&mut self) {
        self.exchanging = true;
    }

    pub(crate) fn end_exchange(&mut self) {
        self.exchanging = false;
    }

    /// Sends `commands` in one write and skips replies owed to callers that
    /// went away; afterwards the next `commands.len()` replies are ours.
    pub(crate) async fn send(&mut self, commands: &[&[&[u8]]]) -> Result<()> {
        self.poisoned = true;
        let sent = tokio::time::timeout(self.timeout, self.write(commands)).await;
        sent.map_err(|_| timed_out("request write"))??;
        self.poisoned = false;
        self.owed += commands.len();
        while self.owed > commands.len() {
            match self.recv().await {
                Err(e) if e.breaks_connection() => return Err(e),
                // Someone else's reply: their error is not ours.
                Ok(_) | Err(_) => {}
            }
        }
        Ok(())
    }

    /// Sends commands whose replies nobody will read (they are skipped by
    /// the next `send`). Used for RELEASE, whose reply only says how many
    /// leases were live.
    pub(crate) async fn send_detached(&mut self, commands: &[&[&[u8]]]) -> Result<()> {
        self.poisoned = true;
        let sent = tokio::time::timeout(self.timeout, self.write(commands)).await;
        sent.map_err(|_| timed_out("request write"))??;
        self.poisoned = false;
        self.owed += commands.len();
        Ok(())
    }

    /// Writes `commands` with one `writev` where the kernel takes it all:
    /// framing and short arguments from the request buffer, long ones
    /// straight from the caller's memory. One write per argument instead
    /// put each header in a packet of its own (`TCP_NODELAY`) and cost a
    /// 32-value batch 64 system calls.
    async fn write(&mut self, commands: &[&[&[u8]]]) -> std::io::Result<()> {
        self.wbuf.clear();
        // Where the long arguments go: (end of the framing before it, arg).
        let mut direct: Vec<(usize, &[u8])> = Vec::new();
        for args in commands {
            self.wbuf.put_u8(b'*');
            put_decimal(&mut self.wbuf, args.len());
            for arg in args.iter() {
                self.wbuf.put_u8(b'$');
                put_decimal(&mut self.wbuf, arg.len());
                if arg.len() >= DIRECT_ARG_BYTES {
                    direct.push((self.wbuf.len(), arg));
                } else {
                    self.wbuf.extend_from_slice(arg);
                }
                self.wbuf.extend_from_slice(b"\r\n");
            }
        }
        if direct.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            // TLS holds back what the socket did not take; TCP: no-op.
            return self.stream.flush().await;
        }
        let mut slices = Vec::with_capacity(2 * direct.len() + 1);
        let mut from = 0;
        for (at, arg) in direct {
            slices.push(IoSlice::new(&self.wbuf[from..at]));
            slices.push(IoSlice::new(arg));
            from = at;
        }
        slices.push(IoSlice::new(&self.wbuf[from..]));
        write_all_vectored(&mut self.stream, &mut slices).await?;
        self.stream.flush().await
    }

    /// Reads the next reply; error replies come back as `Err`.
    pub(crate) async fn recv(&mut self) -> Result<BytesFrame> {
        self.recv_into(None).await.map(Reply::frame)
    }

    /// Reads the next reply; a bulk string that fits `sink` is written
    /// there (`Reply::Placed`), anything else comes back as a frame. Error
    /// replies come back as `Err`.
    pub(crate) async fn recv_into(&mut self, sink: Option<Sink>) -> Result<Reply> {
        let limit = self.timeout;
        let read = async {
            match sink {
                Some(sink) => self.read_placed(sink).await,
                None => self.read_frame().await.map(Reply::Frame),
            }
        };
        let reply = tokio::time::timeout(limit, read)
            .await
            .map_err(|_| timed_out("reply"))??;
        self.owed = self.owed.saturating_sub(1);
        if self.rbuf.is_empty() && self.rbuf.capacity() > READ_BUF_KEEP_BYTES {
            self.rbuf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        }
        match reply {
            Reply::Frame(BytesFrame::Error(text)) => Err(Error::from_reply(&text)),
            other => Ok(other),
        }
    }

    async fn read_placed(&mut self, sink: Sink) -> Result<Reply> {
        loop {
            match head(&self.rbuf) {
                Head::Bulk { len, at } if len <= sink.cap => {
                    self.place(sink, len, at).await?;
                    return Ok(Reply::Placed(len));
                }
                Head::Range {
                    version,
                    total,
                    len,
                    at,
                } if len <= sink.cap => {
                    self.place(sink, len, at).await?;
                    return Ok(Reply::PlacedRange {
                        version,
                        total,
                        len,
                    });
                }
                Head::Incomplete => self.read_some(PLACED_HEAD_BYTES).await?,
                Head::Bulk { .. } | Head::Range { .. } | Head::Other => {
                    return self.read_frame().await.map(Reply::Frame)
                }
            }
        }
    }

    /// Writes the payload of the bulk reply at the front of `rbuf` (`len`
    /// bytes from `at`) into `sink`: what is buffered already by a copy,
    /// the rest by reads from the socket into `sink` itself.
    async fn place(&mut self, sink: Sink, len: usize, at: usize) -> Result<()> {
        // SAFETY: `len <= sink.cap`, and by `Sink::new`'s contract the
        // memory is valid for writes and ours until this exchange ends.
        let dst = unsafe { std::slice::from_raw_parts_mut(sink.ptr, len) };
        let buffered = (self.rbuf.len() - at).min(len);
        dst[..buffered].copy_from_slice(&self.rbuf[at..at + buffered]);
        self.rbuf.advance(at + buffered);
        let mut filled = buffered;
        if filled < len {
            // Cut off here, the stream would be left mid-payload.
            self.poisoned = true;
            while filled < len {
                filled += self.read_payload(&mut dst[filled..]).await?;
            }
            self.poisoned = false;
        }
        while self.rbuf.len() < 2 {
            self.read_some(PLACED_HEAD_BYTES).await?;
        }
        if &self.rbuf[..2] != b"\r\n" {
            return Err(Error::Protocol("bulk reply not ended by CRLF".into()));
        }
        self.rbuf.advance(2);
        Ok(())
    }

    /// One `readv` into `dst` and, past it, the spill buffer (whose bytes
    /// join `rbuf`); returns how many bytes went into `dst`.
    async fn read_payload(&mut self, dst: &mut [u8]) -> Result<usize> {
        let stream = match &mut self.stream {
            Stream::Plain(s) => s,
            // Decrypted straight into `dst`; nothing past it is read.
            tls => {
                let n = tls.read(dst).await?;
                if n == 0 {
                    return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
                }
                return Ok(n);
            }
        };
        loop {
            stream.readable().await?;
            let mut bufs = [IoSliceMut::new(dst), IoSliceMut::new(&mut self.spill)];
            match stream.try_read_vectored(&mut bufs) {
                Ok(0) => return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => {
                    let placed = n.min(dst.len());
                    self.rbuf.extend_from_slice(&self.spill[..n - placed]);
                    return Ok(placed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Appends at most `max` bytes from the socket to `rbuf`.
    async fn read_some(&mut self, max: usize) -> Result<()> {
        self.rbuf.reserve(max);
        let mut limited = (&mut self.stream).take(max as u64);
        if limited.read_buf(&mut self.rbuf).await? == 0 {
            return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(())
    }

    async fn read_frame(&mut self) -> Result<BytesFrame> {
        loop {
            match decode_bytes_mut(&mut self.rbuf) {
                Ok(Some((frame, _, _))) => return Ok(frame),
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(format!("bad reply: {e:?}"))),
            }
            self.rbuf.reserve(wanted_bytes(&self.rbuf));
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}

/// How much room to make before the next read: the rest of a bulk string
/// when the buffer starts with its header (so a large GET reply is read
/// with few syscalls and never regrown), else one chunk.
fn wanted_bytes(buf: &[u8]) -> usize {
    let frame_len = buf.strip_prefix(b"$").and_then(|rest| {
        let end = rest.iter().position(|&b| b == b'\r')?;
        let len: usize = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
        // "$" + digits + CRLF + payload + CRLF
        len.checked_add(end + 5)
    });
    match frame_len {
        Some(total) => total.saturating_sub(buf.len()).max(READ_CHUNK_BYTES),
        None => READ_CHUNK_BYTES,
    }
}

/// How a reply that may be placed starts: a bulk string, a range reply
/// (`*3`, two integers, a bulk string), or anything else.
fn head(buf: &[u8]) -> Head {
    match buf.first() {
        None => Head::Incomplete,
        Some(b'$') => bulk_head(buf),
        Some(b'*') => range_head(buf),
        Some(_) => Head::Other,
    }
}

/// `*3\r\n:version\r\n:total\r\n$len\r\n`, each integer not negative; anything else (a lease's array, a malformed
/// reply) is `Other`, for the decoder.
fn range_head(buf: &[u8]) -> Head {
    const START: &[u8] = b"*3\r\n";
    if buf.len() < START.len() {
        return if START.starts_with(buf) {
            Head::Incomplete
        } else {
            Head::Other
        };
    }
    if !buf.starts_with(START) {
        return Head::Other;
    }
    let mut at = START.len();
    let mut ints = [0u64; 2];
    for int in &mut ints {
        match int_line(&buf[at..]) {
            IntLine::Incomplete => return Head::Incomplete,
            IntLine::Other => return Head::Other,
            IntLine::Int(n, used) => {
                *int = n;
                at += used;
            }
        }
    }
    match bulk_head(&buf[at..]) {
        Head::Bulk { len, at: from } => Head::Range {
            version: ints[0],
            total: ints[1],
            len,
            at: at + from,
        },
        other => other,
    }
}

enum IntLine {
    /// The value and the bytes its line took.
    Int(u64, usize),
    Incomplete,
    Other,
}

/// A RESP integer line, `:digits\r\n`, at the start of `buf`, read as a
/// bulk header is (`strata_proto::request::header`); negative is `Other`.
fn int_line(buf: &[u8]) -> IntLine {
    match buf.first() {
        None => return IntLine::Incomplete,
        Some(b':') => {}
        Some(_) => return IntLine::Other,
    }
    match strata_proto::request::header(buf) {
        None => IntLine::Incomplete,
        Some(Ok((n, used))) => u64::try_from(n).map_or(IntLine::Other, |n| IntLine::Int(n, used)),
        Some(Err(())) => IntLine::Other,
    }
}

/// Whether `buf` starts with a bulk string's header, and where its payload
/// starts. Only well-formed headers of non-negative length count: nil and
/// anything odd go to the decoder, which reports them as usual.
fn bulk_head(buf: &[u8]) -> Head {
    match buf.first() {
        None => return Head::Incomplete,
        Some(b'$') => {}
        Some(_) => return Head::Other,
    }
    match strata_proto::request::header(buf) {
        None => Head::Incomplete,
        Some(Ok((len, at))) => match usize::try_from(len) {
            Ok(len) => Head::Bulk { len, at },
            Err(_) => Head::Other,
        },
        Some(Err(())) => Head::Other,
    }
}

/// Most buffers one `writev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// `write_all` over several buffers: `writev` until every byte is out.
async fn write_all_vectored(
    stream: &mut Stream,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = stream
            .write_vectored(&slices[..slices.len().min(IOV_MAX)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

fn put_decimal(buf: &mut BytesMut, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[at..]);
    buf.extend_from_slice(b"\r\n");
}

fn timed_out(what: &str) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

/// Reply accessors: the shapes the client expects, anything else is
/// `Error::Protocol`.
pub(crate) fn expect_ok(frame: BytesFrame) -> Result<bool> {
    match frame {
        BytesFrame::SimpleString(s) if &s[..] == b"OK" => Ok(true),
        BytesFrame::Null => Ok(false),
        other => Err(unexpected("+OK or nil", &other)),
    }
}

pub(crate) fn expect_int(frame: BytesFrame) -> Result<i64> {
    match frame {
        BytesFrame::Integer(n) => Ok(n),
        other => Err(unexpected("an integer", &other)),
    }
}

pub(crate) fn expect_bulk_or_nil(frame: BytesFrame) -> Result<Option<Bytes>> {
    match frame {
        BytesFrame::BulkString(b) => Ok(Some(b)),
        BytesFrame::Null => Ok(None),
        other => Err(unexpected("a bulk string or nil", &other)),
    }
}

pub(crate) fn unexpected(want: &str, got: &BytesFrame) -> Error {
    let shown = format!("{got:?}");
    let shown: String = shown.chars().take(120).collect();
    Error::Protocol(format!("expected {want}, got {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_encoding() {
        let mut b = BytesMut::new();
        for n in [0usize, 7, 10, 1024, usize::MAX] {
            b.clear();
            put_decimal(&mut b, n);
            assert_eq!(&b[..], format!("{n}\r\n").as_bytes());
        }
    }

    #[test]
    fn bulk_heads() {
        let head = |b: &[u8]| match bulk_head(b) {
            Head::Bulk { len, at } => format!("bulk {len} at {at}"),
            Head::Incomplete => "incomplete".into(),
            Head::Other => "other".into(),
            Head::Range { .. } => "range".into(),
        };
        assert_eq!(head(b"$5\r\nhello\r\n"), "bulk 5 at 4");
        assert_eq!(head(b"$1048576\r\n"), "bulk 1048576 at 10");
        assert_eq!(head(b"$0\r\n\r\n"), "bulk 0 at 4");
        for partial in [&b""[..], b"$", b"$12", b"$12\r"] {
            assert_eq!(head(partial), "incomplete", "{partial:?}");
        }
        // Nil, signs, junk, other types and over-long headers are the
        // decoder's to judge.
        for other in [
            &b"$-1\r\n"[..],
            b"$+5\r\nhello\r\n",
            b"$5x\r\n",
            b"$5\rx",
            b"$\r\n",
            b"*3\r\n",
            b"-ERR no\r\n",
            b"$1234567890123456789012345678901234567890",
            b"$99999999999999999999999\r\n",
        ] {
            assert_eq!(head(other), "other", "{other:?}");
        }
    }

    #[test]
    fn range_heads() {
        let head = |b: &[u8]| match head(b) {
            Head::Range {
                version,
                total,
                len,
                at,
            } => format!("range v{version} of {total}: {len} at {at}"),
            Head::Bulk { len, at } => format!("bulk {len} at {at}"),
            Head::Incomplete => "incomplete".into(),
            Head::Other => "other".into(),
        };
        let full = b"*3\r\n:77\r\n:1048576\r\n$524288\r\n";
        assert_eq!(head(full), "range v77 of 1048576: 524288 at 28");
        assert_eq!(
            head(b"*3\r\n:0\r\n:0\r\n$0\r\n\r\n"),
            "range v0 of 0: 0 at 16"
        );
        for cut in 1..full.len() {
            assert_eq!(head(&full[..cut]), "incomplete", "{:?}", &full[..cut]);
        }
        // A lease's array, negative or signed integers, another count,
        // nil or a non-bulk third element: the decoder's to judge.
        for other in [
            &b"*3\r\n$31\r\ntcp:"[..],
            b"*3\r\n:-1\r\n:5\r\n$5\r\n",
            b"*3\r\n:+1\r\n",
            b"*3\r\n:\r\n",
            b"*2\r\n:1\r\n",
            b"*3\r\n:1\r\n:5\r\n$-1\r\n",
            b"*3\r\n:1\r\n:5\r\n:5\r\n",
            b"*3\r\n:1\r\n:5\r\n$5x\r\n",
            b"*3\r\n:123456789012345678901\r\n",
            b"*3\r\n:99999999999999999999\r\n",
            b"*3\r\n:1\rx",
        ] {
            assert_eq!(head(other), "other", "{other:?}");
        }
    }

    /// A scripted peer: writes `chunks` one by one with a pause between
    /// them (so the client sees them as separate reads), then hangs up if
    /// `close`, else waits for the client to.
    async fn scripted(chunks: Vec<Vec<u8>>, close: bool) -> Conn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.expect("accept");
            for chunk in chunks {
                peer.write_all(&chunk).await.expect("write");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !close {
                let mut rest = Vec::new();
                let _ = peer.read_to_end(&mut rest).await;
            }
        });
        Conn::connect(&addr, Duration::from_secs(10), None, None)
            .await
            .expect("connect")
    }

    fn sink_of(buf: &mut [u8]) -> Sink {
        // SAFETY: `buf` outlives every exchange the tests make with it.
        unsafe { Sink::new(buf.as_mut_ptr(), buf.len()) }
    }

    fn placed(r: Result<Reply>) -> usize {
        match r.expect("reply") {
            Reply::Placed(n) => n,
            Reply::Frame(f) => panic!("not placed: {f:?}"),
            other => panic!("not a bulk: {other:?}"),
        }
    }

    /// Bulk replies land in their sinks whatever the read boundaries:
    /// a header cut in two, a payload spread over reads, a CRLF arriving
    /// alone, and the next pipelined reply right behind a payload.
    #[tokio::test]
    async fn bulk_replies_are_placed_across_read_boundaries() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut script = vec![b"$30".to_vec(), b"0000\r\n".to_vec()];
        script.push(big[..1000].to_vec());
        script.push(big[1000..200_000].to_vec());
        script.push(big[200_000..].to_vec());
        script.push(b"\r".to_vec());
        let mut tail = b"\n$3\r\nabc\r\n$5\r\nhello\r\n*1\r\n$1\r\nx\r\n".to_vec();
        tail.extend_from_slice(b"$-1\r\n$4\r\nlast\r\n");
        script.push(tail);
        let mut conn = scripted(script, false).await;
        let mut dst = vec![0u8; 300_001];
        assert_eq!(
            placed(conn.recv_into(Some(sink_of(&mut dst))).await),
            300_000
        );
        assert!(dst[..300_000] == big[..] && dst[300_000] == 0);
        let mut small = [0u8; 8];
        assert_eq!(placed(conn.recv_into(Some(sink_of(&mut small))).await), 3);
        assert_eq!(&small[..3], b"abc");
        // Too large for its sink: an ordinary frame, the sink untouched.
        let mut tiny = [0u8; 4];
        match conn
            .recv_into(Some(sink_of(&mut tiny)))
            .await
            .expect("reply")
        {
            Reply::Frame(BytesFrame::BulkString(b)) => assert_eq!(&b[..], b"hello"),
            _ => panic!("expected the bulk as a frame"),
        }
        assert_eq!(tiny, [0; 4]);
        // Arrays and nil are frames, as without a sink.
        assert!(matches!(
            conn.recv_into(Some(sink_of(&mut small))).await,
            Ok(Reply::Frame(BytesFrame::Array(_)))
        ));
        assert!(matches!(
            conn.recv_into(Some(sink_of(&mut small))).await,
            Ok(Reply::Frame(BytesFrame::Null))
        ));
        let last = conn.recv().await.expect("last");
        assert!(matches!(last, BytesFrame::BulkString(b) if &b[..] == b"last"));
        assert!(!conn.is_poisoned());
    }

    /// An error reply is an error with a sink too; a payload not ended by
    /// CRLF is a protocol error, not bytes taken for the next reply.
    #[tokio::test]
    async fn placed_errors_and_malformed_bulks() {
        let mut conn = scripted(
            vec![b"-NOTFOUND no such key\r\n$3\r\nabcXY".to_vec()],
            false,
        )
        .await;
        let mut dst = [0u8; 8];
        let e = conn.recv_into(Some(sink_of(&mut dst))).await.unwrap_err();
        assert!(matches!(e, Error::NotFound), "{e:?}");
        let e = conn.recv_into(Some(sink_of(&mut dst))).await.unwrap_err();
        assert!(matches!(e, Error::Protocol(_)), "{e:?}");
    }

    /// A peer gone mid-payload: an I/O error, and the connection is marked
    /// unusable (it stopped inside a reply).
    #[tokio::test]
    async fn peer_gone_mid_payload_poisons_the_connection() {
        let script = vec![b"$100000\r\n".to_vec(), vec![7u8; 50_000]];
        let mut conn = scripted(script, true).await;
        let mut dst = vec![0u8; 100_000];
        let e = conn.recv_into(Some(sink_of(&mut dst))).await.unwrap_err();
        assert!(matches!(e, Error::Io(_)), "{e:?}");
        assert!(conn.is_poisoned());
    }

    #[test]
    fn wanted_bytes_follows_bulk_headers() {
        assert_eq!(wanted_bytes(b"$1048576\r\nabc"), 1048576 + 12 - 13);
        assert_eq!(wanted_bytes(b"$5\r\n"), READ_CHUNK_BYTES);
        assert_eq!(wanted_bytes(b"*3\r\n"), READ_CHUNK_BYTES);
        assert_eq!(wanted_bytes(b"$12"), READ_CHUNK_BYTES);
    }
}
