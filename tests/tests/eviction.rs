//! A 16 MiB pool written with 40 MiB of values: the node must evict, stay
//! within its pool, keep the newest values intact, and report the same
//! figures in `INFO` and on `/metrics`.

use strata_tests::{info_value, Server};

const MIB: u64 = 1 << 20;
const POOL_BYTES: u64 = 16 * MIB;
const VALUE_BYTES: usize = 100 * 1024;
const WRITES: usize = 400;
/// The newest values must survive: LRU evicts the oldest first, and 50
/// values (5 MiB) are far below the pool.
const NEWEST: usize = 50;
/// Pool usage is sampled this often while writing.
const SAMPLE_EVERY: usize = 10;

fn value(i: usize) -> Vec<u8> {
    let tag = (i as u32).to_le_bytes();
    (0..VALUE_BYTES)
        .map(|j| tag[j % 4] ^ (j as u8).wrapping_mul(31))
        .collect()
}

fn key(i: usize) -> String {
    format!("evict:{i:04}")
}

#[test]
fn writes_past_the_pool_evict_and_stay_within_it() {
    let server = Server::start(&["--cpu-memory-pool-size", "16MiB"]);
    let mut con = server.client(false);
    for i in 0..WRITES {
        let _: () = redis::cmd("SET")
            .arg(key(i))
            .arg(value(i))
            .query(&mut con)
            .unwrap_or_else(|e| panic!("SET {}: {e}", key(i)));
        if i % SAMPLE_EVERY == 0 || i == WRITES - 1 {
            let reserved = server.info_field("dram_reserved_bytes");
            assert!(
                reserved <= POOL_BYTES,
                "after {} writes dram_reserved_bytes is {reserved} > {POOL_BYTES}",
                i + 1
            );
        }
    }
    assert!(server.info_field("evicted_keys") > 0);
    for i in WRITES - NEWEST..WRITES {
        let got: Option<Vec<u8>> = redis::cmd("GET").arg(key(i)).query(&mut con).unwrap();
        assert!(got == Some(value(i)), "{} lost or corrupted", key(i));
    }

    // Nothing writes now, so both views must read the same numbers.
    let info = server.info();
    let field = |name: &str| {
        info_value(&info, name).unwrap_or_else(|| panic!("INFO has no {name}:\n{info}"))
    };
    let dram = |name: &str| server.metric(&format!("{name}{{tier=\"dram\"}}")) as u64;
    assert_eq!(field("dram_keys"), server.metric("strata_keys") as u64);
    assert_eq!(field("dram_used_bytes"), dram("strata_tier_used_bytes"));
    assert_eq!(field("used_memory"), field("dram_used_bytes"));
    assert_eq!(
        field("dram_capacity_bytes"),
        dram("strata_tier_capacity_bytes")
    );
    assert_eq!(field("dram_capacity_bytes"), POOL_BYTES);
    assert_eq!(field("evicted_keys"), dram("strata_evictions_total"));
    assert_eq!(field("dram_evictions"), field("evicted_keys"));
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, field("dram_keys"));
    assert_eq!(
        dbsize + field("evicted_keys"),
        WRITES as u64,
        "every key is either stored or evicted"
    );
}

#[test]
fn value_larger_than_the_pool_is_too_large() {
    // The enforced value limit is min(max_value_size, pool): 16 MiB here.
    let server = Server::start(&["--cpu-memory-pool-size", "16MiB"]);
    let mut c = server.conn();
    c.send(format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n", 16 * MIB + 1).as_bytes());
    let reply = String::from_utf8_lossy(&c.read_reply()).into_owned();
    assert!(reply.starts_with("-TOOLARGE "), "{reply:?}");
    assert_eq!(server.conn().request(&[b"EXISTS", b"big"]), b":0\r\n");
}

/// `cpu_memory_prefault`: the arena is faulted in in the background while
/// the node already serves, values written meanwhile keep their bytes, and
/// the node says when it is done. Without it the arena stays lazy.
#[test]
fn prefault_brings_the_whole_pool_in_while_serving() {
    const PREFAULT_POOL: u64 = 192 * MIB;
    let pool = format!("{}MiB", PREFAULT_POOL / MIB);
    let lazy = Server::start(&["--cpu-memory-pool-size", &pool, "--ssd-pool-size", "0"]);
    let server = Server::start(&[
        "--cpu-memory-pool-size",
        &pool,
        "--ssd-pool-size",
        "0",
        "--cpu-memory-prefault",
        "true",
    ]);
    let mut conn = server.client(false);
    let early: Vec<u8> = value(7);
    redis::cmd("SET")
        .arg("early")
        .arg(&early)
        .query::<()>(&mut conn)
        .unwrap();
    let done = strata_tests::wait_until(
        strata_tests::within(std::time::Duration::from_secs(60)),
        || server.stderr().contains("DRAM arena prefaulted"),
    );
    assert!(done, "no end of prefault logged:\n{}", server.stderr());
    assert!(
        server.rss_bytes() >= PREFAULT_POOL,
        "RSS {} after prefaulting a pool of {PREFAULT_POOL}",
        server.rss_bytes()
    );
    assert!(
        lazy.rss_bytes() < PREFAULT_POOL / 2,
        "a node without prefault holds {} bytes before any write",
        lazy.rss_bytes()
    );
    let got: Vec<u8> = redis::cmd("GET").arg("early").query(&mut conn).unwrap();
    assert!(got == early, "a value written during the prefault changed");
}
