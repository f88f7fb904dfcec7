//! Cross-memory attach between a client and a node on this host, against
//! the real binary: byte-exact round trips with no network data-plane
//! read, batches, leases that end before RELEASE, a client process that
//! dies before the node reads it, a client of another user, and either
//! side turning it off.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{info_field, pattern, round_trip, Node};
use strata_client::{Client, ClientConfig};
use strata_rdma::cma::{CmaReader, Identity};
use strata_rdma::Descriptor;

const MIB: usize = 1 << 20;

/// Sizes from 1 byte to 64 MiB, one at a time and in batches: every byte
/// right, the node's PUT reads all by CMA, and no GET read over TCP.
#[tokio::test]
async fn round_trips_go_by_cma_byte_exact() {
    let node = Node::start(&["--cpu-memory-pool-size", "512MiB"]);
    let c = node.client().await;
    let sizes = [1, 100, 4096, 65536, MIB, 4 * MIB + 3, 64 * MIB];
    for len in sizes {
        round_trip(&c, &format!("cma-{len}"), len).await;
    }
    // Batches: one MPUT, pipelined GETs.
    let bufs: Vec<_> = (0..32)
        .map(|i| {
            let mut b = c.alloc(65536).expect("alloc");
            b.as_mut_slice()
                .copy_from_slice(&pattern(format!("b{i}").as_bytes(), 65536));
            b
        })
        .collect();
    let items: Vec<_> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| (format!("b{i}"), b, 0..65536))
        .collect();
    for r in c.put_many(&items).await {
        r.expect("put_many");
    }
    let mut dsts: Vec<_> = (0..32).map(|_| c.alloc(65536).expect("alloc")).collect();
    let mut gets: Vec<_> = dsts
        .iter_mut()
        .enumerate()
        .map(|(i, b)| (format!("b{i}"), b, 0))
        .collect();
    for (i, r) in c.get_many(&mut gets).await.into_iter().enumerate() {
        assert_eq!(r.expect("get_many"), 65536);
        assert!(gets[i].1.as_slice() == &pattern(format!("b{i}").as_bytes(), 65536)[..]);
    }
    assert_eq!(info_field(&c, "stats", "cma_enabled").await, 1);
    assert!(info_field(&c, "stats", "cma_sessions").await >= 1);
    let reads = info_field(&c, "stats", "cma_reads").await;
    assert!(reads >= (sizes.len() + 32) as u64, "{reads} CMA reads");
    assert_eq!(
        info_field(&c, "stats", "data_reads_served").await,
        0,
        "a GET read over TCP"
    );
    assert_eq!(info_field(&c, "stats", "cma_read_errors").await, 0);
    // The client counts its own GET copies, which the node cannot see
    // (plus the 16-byte probe it reads from the node per connection).
    // Values up to the inline limit came back in the GET reply instead.
    let own = c.cma_stats().expect("this process can use CMA");
    let by_cma: Vec<u64> = sizes
        .iter()
        .map(|&l| l as u64)
        .chain([65536; 32])
        .filter(|&l| l > strata_client::ONE_SIDED_INLINE_GET_MAX)
        .collect();
    assert_eq!(by_cma.len(), 3, "the large ones: {by_cma:?}");
    let got: u64 = by_cma.iter().sum();
    let own_reads = own.reads.load(std::sync::atomic::Ordering::Relaxed);
    let probes = own_reads - by_cma.len() as u64;
    assert!((1..=8).contains(&probes), "{own_reads} reads");
    assert_eq!(
        own.bytes.load(std::sync::atomic::Ordering::Relaxed),
        got + 16 * probes
    );
    assert_eq!(own.errors.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(
        node.metric("strata_cma_reads_total"),
        reads as f64,
        "/metrics and INFO agree"
    );
    assert_eq!(
        c.data_plane_stats()
            .connections_accepted
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the node dialled the client's TCP data plane"
    );
}

/// `cma: off` on the node, or `cma: false` in the client: the network data
/// plane, with the same bytes (a value over the SDK's inline limits, since
/// over TCP smaller ones travel with the command).
#[tokio::test]
async fn off_on_either_side_uses_the_network() {
    let len = strata_client::DEFAULT_INLINE_GET_MAX.max(strata_client::DEFAULT_INLINE_PUT_MAX)
        as usize
        + MIB;
    let node = Node::start(&["--cma", "off"]);
    let c = node.client().await;
    round_trip(&c, "off-node", len).await;
    assert_eq!(info_field(&c, "stats", "cma_enabled").await, 0);
    assert!(info_field(&c, "stats", "data_reads_served").await >= 1);

    let node = Node::start(&[]);
    let c = node.network_client().await;
    round_trip(&c, "off-client", len).await;
    assert_eq!(info_field(&c, "stats", "cma_sessions").await, 0);
    assert!(info_field(&c, "stats", "data_reads_served").await >= 1);
}

/// A plain RESP connection to the node at `addr`.
fn connection(addr: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// A raw RESP connection that has proven this process to the node.
struct Raw {
    con: redis::Connection,
    node_pid: u32,
}

fn prove(port: u16) -> Raw {
    let mut con = connection(&format!("127.0.0.1:{port}"));
    let hello: Vec<redis::Value> = redis::cmd("STRATA.CMA")
        .arg("HELLO")
        .query(&mut con)
        .unwrap();
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        redis::Value::SimpleString(s) => s.clone(),
        other => panic!("{other:?}"),
    };
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => *n,
        other => panic!("{other:?}"),
    };
    assert_eq!(hello.len(), 9, "{hello:?}");
    assert!(int(&hello[8]) > 0, "lease_ttl_ms");
    let nonce_hex = text(&hello[7]);
    let nonce: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&nonce_hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let me = Identity::current().unwrap();
    let proof = nonce.clone();
    let ok: String = redis::cmd("STRATA.CMA")
        .arg("PROVE")
        .arg(me.pid)
        .arg(me.start)
        .arg(format!("{:x}", proof.as_ptr() as u64))
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    drop(proof);
    Raw {
        con,
        node_pid: int(&hello[3]) as u32,
    }
}

/// A lease that ended before the client's RELEASE (its TTL ran out while
/// the client was reading) counts 0: the client must not trust the bytes
/// (the Rust client answers STALE and reads again). One still live counts
/// 1, and its bytes are the value's as of the GET, even when the key was
/// overwritten meanwhile (the lease pins them).
#[tokio::test]
async fn leases_are_confirmed_by_release() {
    let node = Node::start(&["--lease-ttl-ms", "300"]);
    let mut raw = prove(node.port);
    let old = pattern(b"lk", 8192);
    let _: () = redis::cmd("SET")
        .arg("lk")
        .arg(&old)
        .query(&mut raw.con)
        .unwrap();
    let me = Identity::current().unwrap();
    let mut dst = vec![0u8; 8192];
    let dst_desc = strata_rdma::cma::describe(&me, dst.as_mut_ptr() as u64, 8192, 0, None);
    let get = |con: &mut redis::Connection| -> (Descriptor, i64) {
        let (src, lease, len): (String, i64, i64) = redis::cmd("GET")
            .arg("lk")
            .arg(dst_desc.to_string())
            .query(con)
            .unwrap();
        assert_eq!(len, 8192);
        let src = Descriptor::parse(src.as_bytes()).unwrap();
        assert_eq!(src.process().map(|p| p.0), Some(raw_pid(&src)));
        (src, lease)
    };
    let reader = CmaReader::new();

    let (src, lease) = get(&mut raw.con);
    assert_eq!(src.process().unwrap().0, raw.node_pid);
    let _: () = redis::cmd("SET")
        .arg("lk")
        .arg(b"new")
        .query(&mut raw.con)
        .unwrap();
    // SAFETY: `dst` is ours and 8192 bytes long.
    unsafe { reader.read(&src, dst.as_mut_ptr()) }.unwrap();
    let live: i64 = redis::cmd("RELEASE")
        .arg(lease)
        .query(&mut raw.con)
        .unwrap();
    assert_eq!(live, 1);
    assert!(
        dst == old,
        "a live lease's bytes are the value as of the GET"
    );

    let _: () = redis::cmd("SET")
        .arg("lk")
        .arg(&old)
        .query(&mut raw.con)
        .unwrap();
    let (_, lease) = get(&mut raw.con);
    std::thread::sleep(Duration::from_millis(600));
    let live: i64 = redis::cmd("RELEASE")
        .arg(lease)
        .query(&mut raw.con)
        .unwrap();
    assert_eq!(live, 0, "a lease past its TTL is not confirmed");
}

fn raw_pid(src: &Descriptor) -> u32 {
    src.process().unwrap().0
}

/// The `cma` descriptors of a connection can only name the process that
/// proved itself on it; an unproven connection gets `-NOCMA`.
#[tokio::test]
async fn descriptors_of_unproven_processes_are_refused() {
    let node = Node::start(&[]);
    let me = Identity::current().unwrap();
    let buf = vec![7u8; 4096];
    let desc = strata_rdma::cma::describe(&me, buf.as_ptr() as u64, 4096, 0, None).to_string();
    let mut con = connection(&node.addr());
    let r: redis::RedisResult<()> = redis::cmd("PUT").arg("k").arg(&desc).query(&mut con);
    let e = r.unwrap_err();
    assert_eq!(e.code(), Some("NOCMA"), "{e}");
    let r: redis::RedisResult<()> = redis::cmd("GET").arg("k").arg(&desc).query(&mut con);
    assert_eq!(r.unwrap_err().code(), Some("NOCMA"));
    // Proven, but naming another process (pid 1): refused, nothing stored.
    let mut raw = prove(node.port);
    let other = Descriptor {
        endpoint: Descriptor::process_endpoint(1, 1),
        ..Descriptor::parse(desc.as_bytes()).unwrap()
    };
    let r: redis::RedisResult<()> = redis::cmd("PUT")
        .arg("k")
        .arg(other.to_string())
        .query(&mut raw.con);
    assert_eq!(r.unwrap_err().code(), Some("NOCMA"));
    // An unmapped range of the proven process: BADDESC, nothing stored.
    let unmapped = Descriptor {
        addr: 4096,
        ..Descriptor::parse(desc.as_bytes()).unwrap()
    };
    let r: redis::RedisResult<()> = redis::cmd("PUT")
        .arg("k")
        .arg(unmapped.to_string())
        .query(&mut raw.con);
    assert_eq!(r.unwrap_err().code(), Some("BADDESC"));
    let n: i64 = redis::cmd("EXISTS").arg("k").query(&mut raw.con).unwrap();
    assert_eq!(n, 0);
    // Its own memory works.
    let ok: String = redis::cmd("PUT")
        .arg("k")
        .arg(&desc)
        .query(&mut raw.con)
        .unwrap();
    assert_eq!(ok, "OK");
    let got: Vec<u8> = redis::cmd("GET").arg("k").query(&mut raw.con).unwrap();
    assert_eq!(got, buf);
}

/// A client process proves itself, then dies before the node reads its
/// PUT payload: the PUT fails and nothing is stored (the pid is not read
/// again, whoever has it next).
#[tokio::test]
async fn a_client_process_that_died_leaves_nothing_stored() {
    let node = Node::start(&[]);
    let mut con = connection(&node.addr());
    let hello: Vec<redis::Value> = redis::cmd("STRATA.CMA")
        .arg("HELLO")
        .query(&mut con)
        .unwrap();
    let redis::Value::BulkString(nonce) = &hello[7] else {
        panic!("{hello:?}")
    };
    let nonce = String::from_utf8(nonce.clone()).unwrap();
    // A child holding the nonce and a payload at addresses it prints.
    let script = "import ctypes,sys\n\
                  n=bytes.fromhex(sys.stdin.readline().strip())\n\
                  b=ctypes.create_string_buffer(n+b'x'*4096,len(n)+4096)\n\
                  print(ctypes.addressof(b),flush=True)\n\
                  sys.stdin.readline()\n";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    writeln!(child.stdin.as_mut().unwrap(), "{nonce}").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: u64 = line.trim().parse().unwrap();
    let pid = child.id();
    let start = strata_rdma::cma::start_time(pid).unwrap();
    let ok: String = redis::cmd("STRATA.CMA")
        .arg("PROVE")
        .arg(pid)
        .arg(start)
        .arg(format!("{addr:x}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    let desc = Descriptor {
        transport: strata_rdma::TransportKind::Cma,
        endpoint: Descriptor::process_endpoint(pid, start),
        addr: addr + 16,
        len: 4096,
        rkey: 0,
        epoch: None,
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let r: redis::RedisResult<()> = redis::cmd("PUT")
        .arg("dead")
        .arg(desc.to_string())
        .query(&mut con);
    assert!(r.is_err(), "a PUT from a dead process succeeded");
    let n: i64 = redis::cmd("EXISTS").arg("dead").query(&mut con).unwrap();
    assert_eq!(n, 0);
    let e: i64 = redis::cmd("INFO")
        .arg("stats")
        .query::<String>(&mut con)
        .map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("cma_read_errors:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .unwrap();
    assert!(e >= 1);
}

/// A client of another user never uses CMA with the node (it is never
/// offered across users) and is served over TCP, with the same bytes.
/// Needs root (to run the client as `nobody`).
#[tokio::test]
async fn a_client_of_another_user_is_served_over_tcp() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let bench = common::server_bin().with_file_name("strata-bench");
    assert!(
        bench.is_file(),
        "build strata-bench first: {}",
        bench.display()
    );
    let node = Node::start(&[]);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bench)
        .args([
            "--addr",
            &node.addr(),
            "--api",
            "zerocopy",
            "--sizes",
            "1MiB",
            // Every value by a data-plane read, as over CMA.
            "--inline-get-max",
            "0",
            "--inline-put-max",
            "0",
        ])
        .args(["--keys", "20", "--ops", "20"])
        .output()
        .expect("setpriv");
    assert!(
        out.status.success(),
        "bench as nobody failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Client::connect_with(ClientConfig {
        cma: false,
        ..ClientConfig::new(node.addr())
    })
    .await
    .unwrap();
    assert_eq!(info_field(&c, "stats", "cma_sessions").await, 0);
    assert!(
        info_field(&c, "stats", "data_reads_served").await >= 20,
        "GETs went over TCP"
    );
}

/// Long CMA reads go over `cma_lanes` threads on both sides (the node's
/// PUT pulls, the client's GET reads), byte-exact whatever the split;
/// with one lane on each side no helper copies anything.
#[tokio::test]
async fn long_reads_are_split_over_lanes_on_both_sides() {
    for lanes in [2usize, 1] {
        let node = Node::start(&[
            "--cpu-memory-pool-size",
            "256MiB",
            "--cma-lanes",
            &lanes.to_string(),
        ]);
        let c = Client::connect_with(ClientConfig {
            cma_lanes: lanes,
            ..ClientConfig::new(node.addr())
        })
        .await
        .expect("connect");
        // Around the split threshold, and well over it, at odd offsets.
        let split = strata_rdma::cma::SPLIT_MIN_BYTES;
        for len in [split - 1, split, 8 * MIB + 4097] {
            for round in 0..10 {
                round_trip(&c, &format!("lanes-{lanes}-{len}-{round}"), len).await;
            }
        }
        let node_pieces = info_field(&c, "stats", "cma_lane_pieces").await;
        let client_pieces = c
            .cma_stats()
            .expect("this process can use CMA")
            .lane_pieces
            .load(std::sync::atomic::Ordering::Relaxed);
        if lanes == 1 {
            assert_eq!((node_pieces, client_pieces), (0, 0));
        } else {
            // The callers take back pieces a helper has not started, so
            // not every piece, but some over 20 long reads each way.
            assert!(node_pieces > 0, "the node's helpers copied no piece");
            assert!(client_pieces > 0, "the client's helpers copied no piece");
        }
        assert_eq!(
            node.metric("strata_cma_lane_pieces_total"),
            node_pieces as f64,
            "/metrics and INFO agree"
        );
        assert_eq!(info_field(&c, "stats", "cma_read_errors").await, 0);
    }
}

/// A GET answered with a `cma` lease is a transfer the node does not see:
/// the client's next request follows once it has copied the value, so the
/// node polls for it about that long (`echo_poll_us`, set below) after each
/// lease, and finds it at least sometimes (how often is a matter of speed:
/// `strata-bench`, not this test). Off, it never polls.
#[tokio::test]
async fn after_leasing_a_large_value_the_node_polls_for_the_next_request() {
    let runs = [
        (&["--echo-poll-us", "0"][..], false),
        (&["--echo-poll-us", "1000"][..], true),
    ];
    for (args, polls) in runs {
        let node = Node::start(args);
        let c = node.client().await;
        round_trip(&c, "echo-cma", 4 * MIB).await;
        let mut dst = c.alloc(4 * MIB).expect("alloc");
        let counts = || async {
            (
                info_field(&c, "stats", "echo_poll_hits").await,
                info_field(&c, "stats", "echo_poll_misses").await,
            )
        };
        let before = counts().await;
        for _ in 0..50 {
            let n = c.get_into(b"echo-cma", &mut dst, 0).await.expect("get");
            assert_eq!(n, 4 * MIB);
        }
        let after = counts().await;
        assert!(dst.as_slice() == &pattern(b"echo-cma", 4 * MIB)[..]);
        let (hits, misses) = (after.0 - before.0, after.1 - before.1);
        if polls {
            assert!(
                hits + misses >= 50,
                "{hits} found, {misses} slept: a poll per lease"
            );
            assert!(hits > 0, "{hits} found while polling, {misses} slept");
        } else {
            assert_eq!((hits, misses), (0, 0));
        }
    }
}
