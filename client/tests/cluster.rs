//! The client against a real cluster (etcd plus three `strata-server`
//! processes, from `strata-tests`): routing by slot, batches split by
//! node, failover when a node is killed, and a standalone node.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_client::{Buffer, Client, ClientConfig, Error};
use strata_tests::cluster::{cluster_slots, owner_table, Cluster};
use strata_tests::Server;

const POOL: &str = "256MiB";
const VALUE_BYTES: usize = 4096;

/// `len` bytes for (key number, version): an 16-byte header naming both,
/// then bytes derived from them, so a wrong, torn or shifted value never
/// checks out.
fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let mut x = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version ^ 0x5555;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// The version a value read back holds, if it is intact and `key`'s.
fn check(key: u64, bytes: &[u8]) -> Result<u64, String> {
    if bytes.len() != VALUE_BYTES {
        return Err(format!("key {key}: {} bytes", bytes.len()));
    }
    let k = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let version = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if k != key || bytes != value(key, version, VALUE_BYTES) {
        return Err(format!(
            "key {key}: wrong bytes (header key {k} v{version})"
        ));
    }
    Ok(version)
}

fn key(i: u64) -> Vec<u8> {
    format!("blk:{i}").into_bytes()
}

async fn put(c: &Client, buf: &mut Buffer, i: u64, version: u64) -> strata_client::Result<()> {
    buf.as_mut_slice()
        .copy_from_slice(&value(i, version, VALUE_BYTES));
    c.put_from(&key(i), buf, 0..VALUE_BYTES).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_keys_and_batches_across_nodes() {
    let cluster = Cluster::start(&[POOL, POOL, POOL], 2);
    let seed = cluster.nodes[0].addr().to_string();
    let c = Client::connect(seed.clone()).await.expect("connect");
    assert_eq!(c.cluster_nodes().len(), 3, "map names every node");

    // The client's owners are the cluster's.
    let owners = owner_table(&cluster_slots(cluster.nodes[1].addr()).expect("slots"));
    let mut used = BTreeSet::new();
    for i in 0..200 {
        let k = key(i);
        let owner = c.owner_of(&k).expect("owned");
        let slot = usize::from(strata_ring::key_slot(&k));
        assert_eq!(
            Some(owner.parse().expect("addr")),
            owners[slot],
            "owner of key {i}"
        );
        used.insert(owner);
    }
    assert_eq!(used.len(), 3, "200 keys land on every node");

    // 200 zero-copy puts and gets, one by one.
    let mut buf = c.alloc(VALUE_BYTES).expect("alloc");
    for i in 0..200 {
        put(&c, &mut buf, i, 1).await.expect("put");
    }
    for i in 0..200 {
        let n = c.get_into(&key(i), &mut buf, 0).await.expect("get");
        assert_eq!(check(i, &buf.as_slice()[..n]), Ok(1));
    }
    for s in cluster.live() {
        assert!(dbsize(s) > 0, "node {} holds keys", s.port());
    }

    // Batches spanning the nodes: MPUT per node, pipelined GETs per node.
    let srcs: Vec<Buffer> = (200..264u64)
        .map(|i| {
            let mut b = c.alloc(VALUE_BYTES).expect("alloc");
            b.as_mut_slice().copy_from_slice(&value(i, 7, VALUE_BYTES));
            b
        })
        .collect();
    let items: Vec<(Vec<u8>, &Buffer, std::ops::Range<usize>)> = srcs
        .iter()
        .zip(200..)
        .map(|(b, i)| (key(i), b, 0..VALUE_BYTES))
        .collect();
    for r in c.put_many(&items).await {
        r.expect("put_many item");
    }
    let mut dsts: Vec<Buffer> = (0..64)
        .map(|_| c.alloc(VALUE_BYTES).expect("alloc"))
        .collect();
    let mut gets: Vec<(Vec<u8>, &mut Buffer, usize)> = dsts
        .iter_mut()
        .zip(200..)
        .map(|(b, i)| (key(i), b, 0))
        .collect();
    let results = c.get_many(&mut gets).await;
    for ((r, (_, b, _)), i) in results.into_iter().zip(&gets).zip(200..) {
        let n = r.expect("get_many item");
        assert_eq!(check(i, &b.as_slice()[..n]), Ok(7));
    }

    // PREFIX across nodes: the leading run of present keys.
    let mut keys: Vec<Vec<u8>> = (200..264).map(key).collect();
    assert_eq!(c.prefix(&keys).await.expect("prefix"), 64);
    keys[40] = b"blk:absent".to_vec();
    assert_eq!(c.prefix(&keys).await.expect("prefix"), 40);
    keys[3] = b"blk:absent2".to_vec();
    assert_eq!(c.prefix(&keys).await.expect("prefix"), 3);
    keys[0] = b"blk:absent3".to_vec();
    assert_eq!(c.prefix(&keys).await.expect("prefix"), 0);
    assert_eq!(c.prefix::<Vec<u8>>(&[]).await.expect("prefix"), 0);

    // Inline commands route too.
    for i in 0..30u64 {
        c.set(&key(1000 + i), format!("v{i}").as_bytes())
            .await
            .expect("set");
    }
    for i in 0..30u64 {
        let v = c.get(&key(1000 + i)).await.expect("get");
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()));
        assert!(c.exists(&key(1000 + i)).await.expect("exists"));
        assert!(c.del(&key(1000 + i)).await.expect("del"));
    }
}

fn dbsize(s: &Server) -> u64 {
    strata_tests::cluster::dbsize(s).unwrap_or(0)
}

/// Figures of the load run while a node is killed.
#[derive(Default)]
struct Load {
    reads: AtomicU64,
    writes: AtomicU64,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    wrong: AtomicU64,
    /// Longest read, in µs, of those that started after the kill.
    read_max_us: AtomicU64,
    write_max_us: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_nothing_and_reads_fail_over() {
    const KEYS: u64 = 120;
    const WRITERS: u64 = 4;
    const READERS: u64 = 4;
    let mut cluster = Cluster::start(&[POOL, POOL, POOL], 2);
    let cfg = ClientConfig::new(cluster.nodes[0].addr().to_string());
    let failover_ms = cfg.failover_timeout_ms;
    let c = Arc::new(Client::connect_with(cfg).await.expect("connect"));
    let victim = cluster.nodes[1].addr().to_string();

    // Every key at version 1 first; acked[i] is the newest acknowledged.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut buf = c.alloc(VALUE_BYTES).expect("alloc");
    for i in 0..KEYS {
        put(&c, &mut buf, i, 1).await.expect("fill");
        acked[i as usize].store(1, Ordering::SeqCst);
    }
    let on_victim: Vec<u64> = (0..KEYS)
        .filter(|&i| c.owner_of(&key(i)).as_deref() == Some(victim.as_str()))
        .collect();
    assert!(!on_victim.is_empty(), "some keys live on the victim");

    let stop = Arc::new(AtomicBool::new(false));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let load = Arc::new(Load::default());
    let errors: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (c, acked, stop, load, killed_at, errors) = (
            c.clone(),
            acked.clone(),
            stop.clone(),
            load.clone(),
            killed_at.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut buf = c.alloc(VALUE_BYTES).expect("alloc");
            let mine: Vec<u64> = (0..KEYS).filter(|i| i % WRITERS == w).collect();
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let i = mine[n % mine.len()];
                n += 1;
                let version = acked[i as usize].load(Ordering::SeqCst) + 1;
                let after_kill = killed_at.lock().expect("lock").is_some();
                let t0 = Instant::now();
                match put(&c, &mut buf, i, version).await {
                    Ok(()) => {
                        acked[i as usize].store(version, Ordering::SeqCst);
                        load.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        load.write_errors.fetch_add(1, Ordering::Relaxed);
                        errors.lock().expect("lock").push(format!("put {i}: {e}"));
                    }
                }
                if after_kill {
                    let us = t0.elapsed().as_micros() as u64;
                    load.write_max_us.fetch_max(us, Ordering::Relaxed);
                }
            }
        }));
    }
    for r in 0..READERS {
        let (c, acked, stop, load, killed_at, errors) = (
            c.clone(),
            acked.clone(),
            stop.clone(),
            load.clone(),
            killed_at.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut buf = c.alloc(VALUE_BYTES).expect("alloc");
            let mut n = r * 31;
            while !stop.load(Ordering::SeqCst) {
                let i = (n * 7 + r) % KEYS;
                n += 1;
                let floor = acked[i as usize].load(Ordering::SeqCst);
                let after_kill = killed_at.lock().expect("lock").is_some();
                let t0 = Instant::now();
                let outcome = c.get_into(&key(i), &mut buf, 0).await;
                if after_kill {
                    let us = t0.elapsed().as_micros() as u64;
                    load.read_max_us.fetch_max(us, Ordering::Relaxed);
                }
                match outcome.map(|len| check(i, &buf.as_slice()[..len])) {
                    Ok(Ok(v)) if v >= floor => {
                        load.reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(v)) => {
                        load.wrong.fetch_add(1, Ordering::Relaxed);
                        errors
                            .lock()
                            .expect("lock")
                            .push(format!("get {i}: v{v} older than acknowledged v{floor}"));
                    }
                    Ok(Err(m)) => {
                        load.wrong.fetch_add(1, Ordering::Relaxed);
                        errors.lock().expect("lock").push(m);
                    }
                    Err(e) => {
                        load.read_errors.fetch_add(1, Ordering::Relaxed);
                        errors.lock().expect("lock").push(format!("get {i}: {e}"));
                    }
                }
            }
        }));
    }

    // Steady load first, then kill -9 the victim under it.
    wait_for(Duration::from_secs(20), || {
        load.reads.load(Ordering::Relaxed) > 200
    })
    .await;
    let before = (
        load.reads.load(Ordering::Relaxed),
        load.writes.load(Ordering::Relaxed),
    );
    *killed_at.lock().expect("lock") = Some(Instant::now());
    cluster.kill(1);
    let t_kill = Instant::now();

    // Reads of the victim's keys, each timed from the kill: the failover.
    let probe = c.clone();
    let mut probe_buf = probe.alloc(VALUE_BYTES).expect("alloc");
    let mut failover = Duration::ZERO;
    for &i in &on_victim {
        let floor = acked[i as usize].load(Ordering::SeqCst);
        let len = probe
            .get_into(&key(i), &mut probe_buf, 0)
            .await
            .unwrap_or_else(|e| panic!("read of key {i} (victim's) after the kill: {e}"));
        let v = check(i, &probe_buf.as_slice()[..len]).expect("intact");
        assert!(v >= floor, "key {i}: v{v} < acknowledged v{floor}");
        failover = failover.max(t_kill.elapsed());
        if failover > Duration::from_millis(failover_ms) {
            break;
        }
    }
    println!(
        "failover: every key of the killed node readable {:.0} ms after kill -9 \
         (failover_timeout_ms {failover_ms})",
        failover.as_secs_f64() * 1e3
    );
    // Keep the load on a while after the failover.
    let after = load.writes.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(20), || {
        load.writes.load(Ordering::Relaxed) > after + 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("load task");
    }

    // Every acknowledged write is there, intact, at least as new.
    let mut lost = Vec::new();
    for i in 0..KEYS {
        let floor = acked[i as usize].load(Ordering::SeqCst);
        match c.get_into(&key(i), &mut buf, 0).await {
            Ok(len) => match check(i, &buf.as_slice()[..len]) {
                Ok(v) if v >= floor => {}
                other => lost.push(format!("key {i}: {other:?}, acknowledged v{floor}")),
            },
            Err(e) => lost.push(format!("key {i}: {e}, acknowledged v{floor}")),
        }
    }
    let errs = errors.lock().expect("lock").clone();
    let figures: HashMap<&str, u64> = [
        ("reads", load.reads.load(Ordering::Relaxed)),
        ("writes", load.writes.load(Ordering::Relaxed)),
        ("reads before kill", before.0),
        ("writes before kill", before.1),
        ("read errors", load.read_errors.load(Ordering::Relaxed)),
        ("write errors", load.write_errors.load(Ordering::Relaxed)),
        ("wrong reads", load.wrong.load(Ordering::Relaxed)),
        (
            "longest read after kill ms",
            load.read_max_us.load(Ordering::Relaxed) / 1000,
        ),
        (
            "longest write after kill ms",
            load.write_max_us.load(Ordering::Relaxed) / 1000,
        ),
    ]
    .into_iter()
    .collect();
    println!("load: {figures:?}");
    assert!(lost.is_empty(), "acknowledged values lost: {lost:?}");
    assert!(
        errs.is_empty(),
        "errors under load ({}): {:?}",
        errs.len(),
        &errs[..errs.len().min(10)]
    );
    assert!(
        failover <= Duration::from_millis(failover_ms),
        "reads served again only after {failover:?}"
    );
    assert!(
        load.read_max_us.load(Ordering::Relaxed) <= failover_ms * 1000,
        "a read took longer than failover_timeout_ms"
    );
}

#[tokio::test]
async fn standalone_node_is_a_cluster_of_one() {
    let node = Server::start(&[]);
    let addr = node.addr().to_string();
    let c = Client::connect(addr.clone()).await.expect("connect");
    assert_eq!(c.cluster_nodes(), vec![addr.clone()]);
    let mut buf = c.alloc(VALUE_BYTES).expect("alloc");
    for i in 0..50 {
        assert_eq!(c.owner_of(&key(i)).as_deref(), Some(addr.as_str()));
        put(&c, &mut buf, i, 3).await.expect("put");
    }
    for i in 0..50 {
        let n = c.get_into(&key(i), &mut buf, 0).await.expect("get");
        assert_eq!(check(i, &buf.as_slice()[..n]), Ok(3));
    }
    let keys: Vec<Vec<u8>> = (0..60).map(key).collect();
    assert_eq!(c.prefix(&keys).await.expect("prefix"), 50);
    assert!(matches!(
        c.get_into(b"nope", &mut buf, 0).await,
        Err(Error::NotFound)
    ));
}

async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_lists_each_key_once_and_skips_a_dead_node() {
    let mut cluster = Cluster::start(&[POOL, POOL, POOL], 2);
    let seed = cluster.nodes[0].addr().to_string();
    let c = Client::connect(seed).await.expect("connect");
    for i in 0..60u64 {
        c.set(&key(i), b"v").await.expect("set");
    }
    c.set(b"other:1", b"v").await.expect("set");
    let listed = |keys: Vec<bytes::Bytes>| -> BTreeSet<Vec<u8>> {
        let n = keys.len();
        let set: BTreeSet<Vec<u8>> = keys.into_iter().map(|k| k.to_vec()).collect();
        assert_eq!(set.len(), n, "a key listed twice");
        set
    };
    let want: BTreeSet<Vec<u8>> = (0..60).map(key).collect();
    assert_eq!(listed(c.scan(b"blk:*", 1000).await.expect("scan")), want);
    assert_eq!(c.scan(b"blk:*", 7).await.expect("scan").len(), 7, "limit");

    // The client's map still names the killed node: it is skipped, and
    // with two copies of every key nothing is missing from the listing.
    cluster.kill(1);
    assert_eq!(c.cluster_nodes().len(), 3, "map not refreshed yet");
    assert_eq!(listed(c.scan(b"blk:*", 1000).await.expect("scan")), want);

    // With no node answering, the failure reaches the caller.
    cluster.kill(0);
    cluster.kill(2);
    assert!(matches!(c.scan(b"blk:*", 1000).await, Err(Error::Io(_))));
}
