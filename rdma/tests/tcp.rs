//! The TCP transport against real sockets on 127.0.0.1.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_rdma::faulty::FaultyTransport;
use strata_rdma::tcp::{
    TcpConfig, TcpTransport, CONNS_PER_PEER_MAX, READ_LEN_MAX, SPLIT_PIECE_BYTES_MIN,
};
use strata_rdma::{
    Descriptor, ReadGuard, ReadOp, Refusal, Region, TransferError, Transport, TransportKind,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const LOCALHOST: &str = "127.0.0.1:0";

/// Bound on any single test step, so a hang fails instead of stalling CI.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

fn config() -> TcpConfig {
    TcpConfig {
        read_timeout: Duration::from_secs(5),
        ..TcpConfig::default()
    }
}

async fn transport() -> Arc<TcpTransport> {
    let addr: SocketAddr = LOCALHOST.parse().expect("addr");
    TcpTransport::bind_with(addr, config()).await.expect("bind")
}

/// A buffer registered with a transport. The region is declared first so it
/// is deregistered before the buffer is freed.
struct Mem {
    region: Region,
    buf: Vec<u8>,
}

impl Mem {
    fn new<T: Transport>(t: &T, mut buf: Vec<u8>, guard: Option<Arc<dyn ReadGuard>>) -> Self {
        // SAFETY: the buffer is owned by the returned `Mem`, never resized,
        // and its `region` field drops before `buf`. Tests only look at the
        // bytes when no transfer is in flight.
        let region = unsafe { t.register(buf.as_mut_ptr() as u64, buf.len() as u64, guard) }
            .expect("register");
        Self { region, buf }
    }

    fn zeroed<T: Transport>(t: &T, len: usize) -> Self {
        Self::new(t, vec![0; len], None)
    }
}

/// Deterministic bytes (xorshift64*), different for each seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP_TIMEOUT, f)
        .await
        .expect("test step hung")
}

/// The owner's count of reads served once it reaches `want` (or after
/// the step timeout): the owner counts a read when its write returns,
/// which can be after the reader already has every byte.
async fn served_once(owner: &TcpTransport, want: u64) -> u64 {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let served = owner.stats().reads_served.load(Ordering::Relaxed);
        if served >= want || Instant::now() > deadline {
            return served;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_of_every_size() {
    let (owner, reader) = (transport().await, transport().await);
    for (i, len) in [1usize, 4 << 10, 1 << 20, 64 << 20].into_iter().enumerate() {
        let src = Mem::new(&owner, pattern(len, i as u64 + 1), None);
        let dst = Mem::zeroed(&reader, len + 16);
        let desc = owner
            .describe(&src.region, 0, len as u64, None)
            .expect("describe");
        // The descriptor survives its text form, as it would inside RESP.
        let desc = Descriptor::parse(desc.to_string().as_bytes()).expect("parse");
        bounded(reader.read(&desc, &dst.region, 16))
            .await
            .expect("read");
        assert!(dst.buf[..16].iter().all(|&b| b == 0), "len {len}");
        assert!(
            dst.buf[16..] == src.buf[..],
            "content mismatch at len {len}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_a_sub_range() {
    let (owner, reader) = (transport().await, transport().await);
    let src = Mem::new(&owner, pattern(8192, 9), None);
    let dst = Mem::zeroed(&reader, 8192);
    let desc = owner
        .describe(&src.region, 1000, 3000, None)
        .expect("describe");
    bounded(reader.read(&desc, &dst.region, 5000))
        .await
        .expect("read");
    assert_eq!(dst.buf[5000..8000], src.buf[1000..4000]);
    assert!(dst.buf[..5000]
        .iter()
        .chain(&dst.buf[8000..])
        .all(|&b| b == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_readers() {
    const READERS: usize = 16;
    const SLICE: usize = 256 << 10;
    let (owner, reader) = (transport().await, transport().await);
    let src = Mem::new(&owner, pattern(READERS * SLICE, 77), None);
    let dst = Arc::new(Mem::zeroed(&reader, READERS * SLICE));
    let mut tasks = Vec::new();
    for i in 0..READERS {
        // Reader i pulls slice (i * 7) % 16 into slot i: every reader moves
        // different bytes to a different place.
        let from = ((i * 7) % READERS * SLICE) as u64;
        let desc = owner
            .describe(&src.region, from, SLICE as u64, None)
            .expect("describe");
        let (reader, dst) = (Arc::clone(&reader), Arc::clone(&dst));
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                reader
                    .read(&desc, &dst.region, (i * SLICE) as u64)
                    .await
                    .expect("read");
            }
        }));
    }
    for t in tasks {
        bounded(t).await.expect("reader task");
    }
    for i in 0..READERS {
        let from = (i * 7) % READERS * SLICE;
        assert!(dst.buf[i * SLICE..(i + 1) * SLICE] == src.buf[from..from + SLICE]);
    }
    let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
    assert!(opened <= CONNS_PER_PEER_MAX as u64, "opened {opened}");
}

/// Serves only reads that carry the `current` epoch.
struct EpochGuard {
    current: u64,
}

impl ReadGuard for EpochGuard {
    fn pin(
        &self,
        _addr: u64,
        _len: u64,
        epoch: Option<u64>,
    ) -> Result<Box<dyn Any + Send>, Refusal> {
        match epoch {
            Some(e) if e == self.current => Ok(Box::new(e)),
            Some(_) => Err(Refusal::Stale),
            None => Err(Refusal::Gone),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_clear_and_the_listener_keeps_serving() {
    let (owner, reader) = (transport().await, transport().await);
    let src = Mem::new(&owner, pattern(4096, 3), None);
    let guarded = Mem::new(
        &owner,
        pattern(4096, 4),
        Some(Arc::new(EpochGuard { current: 7 })),
    );
    let doomed = Mem::new(&owner, pattern(4096, 5), None);
    let dst = Mem::zeroed(&reader, 8192);
    let good = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let doomed_desc = owner
        .describe(&doomed.region, 0, 4096, None)
        .expect("describe");
    doomed.region.deregister();

    let base = good.clone();
    let cases: Vec<(&str, Descriptor, &str)> = vec![
        (
            "wrong rkey",
            Descriptor {
                rkey: base.rkey ^ 0x8000_0001,
                ..base.clone()
            },
            "BADDESC",
        ),
        (
            "addr before the region",
            Descriptor {
                addr: base.addr - 1,
                ..base.clone()
            },
            "BADDESC",
        ),
        (
            "len past the end",
            Descriptor {
                len: 4097,
                ..base.clone()
            },
            "BADDESC",
        ),
        (
            "addr past the end",
            Descriptor {
                addr: base.addr + 4096,
                len: 1,
                ..base.clone()
            },
            "BADDESC",
        ),
        (
            "addr + len overflows",
            Descriptor {
                addr: u64::MAX - 1,
                len: 16,
                ..base.clone()
            },
            "BADDESC",
        ),
        ("deregistered region", doomed_desc, "BADDESC"),
        (
            "stale epoch",
            owner
                .describe(&guarded.region, 0, 4096, Some(6))
                .expect("describe"),
            "STALE",
        ),
        (
            "guard says gone",
            owner
                .describe(&guarded.region, 0, 4096, None)
                .expect("describe"),
            "BADDESC",
        ),
        (
            "over the length limit",
            Descriptor {
                len: READ_LEN_MAX + 1,
                ..base.clone()
            },
            "TOOLARGE",
        ),
        (
            "rdma descriptor",
            Descriptor {
                transport: TransportKind::Rdma,
                ..base.clone()
            },
            "BADDESC",
        ),
    ];
    for (what, desc, expected) in cases {
        let err = bounded(reader.read(&desc, &dst.region, 0))
            .await
            .expect_err(what);
        assert_eq!(err.code(), expected, "{what}: got {err:?}");
        bounded(reader.read(&good, &dst.region, 0))
            .await
            .unwrap_or_else(|e| panic!("good read after {what}: {e}"));
        assert!(dst.buf[..4096] == src.buf[..]);
    }
    let current = owner
        .describe(&guarded.region, 0, 4096, Some(7))
        .expect("describe");
    bounded(reader.read(&current, &dst.region, 4096))
        .await
        .expect("current epoch");
    assert!(dst.buf[4096..] == guarded.buf[..]);
    // A refusal leaves the connection in a known state: it is reused.
    assert_eq!(reader.stats().connections_opened.load(Ordering::Relaxed), 1);
    assert!(owner.stats().reads_refused.load(Ordering::Relaxed) >= 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_out_of_range_is_refused_locally() {
    let (owner, reader) = (transport().await, transport().await);
    let src = Mem::new(&owner, pattern(4096, 3), None);
    let dst = Mem::zeroed(&reader, 4096);
    let desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let err = reader
        .read(&desc, &dst.region, 1)
        .await
        .expect_err("overflow dst");
    assert!(matches!(err, TransferError::BadDescriptor(_)), "{err:?}");
    assert_eq!(reader.stats().connections_opened.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pool_reuses_connections() {
    let (owner, reader) = (transport().await, transport().await);
    let src = Mem::new(&owner, pattern(4096, 11), None);
    let dst = Arc::new(Mem::zeroed(&reader, 8 * 4096));
    let desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (reader, dst, desc) = (Arc::clone(&reader), Arc::clone(&dst), desc.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..125 {
                reader
                    .read(&desc, &dst.region, i * 4096)
                    .await
                    .expect("read");
            }
        }));
    }
    for t in tasks {
        bounded(t).await.expect("reader task");
    }
    let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
    assert!(
        (1..=CONNS_PER_PEER_MAX as u64).contains(&opened),
        "opened {opened}"
    );
    // The owner counts a read after its last byte is written, which may be
    // just after the reader has it.
    bounded(async {
        while owner.stats().reads_served.load(Ordering::Relaxed) < 1000 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(owner.stats().reads_served.load(Ordering::Relaxed), 1000);
    assert!(dst.buf.chunks(4096).all(|c| c == &src.buf[..]));
}

/// Blocks the serving task inside `pin` until the test lets it go.
struct Gate {
    entered: mpsc::UnboundedSender<()>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl ReadGuard for Gate {
    fn pin(
        &self,
        _addr: u64,
        _len: u64,
        _epoch: Option<u64>,
    ) -> Result<Box<dyn Any + Send>, Refusal> {
        let _ = self.entered.send(());
        let release = self.release.lock().expect("gate lock");
        let _ = release.recv_timeout(STEP_TIMEOUT);
        Ok(Box::new(()))
    }
}

/// Kills the owner while a 64 MiB read from it is in flight. The reader runs
/// on its own single-threaded runtime that the test stalls, so the owner is
/// guaranteed to be mid-payload (socket buffers full) when it dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_killed_mid_read_fails_without_hanging() {
    const LEN: usize = 64 << 20;
    let owner = transport().await;
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        entered: entered_tx,
        release: std::sync::Mutex::new(release_rx),
    });
    let src = Mem::new(&owner, pattern(LEN, 21), Some(gate));
    let desc = owner
        .describe(&src.region, 0, LEN as u64, None)
        .expect("describe");

    let (freeze, mut freeze_rx) = mpsc::unbounded_channel::<()>();
    let (stalled_tx, mut stalled) = mpsc::unbounded_channel();
    let (unstall, unstall_rx) = std::sync::mpsc::channel::<()>();
    let reader_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            // One connection: the read is not split, so it is one stream
            // cut mid-payload.
            let addr: SocketAddr = LOCALHOST.parse().expect("addr");
            let one = TcpConfig {
                conns_per_peer: 1,
                ..config()
            };
            let reader = TcpTransport::bind_with(addr, one).await.expect("bind");
            let dst = Mem::zeroed(&reader, LEN);
            let read = reader.read(&desc, &dst.region, 0);
            let staller = async {
                // Once the owner is inside `pin` (so the request was sent),
                // freeze this thread, and so the reader, until the owner is
                // dead.
                freeze_rx.recv().await.expect("freeze");
                stalled_tx.send(()).expect("stalled");
                let _ = unstall_rx.recv_timeout(STEP_TIMEOUT);
                std::future::pending::<()>().await
            };
            let started = Instant::now();
            tokio::select! {
                r = read => (r, started.elapsed()),
                () = staller => unreachable!(),
            }
        })
    });

    bounded(entered.recv()).await.expect("owner entered pin");
    freeze.send(()).expect("freeze");
    bounded(stalled.recv()).await.expect("reader stalled");
    drop(src.region);
    drop(owner);
    release.send(()).expect("release pin");
    // Give the dying owner a moment to fill the socket buffers and close.
    tokio::time::sleep(Duration::from_millis(100)).await;
    unstall.send(()).expect("unstall");
    let (result, elapsed) = tokio::task::spawn_blocking(move || reader_thread.join())
        .await
        .expect("join")
        .expect("reader thread");
    let err = result.expect_err("read from a dead peer must fail");
    assert!(matches!(err, TransferError::PeerClosed), "{err:?}");
    assert!(elapsed < config().read_timeout, "took {elapsed:?}");
}

/// A fake owner that answers every request with `respond`, for the cases a
/// real owner never produces.
async fn fake_owner(respond: fn(&[u8; 48]) -> Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(LOCALHOST).await.expect("bind");
    let endpoint = listener.local_addr().expect("addr").to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = [0u8; 48];
                while s.read_exact(&mut req).await.is_ok() {
                    let reply = respond(&req);
                    if reply.is_empty() || s.write_all(&reply).await.is_err() {
                        // Empty reply: go silent but keep the socket open.
                        tokio::time::sleep(STEP_TIMEOUT).await;
                        return;
                    }
                }
            });
        }
    });
    (endpoint, task)
}

/// Response header per docs/transport-tcp.md, echoing the request id.
fn response(req: &[u8; 48], status: u8, len: u64) -> Vec<u8> {
    let mut r = b"STRP\x01".to_vec();
    r.push(status);
    r.extend_from_slice(&[0, 0]);
    r.extend_from_slice(&req[8..16]);
    r.extend_from_slice(&len.to_be_bytes());
    r
}

fn requested_len(req: &[u8; 48]) -> u64 {
    u64::from_be_bytes(req[24..32].try_into().expect("8 bytes"))
}

fn remote(endpoint: &str, len: u64) -> Descriptor {
    Descriptor {
        transport: TransportKind::Tcp,
        endpoint: endpoint.to_owned(),
        addr: 0x1000,
        len,
        rkey: 1,
        epoch: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_payload_times_out() {
    // Header and 100 payload bytes, then silence with the socket open.
    let (endpoint, _server) = fake_owner(|req| {
        let mut r = response(req, 0, requested_len(req));
        r.extend(std::iter::repeat_n(0xab, 100));
        r
    })
    .await;
    let reader = TcpTransport::bind_with(
        LOCALHOST.parse().expect("addr"),
        TcpConfig {
            read_timeout: Duration::from_millis(300),
            ..config()
        },
    )
    .await
    .expect("bind");
    let dst = Mem::zeroed(&reader, 4096);
    let err = bounded(reader.read(&remote(&endpoint, 4096), &dst.region, 0))
        .await
        .expect_err("stalled payload");
    assert!(matches!(err, TransferError::Timeout), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_times_out() {
    let (endpoint, _server) = fake_owner(|_| Vec::new()).await;
    let reader = TcpTransport::bind_with(
        LOCALHOST.parse().expect("addr"),
        TcpConfig {
            read_timeout: Duration::from_millis(200),
            ..config()
        },
    )
    .await
    .expect("bind");
    let dst = Mem::zeroed(&reader, 64);
    let started = Instant::now();
    let err = bounded(reader.read(&remote(&endpoint, 64), &dst.region, 0))
        .await
        .expect_err("silent peer");
    assert!(matches!(err, TransferError::Timeout), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_length_and_junk_responses_are_errors() {
    let reader = transport().await;
    let dst = Mem::zeroed(&reader, 64);
    let (short, _a) = fake_owner(|req| response(req, 0, requested_len(req) - 1)).await;
    let err = reader
        .read(&remote(&short, 64), &dst.region, 0)
        .await
        .expect_err("short");
    assert!(
        matches!(err, TransferError::LengthMismatch { want: 64, got: 63 }),
        "{err:?}"
    );
    let (junk, _b) = fake_owner(|_| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()).await;
    let err = reader
        .read(&remote(&junk, 64), &dst.region, 0)
        .await
        .expect_err("junk");
    assert!(matches!(err, TransferError::Protocol(_)), "{err:?}");
}

/// BAD_REQUEST carries request id 0 (the owner could not read ours): the
/// reader reports the rejection, not an id mismatch, and drops the
/// connection the owner is closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_request_with_id_zero_is_reported_as_a_rejection() {
    let reader = transport().await;
    let dst = Mem::zeroed(&reader, 64);
    let (owner, _t) = fake_owner(|_| {
        let mut r = b"STRP\x01\x06\x00\x00".to_vec();
        r.extend_from_slice(&[0u8; 16]); // id 0, len 0
        r
    })
    .await;
    for _ in 0..2 {
        let err = reader
            .read(&remote(&owner, 64), &dst.region, 0)
            .await
            .expect_err("rejected");
        assert!(
            matches!(err, TransferError::Protocol(m) if m.contains("rejected the request")),
            "{err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_mid_payload_is_peer_closed() {
    let listener = TcpListener::bind(LOCALHOST).await.expect("bind");
    let endpoint = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut req = [0u8; 48];
        s.read_exact(&mut req).await.expect("request");
        let mut r = response(&req, 0, requested_len(&req));
        r.extend(std::iter::repeat_n(0xab, 1000));
        s.write_all(&r).await.expect("write");
        // Dropping `s` closes the connection 1000 bytes into the payload.
    });
    let reader = transport().await;
    let dst = Mem::zeroed(&reader, 4096);
    let err = bounded(reader.read(&remote(&endpoint, 4096), &dst.region, 0))
        .await
        .expect_err("cut payload");
    assert!(matches!(err, TransferError::PeerClosed), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_gets_bad_request_then_close() {
    let owner = transport().await;
    let mut s = tokio::net::TcpStream::connect(owner.endpoint())
        .await
        .expect("connect");
    s.write_all(&[0x55; 48]).await.expect("write");
    let mut reply = Vec::new();
    bounded(s.read_to_end(&mut reply)).await.expect("read");
    assert_eq!(reply.len(), 24);
    assert_eq!(&reply[..6], b"STRP\x01\x06");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_transport_never_reports_partial_success() {
    let owner = transport().await;
    let reader = FaultyTransport::new(transport().await);
    let src = Mem::new(&owner, pattern(64 << 10, 8), None);
    let dst = Mem::zeroed(&reader, 64 << 10);
    let desc = owner
        .describe(&src.region, 0, 64 << 10, None)
        .expect("describe");

    reader.fail_next_reads(2);
    for _ in 0..2 {
        let err = reader
            .read(&desc, &dst.region, 0)
            .await
            .expect_err("injected");
        assert!(matches!(err, TransferError::Io(_)), "{err:?}");
    }
    assert!(dst.buf.iter().all(|&b| b == 0), "a failed read moved bytes");

    reader.cut_next_read_after(1000);
    let err = reader.read(&desc, &dst.region, 0).await.expect_err("cut");
    assert!(matches!(err, TransferError::PeerClosed), "{err:?}");
    // Exactly the bytes before the cut arrived; the caller got an error, so
    // a store must not keep any of them.
    assert_eq!(dst.buf[..1000], src.buf[..1000]);
    assert!(dst.buf[1000..].iter().all(|&b| b == 0));

    reader
        .read(&desc, &dst.region, 0)
        .await
        .expect("healthy again");
    assert!(dst.buf == src.buf);
    assert_eq!(reader.faults_injected(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_reads_in_flight() {
    let owner = transport().await;
    let reader = transport().await;
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        entered: entered_tx,
        release: std::sync::Mutex::new(release_rx),
    });
    let src = Mem::new(&owner, pattern(4096, 2), Some(gate));
    let dst = Arc::new(Mem::zeroed(&reader, 4096));
    let desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let read = {
        let (reader, dst) = (Arc::clone(&reader), Arc::clone(&dst));
        tokio::spawn(async move { reader.read(&desc, &dst.region, 0).await })
    };
    bounded(entered.recv()).await.expect("pinned");
    let Mem { region, buf } = src;
    let close = tokio::spawn(region.close());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !close.is_finished(),
        "close returned while a read was served"
    );
    release.send(()).expect("release");
    bounded(close).await.expect("close");
    bounded(read).await.expect("task").expect("read");
    assert!(dst.buf == buf);
}

/// Prints throughput; meaningful only with `--release`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throughput_report() {
    let run_for = if cfg!(debug_assertions) {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(2)
    };
    let (owner, reader) = (transport().await, transport().await);
    for size in [1usize << 20, 4 << 20] {
        for concurrency in [1usize, 4] {
            let src = Mem::new(&owner, pattern(size, 5), None);
            let dst = Arc::new(Mem::zeroed(&reader, size * concurrency));
            let desc = owner
                .describe(&src.region, 0, size as u64, None)
                .expect("describe");
            let started = Instant::now();
            let mut tasks = Vec::new();
            for i in 0..concurrency {
                let (reader, dst, desc) = (Arc::clone(&reader), Arc::clone(&dst), desc.clone());
                tasks.push(tokio::spawn(async move {
                    let mut bytes = 0u64;
                    while started.elapsed() < run_for {
                        reader
                            .read(&desc, &dst.region, (i * size) as u64)
                            .await
                            .expect("read");
                        bytes += size as u64;
                    }
                    bytes
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += bounded(t).await.expect("task");
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "tcp read {:>4} KiB x{concurrency}: {:.2} GB/s",
                size >> 10,
                total as f64 / secs / 1e9
            );
            assert!(dst.buf[..size] == src.buf[..]);
        }
    }
}

/// A batch of small reads to one peer goes out at once on one connection
/// (one round trip, not one per read): byte-exact, in place, and a read
/// the owner refuses mid-batch fails alone while the rest arrive and the
/// connection stays in the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_small_reads_is_pipelined_on_one_connection() {
    let (owner, reader) = (transport().await, transport().await);
    const N: usize = 64;
    const LEN: usize = 16 << 10;
    let src = Mem::new(&owner, pattern(N * LEN, 31), None);
    let dst = Mem::zeroed(&reader, N * LEN + 1);
    let mut descs: Vec<Descriptor> = (0..N)
        .map(|i| {
            owner
                .describe(&src.region, (i * LEN) as u64, LEN as u64, None)
                .expect("describe")
        })
        .collect();
    // Read 7 names a region the owner does not have.
    descs[7].rkey ^= 0xdead;
    // Into the destination in reverse order, one byte in.
    let ops: Vec<ReadOp<'_>> = descs
        .iter()
        .enumerate()
        .map(|(i, d)| ReadOp {
            src: d,
            dst: &dst.region,
            dst_offset: (1 + (N - 1 - i) * LEN) as u64,
        })
        .collect();
    let results = bounded(reader.read_many(&ops)).await;
    assert_eq!(results.len(), N);
    for (i, r) in results.iter().enumerate() {
        let at = 1 + (N - 1 - i) * LEN;
        if i == 7 {
            assert!(
                matches!(r, Err(TransferError::BadDescriptor(_))),
                "read 7: {r:?}"
            );
            assert!(
                dst.buf[at..at + LEN].iter().all(|&b| b == 0),
                "read 7 wrote"
            );
            continue;
        }
        r.as_ref().unwrap_or_else(|e| panic!("read {i}: {e}"));
        assert!(
            dst.buf[at..at + LEN] == src.buf[i * LEN..(i + 1) * LEN],
            "read {i}: wrong bytes"
        );
    }
    assert_eq!(dst.buf[0], 0, "nothing before the first destination");
    let stats = reader.stats();
    assert_eq!(
        stats.connections_opened.load(Ordering::Relaxed),
        1,
        "1 MiB of small reads: one pipelined connection"
    );
    // The connection went back to the pool: a second batch reuses it.
    let again = bounded(reader.read_many(&ops[..4])).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(stats.connections_opened.load(Ordering::Relaxed), 1);
    let want = (N - 1 + 4) as u64;
    assert_eq!(served_once(&owner, want).await, want);
}

/// Large reads are spread over several connections (one stream cannot
/// fill a fast link); reads to two peers in one batch each reach theirs;
/// a bad destination fails locally without sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_spreads_large_reads_and_reaches_every_peer() {
    let (a, b, reader) = (transport().await, transport().await, transport().await);
    const LEN: usize = 4 << 20;
    let src_a = Mem::new(&a, pattern(4 * LEN, 41), None);
    let src_b = Mem::new(&b, pattern(LEN, 42), None);
    let dst = Mem::zeroed(&reader, 5 * LEN);
    let mut descs: Vec<Descriptor> = (0..4)
        .map(|i| a.describe(&src_a.region, (i * LEN) as u64, LEN as u64, None))
        .chain([b.describe(&src_b.region, 0, LEN as u64, None)])
        .collect::<Result<_, _>>()
        .expect("describe");
    descs.push(descs[0].clone());
    let mut ops: Vec<ReadOp<'_>> = descs
        .iter()
        .enumerate()
        .map(|(i, d)| ReadOp {
            src: d,
            dst: &dst.region,
            dst_offset: (i * LEN) as u64,
        })
        .collect();
    // The last one would overrun the destination.
    ops[5].dst_offset = (5 * LEN - 1) as u64;
    let results = bounded(reader.read_many(&ops)).await;
    for (i, r) in results[..5].iter().enumerate() {
        r.as_ref().unwrap_or_else(|e| panic!("read {i}: {e}"));
    }
    assert!(
        matches!(results[5], Err(TransferError::BadDescriptor(_))),
        "{:?}",
        results[5]
    );
    assert!(dst.buf[..4 * LEN] == src_a.buf[..], "peer a's bytes");
    assert!(dst.buf[4 * LEN..] == src_b.buf[..], "peer b's bytes");
    let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
    assert!(
        (3..=1 + CONNS_PER_PEER_MAX as u64).contains(&opened),
        "16 MiB to one peer over several connections, 4 MiB to the other over one: {opened}"
    );
}

/// An owner that dies partway through a batch: the reads it answered
/// stand, the rest fail, nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_cut_partway_fails_the_rest() {
    // Answers the first request of each connection, then closes.
    let (endpoint, _task) = fake_owner_once().await;
    let reader = transport().await;
    let dst = Mem::zeroed(&reader, 3 * 100);
    let descs: Vec<Descriptor> = (0..3).map(|_| remote(&endpoint, 100)).collect();
    let ops: Vec<ReadOp<'_>> = descs
        .iter()
        .enumerate()
        .map(|(i, d)| ReadOp {
            src: d,
            dst: &dst.region,
            dst_offset: (i * 100) as u64,
        })
        .collect();
    let results = bounded(reader.read_many(&ops)).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(dst.buf[..100].iter().all(|&b| b == 0xab));
    for r in &results[1..] {
        assert!(matches!(r, Err(TransferError::PeerClosed)), "{r:?}");
    }
}

async fn fake_owner_once() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(LOCALHOST).await.expect("bind");
    let endpoint = listener.local_addr().expect("addr").to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut req = [0u8; 48];
            if s.read_exact(&mut req).await.is_ok() {
                let len = requested_len(&req);
                let mut reply = response(&req, 0, len);
                reply.extend(std::iter::repeat_n(0xab, len as usize));
                let _ = s.write_all(&reply).await;
            }
            // Dropped: the connection closes with the rest unanswered.
        }
    });
    (endpoint, task)
}

/// One large read goes over several connections (in sub-ranges the owner
/// checks one by one) and arrives byte for byte; a refusal of any part
/// fails the whole read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_read_is_split_over_connections() {
    let (owner, reader) = (transport().await, transport().await);
    const LEN: usize = 8 << 20;
    let src = Mem::new(&owner, pattern(LEN, 51), None);
    let dst = Mem::zeroed(&reader, LEN + 3);
    let desc = owner
        .describe(&src.region, 0, LEN as u64, None)
        .expect("describe");
    bounded(reader.read(&desc, &dst.region, 3))
        .await
        .expect("read");
    assert!(dst.buf[3..] == src.buf[..], "bytes");
    assert!(dst.buf[..3].iter().all(|&b| b == 0));
    let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
    assert!(opened >= 2, "one stream for 8 MiB: {opened}");
    // One byte past the region: the last piece is refused, so the read is.
    let over = Descriptor {
        len: LEN as u64 + 1,
        ..desc.clone()
    };
    let dst2 = Mem::zeroed(&reader, LEN + 1);
    let err = bounded(reader.read(&over, &dst2.region, 0))
        .await
        .expect_err("overrun");
    assert!(matches!(err, TransferError::BadDescriptor(_)), "{err:?}");
}

/// A read is split from twice `SPLIT_PIECE_BYTES_MIN` on: 1 MiB goes in two
/// pieces on two connections, a byte less in one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_starts_at_two_minimum_pieces() {
    let piece = SPLIT_PIECE_BYTES_MIN as usize;
    for (len, streams) in [(2 * piece - 1, 1), (2 * piece, 2), (4 * piece + 1, 4)] {
        let (owner, reader) = (transport().await, transport().await);
        let src = Mem::new(&owner, pattern(len, 53), None);
        let dst = Mem::zeroed(&reader, len);
        let desc = owner
            .describe(&src.region, 0, len as u64, None)
            .expect("describe");
        bounded(reader.read(&desc, &dst.region, 0))
            .await
            .expect("read");
        assert!(dst.buf == src.buf, "{len} bytes");
        let served = served_once(&owner, streams).await;
        assert_eq!(served, streams, "pieces of a {len}-byte read");
        let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
        assert_eq!(opened, streams, "connections for a {len}-byte read");
    }
}

/// Many batches at once from one reader to one owner, each wanting every
/// connection of the pool: they share the pool without deadlock (a round
/// holding connections never waits for more) and every byte arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_share_the_pool_without_deadlock() {
    let (owner, reader) = (transport().await, transport().await);
    const LEN: usize = 1 << 20;
    const PER: usize = 8;
    const TASKS: usize = 12;
    let src = Arc::new(Mem::new(&owner, pattern(PER * LEN, 61), None));
    let descs: Arc<Vec<Descriptor>> = Arc::new(
        (0..PER)
            .map(|i| {
                owner
                    .describe(&src.region, (i * LEN) as u64, LEN as u64, None)
                    .expect("describe")
            })
            .collect(),
    );
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (reader, descs, src) = (reader.clone(), descs.clone(), src.clone());
            tokio::spawn(async move {
                let dst = Mem::zeroed(&reader, PER * LEN);
                let ops: Vec<ReadOp<'_>> = descs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| ReadOp {
                        src: d,
                        dst: &dst.region,
                        dst_offset: (i * LEN) as u64,
                    })
                    .collect();
                let results = reader.read_many(&ops).await;
                drop(ops);
                assert!(results.iter().all(Result::is_ok), "{results:?}");
                assert!(dst.buf == src.buf, "bytes");
            })
        })
        .collect();
    for t in tasks {
        bounded(t).await.expect("task");
    }
    let opened = reader.stats().connections_opened.load(Ordering::Relaxed);
    assert!(opened <= CONNS_PER_PEER_MAX as u64, "pool bound: {opened}");
}
