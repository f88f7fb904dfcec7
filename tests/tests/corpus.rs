//! Replays the checked-in bad-input corpus (`tests/corpus/bad_input/`,
//! manifest `cases.txt`) against one live node while a well-behaved client
//! keeps writing and verifying in another thread: every case must get its
//! clear error, cost at most its own connection, and leave the node's
//! memory where it was. Also a slowloris sender, which must not slow
//! anyone else down.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_tests::{info_value, parse_reply, wait_until, within, RawConn, Resp, Server};

const PASSWORD: &str = "corpus-pass";
/// The replay node: limits small enough that the oversize cases stay small
/// files (a request over `max_request_size` is a header, not 16 MiB).
const NODE_ARGS: &[&str] = &[
    "--cpu-memory-pool-size",
    "256MiB",
    "--max-value-size",
    "16MiB",
    "--max-request-size",
    "16MiB",
    "--requirepass",
    PASSWORD,
];
/// Passes over the corpus; the first one is the warm-up after which RSS is
/// measured.
const ROUNDS: usize = 3;
/// RSS may grow this much over the warm-up value (allocator slack).
const RSS_SLACK_BYTES: u64 = 32 << 20;
/// How long a connection that must stay open is watched for a close.
const STAYS_OPEN_WATCH: Duration = Duration::from_millis(300);
const MIB: u64 = 1 << 20;

/// What the remainder of a refused request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Nothing is owed: the next request can follow at once.
    None,
    /// This many bytes are owed and are sent before the next request.
    Bytes(usize),
    /// More is owed than is worth sending; only check it stays open.
    Endless,
}

#[derive(Debug)]
struct Case {
    name: String,
    bytes: Vec<u8>,
    close: bool,
    auth: bool,
    tail: Tail,
    prefix: String,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/bad_input")
}

/// Parses `cases.txt` and reads every case file; panics on a file the
/// manifest does not list or a listed file that is missing.
fn load_corpus() -> Vec<Case> {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("cases.txt")).expect("cases.txt");
    let cases: Vec<Case> = manifest
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|line| parse_case(&dir, line))
        .collect();
    let mut listed: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    listed.sort_unstable();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n != "cases.txt")
        .collect();
    files.sort_unstable();
    assert_eq!(listed, files, "cases.txt and the corpus files disagree");
    cases
}

fn parse_case(dir: &Path, line: &str) -> Case {
    let mut words = line.splitn(2, ' ');
    let name = words.next().expect("file name").to_string();
    let mut rest = words.next().unwrap_or_else(|| panic!("bad line {line:?}"));
    let mut case = Case {
        bytes: std::fs::read(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}")),
        name,
        close: false,
        auth: true,
        tail: Tail::None,
        prefix: String::new(),
    };
    while !rest.starts_with('-') {
        let (word, more) = rest
            .split_once(' ')
            .unwrap_or_else(|| panic!("no reply prefix in {line:?}"));
        match word {
            "close" => case.close = true,
            "open" => case.close = false,
            "auth=no" => case.auth = false,
            "tail=-" => case.tail = Tail::Endless,
            w => match w.strip_prefix("tail=").and_then(|n| n.parse().ok()) {
                Some(n) => case.tail = Tail::Bytes(n),
                None => panic!("unknown option {w:?} in {line:?}"),
            },
        }
        rest = more;
    }
    case.prefix = rest.to_string();
    case
}

/// A connection to the node that has authenticated.
fn authed(server: &Server) -> RawConn {
    let mut c = server.conn();
    assert_eq!(c.request(&[b"AUTH", PASSWORD.as_bytes()]), b"+OK\r\n");
    c
}

fn info_field(server: &Server, field: &str) -> u64 {
    let reply = authed(server).request(&[b"INFO", b"everything"]);
    let text = match parse_reply(&reply) {
        Resp::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("INFO: {other:?}"),
    };
    info_value(&text, field).unwrap_or_else(|| panic!("INFO has no {field}:\n{text}"))
}

/// Values for the placeholders of the descriptor cases: the node's
/// data-plane endpoint, its arena's rkey and the address of a value in it,
/// read from the source descriptor of a zero-copy GET (then released and
/// deleted, so that the node holds nothing of ours).
fn placeholders(server: &Server) -> Vec<(&'static str, String)> {
    let mut c = authed(server);
    assert_eq!(
        c.request(&[b"SET", b"corpus:probe", b"0123456789"]),
        b"+OK\r\n"
    );
    let reply = c.request(&[
        b"GET",
        b"corpus:probe",
        b"tcp://127.0.0.1:1/1000+64#00000000",
    ]);
    let items = parse_reply(&reply);
    let items = items.as_array();
    let desc = items[0].as_text();
    // tcp://<endpoint>/<addr>+<len>#<rkey>@<epoch>
    let rest = desc.strip_prefix("tcp://").expect("tcp descriptor");
    let (endpoint, rest) = rest.split_once('/').expect("endpoint");
    let (addr, rest) = rest.split_once('+').expect("addr");
    let (_, rest) = rest.split_once('#').expect("rkey");
    let rkey = rest.split('@').next().expect("rkey");
    let lease = items[1].as_int().to_string();
    assert_eq!(c.request(&[b"RELEASE", lease.as_bytes()]), b":1\r\n");
    assert_eq!(c.request(&[b"DEL", b"corpus:probe"]), b":1\r\n");
    vec![
        ("@DATA@", endpoint.to_string()),
        ("@RKEY@", rkey.to_string()),
        ("@ADDR@", addr.to_string()),
    ]
}

fn substitute(bytes: &[u8], vars: &[(&str, String)]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for (name, value) in vars {
        while let Some(at) = out.windows(name.len()).position(|w| w == name.as_bytes()) {
            out.splice(at..at + name.len(), value.bytes());
        }
    }
    out
}

/// Sends one case on a fresh connection and checks the reply and what
/// becomes of the connection; a description of what went wrong, if
/// anything did.
fn replay(server: &Server, case: &Case, vars: &[(&str, String)]) -> Result<(), String> {
    let mut c = if case.auth {
        authed(server)
    } else {
        server.conn()
    };
    // The node may answer and close before it has read everything (a
    // protocol error); that is what the reply says, not a failure here.
    let _ = c.stream().write_all(&substitute(&case.bytes, vars));
    let reply = match c.try_read_reply() {
        Ok(Some(r)) => String::from_utf8_lossy(&r).into_owned(),
        other => return Err(format!("no reply: {other:?}")),
    };
    if !reply.starts_with(&case.prefix) {
        return Err(format!("reply {reply:?}, want {:?}", case.prefix));
    }
    if case.close {
        return match c.try_read_reply() {
            Ok(None) => Ok(()),
            other => Err(format!("connection not closed after {reply:?}: {other:?}")),
        };
    }
    match case.tail {
        Tail::Endless => {
            c.set_read_timeout(STAYS_OPEN_WATCH);
            return match c.try_read_reply() {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    Ok(())
                }
                other => Err(format!("connection not left open: {other:?}")),
            };
        }
        Tail::Bytes(n) => {
            let mut filler = vec![b'x'; n - 2];
            filler.extend_from_slice(b"\r\n");
            c.stream()
                .write_all(&filler)
                .map_err(|e| format!("sending the owed {n} bytes: {e}"))?;
        }
        Tail::None => {}
    }
    match c.try_request(&[b"PING"]) {
        Ok(r) if r == b"+PONG\r\n" => Ok(()),
        other => Err(format!("connection unusable after {reply:?}: {other:?}")),
    }
}

/// A client that keeps writing and verifying its own keys until stopped;
/// any error or wrong byte is counted.
struct WellBehaved {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    handle: JoinHandle<Vec<String>>,
}

const WELL_BEHAVED_KEYS: usize = 64;

impl WellBehaved {
    fn start(server: &Server) -> WellBehaved {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let mut c = authed(server);
        let (s, o) = (stop.clone(), ops.clone());
        let handle = std::thread::spawn(move || {
            let mut errors = Vec::new();
            let mut i = 0usize;
            while !s.load(Relaxed) {
                let key = format!("good:{}", i % WELL_BEHAVED_KEYS).into_bytes();
                let value = format!("value {i}\r\n\0\u{ff}").into_bytes();
                match c.try_request(&[b"SET", &key, &value]) {
                    Ok(r) if r == b"+OK\r\n" => {}
                    other => errors.push(format!("SET #{i}: {other:?}")),
                }
                match c.try_request(&[b"GET", &key]) {
                    Ok(r) if parse_reply(&r) == Resp::Bulk(value) => {}
                    other => errors.push(format!("GET #{i}: {other:?}")),
                }
                o.fetch_add(2, Relaxed);
                i += 1;
            }
            let keys: Vec<Vec<u8>> = (0..WELL_BEHAVED_KEYS)
                .map(|k| format!("good:{k}").into_bytes())
                .collect();
            let mut del: Vec<&[u8]> = vec![b"DEL"];
            del.extend(keys.iter().map(Vec::as_slice));
            if let Err(e) = c.try_request(&del) {
                errors.push(format!("DEL: {e}"));
            }
            errors
        });
        WellBehaved { stop, ops, handle }
    }

    /// Stops it; (operations done, errors seen).
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Relaxed);
        let errors = self.handle.join().expect("well-behaved client");
        (self.ops.load(Relaxed), errors)
    }
}

#[test]
fn every_corpus_case_gets_its_error_and_harms_nobody_else() {
    let cases = load_corpus();
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    let mut server = Server::start(NODE_ARGS);
    let dram_start = info_field(&server, "dram_used_bytes");
    let vars = placeholders(&server);
    let good = WellBehaved::start(&server);

    let mut rss_warm = 0;
    let started = Instant::now();
    for round in 0..ROUNDS {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|case| {
                replay(&server, case, &vars)
                    .err()
                    .map(|e| format!("{}: {e}", case.name))
            })
            .collect();
        assert!(
            failures.is_empty(),
            "round {round}: {} of {} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
        assert!(server.is_alive(), "node died:\n{}", server.stderr());
        if round == 0 {
            rss_warm = server.rss_bytes();
        }
    }
    let (ops, errors) = good.stop();
    assert!(errors.is_empty(), "the well-behaved client saw: {errors:?}");
    assert!(ops > 0, "the well-behaved client did nothing");

    let mut dram_end = 0;
    let back = wait_until(within(Duration::from_secs(10)), || {
        dram_end = info_field(&server, "dram_used_bytes");
        dram_end == dram_start
    });
    assert!(back, "dram_used_bytes {dram_end}, was {dram_start}");
    let rss_end = server.rss_bytes();
    println!(
        "corpus: {} cases x {ROUNDS} rounds in {:.1}s; well-behaved client did {ops} ops, 0 \
         errors; RSS after warm-up {} MiB, at the end {} MiB; dram_used_bytes {dram_start} -> \
         {dram_end}",
        cases.len(),
        started.elapsed().as_secs_f64(),
        rss_warm / MIB,
        rss_end / MIB
    );
    assert!(
        rss_end <= rss_warm + RSS_SLACK_BYTES,
        "RSS grew from {rss_warm} to {rss_end} bytes"
    );
    assert!(server.is_alive());
}

/// The slow sender: a SET header, then its 20-byte value at one byte per
/// 100 ms.
const SLOW_VALUE: &[u8] = b"slow-but-steady-0123";
const SLOW_BYTE_INTERVAL: Duration = Duration::from_millis(100);
/// Latency every other client must keep while the slow one trickles.
const P99_LIMIT: Duration = Duration::from_millis(100);
const FAST_CLIENTS: usize = 3;

#[test]
fn slowloris_does_not_slow_down_other_clients() {
    let server = Server::start(&[]);
    let trickling = Arc::new(AtomicBool::new(true));
    let fast: Vec<JoinHandle<Vec<Duration>>> = (0..FAST_CLIENTS)
        .map(|t| {
            let mut c = server.conn();
            let trickling = trickling.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let key = format!("fast:{t}").into_bytes();
                let mut i = 0u64;
                while trickling.load(Relaxed) {
                    let value = i.to_string().into_bytes();
                    let t0 = Instant::now();
                    assert_eq!(c.request(&[b"SET", &key, &value]), b"+OK\r\n");
                    latencies.push(t0.elapsed());
                    let t0 = Instant::now();
                    assert_eq!(parse_reply(&c.request(&[b"GET", &key])), Resp::Bulk(value));
                    latencies.push(t0.elapsed());
                    i += 1;
                    // A steady client, not a flood: the point is others' latency.
                    std::thread::sleep(Duration::from_millis(2));
                }
                latencies
            })
        })
        .collect();

    let mut slow = server.conn();
    let header = format!(
        "*3\r\n$3\r\nSET\r\n$9\r\nslowloris\r\n${}\r\n",
        SLOW_VALUE.len()
    );
    slow.send(header.as_bytes());
    let trickle_start = Instant::now();
    for &b in SLOW_VALUE {
        std::thread::sleep(SLOW_BYTE_INTERVAL);
        slow.send(&[b]);
    }
    let trickle_s = trickle_start.elapsed().as_secs_f64();
    trickling.store(false, Relaxed);
    slow.send(b"\r\n");
    assert_eq!(slow.read_reply(), b"+OK\r\n");
    assert_eq!(
        parse_reply(&slow.request(&[b"GET", b"slowloris"])),
        Resp::Bulk(SLOW_VALUE.to_vec())
    );

    let mut all: Vec<Duration> = fast
        .into_iter()
        .flat_map(|h| h.join().expect("fast client"))
        .collect();
    all.sort_unstable();
    let p99 = all[all.len() * 99 / 100];
    let max = all[all.len() - 1];
    println!(
        "slowloris: {:.1}s of trickling; others did {} requests, p99 {:.2} ms, max {:.2} ms",
        trickle_s,
        all.len(),
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    assert!(all.len() > 100, "others were barely served: {}", all.len());
    assert!(p99 < P99_LIMIT, "others' p99 {p99:?} during the slowloris");
}
