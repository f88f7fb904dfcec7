//! One client connection: read bytes, frame requests, run commands, write
//! replies.
//!
//! Pipelining: every complete request in a read is executed before any
//! reply is written, and their replies go out together in one write (up to
//! [`FLUSH_BYTES`]). Large values are written straight from store memory,
//! pinned for the duration of the write; they are never copied into the
//! reply buffer.
//!
//! A large `SET` value still arriving is read from the socket straight into
//! the arena chunk it will live in (one copy instead of two, and no request
//! buffer the size of the value); see [`Conn::stream_set`].
//!
//! A refused request (`-TOOLARGE`) is discarded as it streams in, without
//! being buffered, and the connection stays usable. Malformed RESP gets
//! Redis' `-ERR Protocol error` and closes this connection only.

use std::collections::HashSet;
use std::io::IoSlice;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use strata_proto::request::{args, pending_bulk, scan, split_inline};
use strata_proto::{CommandError, Discard, DiscardStep, ErrorCode, Reply, RespVersion, Scan};
use strata_rdma::tls::Stream;
use strata_tiering::{Reservation, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::busy_poll::EchoWindow;
use crate::clock::RunClock;
use crate::cmd::{self, Out};
use crate::node::Node;
use crate::session::Session;

/// Replies accumulate up to this much before being written mid-batch, so a
/// deep pipeline of GETs cannot grow the reply buffer without bound.
const FLUSH_BYTES: usize = 256 * 1024;
/// Values at least this large are written from store memory (pinned until
/// written); smaller ones are cheaper to copy than to give their own iovec.
const COPY_VALUE_BYTES: usize = 1024;
/// iovecs per vectored write stay under the kernel's IOV_MAX (1024).
const MAX_SEGMENTS: usize = 512;
/// Initial read and reply buffers; the read buffer grows to the size of
/// the largest request in flight.
const READ_BUF_BYTES: usize = 16 * 1024;
/// Room offered to each read, doubling from [`READ_BUF_BYTES`] while reads
/// keep filling it, up to this, and halving again when they come back
/// small: a client that pipelines gets its whole batch in one or two
/// reads (16 SETs of 4 KiB: 2.5 per read at 16 KiB, 405k SET/s against
/// 273k on one core), an idle one keeps a small buffer.
const READ_ROOM_MAX: usize = 256 * 1024;
/// A read buffer grown for a huge request is given back once it is idle
/// and larger than this.
const READ_BUF_KEEP_BYTES: usize = 1024 * 1024;
/// Each connection may buffer this much of a request without asking the
/// node-wide budget (`max_buffered_requests_size`): small requests never
/// wait, and this many bytes × `max_connections` is the unbudgeted rest.
const FREE_REQUEST_BYTES: usize = 1024 * 1024;
/// How long a large request waits for room in the node-wide budget before
/// it is refused with `-BUSY` (and skipped as it streams in).
const BUDGET_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// A `SET` value at least this large that has not fully arrived is read
/// straight into its arena chunk. Smaller ones mostly arrive in one read,
/// where buffering costs nothing extra.
const STREAM_VALUE_BYTES: usize = 64 * 1024;
/// A request part-way in polls for the rest (`stream_poll_us`) only when
/// its last read brought at least this much: bytes arriving in bulk are a
/// transfer under way, while a client trickling a request in (slowly, or
/// to hold a core) is left to sleep between its bytes.
const STREAM_READ_BYTES: usize = 16 * 1024;

/// A piece of queued reply output.
enum Segment {
    Buf(Bytes),
    /// Bytes of a pinned value, written straight from store memory.
    Value(Value, Range<usize>),
}

impl Segment {
    fn bytes(&self) -> &[u8] {
        match self {
            Segment::Buf(b) => b,
            Segment::Value(v, range) => &v.as_slice()[range.clone()],
        }
    }
}

struct Conn<'a> {
    node: &'a Arc<Node>,
    /// Plain TCP, or TLS on the TLS port.
    sock: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Output queued before `wbuf` (in order), and its size.
    queued: Vec<Segment>,
    queued_bytes: usize,
    discard: Option<Discard>,
    /// KiB of the node-wide request budget this connection holds for the
    /// request it is receiving.
    budget: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Bytes of pub/sub messages in the output not yet written (they count
    /// against the subscriber's limit until they are).
    mail_unwritten: usize,
    /// Room the next read is offered (see [`READ_ROOM_MAX`]).
    read_room: usize,
    /// Bytes the last read brought (see [`STREAM_READ_BYTES`]).
    last_read: usize,
    /// Set when output was written (which may have waited): the run of
    /// requests' clock starts over.
    flushed: bool,
    /// When the first bytes of the requests being served arrived.
    began: Option<Instant>,
    /// The wait after a long run of requests, from their first bytes to
    /// their last reply written (`echo_poll_us`).
    echo: EchoWindow,
    session: Session,
}

pub async fn serve(node: &Arc<Node>, sock: Stream) -> std::io::Result<()> {
    sock.tcp().set_nodelay(true)?;
    let session = Session {
        id: node.next_client_id(),
        name: None,
        lib_name: None,
        lib_ver: None,
        resp: RespVersion::Resp2,
        authed: node.cfg.requirepass.is_none(),
        quit: false,
        leases: HashSet::new(),
        cma_nonce: None,
        cma_peer: None,
        sub: None,
        streamed: None,
        peer: crate::peer::Peer::of(&sock),
        handed: 0,
    };
    let mut conn = Conn {
        node,
        sock,
        rbuf: BytesMut::with_capacity(READ_BUF_BYTES),
        wbuf: BytesMut::with_capacity(READ_BUF_BYTES),
        queued: Vec::new(),
        queued_bytes: 0,
        discard: None,
        budget: None,
        mail_unwritten: 0,
        read_room: READ_BUF_BYTES,
        last_read: 0,
        flushed: false,
        began: None,
        echo: EchoWindow::default(),
        session,
    };
    let result = conn.run().await;
    for id in conn.session.leases.drain() {
        node.leases.release(id);
    }
    if let Some(sub) = &mut conn.session.sub {
        node.pubsub.leave(sub);
    }
    result
}

enum Step {
    /// Run this request.
    Request(Vec<Bytes>),
    /// Need more bytes (at least this many in the buffer).
    Read(usize),
    /// Write what we have and close.
    Close,
    /// Something was consumed without a request to run; look again.
    Again,
}

impl Conn<'_> {
    async fn run(&mut self) -> std::io::Result<()> {
        loop {
            // Every pass of this loop follows a wait (a read, a value
            // streamed in, room in the budget, a message).
            let mut clock = RunClock::start();
            self.flushed = false;
            let need = loop {
                match self.next_step() {
                    Step::Request(args) => {
                        // Messages that arrived first go out first.
                        self.take_mail();
                        let mut out =
                            cmd::execute(self.node, &mut self.session, &args, &mut clock, false);
                        let mut waited = matches!(out, Out::Later(_));
                        if let Out::Rerun(before) = out {
                            // Missing keys were fetched (from NVMe or from
                            // their previous holders), or a writer waited
                            // for room: run again, or report why not.
                            let fetched = before.await;
                            clock.restart();
                            out = match fetched {
                                Ok(()) => cmd::execute(
                                    self.node,
                                    &mut self.session,
                                    &args,
                                    &mut clock,
                                    true,
                                ),
                                Err(e) => e.into(),
                            };
                            waited = matches!(out, Out::Later(_));
                        }
                        drop(args);
                        self.session.streamed = None;
                        if self.rbuf.len() <= FREE_REQUEST_BYTES {
                            self.budget = None;
                        }
                        self.emit(out).await?;
                        if waited || std::mem::take(&mut self.flushed) {
                            clock.restart();
                        }
                        if self.session.quit {
                            return self.flush().await;
                        }
                    }
                    Step::Again => {}
                    Step::Read(need) => break need,
                    Step::Close => return self.flush().await,
                }
            };
            self.flush().await?;
            if self.rbuf.is_empty() {
                // Every request that arrived is answered: the next read
                // waits for a new one, polling about as long as these took
                // (values leased to the client count as the time it takes
                // to copy them: its next request comes after that).
                if let Some(began) = self.began.take() {
                    let handed = std::mem::take(&mut self.session.handed);
                    let took = began.elapsed() + strata_rdma::spin::copy_time(handed);
                    self.echo
                        .ran(Instant::now(), took, self.node.cfg.echo_poll());
                }
            }
            if self.rbuf.is_empty() && self.rbuf.capacity() > READ_BUF_KEEP_BYTES {
                self.rbuf = BytesMut::with_capacity(READ_BUF_BYTES);
            }
            if self.discard.is_none() && need > self.rbuf.len() + STREAM_VALUE_BYTES {
                if let Some(res) = self.stream_set().await? {
                    self.session.streamed = Some(res);
                    continue;
                }
            }
            if self.discard.is_none() && !self.reserve_budget(need).await {
                continue;
            }
            if need > self.rbuf.len() {
                self.rbuf.reserve(need - self.rbuf.len());
            }
            self.rbuf.reserve(self.read_room);
            let offered = self.rbuf.capacity() - self.rbuf.len();
            let n = match self.session.mailbox() {
                None => self.read_next(need).await?,
                Some(mb) => {
                    // read_buf is cancel safe: a message wakes the
                    // connection without losing request bytes.
                    let woke = tokio::select! {
                        r = self.sock.read_buf(&mut self.rbuf) => Some(r?),
                        _ = mb.ready() => None,
                    };
                    match woke {
                        Some(n) => n,
                        None => {
                            if mb.is_cut() {
                                return Ok(());
                            }
                            self.take_mail();
                            self.flush().await?;
                            continue;
                        }
                    }
                }
            };
            if n == 0 {
                return Ok(());
            }
            if self.began.is_none() {
                self.began = Some(Instant::now());
            }
            self.last_read = n;
            if n == offered {
                self.read_room = (self.read_room * 2).min(READ_ROOM_MAX);
            } else if n < self.read_room / 4 {
                self.read_room = (self.read_room / 2).max(READ_BUF_BYTES);
            }
            self.node
                .metrics
                .counters
                .net_input_bytes_total
                .fetch_add(n as u64, Relaxed);
        }
    }

    /// Reads what the client sent next. Between requests, first polls for
    /// it for up to `busy_poll_us` when busy polling is on, or after a
    /// request that took 20 µs or more, for as long again as it took, up
    /// to `echo_poll_us` (see `crate::busy_poll::EchoWindow`; a short
    /// request in between leaves that window), while a slot is free; in
    /// the middle of a request arriving in bulk with at least
    /// [`STREAM_VALUE_BYTES`] of its `need` still to come, for up to
    /// `stream_poll_us` (the rest of a smaller one is one burst away, and
    /// polling for it measured no faster). Subscribers never spin: they
    /// wait on their mailbox too, and their requests are rare.
    async fn read_next(&mut self, need: usize) -> std::io::Result<usize> {
        let cfg = &self.node.cfg;
        let busy = cfg.busy_poll();
        let stream = cfg.stream_poll();
        let between = self.rbuf.is_empty();
        let streaming = !between
            && self.last_read >= STREAM_READ_BYTES
            && need.saturating_sub(self.rbuf.len()) >= STREAM_VALUE_BYTES;
        let echo = if between {
            self.echo.left(Instant::now())
        } else {
            Duration::ZERO
        };
        let (idle, stream) = if streaming {
            (busy.max(stream), stream)
        } else {
            (busy.max(echo), Duration::ZERO)
        };
        // The counters say how often waiting for the next request paid,
        // under the setting whose window it was; a transfer's spins are
        // another matter.
        let c = &self.node.metrics.counters;
        let (hits, misses) = if busy >= echo {
            (&c.busy_poll_hits_total, &c.busy_poll_misses_total)
        } else {
            (&c.echo_poll_hits_total, &c.echo_poll_misses_total)
        };
        let counted = between && !idle.is_zero();
        let read = std::pin::pin!(self.sock.read_buf(&mut self.rbuf));
        let ran_out = || {
            if counted {
                misses.fetch_add(1, Relaxed);
            }
        };
        let (n, found) = self.node.busy_poll.run(read, idle, stream, ran_out).await;
        if counted && found && n.is_ok() {
            hits.fetch_add(1, Relaxed);
        }
        n
    }

    /// When the request arriving is `SET key value ...` and most of a large
    /// value is still to come: reserves the value's arena chunk, moves what
    /// has arrived into it, reads the rest from the socket straight into it,
    /// and leaves in the read buffer the same request with an empty value
    /// (`$0`), whose CRLF and options are still to arrive, for the usual
    /// path to frame and run. SET then takes the chunk (`Session::streamed`)
    /// instead of copying its argument.
    ///
    /// `None` (buffer as usual) when that would change what the client
    /// sees: not authenticated, subscribed, a key this node does not own,
    /// a spill queue to wait for, or no room. Those are answered by the
    /// command itself, exactly as before. A client that goes away mid-value
    /// drops the reservation: nothing is stored, the old value stays.
    async fn stream_set(&mut self) -> std::io::Result<Option<Reservation>> {
        if !self.session.authed || self.session.sub.is_some() {
            return Ok(None);
        }
        let Some(p) = pending_bulk(&self.rbuf, 2) else {
            return Ok(None);
        };
        let have = self.rbuf.len() - p.payload_at;
        if p.before.len() != 2
            || p.len < STREAM_VALUE_BYTES
            || have >= p.len
            || !self.rbuf[p.before[0].clone()].eq_ignore_ascii_case(b"SET")
        {
            return Ok(None);
        }
        let node = self.node;
        let key = &self.rbuf[p.before[1].clone()];
        if !node.cluster.standalone() && node.cluster.route(std::iter::once(key)).is_err() {
            return Ok(None);
        }
        if node.spill.as_ref().is_some_and(|s| s.congested()) {
            return Ok(None);
        }
        let Ok(mut res) = node.store.reserve(p.len as u64) else {
            return Ok(None);
        };
        let mut head = BytesMut::with_capacity(p.header_at + 4);
        head.extend_from_slice(&self.rbuf[..p.header_at]);
        head.extend_from_slice(b"$0\r\n");
        let dst = res.as_mut_slice();
        dst[..have].copy_from_slice(&self.rbuf[p.payload_at..]);
        let stream = node.cfg.stream_poll();
        let mut last = self.last_read;
        self.rbuf.clear();
        let mut filled = have;
        while filled < dst.len() {
            // Mid-value: poll for the rest while it arrives in bulk.
            let window = if last < STREAM_READ_BYTES {
                Duration::ZERO
            } else {
                stream
            };
            let read = std::pin::pin!(self.sock.read(&mut dst[filled..]));
            let n = node.busy_poll.run(read, window, window, || {}).await.0?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
            last = n;
            node.metrics
                .counters
                .net_input_bytes_total
                .fetch_add(n as u64, Relaxed);
        }
        self.rbuf.extend_from_slice(&head);
        Ok(Some(res))
    }

    /// Before buffering up to `need` bytes of one request: the part beyond
    /// [`FREE_REQUEST_BYTES`] must fit the node-wide budget, so that many
    /// clients sending huge values at once cannot exhaust memory. Waits up
    /// to [`BUDGET_WAIT`]; then refuses the request with `-BUSY`, skips it
    /// as it streams in, and returns `false`.
    async fn reserve_budget(&mut self, need: usize) -> bool {
        let want_kib = need.saturating_sub(FREE_REQUEST_BYTES).div_ceil(1024);
        let held_kib = self.budget.as_ref().map_or(0, |p| p.num_permits());
        if want_kib <= held_kib {
            return true;
        }
        let more = (want_kib - held_kib).min(u32::MAX as usize) as u32;
        let wait = self.node.request_budget.clone().acquire_many_owned(more);
        match tokio::time::timeout(BUDGET_WAIT, wait).await {
            Ok(Ok(p)) => {
                match &mut self.budget {
                    Some(held) => held.merge(p),
                    None => self.budget = Some(p),
                }
                true
            }
            _ => {
                self.budget = None;
                self.node
                    .metrics
                    .counters
                    .buffer_busy_total
                    .fetch_add(1, Relaxed);
                let err = CommandError::new(
                    ErrorCode::Busy,
                    format!(
                        "the node is buffering too many large requests (max_buffered_requests_size {} bytes); retry",
                        self.node.cfg.max_buffered_requests_size
                    ),
                );
                // Only an array whose header has arrived can need more
                // than the free bytes (inline lines are bounded far below).
                let Some((hlen, d)) = Discard::request(&self.rbuf) else {
                    return true;
                };
                Reply::Error(err).encode(self.session.resp, &mut self.wbuf);
                self.rbuf.advance(hlen);
                self.discard = Some(d);
                false
            }
        }
    }

    /// Looks at the read buffer and says what to do next.
    fn next_step(&mut self) -> Step {
        if let Some(d) = &mut self.discard {
            return match d.advance(&self.rbuf) {
                Ok(DiscardStep::More { consumed }) => {
                    self.rbuf.advance(consumed);
                    Step::Read(1)
                }
                Ok(DiscardStep::Done { consumed }) => {
                    self.rbuf.advance(consumed);
                    self.discard = None;
                    Step::Again
                }
                Err(e) => self.protocol_error(e.to_string()),
            };
        }
        match scan(&self.rbuf, &self.node.limits) {
            Scan::Incomplete { need } => Step::Read(need),
            Scan::Empty { len } => {
                self.rbuf.advance(len);
                Step::Again
            }
            Scan::Frame { len } => {
                // scan checked every header, payload and CRLF: the
                // arguments are slices of the frame, nothing is decoded.
                let frame = self.rbuf.split_to(len).freeze();
                let places = args(&frame);
                let mut out = Vec::with_capacity(places.size_hint().1.unwrap_or(0));
                out.extend(places.map(|r| frame.slice(r)));
                Step::Request(out)
            }
            Scan::Inline { len } => {
                let line = self.rbuf.split_to(len);
                match split_inline(&line) {
                    Ok(args) if args.is_empty() => Step::Again,
                    Ok(args) => Step::Request(args.into_iter().map(Bytes::from).collect()),
                    Err(e) => self.protocol_error(e.to_string()),
                }
            }
            Scan::TooLarge {
                consumed,
                discard,
                len,
            } => {
                self.rbuf.advance(consumed);
                self.discard = Some(discard);
                self.node
                    .metrics
                    .counters
                    .too_large_total
                    .fetch_add(1, Relaxed);
                let err = CommandError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "request of {len} bytes exceeds the limit (max_value_size {} bytes, max_request_size {} bytes)",
                        self.node.limits.max_bulk_len, self.node.limits.max_request_len
                    ),
                );
                Reply::Error(err).encode(self.session.resp, &mut self.wbuf);
                Step::Again
            }
            Scan::Error(e) => self.protocol_error(e.to_string()),
        }
    }

    fn protocol_error(&mut self, msg: String) -> Step {
        self.node
            .metrics
            .counters
            .protocol_errors_total
            .fetch_add(1, Relaxed);
        let msg = msg
            .strip_prefix("Protocol error: ")
            .unwrap_or(&msg)
            .to_string();
        Reply::Error(CommandError::err(format!("Protocol error: {msg}")))
            .encode(self.session.resp, &mut self.wbuf);
        self.rbuf.clear();
        Step::Close
    }

    async fn emit(&mut self, out: Out) -> std::io::Result<()> {
        match out {
            Out::Reply(r) => r.encode(self.session.resp, &mut self.wbuf),
            Out::Later(work) => work.await.encode(self.session.resp, &mut self.wbuf),
            // Only returned from a first execution; the loop above reruns.
            Out::Rerun(_) => Reply::Error(CommandError::err("internal: unexpected rerun"))
                .encode(self.session.resp, &mut self.wbuf),
            Out::Value(None) => Reply::Nil.encode(self.session.resp, &mut self.wbuf),
            Out::Value(Some(v)) => {
                let all = 0..v.as_slice().len();
                self.value(v, all).await?
            }
            Out::Range { value, start, end } => {
                // Written by hand, not as a `Reply`, so that the bytes go
                // straight from store memory like a whole value's.
                self.wbuf.extend_from_slice(b"*3\r\n");
                Reply::Int(value.version() as i64).encode(self.session.resp, &mut self.wbuf);
                Reply::Int(value.len() as i64).encode(self.session.resp, &mut self.wbuf);
                self.value(value, start..end).await?
            }
            Out::Values(vs) => {
                self.wbuf
                    .extend_from_slice(format!("*{}\r\n", vs.len()).as_bytes());
                for v in vs {
                    match v {
                        Some(v) => {
                            let all = 0..v.as_slice().len();
                            self.value(v, all).await?
                        }
                        None => Reply::Nil.encode(self.session.resp, &mut self.wbuf),
                    }
                }
            }
        }
        if self.wbuf.len() + self.queued_bytes >= FLUSH_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queues bytes `range` of a value as a bulk string. Large ones are not
    /// copied: the reply buffer so far and the pinned value are queued as
    /// separate segments and written together with one vectored write at
    /// flush.
    async fn value(&mut self, v: Value, range: Range<usize>) -> std::io::Result<()> {
        let bytes = &v.as_slice()[range.clone()];
        strata_proto::reply::bulk_header(bytes.len(), &mut self.wbuf);
        if bytes.len() < COPY_VALUE_BYTES {
            self.wbuf.extend_from_slice(bytes);
        } else {
            self.queued_bytes += self.wbuf.len() + bytes.len();
            self.queued.push(Segment::Buf(self.wbuf.split().freeze()));
            self.queued.push(Segment::Value(v, range));
            if self.queued.len() >= MAX_SEGMENTS {
                self.flush().await?;
            }
        }
        self.wbuf.extend_from_slice(b"\r\n");
        Ok(())
    }

    /// Moves waiting pub/sub messages into the output.
    fn take_mail(&mut self) {
        if let Some(sub) = &self.session.sub {
            self.mail_unwritten += sub.mailbox.take(&mut self.wbuf);
        }
    }

    /// Writes everything queued. A subscriber cut off at its output limit
    /// stops writing at once and is closed, even if its socket is stuck.
    async fn flush(&mut self) -> std::io::Result<()> {
        self.flushed = true;
        let Some(mb) = self.session.mailbox() else {
            return self.write_out().await;
        };
        let written = tokio::select! {
            r = self.write_out() => r,
            _ = mb.cut() => Err(std::io::Error::other("subscriber over pubsub_output_buffer_limit")),
        };
        written?;
        mb.written(std::mem::take(&mut self.mail_unwritten));
        Ok(())
    }

    /// Writes the segments, then the reply buffer.
    async fn write_out(&mut self) -> std::io::Result<()> {
        if !self.wbuf.is_empty() {
            if self.queued.is_empty() {
                self.sock.write_all(&self.wbuf).await?;
                self.sock.flush().await?;
                self.count_out(self.wbuf.len());
                self.wbuf.clear();
                return Ok(());
            }
            self.queued.push(Segment::Buf(self.wbuf.split().freeze()));
        }
        let mut segments = std::mem::take(&mut self.queued);
        let (mut first, mut offset) = (0usize, 0usize);
        while first < segments.len() {
            let n = {
                let mut bufs = Vec::with_capacity(segments.len() - first);
                bufs.push(IoSlice::new(&segments[first].bytes()[offset..]));
                bufs.extend(
                    segments[first + 1..]
                        .iter()
                        .map(|s| IoSlice::new(s.bytes())),
                );
                self.sock.write_vectored(&bufs).await?
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.count_out(n);
            // Advance past what the kernel took.
            let mut left = n;
            while left > 0 {
                let rest = segments[first].bytes().len() - offset;
                if left >= rest {
                    left -= rest;
                    first += 1;
                    offset = 0;
                } else {
                    offset += left;
                    left = 0;
                }
            }
            while first < segments.len() && segments[first].bytes().len() == offset {
                first += 1;
                offset = 0;
            }
        }
        // TLS holds back what the socket did not take; plain TCP: no-op.
        self.sock.flush().await?;
        // Values are unpinned here, once they are written.
        segments.clear();
        self.queued = segments;
        self.queued_bytes = 0;
        Ok(())
    }

    fn count_out(&self, n: usize) {
        self.node
            .metrics
            .counters
            .net_output_bytes_total
            .fetch_add(n as u64, Relaxed);
    }
}
