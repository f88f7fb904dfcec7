//! The NVMe tier under DRAM, through the real binary: a working set four
//! times DRAM read back byte for byte (inline), Redis semantics for keys
//! that live on NVMe (DEL, EXISTS, overwrite, TTL, NX), the figures in INFO
//! and /metrics, and restarts on the same `ssd_path` after kill -9 and
//! after a graceful stop.

use std::time::Duration;

use strata_tests::{wait_until, within, Server};

const MIB: usize = 1 << 20;
const VALUE: usize = MIB;
/// DRAM holds about 30 values of 1 MiB (32 MiB at a 0.95 watermark).
const DRAM: &str = "32MiB";
/// Four times DRAM.
const KEYS: usize = 128;
// `--ssd-max-value-size 8MiB` sizes NVMe blocks at ~8 MiB, seven values
// each: 512 MiB never fills here, so foyer never evicts a block (which
// drops whatever live values it holds, as a cache does).

fn value(i: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::with_capacity(VALUE + 8);
    while out.len() < VALUE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(VALUE);
    out
}

fn key(i: usize) -> String {
    format!("kv:{i:04}")
}

/// A small DRAM pool over a 512 MiB NVMe tier (at `path`, or a temporary
/// directory when empty).
fn tier_args(path: &str) -> Vec<&str> {
    let mut args = vec![
        "--cpu-memory-pool-size",
        DRAM,
        "--ssd-pool-size",
        "512MiB",
        "--ssd-max-value-size",
        "8MiB",
    ];
    if !path.is_empty() {
        args.extend(["--ssd-path", path]);
    }
    args
}

fn start(path: &str) -> Server {
    Server::start(&tier_args(path))
}

fn fill(server: &Server, range: std::ops::Range<usize>) {
    let mut con = server.client(false);
    for i in range {
        let _: () = redis::cmd("SET")
            .arg(key(i))
            .arg(value(i))
            .query(&mut con)
            .unwrap_or_else(|e| panic!("SET {}: {e}", key(i)));
    }
}

fn get(con: &mut redis::Connection, i: usize) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key(i))
        .query(con)
        .unwrap_or_else(|e| panic!("GET {}: {e}", key(i)))
}

/// Waits until every evicted value is written to NVMe.
fn settle(server: &Server) {
    assert!(
        wait_until(within(Duration::from_secs(30)), || server
            .info_field("nvme_spill_queued")
            == 0),
        "spill queue never drained"
    );
}

#[test]
fn four_times_dram_reads_back_exact_with_redis_semantics() {
    let server = start("");
    fill(&server, 0..KEYS);
    settle(&server);
    assert!(server.info_field("nvme_spilled") >= 90, "{}", server.info());
    assert_eq!(server.info_field("nvme_spill_dropped"), 0);
    let mut con = server.client(false);
    for round in 0..2 {
        for i in 0..KEYS {
            let got = get(&mut con, i).unwrap_or_else(|| panic!("round {round}: {} lost", key(i)));
            assert!(got == value(i), "round {round}: {} has wrong bytes", key(i));
        }
    }
    let promoted = server.info_field("nvme_promoted");
    assert!(promoted >= 2 * 90, "promotions: {promoted}");
    assert_eq!(server.info_field("nvme_read_errors"), 0);
    // The second round re-read values that went back down unchanged: their
    // NVMe copies served, nothing was rewritten.
    assert!(
        server.info_field("nvme_spill_kept") >= 60,
        "{}",
        server.info()
    );
    // INFO and /metrics read the same atomics.
    assert_eq!(server.metric("strata_promoted_total") as u64, promoted);
    assert_eq!(
        server.metric("strata_spilled_total") as u64,
        server.info_field("nvme_spilled")
    );
    assert_eq!(
        server.metric("strata_tier_capacity_bytes{tier=\"nvme\"}") as u64,
        server.info_field("nvme_capacity_bytes")
    );
    assert!(server.info_field("dram_reserved_bytes") <= 32 * MIB as u64);

    // Push keys 0..4 down again: the whole set once more.
    fill(&server, 0..KEYS);
    settle(&server);
    // PREFIX and EXISTS answer for keys on NVMe from its index: no reads.
    let promoted = server.info_field("nvme_promoted");
    let keys: Vec<String> = (0..64).map(key).collect();
    let n: i64 = redis::cmd("PREFIX").arg(&keys).query(&mut con).unwrap();
    assert_eq!(n, 64);
    let n: i64 = redis::cmd("PREFIX")
        .arg(&keys[..10])
        .arg("nope")
        .arg(&keys[10..20])
        .query(&mut con)
        .unwrap();
    assert_eq!(n, 10);
    let n: i64 = redis::cmd("EXISTS")
        .arg(&keys[..32])
        .query(&mut con)
        .unwrap();
    assert_eq!(n, 32);
    assert_eq!(
        server.info_field("nvme_promoted"),
        promoted,
        "existence checks read nothing"
    );
    // Nor does SET NX, which only asks whether the key exists (a value
    // brought up from NVMe counts as a hit there before the command runs).
    let hits = server.info_field("keyspace_hits_nvme");
    let r: Option<String> = redis::cmd("SET")
        .arg(key(7))
        .arg("x")
        .arg("NX")
        .query(&mut con)
        .unwrap();
    assert_eq!(r, None, "NX sees the key on NVMe");
    assert_eq!(
        server.info_field("keyspace_hits_nvme"),
        hits,
        "SET NX brought up the value it would not replace"
    );
    let below = |i: usize| key(i);
    // EXISTS counts a key on NVMe; STRLEN and PTTL see it.
    let n: i64 = redis::cmd("EXISTS")
        .arg(below(0))
        .arg(below(1))
        .arg("nope")
        .query(&mut con)
        .unwrap();
    assert_eq!(n, 2);
    let len: i64 = redis::cmd("STRLEN").arg(below(2)).query(&mut con).unwrap();
    assert_eq!(len, VALUE as i64);
    // DEL of a key on NVMe deletes it for good.
    let n: i64 = redis::cmd("DEL").arg(below(3)).query(&mut con).unwrap();
    assert_eq!(n, 1);
    assert_eq!(get(&mut con, 3), None);
    let n: i64 = redis::cmd("DEL").arg(below(3)).query(&mut con).unwrap();
    assert_eq!(n, 0);
    // SET NX on a key on NVMe does not apply; SET XX and a plain SET
    // replace it.
    let r: Option<String> = redis::cmd("SET")
        .arg(below(4))
        .arg("x")
        .arg("NX")
        .query(&mut con)
        .unwrap();
    assert_eq!(r, None, "NX sees the key on NVMe");
    let r: Option<String> = redis::cmd("SET")
        .arg(below(6))
        .arg("xx")
        .arg("XX")
        .query(&mut con)
        .unwrap();
    assert_eq!(r.as_deref(), Some("OK"), "XX replaces a key on NVMe");
    assert_eq!(get(&mut con, 6).as_deref(), Some(&b"xx"[..]));
    let _: () = redis::cmd("SET")
        .arg(below(5))
        .arg("new")
        .query(&mut con)
        .unwrap();
    assert_eq!(get(&mut con, 5).as_deref(), Some(&b"new"[..]));

    // A TTL survives the trip down and up; an expired key does not return.
    let _: () = redis::cmd("SET")
        .arg("ttl:live")
        .arg(value(1))
        .arg("PX")
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("ttl:dead")
        .arg(value(2))
        .arg("PX")
        .arg(1500)
        .query(&mut con)
        .unwrap();
    fill(&server, 200..240);
    settle(&server);
    std::thread::sleep(Duration::from_millis(1600));
    let pttl: i64 = redis::cmd("PTTL").arg("ttl:live").query(&mut con).unwrap();
    assert!(pttl > 500_000 && pttl <= 600_000, "PTTL {pttl}");
    let dead: Option<Vec<u8>> = redis::cmd("GET").arg("ttl:dead").query(&mut con).unwrap();
    assert_eq!(dead, None);

    // A key read back from NVMe keeps its copy there; an expiry that ends
    // it must end that copy too.
    assert!(get(&mut con, 6).is_some());
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(key(6))
        .arg(1)
        .query(&mut con)
        .unwrap();
    assert_eq!(set, 1);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(get(&mut con, 6), None, "expired key came back from NVMe");
    let n: i64 = redis::cmd("EXISTS").arg(key(6)).query(&mut con).unwrap();
    assert_eq!(n, 0);

    // FLUSHALL reaches NVMe too.
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    for i in [0, 1, 2, 200] {
        assert_eq!(get(&mut con, i), None, "{} after FLUSHALL", key(i));
    }
}

#[test]
fn values_on_nvme_survive_kill_and_a_graceful_stop_keeps_dram_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap().to_string();
    let mut server = start(&path);
    fill(&server, 0..96);
    settle(&server);
    // The oldest keys were evicted (LRU, nothing read): they are on NVMe.
    let spilled = server.info_field("nvme_spilled") as usize;
    assert!(spilled >= 60, "{spilled} spilled");
    let port = server.port();
    let metrics = server.metrics_port();
    server.kill();

    let mut server = Server::start_on(port, metrics, &tier_args(&path));
    let mut con = server.client(false);
    // The key log names the recovered keys: EXISTS and PREFIX answer for
    // them without reading NVMe.
    assert!(dir.path().join("strata-keys.log").exists(), "no key log");
    let keys: Vec<String> = (0..spilled).map(key).collect();
    let exists: usize = redis::cmd("EXISTS").arg(&keys).query(&mut con).unwrap();
    if exists != spilled {
        let missing: Vec<&String> = keys
            .iter()
            .filter(|k| {
                redis::cmd("EXISTS")
                    .arg(k)
                    .query::<usize>(&mut con)
                    .unwrap()
                    == 0
            })
            .collect();
        panic!(
            "EXISTS after kill -9: {exists} of {spilled}; missing {missing:?}\n{}",
            server.info()
        );
    }
    let prefix: usize = redis::cmd("PREFIX").arg(&keys).query(&mut con).unwrap();
    assert_eq!(prefix, spilled, "PREFIX after kill -9");
    assert_eq!(
        server.info_field("nvme_promoted"),
        0,
        "EXISTS/PREFIX read NVMe"
    );
    // Counted and listed too, by DBSIZE, INFO keyspace, KEYS and a SCAN
    // with a small COUNT, all without a read.
    let dbsize: usize = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, spilled, "DBSIZE after kill -9");
    let info: String = redis::cmd("INFO").arg("keyspace").query(&mut con).unwrap();
    assert!(
        info.contains(&format!("db0:keys={spilled},")),
        "INFO keyspace: {info}"
    );
    let mut listed: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    listed.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(listed, want, "KEYS after kill -9");
    let mut scanned = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(7)
            .query(&mut con)
            .unwrap();
        scanned.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    scanned.sort();
    assert_eq!(scanned, want, "SCAN after kill -9: every key once");
    assert_eq!(server.info_field("nvme_promoted"), 0, "listing read NVMe");
    for i in 0..spilled {
        let got = get(&mut con, i).unwrap_or_else(|| panic!("{} lost after kill -9", key(i)));
        assert!(got == value(i), "{} has wrong bytes after kill -9", key(i));
    }
    // Now write everything again and stop gracefully: DRAM goes to NVMe.
    drop(con);
    fill(&server, 0..96);
    let status = server.stop(Duration::from_secs(60));
    assert!(status.success(), "graceful stop: {status}");

    let server = Server::start_on(port, metrics, &tier_args(&path));
    let mut con = server.client(false);
    for i in 0..96 {
        let got = get(&mut con, i)
            .unwrap_or_else(|| panic!("{} lost after a graceful stop\n{}", key(i), server.info()));
        assert!(
            got == value(i),
            "{} has wrong bytes after a graceful stop",
            key(i)
        );
    }
}

#[test]
fn bad_nvme_config_is_refused_at_start() {
    let cases: &[(&[&str], &str)] = &[
        (&["--ssd-pool-size", "1MiB"], "ssd_pool_size"),
        (
            &["--ssd-pool-size", "64MiB", "--ssd-max-value-size", "64MiB"],
            "ssd_pool_size",
        ),
        (&["--ssd-engine", "aio"], "ssd_engine"),
        (&["--ssd-direct-io", "maybe"], "ssd_direct_io"),
        (&["--ssd-max-value-size", "1GiB"], "ssd_max_value_size"),
        (
            &[
                "--ssd-pool-size",
                "128MiB",
                "--ssd-path",
                "/proc/strata-cannot-be-here",
            ],
            "ssd_path",
        ),
    ];
    for (args, needle) in cases {
        let mut cmd = strata_tests::server_command();
        cmd.args(["--port", "1", "--metrics-port", "0", "--data-port", "0"])
            .args(*args);
        let exit = strata_tests::run_to_exit(cmd);
        assert!(!exit.status.success(), "{args:?} started");
        assert!(
            exit.stderr.contains(needle),
            "{args:?}: stderr does not name {needle}:\n{}",
            exit.stderr
        );
    }
}

/// Four clients write, overwrite, delete and read 300 keys of 256 KiB over
/// a 16 MiB DRAM pool, so most operations cross the NVMe tier in both
/// directions while others race them. Each key's operations are serialized
/// by the test, so every read must return exactly the last acknowledged
/// write, or nil after a delete: never older bytes, never a deleted value.
#[test]
fn concurrent_writes_deletes_and_reads_across_tiers_stay_exact() {
    const N: usize = 300;
    const SIZE: usize = 256 * 1024;
    let server = Server::start(&[
        "--cpu-memory-pool-size",
        "16MiB",
        "--ssd-pool-size",
        "512MiB",
        "--ssd-max-value-size",
        "1MiB",
    ]);
    // Every SET is spilled sooner or later: stop writing well before
    // 512 MiB, so that foyer never reclaims a block (which drops live
    // values, as a cache may) and the tier stays small on a CI disk.
    const MAX_SETS: u64 = 1200;
    let sets = std::sync::atomic::AtomicU64::new(0);
    let latest: Vec<std::sync::Mutex<Option<u64>>> =
        (0..N).map(|_| std::sync::Mutex::new(None)).collect();
    let content = |k: usize, v: u64| -> Vec<u8> {
        let mut x = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ v.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        (0..SIZE / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    };
    let deadline = within(Duration::from_secs(15));
    let (reads, wrong) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (server, latest, content, sets) = (&server, &latest, &content, &sets);
                s.spawn(move || {
                    let mut con = server.client(false);
                    let mut rng = t.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
                    let mut version = t << 40;
                    let (mut reads, mut wrong) = (0u64, Vec::new());
                    while std::time::Instant::now() < deadline {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let k = (rng % N as u64) as usize;
                        let op = (rng >> 32) % 100;
                        let key = format!("mix:{k}");
                        let mut last = latest[k].lock().unwrap();
                        if op < 35 {
                            if sets.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= MAX_SETS {
                                break;
                            }
                            version += 1;
                            let _: () = redis::cmd("SET")
                                .arg(&key)
                                .arg(content(k, version))
                                .query(&mut con)
                                .unwrap();
                            *last = Some(version);
                        } else if op < 40 {
                            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
                            *last = None;
                        } else {
                            let got: Option<Vec<u8>> =
                                redis::cmd("GET").arg(&key).query(&mut con).unwrap();
                            reads += 1;
                            let ok = match (*last, got) {
                                (None, None) => true,
                                (Some(v), Some(got)) => got == content(k, v),
                                _ => false,
                            };
                            if !ok {
                                wrong.push(k);
                            }
                        }
                    }
                    (reads, wrong)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).fold(
            (0, Vec::new()),
            |(r, mut w), (r2, w2)| {
                w.extend(w2);
                (r + r2, w)
            },
        )
    });
    let info = server.info();
    assert!(reads > 500, "only {reads} reads");
    assert!(server.info_field("nvme_promoted") > 100, "{info}");
    // 512 MiB of NVMe never fills with these writes: nothing may be missing.
    assert_eq!(server.info_field("nvme_evicted_blocks"), 0, "{info}");
    assert!(
        wrong.is_empty(),
        "{} of {reads} reads were wrong or missing (keys {:?})\n{info}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
}

/// The default NVMe directory is temporary: removed on a graceful stop,
/// and one left by a node killed with SIGKILL is removed by the next node
/// that starts with the default.
#[test]
fn default_temporary_directory_is_cleaned_up() {
    let base = tempfile::tempdir().unwrap();
    let tmpdir = base.path().to_str().unwrap();
    let nvme_dirs = || -> Vec<String> {
        std::fs::read_dir(base.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("strata-nvme-"))
            .collect()
    };
    let args = ["--ssd-pool-size", "64MiB", "--ssd-max-value-size", "1MiB"];
    let env = [("TMPDIR", tmpdir)];
    let mut killed = Server::start_with_env(&args, &env);
    assert_eq!(nvme_dirs().len(), 1, "one temporary NVMe directory");
    killed.kill();
    assert_eq!(nvme_dirs().len(), 1, "SIGKILL leaves it behind");
    let mut next = Server::start_with_env(&args, &env);
    let left = nvme_dirs();
    assert_eq!(
        left.len(),
        1,
        "the orphan is gone, the new node has its own: {left:?}"
    );
    assert!(
        next.info().contains(&left[0]),
        "INFO names the new directory"
    );
    assert!(next.stop(Duration::from_secs(30)).success());
    assert!(nvme_dirs().is_empty(), "a graceful stop removes it");
}

/// Three clustered nodes (two copies of every value) whose values are
/// mostly on NVMe. One node is killed: repair copies the keys it held to
/// the survivors, including keys that sit on the survivors' NVMe. Then a
/// second node is killed: the last one alone must still serve every value.
#[test]
fn repair_reaches_values_on_nvme() {
    use strata_tests::cluster::Cluster;
    const KEYS: usize = 240;
    const SIZE: usize = 256 * 1024;
    let mut cluster = Cluster::start_with(
        &["16MiB", "16MiB", "16MiB"],
        2,
        &["--ssd-pool-size", "256MiB", "--ssd-max-value-size", "1MiB"],
    );
    let value = |i: usize| -> Vec<u8> {
        let mut v = vec![0u8; SIZE];
        for (j, b) in v.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ (j >> 8) as u8;
        }
        v
    };
    let mut client = cluster.client();
    for i in 0..KEYS {
        client
            .set(format!("rk:{i}").as_bytes(), &value(i))
            .unwrap_or_else(|e| panic!("SET rk:{i}: {e}"));
    }
    // 120 MiB of copies on 48 MiB of DRAM: most are on NVMe.
    let spilled: u64 = cluster.live().map(|s| s.info_field("nvme_spilled")).sum();
    assert!(spilled > 100, "only {spilled} values spilled");
    let check_all = |cluster: &Cluster, when: &str| {
        let mut c = cluster.client();
        for i in 0..KEYS {
            let got = c
                .get(format!("rk:{i}").as_bytes())
                .unwrap_or_else(|e| panic!("{when}: GET rk:{i}: {e}"));
            assert!(
                got.as_deref() == Some(&value(i)[..]),
                "{when}: rk:{i} lost or wrong"
            );
        }
    };
    cluster.kill(0);
    cluster.wait_ring(2);
    // Repair has finished when both survivors pushed what they had to; give
    // it time, then take away a second copy.
    let repaired = wait_until(within(Duration::from_secs(60)), || {
        cluster.live().all(|s| s.info_field("repair_runs") >= 1)
            && cluster
                .live()
                .map(|s| s.info_field("repair_pushes"))
                .sum::<u64>()
                > 0
    });
    assert!(repaired, "no repair ran");
    std::thread::sleep(Duration::from_secs(3));
    check_all(&cluster, "after the first kill");
    cluster.kill(1);
    cluster.wait_ring(1);
    check_all(&cluster, "with one node left");
}

/// The scenario end to end: kill -9 a node holding NVMe-resident
/// values, restart it on its own `ssd_path`, kill another node, let repair
/// run, kill the restarted one: the last node holds every acknowledged
/// value. (The surviving holders also push the restarted node its keys when
/// it rejoins; that recovered keys are known without a read is asserted by
/// `values_on_nvme_survive_kill_and_a_graceful_stop_keeps_dram_too`.)
#[test]
fn keys_recovered_from_nvme_are_repaired_after_a_restart() {
    use strata_tests::cluster::Cluster;
    const KEYS: usize = 160;
    const SIZE: usize = 256 * 1024;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut cluster = Cluster::empty(
        2,
        &["--ssd-pool-size", "256MiB", "--ssd-max-value-size", "1MiB"],
    );
    for d in &dirs {
        cluster.spawn_node_with("16MiB", &["--ssd-path", d.path().to_str().unwrap()]);
    }
    cluster.wait_ring(3);
    let value = |i: usize| -> Vec<u8> {
        let mut v = vec![0u8; SIZE];
        for (j, b) in v.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(29) ^ (j as u8).wrapping_mul(5) ^ (j >> 9) as u8;
        }
        v
    };
    let mut client = cluster.client();
    for i in 0..KEYS {
        client
            .set(format!("nk:{i}").as_bytes(), &value(i))
            .unwrap_or_else(|e| panic!("SET nk:{i}: {e}"));
    }
    // 80 MiB of copies on 48 MiB of DRAM: many are on NVMe. Wait until the
    // spill queues are written, so kill -9 leaves them on the device.
    let settled = wait_until(within(Duration::from_secs(30)), || {
        cluster
            .live()
            .all(|s| s.info_field("nvme_spill_queued") == 0)
    });
    assert!(settled, "spill queues never drained");
    let on_nvme = cluster.node(0).info_field("nvme_spilled");
    assert!(on_nvme > 20, "node 0 spilled only {on_nvme}");
    let repaired_once = |cluster: &Cluster, before: &[u64]| {
        let done = wait_until(within(Duration::from_secs(60)), || {
            cluster
                .nodes
                .iter()
                .zip(before)
                .filter(|(n, _)| n.is_running())
                .all(|(n, &b)| n.server().info_field("repair_runs") > b)
        });
        assert!(done, "repair did not run");
        // Pushes of a run finish before its count moves on; let them land.
        std::thread::sleep(Duration::from_secs(2));
    };
    let runs = |cluster: &Cluster| -> Vec<u64> {
        cluster
            .nodes
            .iter()
            .map(|n| {
                if n.is_running() {
                    n.server().info_field("repair_runs")
                } else {
                    0
                }
            })
            .collect()
    };

    cluster.kill(0);
    cluster.wait_ring(2);
    let before = runs(&cluster);
    cluster.restart(0);
    cluster.wait_ring(3);
    repaired_once(&cluster, &before);

    let before = runs(&cluster);
    cluster.kill(1);
    cluster.wait_ring(2);
    repaired_once(&cluster, &before);

    cluster.kill(0);
    cluster.wait_ring(1);
    let mut c = cluster.client();
    let mut lost = Vec::new();
    for i in 0..KEYS {
        let got = c
            .get(format!("nk:{i}").as_bytes())
            .unwrap_or_else(|e| panic!("GET nk:{i}: {e}"));
        if got.as_deref() != Some(&value(i)[..]) {
            lost.push(i);
        }
    }
    assert!(lost.is_empty(), "{} of {KEYS} lost: {lost:?}", lost.len());
}
