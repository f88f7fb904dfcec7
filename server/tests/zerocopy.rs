//! Zero-copy PUT/GET against the real binary: the node pulls PUT payloads
//! from this process's data plane, and this process pulls GET values from
//! the node's, with content checks, bad descriptors, leases and cut
//! transfers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value as V;
use strata_rdma::tcp::TcpTransport;
use strata_rdma::{Descriptor, Region, TransferError, Transport};
use strata_tests::Server;

/// A node on free loopback ports; the shared harness retries when another
/// test took a port first, and fails with the node's stderr if it exits
/// (a bare wait on PING hid both behind a 20 s timeout).
struct Node {
    server: Server,
    port: u16,
}

impl Node {
    fn start(extra: &[&str]) -> Node {
        let server = Server::start(extra);
        let port = server.port();
        Node { server, port }
    }

    fn conn(&self) -> redis::Connection {
        self.server.client(false)
    }

    fn info(&self, field: &str) -> u64 {
        self.server.info_field(field)
    }
}

/// A buffer of this process registered with its data plane.
struct Buf {
    mem: Vec<u8>,
    region: Region,
}

/// This test's own data plane, on loopback.
async fn transport() -> Arc<TcpTransport> {
    TcpTransport::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn buf(t: &TcpTransport, mem: Vec<u8>) -> Buf {
    let mut mem = mem;
    // SAFETY: `mem` is owned by the returned Buf next to the region and is
    // never reallocated; the region is dropped with it.
    let region = unsafe { t.register(mem.as_mut_ptr() as u64, mem.len() as u64, None) }.unwrap();
    Buf { mem, region }
}

fn desc(t: &TcpTransport, b: &Buf, len: u64) -> String {
    t.describe(&b.region, 0, len, None).unwrap().to_string()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn err_code(e: &redis::RedisError) -> String {
    e.code().unwrap_or("").to_string()
}

/// GET key desc → (source descriptor, lease, len).
fn lease(
    c: &mut redis::Connection,
    key: &str,
    dst: &str,
) -> redis::RedisResult<(Descriptor, i64, u64)> {
    let v: Vec<V> = redis::cmd("GET").arg(key).arg(dst).query(c)?;
    let src = match &v[0] {
        V::BulkString(b) => Descriptor::parse(b).unwrap(),
        other => panic!("{other:?}"),
    };
    let (V::Int(lease), V::Int(len)) = (&v[1], &v[2]) else {
        panic!("{v:?}")
    };
    Ok((src, *lease, *len as u64))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn round_trips_of_many_sizes() {
    let node = Node::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let t = transport().await;
        let mut c = node.conn();
        for (i, size) in [1usize, 4096, 1 << 20, 64 << 20].into_iter().enumerate() {
            let src = buf(&t, pattern(i as u64, size)).await;
            let reply: String = redis::cmd("PUT")
                .arg(format!("k{i}"))
                .arg(desc(&t, &src, size as u64))
                .query(&mut c)
                .unwrap();
            assert_eq!(reply, "OK");
            let dst = buf(&t, vec![0u8; size]).await;
            let (sdesc, lease_id, len) =
                lease(&mut c, &format!("k{i}"), &desc(&t, &dst, size as u64)).unwrap();
            assert_eq!(len, size as u64);
            assert!(sdesc.epoch.is_some());
            t.read(&sdesc, &dst.region, 0).await.unwrap();
            assert!(dst.mem == src.mem, "size {size}: bytes differ");
            let released: i64 = redis::cmd("RELEASE").arg(lease_id).query(&mut c).unwrap();
            assert_eq!(released, 1);
            // The same descriptor after release is stale, never other bytes.
            match t.read(&sdesc, &dst.region, 0).await {
                Err(TransferError::Stale) => {}
                other => panic!("expected Stale, got {other:?}"),
            }
            // Inline GET sees the same bytes.
            let inline: Vec<u8> = redis::cmd("GET")
                .arg(format!("k{i}"))
                .query(&mut c)
                .unwrap();
            assert!(inline == src.mem);
        }
    });
}

#[test]
fn concurrent_clients_and_batches() {
    let node = Node::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for client in 0..16u64 {
            let port = node.port;
            tasks.push(tokio::spawn(async move {
                let t = transport().await;
                let client_conn =
                    redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
                let mut c = client_conn
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                for j in 0..8u64 {
                    let size = 64 * 1024 + (j as usize) * 1000;
                    let src = buf(&t, pattern(client * 100 + j, size)).await;
                    let key = format!("c{client}:{j}");
                    let _: () = redis::cmd("PUT")
                        .arg(&key)
                        .arg(desc(&t, &src, size as u64))
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    let dst = buf(&t, vec![0u8; size]).await;
                    let v: Vec<V> = redis::cmd("GET")
                        .arg(&key)
                        .arg(desc(&t, &dst, size as u64))
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    let V::BulkString(s) = &v[0] else { panic!() };
                    t.read(&Descriptor::parse(s.as_slice()).unwrap(), &dst.region, 0)
                        .await
                        .unwrap();
                    assert!(dst.mem == src.mem);
                    let V::Int(id) = v[1] else { panic!() };
                    let _: i64 = redis::cmd("RELEASE")
                        .arg(id)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // A 32-block MPUT is one round trip, answered per pair.
        let t = transport().await;
        let mut c = node.conn();
        let mut bufs = Vec::new();
        let mut cmd = redis::cmd("MPUT");
        for i in 0..32u64 {
            let b = buf(&t, pattern(1000 + i, 16 * 1024)).await;
            cmd.arg(format!("blk:{i}")).arg(desc(&t, &b, 16 * 1024));
            bufs.push(b);
        }
        let replies: Vec<V> = cmd.query(&mut c).unwrap();
        assert_eq!(replies.len(), 32);
        assert!(replies.iter().all(|r| matches!(r, V::Okay)), "{replies:?}");
        // Pairs fail on their own; raw bytes, since redis-rs turns an error
        // element into an error for the whole reply.
        let good = desc(&t, &bufs[0], 16 * 1024);
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", node.port)).unwrap();
        let req = format!(
            "*5\r\n$4\r\nMPUT\r\n$2\r\nok\r\n${}\r\n{good}\r\n$3\r\nbad\r\n$7\r\ngarbage\r\n",
            good.len()
        );
        std::io::Write::write_all(&mut raw, req.as_bytes()).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reply = Vec::new();
        let mut chunk = [0u8; 512];
        while !reply.ends_with(b"\r\n") || !String::from_utf8_lossy(&reply).contains("-BADDESC") {
            let n = std::io::Read::read(&mut raw, &mut chunk).unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&reply));
            reply.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&reply);
        assert!(text.starts_with("*2\r\n+OK\r\n-BADDESC "), "{text}");
        for (i, b) in bufs.iter().enumerate() {
            let v: Vec<u8> = redis::cmd("GET")
                .arg(format!("blk:{i}"))
                .query(&mut c)
                .unwrap();
            assert!(v == b.mem);
        }
        // PREFIX: the run of present keys from the first.
        let n: i64 = redis::cmd("PREFIX")
            .arg("blk:0")
            .arg("blk:1")
            .arg("nope")
            .arg("blk:2")
            .query(&mut c)
            .unwrap();
        assert_eq!(n, 2);
        let pinned: Vec<i64> = redis::cmd("PREFIX")
            .arg("blk:0")
            .arg("blk:1")
            .arg("PIN")
            .arg(1000)
            .query(&mut c)
            .unwrap();
        assert_eq!(pinned[0], 2);
        assert!(pinned[1] > 0);
        let r: i64 = redis::cmd("RELEASE").arg(pinned[1]).query(&mut c).unwrap();
        assert_eq!(r, 1);
    });
}

#[test]
fn bad_descriptors_store_nothing() {
    let node = Node::start(&["--lease-ttl-ms", "200"]);
    let rt = runtime();
    rt.block_on(async {
        let t = transport().await;
        let mut c = node.conn();
        let src = buf(&t, pattern(7, 8192)).await;
        let good: Descriptor = Descriptor::parse(desc(&t, &src, 8192).as_bytes()).unwrap();
        let used_before = node.info("dram_used_bytes");
        let cases: Vec<(String, &str)> = vec![
            ("garbage".into(), "BADDESC"),
            (
                Descriptor {
                    rkey: good.rkey ^ 1,
                    ..good.clone()
                }
                .to_string(),
                "BADDESC",
            ),
            (
                Descriptor {
                    addr: good.addr + 4096,
                    ..good.clone()
                }
                .to_string(),
                "BADDESC",
            ),
            (
                Descriptor {
                    len: 1 << 40,
                    ..good.clone()
                }
                .to_string(),
                "TOOLARGE",
            ),
            (
                Descriptor {
                    epoch: Some(3),
                    ..good.clone()
                }
                .to_string(),
                "BADDESC",
            ),
            (
                Descriptor {
                    transport: strata_rdma::TransportKind::Rdma,
                    ..good.clone()
                }
                .to_string(),
                "BADDESC",
            ),
        ];
        for (d, code) in cases {
            let e = redis::cmd("PUT")
                .arg("bad")
                .arg(&d)
                .query::<()>(&mut c)
                .unwrap_err();
            assert_eq!(err_code(&e), code, "{d}: {e}");
            let exists: i64 = redis::cmd("EXISTS").arg("bad").query(&mut c).unwrap();
            assert_eq!(exists, 0, "{d}");
        }
        // A deregistered region: the node's read is refused.
        let gone = buf(&t, vec![1u8; 4096]).await;
        let d = desc(&t, &gone, 4096);
        drop(gone);
        let e = redis::cmd("PUT")
            .arg("bad")
            .arg(&d)
            .query::<()>(&mut c)
            .unwrap_err();
        assert_eq!(err_code(&e), "BADDESC", "{e}");
        assert_eq!(node.info("dram_used_bytes"), used_before);

        // GET into a buffer too small; missing key; expired lease.
        let _: () = redis::cmd("PUT")
            .arg("k")
            .arg(good.to_string())
            .query(&mut c)
            .unwrap();
        let small = buf(&t, vec![0u8; 100]).await;
        let e = lease(&mut c, "k", &desc(&t, &small, 100)).unwrap_err();
        assert_eq!(err_code(&e), "TOOLARGE");
        let dst = buf(&t, vec![0u8; 8192]).await;
        let e = lease(&mut c, "missing", &desc(&t, &dst, 8192)).unwrap_err();
        assert_eq!(err_code(&e), "NOTFOUND");
        let (sdesc, _, _) = lease(&mut c, "k", &desc(&t, &dst, 8192)).unwrap();
        // Wait for the lease to run out (condition, bounded).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match t.read(&sdesc, &dst.region, 0).await {
                Err(TransferError::Stale) => break,
                Ok(()) => assert!(Instant::now() < deadline, "lease never expired"),
                Err(e) => panic!("{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Reads outside the value, or with another epoch, are refused.
        let (sdesc, _, _) = lease(&mut c, "k", &desc(&t, &dst, 8192)).unwrap();
        let wider = Descriptor {
            len: sdesc.len + 1,
            ..sdesc.clone()
        };
        let big = buf(&t, vec![0u8; 8193]).await;
        assert!(t.read(&wider, &big.region, 0).await.is_err());
        let other = Descriptor {
            epoch: sdesc.epoch.map(|e| e + 1000),
            ..sdesc.clone()
        };
        assert!(matches!(
            t.read(&other, &dst.region, 0).await,
            Err(TransferError::Stale)
        ));
        // The descriptor carries a random read token, not the store's
        // sequential epoch: guessing small epochs reads nothing.
        assert!(sdesc.epoch.unwrap() > 1 << 20, "{sdesc:?}");
        for guess in 0..64 {
            let guessed = Descriptor {
                epoch: Some(guess),
                ..sdesc.clone()
            };
            assert!(matches!(
                t.read(&guessed, &dst.region, 0).await,
                Err(TransferError::Stale)
            ));
        }
    });
}

#[test]
fn a_client_that_vanishes_mid_transfer_leaves_nothing() {
    let node = Node::start(&[]);
    let rt = runtime();
    let used_before = node.info("dram_used_bytes");
    rt.block_on(async {
        let t: Arc<TcpTransport> = transport().await;
        let size = 256 << 20;
        let src = buf(&t, vec![9u8; size]).await;
        let d = desc(&t, &src, size as u64);
        let port = node.port;
        let put = tokio::spawn(async move {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            redis::cmd("PUT")
                .arg("big")
                .arg(d)
                .query_async::<()>(&mut c)
                .await
        });
        // Let the node start pulling, then vanish: the data plane goes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while t
            .stats()
            .reads_served
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
            && t.stats()
                .connections_accepted
                .load(std::sync::atomic::Ordering::Relaxed)
                == 0
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(src);
        drop(t);
        let r = put.await.unwrap();
        assert!(r.is_err(), "a cut transfer must fail: {r:?}");
    });
    let mut c = node.conn();
    let exists: i64 = redis::cmd("EXISTS").arg("big").query(&mut c).unwrap();
    assert_eq!(exists, 0);
    assert_eq!(node.info("dram_used_bytes"), used_before);
}

/// What a data-plane read of a node's arena gets for each way it can miss
/// the leased value (docs/PROTOCOL.md, the status table).
#[test]
fn reads_outside_the_leased_value_or_without_its_token_are_refused() {
    let node = Node::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let t = transport().await;
        let mut c = node.conn();
        let size = 4096usize;
        // A value before ours, so ours does not start the arena.
        for key in ["pad", "k"] {
            let src = buf(&t, pattern(7, size)).await;
            let reply: String = redis::cmd("PUT")
                .arg(key)
                .arg(desc(&t, &src, size as u64))
                .query(&mut c)
                .unwrap();
            assert_eq!(reply, "OK");
        }
        let dst = buf(&t, vec![0u8; size + 1]).await;
        let (sdesc, _lease, len) = lease(&mut c, "k", &desc(&t, &dst, size as u64)).unwrap();
        assert_eq!(len, size as u64);
        let read = |d: Descriptor| {
            let (t, region) = (&t, &dst.region);
            async move { t.read(&d, region, 0).await }
        };
        read(sdesc.clone()).await.expect("the leased range");

        // Inside the arena, one byte off the leased value: GONE.
        let mut before = sdesc.clone();
        before.addr -= 1;
        let mut past = sdesc.clone();
        past.len += 1;
        for d in [before, past] {
            match read(d.clone()).await {
                Err(TransferError::BadDescriptor(why)) => {
                    assert!(why.contains("outside the leased value"), "{why}")
                }
                other => panic!("{d}: expected GONE, got {other:?}"),
            }
        }
        // No token, or a token that never was: STALE.
        let mut no_epoch = sdesc.clone();
        no_epoch.epoch = None;
        let mut wrong = sdesc.clone();
        wrong.epoch = Some(sdesc.epoch.unwrap() ^ 1);
        for d in [no_epoch, wrong] {
            assert!(
                matches!(read(d.clone()).await, Err(TransferError::Stale)),
                "{d}"
            );
        }
        // Not the arena's rkey: UNKNOWN_RKEY.
        let mut rkey = sdesc.clone();
        rkey.rkey ^= 1;
        match read(rkey).await {
            Err(TransferError::BadDescriptor(why)) => assert!(why.contains("rkey"), "{why}"),
            other => panic!("expected UNKNOWN_RKEY, got {other:?}"),
        }
        // Outside the arena altogether: OUT_OF_RANGE.
        let mut outside = sdesc.clone();
        outside.addr = 4096;
        match read(outside).await {
            Err(TransferError::BadDescriptor(why)) => {
                assert!(why.contains("outside the region"), "{why}")
            }
            other => panic!("expected OUT_OF_RANGE, got {other:?}"),
        }
        // And the lease still reads right after all of that.
        read(sdesc).await.expect("the leased range, again");
    });
}

#[test]
fn get_inline_returns_small_values_in_the_reply_and_leases_the_rest() {
    let node = Node::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let t = transport().await;
        let mut c = node.conn();
        for (key, len) in [("small", 1000usize), ("big", 100_000)] {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(pattern(len as u64, len))
                .query(&mut c)
                .unwrap();
        }
        let dst = buf(&t, vec![0u8; 200_000]).await;
        let d = desc(&t, &dst, 200_000);
        let get = |c: &mut redis::Connection, key: &str, n: &str| -> redis::RedisResult<V> {
            redis::cmd("GET")
                .arg(key)
                .arg(&d)
                .arg("INLINE")
                .arg(n)
                .query(c)
        };
        // At or under the limit: the bytes themselves, no lease.
        for n in ["1000", "65536"] {
            match get(&mut c, "small", n).unwrap() {
                V::BulkString(b) => assert_eq!(b, pattern(1000, 1000)),
                other => panic!("INLINE {n}: {other:?}"),
            }
        }
        // Over it: a lease, as without the option.
        for n in ["999", "0", "65536"] {
            let key = if n == "65536" { "big" } else { "small" };
            let v = get(&mut c, key, n).unwrap();
            let V::Array(parts) = &v else {
                panic!("INLINE {n} {key}: {v:?}")
            };
            assert_eq!(parts.len(), 3, "{v:?}");
            let V::Int(lease) = parts[1] else {
                panic!("{v:?}")
            };
            let _: i64 = redis::cmd("RELEASE").arg(lease).query(&mut c).unwrap();
        }
        // The destination is checked whichever way the value would travel.
        let small = buf(&t, vec![0u8; 100]).await;
        let e = redis::cmd("GET")
            .arg("small")
            .arg(desc(&t, &small, 100))
            .arg("INLINE")
            .arg(65536)
            .query::<V>(&mut c)
            .unwrap_err();
        assert_eq!(err_code(&e), "TOOLARGE", "{e}");
        let e = get(&mut c, "missing", "65536").unwrap_err();
        assert_eq!(err_code(&e), "NOTFOUND", "{e}");
        let e = redis::cmd("GET")
            .arg("small")
            .arg("garbage")
            .arg("INLINE")
            .arg(65536)
            .query::<V>(&mut c)
            .unwrap_err();
        assert_eq!(err_code(&e), "BADDESC", "{e}");
        // Bad option or count: clear errors, and the connection goes on.
        for (opt, n) in [("INLINE", "-1"), ("INLINE", "x"), ("NOPE", "5")] {
            let e = redis::cmd("GET")
                .arg("small")
                .arg(&d)
                .arg(opt)
                .arg(n)
                .query::<V>(&mut c)
                .unwrap_err();
            assert_eq!(err_code(&e), "ERR", "{opt} {n}: {e}");
        }
        let e = redis::cmd("GET")
            .arg("small")
            .arg(&d)
            .arg("INLINE")
            .query::<V>(&mut c)
            .unwrap_err();
        assert_eq!(err_code(&e), "ERR", "{e}");
        assert!(e.to_string().contains("wrong number of arguments"), "{e}");
        let pong: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(pong, "PONG");
    });
}
