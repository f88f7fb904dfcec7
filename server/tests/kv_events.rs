//! KV events against the real binary: a ZMQ SUB of this process follows a
//! node's publisher while SET, MSET, PUT, DEL, eviction and FLUSHALL run,
//! and keeps the index a router would (block → media); every batch is
//! numbered one more than the last; the replay socket serves what was
//! sent; a full queue drops and counts; bad endpoints are refused at
//! start. vLLM's own decoder reading this stream is
//! python/tests/vllm/test_vllm_kv_events.py.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use strata_rdma::tcp::TcpTransport;
use strata_rdma::Transport;
use strata_tests::{run_to_exit, server_command, Server};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Longest wait for one batch the test expects.
const WAIT: Duration = Duration::from_secs(10);

/// A key as the vLLM connector writes it, for block `n` (the block hash
/// routers get is the digest's last 8 bytes: `n`).
fn key(n: u64, layer: u32) -> String {
    format!(
        "vllm:m:tp0of1:bfloat16.8x128:{:048x}{n:016x}:layer.{layer}",
        0xabcu64
    )
}

/// `tcp://...` as INFO shows it, with this host's loopback for a wildcard.
fn info_endpoint(server: &Server, field: &str) -> String {
    let info = server.info();
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO has no {field}:\n{info}"));
    line.trim().replace("0.0.0.0", "127.0.0.1")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a router knows: each block's media, as the events say.
#[derive(Default)]
struct Follower {
    blocks: BTreeMap<u64, BTreeSet<String>>,
    /// Every block any event named.
    seen: BTreeSet<u64>,
    last_seq: Option<u64>,
    /// seq → payload, as received.
    payloads: BTreeMap<u64, Bytes>,
    cleared: u32,
}

impl Follower {
    /// Applies one message; panics on a malformed one or a gap in seq.
    fn apply(&mut self, m: ZmqMessage, topic: &[u8]) {
        let frames = m.into_vec();
        assert_eq!(frames.len(), 3, "[topic, seq, payload]");
        assert_eq!(&frames[0][..], topic);
        let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8-byte seq"));
        if let Some(last) = self.last_seq {
            assert_eq!(seq, last + 1, "batches are numbered one by one");
        }
        self.last_seq = Some(seq);
        self.payloads.insert(seq, frames[2].clone());
        let batch: Value = rmp_serde::from_slice(&frames[2]).expect("msgpack");
        let batch = batch.as_array().expect("[ts, events, dp_rank]");
        assert_eq!(batch.len(), 3);
        assert!(batch[0].as_f64().unwrap() > 1.7e9, "ts is Unix seconds");
        assert_eq!(batch[2], 0);
        for e in batch[1].as_array().unwrap() {
            self.event(e);
        }
    }

    fn event(&mut self, e: &Value) {
        let hashes = || -> Vec<u64> {
            e["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_u64().unwrap())
                .collect()
        };
        let medium = || e["medium"].as_str().unwrap().to_string();
        match e["type"].as_str().unwrap() {
            "BlockStored" => {
                assert_eq!(e["block_size"], 16);
                assert_eq!(e["token_ids"], serde_json::json!([]));
                assert!(e["parent_block_hash"].is_null() && e["lora_id"].is_null());
                for h in hashes() {
                    self.seen.insert(h);
                    self.blocks.entry(h).or_default().insert(medium());
                }
            }
            "BlockRemoved" => {
                for h in hashes() {
                    self.seen.insert(h);
                    if let Some(m) = self.blocks.get_mut(&h) {
                        m.remove(&medium());
                        if m.is_empty() {
                            self.blocks.remove(&h);
                        }
                    }
                }
            }
            "AllBlocksCleared" => {
                self.blocks.clear();
                self.cleared += 1;
            }
            other => panic!("unknown event {other}: {e}"),
        }
    }

    fn in_cpu(&self, h: u64) -> bool {
        self.blocks.get(&h).is_some_and(|m| m.contains("CPU"))
    }
}

/// Receives batches until `done` holds; panics after [`WAIT`].
async fn follow(
    sub: &mut SubSocket,
    f: &mut Follower,
    topic: &[u8],
    what: &str,
    done: impl Fn(&Follower) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !done(f) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sub.recv()).await {
            Ok(m) => f.apply(m.expect("recv"), topic),
            Err(_) => panic!(
                "no events for {what} within {WAIT:?}; index: {:?}",
                f.blocks
            ),
        }
    }
}

/// Writes block `probe` until its first event arrives: a SUB's
/// subscription reaches the PUB a moment after it connects.
async fn join(sub: &mut SubSocket, f: &mut Follower, c: &mut redis::Connection, probe: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let _: () = redis::cmd("SET")
            .arg(key(probe, 0))
            .arg("x")
            .query(c)
            .unwrap();
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            f.apply(m.expect("recv"), b"");
            return;
        }
        assert!(Instant::now() < deadline, "the publisher sent nothing");
    }
}

#[test]
fn events_follow_writes_deletes_evictions_and_flushall() {
    let node = Server::start(&[
        "--kv-events-endpoint",
        "tcp://*:0",
        "--kv-events-replay-endpoint",
        "tcp://127.0.0.1:0",
        "--cpu-memory-pool-size",
        "4MiB",
    ]);
    let endpoint = info_endpoint(&node, "kv_events_endpoint");
    let replay = info_endpoint(&node, "kv_events_replay_endpoint");
    let mut c = node.client(false);
    runtime().block_on(async {
        let mut sub = SubSocket::new();
        sub.connect(&endpoint).await.unwrap();
        sub.subscribe("").await.unwrap();
        let mut f = Follower::default();
        join(&mut sub, &mut f, &mut c, 1).await;

        // Keys not in an adapter's format have no events; a block of
        // four layer keys is one block.
        let upper = key(2, 0).to_uppercase();
        let _: () = redis::cmd("SET")
            .arg("plain")
            .arg("x")
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(&upper)
            .arg("x")
            .query(&mut c)
            .unwrap();
        let mut mset = redis::cmd("MSET");
        for layer in 0..4 {
            mset.arg(key(3, layer)).arg("x");
        }
        let _: () = mset.query(&mut c).unwrap();
        follow(&mut sub, &mut f, b"", "MSET", |f| f.in_cpu(3)).await;

        // A zero-copy PUT.
        let t = TcpTransport::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let mut mem = vec![7u8; 4096];
        // SAFETY: `mem` outlives the region (dropped at the end of this
        // block, after the PUT has been answered) and is not reallocated.
        let region = unsafe { t.register(mem.as_mut_ptr() as u64, 4096, None) }.unwrap();
        let desc = t.describe(&region, 0, 4096, None).unwrap().to_string();
        let ok: String = redis::cmd("PUT")
            .arg(key(4, 0))
            .arg(desc)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
        follow(&mut sub, &mut f, b"", "PUT", |f| f.in_cpu(4)).await;

        // DEL of one layer: the block can no longer be loaded whole.
        let n: i64 = redis::cmd("DEL").arg(key(3, 2)).query(&mut c).unwrap();
        assert_eq!(n, 1);
        follow(&mut sub, &mut f, b"", "DEL", |f| !f.blocks.contains_key(&3)).await;

        // Eviction: 40 blocks of 256 KiB into a 4 MiB arena.
        let value = vec![1u8; 256 << 10];
        for n in 100..140 {
            let _: () = redis::cmd("SET")
                .arg(key(n, 0))
                .arg(&value[..])
                .query(&mut c)
                .unwrap();
        }
        assert!(node.info_field("evicted_keys") > 0);
        let held = |c: &mut redis::Connection| -> BTreeSet<u64> {
            // Block 3 lost a layer: whatever is left of it is not a block.
            [1, 4]
                .into_iter()
                .chain(100..140)
                .filter(|&n| redis::cmd("EXISTS").arg(key(n, 0)).query::<i64>(c).unwrap() == 1)
                .collect()
        };
        let expect = held(&mut c);
        assert!(expect.len() < 40, "something was evicted");
        follow(&mut sub, &mut f, b"", "eviction", |f| {
            f.blocks.keys().copied().collect::<BTreeSet<_>>() == expect
        })
        .await;
        assert!(f.blocks.values().all(|m| m.len() == 1 && m.contains("CPU")));

        // FLUSHALL.
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        follow(&mut sub, &mut f, b"", "FLUSHALL", |f| f.cleared == 1).await;
        assert!(f.blocks.is_empty());
        let want: BTreeSet<u64> = [1, 3, 4].into_iter().chain(100..140).collect();
        assert_eq!(f.seen, want, "only adapter keys have events");

        // The figures agree with what arrived.
        let last = f.last_seq.unwrap();
        assert_eq!(node.info_field("kv_events_batches"), last + 1);
        assert_eq!(node.info_field("kv_events_cleared"), 1);
        assert_eq!(node.info_field("kv_events_dropped"), 0);
        assert_eq!(
            node.metric("strata_kv_events_total{type=\"AllBlocksCleared\"}"),
            1.0
        );
        assert_eq!(
            node.metric("strata_kv_event_batches_total"),
            (last + 1) as f64
        );

        // Replay from 0: every batch, numbered from 0, the same bytes as
        // the live stream, then the end marker.
        let mut dealer = DealerSocket::new();
        dealer.connect(&replay).await.unwrap();
        let replayed = replay_from(&mut dealer, 0).await;
        let seqs: Vec<u64> = replayed.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (0..=last).collect::<Vec<_>>());
        for (seq, payload) in &replayed {
            if let Some(live) = f.payloads.get(seq) {
                assert_eq!(live, payload, "seq {seq}");
            }
        }
        let tail = replay_from(&mut dealer, last).await;
        assert_eq!(tail.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [last]);
        assert!(replay_from(&mut dealer, last + 1).await.is_empty());
        assert_eq!(node.info_field("kv_events_replays"), 3);
    });
}

/// vLLM's replay request: `["", start]`; the answer is `["", topic, seq,
/// payload]` per kept batch, then `["", "", -1, ""]`.
async fn replay_from(dealer: &mut DealerSocket, start: u64) -> Vec<(u64, Bytes)> {
    let mut req = ZmqMessage::from(Bytes::new());
    req.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
    dealer.send(req).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(WAIT, dealer.recv())
            .await
            .expect("replay answers")
            .unwrap()
            .into_vec();
        assert_eq!(m.len(), 4, "[\"\", topic, seq, payload]");
        assert!(m[0].is_empty());
        if m[2][..] == [0xff; 8] {
            assert!(m[1].is_empty() && m[3].is_empty());
            return out;
        }
        out.push((
            u64::from_be_bytes(m[2][..].try_into().unwrap()),
            m[3].clone(),
        ));
    }
}

#[test]
fn a_full_queue_drops_and_counts() {
    // One runtime thread: the publisher cannot drain while MSET runs, so
    // all but the first change of a one-slot queue are dropped.
    let node = Server::start(&[
        "--kv-events-endpoint",
        "tcp://*:0",
        "--kv-events-queue",
        "1",
        "--worker-threads",
        "1",
    ]);
    let mut c = node.client(false);
    let mut mset = redis::cmd("MSET");
    for n in 0..200 {
        mset.arg(key(n, 0)).arg("x");
    }
    let _: () = mset.query(&mut c).unwrap();
    let dropped = node.info_field("kv_events_dropped");
    assert!(dropped >= 150, "dropped {dropped} of 200");
    assert_eq!(
        node.metric("strata_kv_events_dropped_total"),
        dropped as f64
    );
    // What got through was published.
    assert!(strata_tests::wait_until(strata_tests::within(WAIT), || {
        node.info_field("kv_events_stored") == 200 - dropped
    }));
}

#[test]
fn a_node_connects_to_a_router_that_binds_and_names_its_topic() {
    runtime().block_on(async {
        let mut sub = SubSocket::new();
        let bound = sub.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        sub.subscribe("kv@").await.unwrap();
        let node = Server::start(&[
            "--kv-events-endpoint",
            &bound,
            "--kv-events-topic",
            "kv@node-a@m",
        ]);
        let mut c = node.client(false);
        let mut f = Follower::default();
        let topic = b"kv@node-a@m";
        // The node connects in the background: write until it is heard.
        let deadline = Instant::now() + WAIT;
        while f.last_seq.is_none() {
            let _: () = redis::cmd("SET")
                .arg(key(9, 0))
                .arg("x")
                .query(&mut c)
                .unwrap();
            if let Ok(m) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
                f.apply(m.unwrap(), topic);
            }
            assert!(Instant::now() < deadline, "the node never connected");
        }
        assert!(f.in_cpu(9));
        assert_eq!(info_endpoint(&node, "kv_events_endpoint"), bound);
    });
}

fn refused(args: &[&str]) -> String {
    let port = strata_tests::free_port().to_string();
    let mut cmd = server_command();
    cmd.args(["--port", &port, "--data-port", "0", "--metrics-port", "0"])
        .args(args);
    let exit = run_to_exit(cmd);
    assert!(!exit.status.success(), "started with {args:?}");
    exit.stderr
}

#[test]
fn bad_endpoints_are_refused_with_the_key_named() {
    let e = refused(&["--kv-events-endpoint", "udp://*:5557"]);
    assert!(
        e.contains("kv_events_endpoint: \"udp://*:5557\" is not a ZMQ TCP endpoint"),
        "{e}"
    );
    let e = refused(&["--kv-events-endpoint", "tcp://router:0"]);
    assert!(e.contains("port 0 needs a wildcard host"), "{e}");
    let e = refused(&["--kv-events-replay-endpoint", "tcp://*:5558"]);
    assert!(
        e.contains("kv_events_replay_endpoint: set, but kv_events_endpoint is empty"),
        "{e}"
    );
    let e = refused(&["--kv-events-queue", "0"]);
    assert!(e.contains("kv_events_queue: 0 is out of range"), "{e}");
    // A port another process holds: the node does not start.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = format!("tcp://127.0.0.1:{}", taken.local_addr().unwrap().port());
    let e = refused(&[
        "--kv-events-endpoint",
        "tcp://*:0",
        "--kv-events-replay-endpoint",
        &at,
    ]);
    assert!(
        e.contains(&format!("kv_events_replay_endpoint: cannot bind {at}")),
        "{e}"
    );
}
