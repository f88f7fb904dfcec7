//! Cluster mode against a real etcd and real nodes on 127.0.0.1: ring
//! formation and capacity weighting, routing errors, placement stability
//! when a node joins, a node killed under load, etcd going away under
//! load, and unmodified cluster clients (redis-cli -c, redis-py).
//!
//! Every wait is for a condition under a deadline; figures (failover and
//! repair times) are printed, run with `--nocapture` to see them.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_ring::{key_slot, Ring, SLOTS};
use strata_tests::cluster::{
    cluster_slots, dbsize, info_cluster_field, owner_table, try_request, Cluster, ClusterClient,
    SlotRange, RING_TIMEOUT,
};
use strata_tests::{parse_reply, wait_until, within, Resp};

/// Every acknowledged key must be readable again within this after a node
/// dies (lease expiry + watch + client refresh, with a wide margin).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Repair of a few thousand keys in a debug build.
const REPAIR_TIMEOUT: Duration = Duration::from_secs(60);
/// A writer gives up on a key that no node accepted for this long.
const WRITE_RETRY_MAX: Duration = Duration::from_secs(30);

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A value that says which key it belongs to, with bytes RESP must carry
/// verbatim (CR, LF, NUL) and a length that varies by key.
fn value_for(key: &[u8], i: usize) -> Vec<u8> {
    let mut v = key.to_vec();
    v.extend_from_slice(b"\r\n\0");
    v.extend((0..i % 97).map(|j| (i + j) as u8));
    v
}

/// The first key `prefix:N` for which `pick(owner)` holds.
fn key_where(c: &ClusterClient, prefix: &str, pick: impl Fn(SocketAddr) -> bool) -> Vec<u8> {
    (0..100_000)
        .map(|j| format!("{prefix}:{j}").into_bytes())
        .find(|k| c.owner(k).is_some_and(&pick))
        .expect("some key has such an owner")
}

/// Slots owned by each node address.
fn slot_counts(ranges: &[SlotRange]) -> HashMap<SocketAddr, u32> {
    let mut counts = HashMap::new();
    for r in ranges {
        *counts.entry(r.nodes[0]).or_default() += u32::from(r.end - r.start) + 1;
    }
    counts
}

/// Keys whose read does not return exactly their value, with what came.
fn unreadable(c: &mut ClusterClient, pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter_map(|(k, v)| {
            let got = c.get(k);
            match &got {
                Ok(Some(g)) if g == v => None,
                Ok(Some(g)) => Some(format!("wrong bytes ({} long)", g.len())),
                Ok(None) => Some("nil".to_string()),
                Err(e) => Some(e.clone()),
            }
            .map(|why| (String::from_utf8_lossy(k).into_owned(), why))
        })
        .collect()
}

/// Waits until every pair reads back exactly (re-reading only those that
/// did not yet), then checks all of them once more; the time it took.
fn wait_readable(c: &mut ClusterClient, pairs: &[(Vec<u8>, Vec<u8>)], timeout: Duration) -> f64 {
    let start = Instant::now();
    let mut pending: Pairs = pairs.to_vec();
    let mut last = Vec::new();
    let ok = wait_until(within(timeout), || {
        last = unreadable(c, &pending);
        let bad: Vec<&String> = last.iter().map(|(k, _)| k).collect();
        pending.retain(|(k, _)| bad.contains(&&String::from_utf8_lossy(k).into_owned()));
        pending.is_empty()
    });
    assert!(
        ok,
        "{} of {} keys still unreadable after {timeout:?}, e.g. {:?}",
        last.len(),
        pairs.len(),
        &last[..last.len().min(5)]
    );
    let took = start.elapsed().as_secs_f64();
    let bad = unreadable(c, pairs);
    assert!(bad.is_empty(), "readable once, then not: {bad:?}");
    took
}

/// Writes fresh keys with verifiable values as fast as the cluster takes
/// them, recording every acknowledged one. A key that fails (its owner is
/// dead) is queued and retried while new keys keep going to live owners.
struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Pairs>>,
    failures: Arc<AtomicU64>,
    handle: JoinHandle<Result<(), String>>,
}

impl Writer {
    fn start(cluster: &Cluster, prefix: &'static str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(AtomicU64::new(0));
        let mut c = cluster.client();
        let (s, a, f) = (stop.clone(), acked.clone(), failures.clone());
        let handle = std::thread::spawn(move || {
            let mut pending: Vec<(Vec<u8>, Vec<u8>, Instant)> = Vec::new();
            let mut try_one = |k: Vec<u8>, v: Vec<u8>, since: Instant, pending: &mut Vec<_>| {
                match c.set(&k, &v) {
                    Ok(()) => a.lock().unwrap().push((k, v)),
                    Err(e) if since.elapsed() > WRITE_RETRY_MAX => {
                        return Err(format!("{}: {e}", String::from_utf8_lossy(&k)))
                    }
                    Err(_) => {
                        f.fetch_add(1, Relaxed);
                        pending.push((k, v, since));
                    }
                }
                Ok(())
            };
            for i in 0.. {
                if s.load(Relaxed) && pending.is_empty() {
                    return Ok(());
                }
                if !pending.is_empty() && (i % 8 == 0 || s.load(Relaxed)) {
                    let (k, v, since) = pending.remove(0);
                    try_one(k, v, since, &mut pending)?;
                }
                if !s.load(Relaxed) {
                    let k = format!("{prefix}:{i}").into_bytes();
                    let v = value_for(&k, i);
                    try_one(k, v, Instant::now(), &mut pending)?;
                }
            }
            Ok(())
        });
        Writer {
            stop,
            acked,
            failures,
            handle,
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn snapshot(&self) -> Pairs {
        self.acked.lock().unwrap().clone()
    }

    /// Panics unless `n` more writes are acknowledged within `timeout`.
    fn wait_progress(&self, n: usize, timeout: Duration) {
        let want = self.acked() + n;
        assert!(
            wait_until(within(timeout), || self.acked() >= want
                || self.handle.is_finished()),
            "writer stalled at {} acks (wanted {want})",
            self.acked()
        );
        assert!(!self.handle.is_finished(), "writer stopped early");
    }

    /// Stops after every queued key was acknowledged; all acknowledged
    /// pairs and how many writes had failed.
    fn stop(self) -> (Pairs, u64) {
        self.stop.store(true, Relaxed);
        self.handle
            .join()
            .expect("writer thread")
            .unwrap_or_else(|e| panic!("writer gave up: {e}"));
        let pairs = self.acked.lock().unwrap().clone();
        (pairs, self.failures.load(Relaxed))
    }
}

/// Waits until every running node holds exactly the keys whose replica
/// set (per [`Cluster::expected_ring`]) includes it: repair has pushed
/// every missing copy and shed every extra one. The time it took.
fn wait_placed(cluster: &Cluster, pairs: &[(Vec<u8>, Vec<u8>)], timeout: Duration) -> f64 {
    let start = Instant::now();
    let copies = 2;
    let ring = cluster.expected_ring();
    let mut want: HashMap<String, u64> = HashMap::new();
    for (k, _) in pairs {
        for n in ring.replicas(key_slot(k), copies) {
            *want.entry(n.resp_addr.clone()).or_default() += 1;
        }
    }
    let placement = || -> Vec<(SocketAddr, Option<u64>, u64)> {
        cluster
            .live()
            .map(|s| {
                let w = want.get(&s.addr().to_string()).copied().unwrap_or(0);
                (s.addr(), dbsize(s), w)
            })
            .collect()
    };
    let ok = wait_until(within(timeout), || {
        placement().iter().all(|(_, has, want)| *has == Some(*want))
    });
    assert!(
        ok,
        "copies not where the ring puts them after {timeout:?}: (node, DBSIZE, want) {:?}\n{}",
        placement(),
        misplaced(cluster, &ring, pairs)
    );
    start.elapsed().as_secs_f64()
}

/// Keys a node holds locally (`KEYS *` is not routed).
fn local_keys(s: &strata_tests::Server) -> Vec<Vec<u8>> {
    match parse_reply(&s.conn().request(&[b"KEYS", b"*"])) {
        Resp::Array(items) => items
            .into_iter()
            .filter_map(|r| match r {
                Resp::Bulk(b) => Some(b),
                _ => None,
            })
            .collect(),
        other => panic!("KEYS *: {other:?}"),
    }
}

/// Which node holds which key it should not, or lacks one it should, for
/// failure messages.
fn misplaced(cluster: &Cluster, ring: &Ring, pairs: &[(Vec<u8>, Vec<u8>)]) -> String {
    let set_of = |k: &[u8]| -> Vec<String> {
        ring.replicas(key_slot(k), 2)
            .iter()
            .map(|n| n.resp_addr.clone())
            .collect()
    };
    let show = |k: &[u8]| {
        format!(
            "{} (slot {}, set {:?})",
            String::from_utf8_lossy(k),
            key_slot(k),
            set_of(k)
        )
    };
    let mut out = String::new();
    for s in cluster.live() {
        let me = s.addr().to_string();
        let local = local_keys(s);
        let extra: Vec<String> = local
            .iter()
            .filter(|k| !set_of(k).contains(&me))
            .map(|k| show(k))
            .take(5)
            .collect();
        let missing: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| set_of(k).contains(&me) && !local.contains(k))
            .map(|(k, _)| show(k))
            .take(5)
            .collect();
        out.push_str(&format!("{me}: extra {extra:?}, missing {missing:?}\n"));
    }
    out
}

#[test]
fn ring_forms_weighted_by_capacity_and_routes_with_moved_and_crossslot() {
    let cluster = Cluster::start(&["64MiB", "64MiB", "128MiB"], 2);
    let addrs: Vec<SocketAddr> = cluster.live().map(|s| s.addr()).collect();

    let slots: Vec<Vec<SlotRange>> = addrs
        .iter()
        .map(|&a| cluster_slots(a).expect("CLUSTER SLOTS"))
        .collect();
    for (a, s) in addrs.iter().zip(&slots) {
        assert_eq!(s, &slots[0], "{a} describes a different ring");
    }
    let owners = owner_table(&slots[0]);
    assert!(owners.iter().all(Option::is_some), "a slot has no owner");
    for r in &slots[0] {
        assert_eq!(r.nodes.len(), 2, "owner + 1 replica: {r:?}");
        assert_ne!(r.nodes[0], r.nodes[1], "replica on the owner: {r:?}");
    }
    for s in cluster.live() {
        let (status, body) = s.http_get("/health");
        assert_eq!(status, 200, "{body}");
        let h: serde_json::Value = serde_json::from_str(&body).expect("/health is JSON");
        assert_eq!(h["ring_nodes"], 3, "{body}");
        assert_eq!(h["etcd_healthy"], true, "{body}");
        let info = s.conn().request(&[b"CLUSTER", b"INFO"]);
        let info = String::from_utf8_lossy(&info);
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
    let ids: Vec<String> = cluster
        .live()
        .map(|s| parse_reply(&s.conn().request(&[b"CLUSTER", b"MYID"])).as_text())
        .collect();
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );

    let client = cluster.client();
    for (i, s) in cluster.live().enumerate() {
        let key = key_where(&client, "moved", |o| o != addrs[i]);
        let owner = client.owner(&key).unwrap();
        let mut con = s.conn();
        let slot = parse_reply(&con.request(&[b"CLUSTER", b"KEYSLOT", &key])).as_int();
        assert_eq!(
            slot,
            i64::from(key_slot(&key)),
            "KEYSLOT disagrees with CRC16"
        );
        let want = format!("-MOVED {slot} {owner}\r\n");
        let got = con.request(&[b"GET", &key]);
        assert_eq!(String::from_utf8_lossy(&got), want);
        let on_owner = try_request(owner, &[b"GET", &key]).expect("owner answers");
        assert_eq!(on_owner, b"$-1\r\n", "the owner serves the key");
    }

    let ka = key_where(&client, "xa", |o| o == addrs[0]);
    let kb = key_where(&client, "xb", |o| o == addrs[1]);
    let r = cluster
        .node(0)
        .conn()
        .request(&[b"MSET", &ka, b"1", &kb, b"2"]);
    assert!(
        r.starts_with(b"-CROSSSLOT "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    // Keys of different slots on one node may go together (documented
    // superset of Redis' same-slot rule).
    let ka2 = key_where(&client, "xc", |o| o == addrs[0]);
    assert_ne!(key_slot(&ka), key_slot(&ka2));
    let r = cluster
        .node(0)
        .conn()
        .request(&[b"MSET", &ka, b"1", &ka2, b"2"]);
    assert_eq!(r, b"+OK\r\n", "{}", String::from_utf8_lossy(&r));
    // Last, so that a failure here does not hide the routing checks.
    assert_twice_the_slots(&slots[0], addrs[2], &addrs[..2]);
}

/// The node at `big` (twice the pool of each of `smalls`) owns 1.6-2.4
/// times the slots of each.
fn assert_twice_the_slots(ranges: &[SlotRange], big: SocketAddr, smalls: &[SocketAddr]) {
    let counts = slot_counts(ranges);
    assert_eq!(counts.values().sum::<u32>(), u32::from(SLOTS));
    let big = f64::from(counts[&big]);
    for small in smalls {
        let small = f64::from(counts[small]);
        let ratio = big / small;
        println!("slots: big node {big}, small node {small} (x{ratio:.2})");
        assert!(
            (1.6..=2.4).contains(&ratio),
            "the node with twice the pool owns {big} slots, the other {small}: x{ratio:.2}"
        );
    }
}

/// `CLUSTER SLOTS` lists, for every range, the nodes that hold copies of
/// each of its slots (owner first). Checked where it matters: for slots
/// whose copies the placement puts elsewhere than the range's first slot's,
/// a key is written and its holders (`KEYS *` per node) compared.
#[test]
fn cluster_slots_lists_the_nodes_that_hold_each_slot() {
    let cluster = Cluster::start(&["64MiB", "64MiB", "64MiB", "64MiB"], 2);
    let ring = cluster.expected_ring();
    let ranges = cluster_slots(cluster.node(0).addr()).unwrap();
    let listed = |slot: u16| -> Vec<String> {
        let r = ranges
            .iter()
            .find(|r| (r.start..=r.end).contains(&slot))
            .expect("every slot is listed");
        r.nodes.iter().map(SocketAddr::to_string).collect()
    };
    let placed = |slot: u16| -> Vec<String> {
        ring.replicas(slot, 2)
            .iter()
            .map(|n| n.resp_addr.clone())
            .collect()
    };
    for slot in 0..SLOTS {
        assert_eq!(listed(slot)[0], placed(slot)[0], "owner of slot {slot}");
    }
    let wrong: Vec<u16> = (0..SLOTS).filter(|&s| listed(s) != placed(s)).collect();
    let mut probes: Vec<u16> = wrong.iter().copied().take(3).collect();
    probes.extend([0, 8191, 16383]);
    let mut c = cluster.client();
    let mut bad = Vec::new();
    for slot in probes {
        let key = (0..1_000_000)
            .map(|j| format!("probe:{j}").into_bytes())
            .find(|k| key_slot(k) == slot)
            .expect("a key in every slot");
        c.set(&key, b"v").expect("SET");
        let mut holders: Vec<String> = cluster
            .live()
            .filter(|s| local_keys(s).contains(&key))
            .map(|s| s.addr().to_string())
            .collect();
        holders.sort();
        let mut want = listed(slot);
        want.sort();
        if holders != want {
            bad.push((slot, listed(slot), holders));
        }
    }
    assert!(
        bad.is_empty() && wrong.is_empty(),
        "{} of {SLOTS} slots are held by other nodes than CLUSTER SLOTS lists (e.g. {:?}); \
         probes (slot, listed, holders): {bad:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
}

/// Pools above the ring's floor of virtual points (160 × 256 MiB = 40 GiB)
/// are weighted; the arena is reserved, not touched, so this costs no RAM.
#[test]
fn large_pools_weight_the_ring_by_capacity() {
    let cluster = Cluster::start(&["40GiB", "40GiB", "80GiB"], 1);
    let addrs = cluster.seeds();
    let slots = cluster_slots(addrs[0]).unwrap();
    assert_twice_the_slots(&slots, addrs[2], &addrs[..2]);
}

/// `INFO cluster` is the operator's view of the ring (documented fields).
#[test]
fn info_cluster_section_reports_the_ring_and_repair_figures() {
    let cluster = Cluster::start(&["64MiB", "64MiB"], 2);
    for s in cluster.live() {
        let reply = s.conn().request(&[b"INFO", b"cluster"]);
        let text = match parse_reply(&reply) {
            Resp::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!("INFO cluster: {other:?}"),
        };
        assert!(text.contains("# Cluster"), "INFO cluster is {text:?}");
        assert_eq!(info_cluster_field(s, "ring_nodes"), Some(2), "{text:?}");
        assert_eq!(info_cluster_field(s, "etcd_healthy"), Some(1), "{text:?}");
        for field in [
            "replica_pushes",
            "repair_runs",
            "repair_pushes",
            "repair_shed",
        ] {
            assert!(
                info_cluster_field(s, field).is_some(),
                "INFO cluster has no {field}: {text:?}"
            );
        }
    }
}

#[test]
fn joining_node_takes_only_moved_slots_and_keys_stay_readable() {
    const KEYS: usize = 300;
    let mut cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let mut c = cluster.client();
    let pairs: Pairs = (0..KEYS)
        .map(|i| {
            let k = format!("stable:{i}").into_bytes();
            let v = value_for(&k, i);
            (k, v)
        })
        .collect();
    for (k, v) in &pairs {
        c.set(k, v).expect("SET before the join");
    }
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    let before = owner_table(&cluster_slots(cluster.node(0).addr()).unwrap());

    // Reads keep going while the node joins; any read that is not exactly
    // the written value is recorded.
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, passes, pairs) = (stop.clone(), passes.clone(), pairs.clone());
        let mut c = cluster.client();
        std::thread::spawn(move || {
            let mut bad: BTreeMap<String, (u64, String)> = BTreeMap::new();
            while !stop.load(Relaxed) {
                for (k, why) in unreadable(&mut c, &pairs) {
                    bad.entry(k).or_insert((0, why)).0 += 1;
                }
                passes.fetch_add(1, Relaxed);
            }
            bad
        })
    };
    assert!(wait_until(within(RING_TIMEOUT), || passes.load(Relaxed) >= 1));

    let joined = Instant::now();
    let new = cluster.spawn_node("64MiB");
    cluster.wait_ring(4);
    let ring_s = joined.elapsed().as_secs_f64();
    let settle_s = wait_placed(&cluster, &pairs, REPAIR_TIMEOUT) + ring_s;
    let p = passes.load(Relaxed);
    assert!(wait_until(within(RING_TIMEOUT), || passes.load(Relaxed) >= p + 2));
    stop.store(true, Relaxed);
    let bad = reader.join().expect("reader thread");

    let new_addr = cluster.node(new).addr();
    let slots: Vec<Vec<SlotRange>> = cluster
        .live()
        .map(|s| cluster_slots(s.addr()).unwrap())
        .collect();
    assert!(slots.iter().all(|s| s == &slots[0]), "nodes disagree");
    let after = owner_table(&slots[0]);
    let mut moved = 0;
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        if b != a {
            assert_eq!(
                *a,
                Some(new_addr),
                "slot {s} moved from {b:?} to an old node"
            );
            moved += 1;
        }
    }
    let share = f64::from(moved) / f64::from(SLOTS);
    println!(
        "join: {moved} slots moved ({:.1}%), ring in {ring_s:.2}s, settled in {settle_s:.2}s, \
         {} read passes",
        share * 100.0,
        passes.load(Relaxed)
    );
    assert!(
        (0.1..=0.4).contains(&share),
        "a 4th equal node took {moved} slots"
    );
    assert!(
        bad.is_empty(),
        "{} keys were not readable with their bytes at some point during the join \
         ((key, (failed reads, first failure))): {:?}",
        bad.len(),
        bad.iter().take(10).collect::<Vec<_>>()
    );
    assert!(unreadable(&mut c, &pairs).is_empty());
}

#[test]
fn kill_9_under_load_keeps_every_acknowledged_write_and_repairs() {
    let mut cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let writer = Writer::start(&cluster, "load");
    writer.wait_progress(200, RING_TIMEOUT);
    let survivor_runs = |c: &Cluster| -> f64 {
        [0, 2]
            .iter()
            .filter_map(|&i| c.node(i).try_metric("strata_repair_runs_total"))
            .sum()
    };
    let runs_before = survivor_runs(&cluster);

    let acked_at_kill = writer.snapshot();
    let killed = Instant::now();
    cluster.kill(1);
    cluster.wait_ring(2);
    let ring_s = killed.elapsed().as_secs_f64();
    let mut c = cluster.client();
    wait_readable(&mut c, &acked_at_kill, FAILOVER_TIMEOUT);
    let failover_s = killed.elapsed().as_secs_f64();
    writer.wait_progress(200, FAILOVER_TIMEOUT);
    let (pairs, failed_writes) = writer.stop();
    let keys = pairs.len() as u64;
    wait_readable(&mut c, &pairs, FAILOVER_TIMEOUT);

    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    assert!(
        wait_until(within(REPAIR_TIMEOUT), || survivor_runs(&cluster)
            > runs_before),
        "no repair ran on the survivors:\n{}",
        cluster
            .live()
            .map(|s| s.stderr())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
    let repair_s = killed.elapsed().as_secs_f64();

    let restarted = Instant::now();
    cluster.restart(1);
    cluster.wait_ring(3);
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    let rejoin_s = restarted.elapsed().as_secs_f64();
    let bad = unreadable(&mut c, &pairs);
    assert!(bad.is_empty(), "after the rejoin: {bad:?}");
    let shed = cluster.metric_sum("strata_repair_shed_total");
    assert!(shed > 0.0, "the rejoin shed no copies");
    println!(
        "kill -9: {keys} keys acknowledged ({} before the kill, {failed_writes} failed writes \
         retried); ring without the node in {ring_s:.2}s; all acknowledged keys readable \
         {failover_s:.2}s after the kill; 2 copies of each {repair_s:.2}s after the kill; \
         rejoined and shed ({shed} copies) in {rejoin_s:.2}s",
        acked_at_kill.len()
    );
}

/// A node killed and started again before its lease runs out never leaves
/// the ring, and comes back with nothing it held in memory. Its new
/// incarnation makes its slots "changed" for repair, so the other holders
/// push it their copies; losing those holders afterwards loses nothing.
/// (Without the incarnation the ring looked unchanged, nothing was pushed,
/// and each key had one copy left.)
#[test]
fn node_restarted_within_its_lease_gets_its_copies_back() {
    let mut cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let mut c = cluster.client();
    let pairs: Pairs = (0..300)
        .map(|i| {
            let k = format!("quick:{i}").into_bytes();
            let v = value_for(&k, i);
            (k, v)
        })
        .collect();
    for (k, v) in &pairs {
        c.set(k, v).unwrap();
    }
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    let killed = Instant::now();
    cluster.kill(0);
    cluster.restart(0);
    assert!(
        killed.elapsed() < Duration::from_secs(u64::from(strata_tests::cluster::NODE_TTL_S)),
        "the restart took longer than the lease: the test no longer tests a quick restart"
    );
    // Node 0 is back, empty; repair fills it again.
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    cluster.kill(1);
    cluster.wait_ring(2);
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    let bad = unreadable(&mut c, &pairs);
    assert!(bad.is_empty(), "lost after the second kill: {bad:?}");
}

/// A member whose record is gone gets no peer's word that it may serve,
/// even once they reach it again: the others took its slots over and wrote
/// past its copies, and that word let it serve them (stale reads in
/// tests/bed/faults.py's `isolate`) before it learned from etcd that its
/// record was deleted. A healthy member keeps the word, and the removed one
/// gets it back once it has registered anew.
#[test]
fn peers_vouch_only_for_members_whose_record_they_hold() {
    let cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let vouch = |from: usize, id: &str| {
        try_request(cluster.node(from).addr(), &[b"STRATA.VOUCH", id.as_bytes()])
            .map(|r| parse_reply(&r))
            .ok()
    };
    assert_eq!(vouch(0, "n1"), Some(Resp::Int(1)), "a healthy member");
    assert_eq!(vouch(0, "nobody"), Some(Resp::Int(0)), "never a member");

    let pid = cluster.node(2).pid().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let removed = wait_until(within(RING_TIMEOUT), || {
        (0..2).all(|i| cluster.node(i).try_metric("strata_ring_nodes") == Some(2.0))
    });
    let (at_0, at_1) = (vouch(0, "n2"), vouch(1, "n2"));
    signal("-CONT");
    assert!(
        removed,
        "the stopped node was not removed from the others' rings"
    );
    assert_eq!(
        at_0,
        Some(Resp::Int(0)),
        "node 0 vouched for a removed member"
    );
    assert_eq!(
        at_1,
        Some(Resp::Int(0)),
        "node 1 vouched for a removed member"
    );

    cluster.wait_ring(3);
    assert!(
        wait_until(within(RING_TIMEOUT), || vouch(0, "n2")
            == Some(Resp::Int(1))),
        "the member registered anew but node 0 does not vouch for it"
    );
}

#[test]
fn nodes_serve_while_their_leases_last_when_etcd_is_down_then_refuse_and_rejoin_with_every_write() {
    let mut cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let slots_before = cluster_slots(cluster.node(0).addr()).unwrap();
    let writer = Writer::start(&cluster, "etcd");
    writer.wait_progress(100, RING_TIMEOUT);

    let stopped = Instant::now();
    cluster.etcd.stop();
    cluster.wait_metric("strata_etcd_healthy", 0.0);
    let noticed_s = stopped.elapsed().as_secs_f64();
    // Nobody can take over while etcd is down, but nobody can prove it
    // either once the leases would have run out: every node then refuses
    // key commands (and its map) rather than risk two owners.
    cluster.wait_metric("strata_fenced", 1.0);
    let fenced_s = stopped.elapsed().as_secs_f64();
    let lease = f64::from(strata_tests::cluster::NODE_TTL_S);
    assert!(
        fenced_s <= lease + 1.0,
        "fenced {fenced_s:.2}s after etcd stopped (lease {lease}s)"
    );
    for s in cluster.live() {
        assert_eq!(s.try_metric("strata_ring_nodes"), Some(3.0));
        let err = cluster_slots(s.addr()).expect_err("a fenced node gives no map");
        assert!(err.to_string().contains("CLUSTERDOWN fenced"), "{err}");
        let (_, body) = s.http_get("/health");
        let h: serde_json::Value = serde_json::from_str(&body).expect("/health is JSON");
        assert_eq!(h["etcd_healthy"], false, "{body}");
        assert_eq!(h["ring_nodes"], 3, "{body}");
    }

    let restarted = Instant::now();
    cluster.etcd.restart();
    cluster.wait_metric("strata_etcd_healthy", 1.0);
    cluster.wait_metric("strata_fenced", 0.0);
    cluster.wait_ring(3);
    let back_s = restarted.elapsed().as_secs_f64();
    for s in cluster.live() {
        assert_eq!(cluster_slots(s.addr()).unwrap(), slots_before);
    }
    writer.wait_progress(100, RING_TIMEOUT);
    let (pairs, failed_writes) = writer.stop();
    let mut c = cluster.client();
    wait_readable(&mut c, &pairs, Duration::ZERO);
    wait_placed(&cluster, &pairs, REPAIR_TIMEOUT);
    println!(
        "etcd down: noticed by every node in {noticed_s:.2}s, all fenced after {fenced_s:.2}s, \
         serving again {back_s:.2}s after the restart; {} keys written, {failed_writes} writes failed",
        pairs.len()
    );
}

/// `STRATA_TEST_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("STRATA_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

const REDIS_PY_SCRIPT: &str = r#"
import sys
from redis.cluster import RedisCluster
rc = RedisCluster(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=10)
keys = [f"py:{i}" for i in range(200)]
for i, k in enumerate(keys):
    assert rc.set(k, f"v{i}\r\n\0") is True, k
for i, k in enumerate(keys):
    got = rc.get(k)
    assert got == f"v{i}\r\n\0".encode(), (k, got)
got = rc.mget_nonatomic(keys)
assert got == [f"v{i}\r\n\0".encode() for i in range(200)], got
print("ok", len(rc.get_nodes()))
"#;

#[test]
fn unmodified_cluster_clients_route_by_themselves() {
    let cluster = Cluster::start(&["64MiB", "64MiB", "64MiB"], 2);
    let client = cluster.client();
    let addrs = cluster.seeds();
    for (i, owner) in addrs.iter().enumerate() {
        let key = String::from_utf8(key_where(&client, "cli", |o| o == *owner)).unwrap();
        let entry = addrs[(i + 1) % addrs.len()].port().to_string();
        let cli = |args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-c", "-h", "127.0.0.1", "-p", &entry])
                .args(args)
                .output()
                .expect("run redis-cli");
            assert!(out.status.success(), "{out:?}");
            // With -c, redis-cli may print a redirect line first.
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            stdout.trim().lines().last().unwrap_or("").to_string()
        };
        let value = format!("value of {key}");
        assert_eq!(cli(&["SET", &key, &value]), "OK");
        assert_eq!(cli(&["GET", &key]), value);
        let on_owner = try_request(*owner, &[b"GET", key.as_bytes()]).unwrap();
        assert_eq!(parse_reply(&on_owner), Resp::Bulk(value.into_bytes()));
    }

    let probe = Command::new(python()).args(["-c", "import redis"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        other => {
            println!("redis-py part skipped: `import redis` failed: {other:?}");
            return;
        }
    }
    let out = Command::new(python())
        .args(["-c", REDIS_PY_SCRIPT, &addrs[0].port().to_string()])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "redis-py RedisCluster failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok 3");
}

/// Writes acknowledged with fewer copies than `replica_num` are counted and
/// their keys shown (INFO, `/metrics`, `/health`) until a node joins and
/// they are pushed again; then losing any one node loses none of them.
#[test]
fn under_replicated_writes_are_counted_and_pushed_again_when_a_node_joins() {
    let mut cluster = Cluster::start(&["64MiB", "64MiB"], 3);
    let mut c = cluster.client();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..60)
        .map(|i| {
            let k = format!("under:{i}").into_bytes();
            let v = value_for(&k, i);
            (k, v)
        })
        .collect();
    for (k, v) in &pairs {
        c.set(k, v).expect("SET");
    }
    let field_sum = |cluster: &Cluster, f: &str| -> u64 {
        cluster
            .live()
            .map(|s| info_cluster_field(s, f).unwrap_or(0))
            .sum()
    };
    // Two nodes for three copies: every write is short of one copy.
    assert_eq!(field_sum(&cluster, "under_replicated_writes"), 60);
    assert_eq!(field_sum(&cluster, "under_replicated_keys"), 60);
    assert_eq!(cluster.metric_sum("strata_under_replicated_keys"), 60.0);
    assert_eq!(
        cluster.metric_sum("strata_under_replicated_writes_total"),
        60.0
    );

    // A third node: the keys get their third copy and leave the count.
    cluster.spawn_node("64MiB");
    cluster.wait_ring(3);
    let placed = wait_until(within(REPAIR_TIMEOUT), || {
        field_sum(&cluster, "under_replicated_keys") == 0
    });
    assert!(
        placed,
        "still under-replicated: {}",
        field_sum(&cluster, "under_replicated_keys")
    );
    assert_eq!(
        field_sum(&cluster, "under_replicated_writes"),
        60,
        "a counter"
    );
    for s in cluster.live() {
        let (status, body) = s.http_get("/health");
        assert_eq!(status, 200, "{body}");
        let h: serde_json::Value = serde_json::from_str(&body).expect("/health is JSON");
        assert_eq!(h["under_replicated_keys"], 0, "{body}");
    }
    // Every key is on all three nodes now: any one may go.
    cluster.kill(0);
    wait_readable(&mut c, &pairs, FAILOVER_TIMEOUT);
}
