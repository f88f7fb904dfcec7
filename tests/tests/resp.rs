//! The `redis` crate against a real node, over RESP2 and RESP3, plus raw
//! pipelining. Each test runs its checks once per protocol on one node,
//! with keys prefixed by the protocol so the two runs cannot see each other.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use redis::{Connection, Value};
use strata_tests::{wait_until, within, Server};

/// Runs `check` over a RESP2 and a RESP3 connection to one fresh node.
fn each_protocol(check: impl Fn(&mut Connection, &str)) {
    let server = Server::start(&[]);
    for (resp3, prefix) in [(false, "resp2"), (true, "resp3")] {
        let mut con = server.client(resp3);
        check(&mut con, prefix);
    }
}

/// Deterministic, non-repeating-looking bytes.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn set(con: &mut Connection, key: &[u8], value: &[u8]) {
    let ok: String = redis::cmd("SET").arg(key).arg(value).query(con).unwrap();
    assert_eq!(ok, "OK");
}

fn get(con: &mut Connection, key: &[u8]) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

#[test]
fn binary_safe_values_round_trip() {
    each_protocol(|con, p| {
        let every_byte: Vec<u8> = (0..=255u8).collect();
        let mib = pattern(1 << 20, 7);
        for (name, value) in [
            ("all-bytes", &every_byte[..]),
            ("empty", &[][..]),
            ("one-mib", &mib[..]),
        ] {
            let key = format!("{p}:{name}");
            set(con, key.as_bytes(), value);
            assert_eq!(get(con, key.as_bytes()).as_deref(), Some(value), "{key}");
        }
        assert_eq!(get(con, format!("{p}:missing").as_bytes()), None);
    });
}

/// A large SET is read from the socket straight into its arena chunk, and
/// STRATA.META sums the stored bytes when asked: what it reports must be
/// the CRC-32C of exactly the bytes sent, whatever the size, including
/// sizes around the streaming threshold (64 KiB).
#[test]
fn a_streamed_set_records_the_checksum_of_its_bytes() {
    each_protocol(|con, p| {
        for (i, len) in [65_535, 65_536, 65_537, 131_073, 1 << 20, (3 << 20) + 12_345]
            .into_iter()
            .enumerate()
        {
            let key = format!("{p}:crc:{len}");
            let value = pattern(len, i as u8);
            set(con, key.as_bytes(), &value);
            let meta: HashMap<String, redis::Value> =
                redis::cmd("STRATA.META").arg(&key).query(con).unwrap();
            let sum = match &meta["checksum"] {
                Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => s.clone(),
                other => panic!("checksum: {other:?}"),
            };
            assert_eq!(
                sum,
                format!("crc32c:{:08x}", crc32c::crc32c(&value)),
                "{len} bytes"
            );
            assert_eq!(get(con, key.as_bytes()).as_deref(), Some(&value[..]));
        }
    });
}

#[test]
fn mset_mget_with_a_missing_key() {
    each_protocol(|con, p| {
        let (a, b, missing) = (format!("{p}:a"), format!("{p}:b"), format!("{p}:nope"));
        let ok: String = redis::cmd("MSET")
            .arg(&a)
            .arg(b"1\x00one")
            .arg(&b)
            .arg(b"two")
            .query(con)
            .unwrap();
        assert_eq!(ok, "OK");
        let got: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&a)
            .arg(&missing)
            .arg(&b)
            .query(con)
            .unwrap();
        assert_eq!(
            got,
            vec![Some(b"1\x00one".to_vec()), None, Some(b"two".to_vec())]
        );
    });
}

#[test]
fn del_and_exists_count_keys() {
    each_protocol(|con, p| {
        let keys: Vec<String> = (0..3).map(|i| format!("{p}:k{i}")).collect();
        for k in &keys {
            set(con, k.as_bytes(), b"v");
        }
        let exists = |con: &mut Connection, ks: &[&str]| -> i64 {
            redis::cmd("EXISTS").arg(ks).query(con).unwrap()
        };
        // EXISTS counts repeats, as Redis does.
        assert_eq!(exists(con, &[&keys[0], &keys[0], &keys[1], "none"]), 3);
        let deleted: i64 = redis::cmd("DEL")
            .arg(&keys[0])
            .arg(&keys[1])
            .arg("none")
            .query(con)
            .unwrap();
        assert_eq!(deleted, 2);
        assert_eq!(exists(con, &[&keys[0], &keys[1], &keys[2]]), 1);
        assert_eq!(get(con, keys[0].as_bytes()), None);
    });
}

#[test]
fn expire_and_ttl() {
    each_protocol(|con, p| {
        let (k, gone) = (format!("{p}:ttl"), format!("{p}:soon-gone"));
        set(con, k.as_bytes(), b"v");
        let ttl = |con: &mut Connection, key: &str| -> i64 {
            redis::cmd("TTL").arg(key).query(con).unwrap()
        };
        assert_eq!(ttl(con, &k), -1, "no TTL yet");
        assert_eq!(ttl(con, "missing"), -2);
        let set_ttl: i64 = redis::cmd("EXPIRE").arg(&k).arg(100).query(con).unwrap();
        assert_eq!(set_ttl, 1);
        assert!((99..=100).contains(&ttl(con, &k)), "{}", ttl(con, &k));
        let on_missing: i64 = redis::cmd("EXPIRE")
            .arg("missing")
            .arg(5)
            .query(con)
            .unwrap();
        assert_eq!(on_missing, 0);

        set(con, gone.as_bytes(), b"v");
        let _: i64 = redis::cmd("PEXPIRE").arg(&gone).arg(50).query(con).unwrap();
        let expired = wait_until(within(Duration::from_secs(5)), || {
            get(con, gone.as_bytes()).is_none()
        });
        assert!(expired, "{gone} still readable after its 50 ms TTL");
        assert_eq!(ttl(con, &gone), -2);
    });
}

#[test]
fn scan_visits_every_key_once() {
    each_protocol(|con, p| {
        let want: HashSet<String> = (0..250).map(|i| format!("{p}:scan:{i}")).collect();
        for k in &want {
            set(con, k.as_bytes(), b"x");
        }
        // Keys of the other run and of other tests must be filtered out.
        set(con, format!("{p}:other").as_bytes(), b"x");
        let mut seen = Vec::new();
        let mut cursor = 0u64;
        for _ in 0..10_000 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{p}:scan:*"))
                .arg("COUNT")
                .arg(20)
                .query(con)
                .unwrap();
            seen.extend(keys);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        assert_eq!(cursor, 0, "SCAN did not finish");
        // The server documents "exactly once" for keys present throughout.
        assert_eq!(seen.len(), want.len(), "duplicates or misses");
        assert_eq!(seen.into_iter().collect::<HashSet<_>>(), want);
    });
}

#[test]
fn info_has_a_server_section() {
    each_protocol(|con, _| {
        let info: String = redis::cmd("INFO").query(con).unwrap();
        assert!(info.contains("# Server\r\n"), "{info}");
        assert!(info.contains("redis_mode:standalone"), "{info}");
    });
}

/// Each command is counted under its own name, the same in `/metrics`
/// and `INFO commandstats`, failures apart.
#[test]
fn commands_are_counted_by_name() {
    let server = Server::start(&[]);
    let mut con = server.client(false);
    for i in 0..3 {
        set(&mut con, format!("cnt-{i}").as_bytes(), b"v");
    }
    assert_eq!(get(&mut con, b"cnt-0").as_deref(), Some(&b"v"[..]));
    let bad: redis::RedisResult<Value> = redis::cmd("EXPIRE")
        .arg("cnt-0")
        .arg("soon")
        .query(&mut con);
    assert!(bad.is_err());
    assert_eq!(server.metric("strata_commands_total{cmd=\"set\"}"), 3.0);
    assert_eq!(server.metric("strata_commands_total{cmd=\"get\"}"), 1.0);
    assert_eq!(
        server.metric("strata_command_errors_total{cmd=\"expire\"}"),
        1.0
    );
    // The latency histogram counts the same calls, each in one bucket.
    assert_eq!(
        server.metric("strata_command_seconds_count{cmd=\"set\"}"),
        3.0
    );
    assert_eq!(
        server.metric("strata_command_seconds_bucket{cmd=\"set\",le=\"+Inf\"}"),
        3.0
    );
    assert_eq!(
        server.metric("strata_command_seconds_bucket{cmd=\"set\",le=\"10\"}"),
        3.0
    );
    assert!(server.metric("strata_command_seconds_sum{cmd=\"set\"}") > 0.0);
    assert_eq!(
        server.metric("strata_command_seconds_count{cmd=\"get\"}"),
        1.0
    );
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    assert!(stats.contains("cmdstat_set:calls=3,"), "{stats}");
    assert!(stats.contains("cmdstat_get:calls=1,"), "{stats}");
    assert!(
        stats.contains("cmdstat_expire:calls=1,") && stats.contains("failed_calls=1"),
        "{stats}"
    );
}

/// With `busy_poll_us`, a connection whose next request comes within the
/// window finds it while polling (a hit), and one that waits longer sleeps
/// after the window (a miss); both still get every reply right. Off by
/// default: no connection polls between requests, and the polling for the
/// rest of a long value (`stream_poll_us`, on by default) is not counted.
#[test]
fn busy_polling_finds_close_requests_and_sleeps_after_the_window() {
    let off = Server::start(&[]);
    let mut con = off.client(false);
    for i in 0..50 {
        set(&mut con, format!("bp-{i}").as_bytes(), b"v");
    }
    for i in 0..4u8 {
        let long = pattern(4 << 20, i);
        set(&mut con, b"bp-long", &long);
        assert_eq!(get(&mut con, b"bp-long"), Some(long));
    }
    assert_eq!(off.metric("strata_busy_poll_hits_total"), 0.0);
    assert_eq!(off.metric("strata_busy_poll_misses_total"), 0.0);

    let server = Server::start(&["--busy-poll-us", "1000"]);
    let mut con = server.client(false);
    for i in 0..200u32 {
        let key = format!("bp-{i}");
        let value = pattern(4096 + i as usize, i as u8);
        set(&mut con, key.as_bytes(), &value);
        assert_eq!(get(&mut con, key.as_bytes()), Some(value));
    }
    // 400 requests back to back: most are found while polling, but a
    // loaded test machine may let any gap pass the 1 ms window, so only
    // "some" is certain.
    let hits = server.metric("strata_busy_poll_hits_total");
    assert!(hits > 0.0, "no request of 400 was found while polling");
    // Once the client is quiet, each poll runs out within the window and
    // the connection sleeps: a miss, after the last reply and again after
    // one more request.
    let misses = || server.metric("strata_busy_poll_misses_total");
    assert!(
        wait_until(within(Duration::from_secs(5)), || misses() > 0.0),
        "the poll after the last reply never ended"
    );
    std::thread::sleep(Duration::from_millis(20));
    let before = misses();
    assert_eq!(get(&mut con, b"bp-0"), Some(pattern(4096, 0)));
    assert!(
        wait_until(within(Duration::from_secs(5)), || misses() > before),
        "the poll after one more request never ended"
    );
    assert!(server.info_field("busy_poll_hits") as f64 >= hits);
}

/// After a request that took 20 µs or more from its first bytes to its
/// reply (a 4 MiB SET), a connection polls for the next one for as long
/// again, up to `echo_poll_us` (200 µs by default): a request sent right
/// after the reply is found while polling (a hit), and once the client is
/// quiet the poll runs out and the connection sleeps (a miss). With
/// `--echo-poll-us 0` it never polls.
#[test]
fn after_a_long_request_the_next_is_polled_for_about_as_long() {
    let long = pattern(4 << 20, 7);
    let exchange = |con: &mut redis::Connection| {
        for _ in 0..50 {
            set(con, b"echo-long", &long);
            let pong: String = redis::cmd("PING").query(con).unwrap();
            assert_eq!(pong, "PONG");
        }
    };
    let off = Server::start(&["--echo-poll-us", "0"]);
    exchange(&mut off.client(false));
    assert_eq!(off.metric("strata_echo_poll_hits_total"), 0.0);
    assert_eq!(off.metric("strata_echo_poll_misses_total"), 0.0);

    let server = Server::start(&[]);
    let mut con = server.client(false);
    exchange(&mut con);
    // A PING sent as soon as the SET's reply is read: most are found while
    // polling, though a loaded machine may let any one gap pass the
    // window, so only "some" is certain.
    let hits = server.metric("strata_echo_poll_hits_total");
    assert!(hits > 0.0, "no PING of 50 was found while polling");
    // The PINGs were too short to poll after; one more long SET, and then
    // nothing.
    set(&mut con, b"echo-long", &long);
    let misses = || server.metric("strata_echo_poll_misses_total");
    assert!(
        wait_until(within(Duration::from_secs(5)), || misses() > 0.0),
        "the poll after the last long request never ended"
    );
    assert!(server.info_field("echo_poll_hits") as f64 >= hits);
    assert_eq!(get(&mut con, b"echo-long"), Some(long.clone()));
}

#[test]
fn hello_3_describes_strata() {
    each_protocol(|con, _| {
        let map: HashMap<String, Value> = redis::cmd("HELLO").arg(3).query(con).unwrap();
        let text = |k: &str| -> String {
            redis::from_redis_value_ref(map.get(k).unwrap_or_else(|| panic!("no {k}: {map:?}")))
                .unwrap()
        };
        assert_eq!(text("server"), "strata");
        assert_eq!(text("mode"), "standalone");
        let proto: i64 = redis::from_redis_value_ref(&map["proto"]).unwrap();
        assert_eq!(proto, 3);
    });
}

#[test]
fn a_thousand_pipelined_requests_in_one_write() {
    let server = Server::start(&[]);
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        let (key, value) = (format!("pipe:{i}"), format!("value-{i}"));
        request.extend(b"*1\r\n$4\r\nPING\r\n");
        request.extend(strata_tests::encode(&[
            b"SET",
            key.as_bytes(),
            value.as_bytes(),
        ]));
        request.extend(strata_tests::encode(&[b"GET", key.as_bytes()]));
        expected.extend(b"+PONG\r\n+OK\r\n");
        expected.extend(format!("${}\r\n{value}\r\n", value.len()).as_bytes());
    }
    let reply = server.send_raw(&request);
    assert_eq!(reply.len(), expected.len());
    assert!(reply == expected, "replies differ from the expected order");
}

/// Values of 32 KiB and up are written straight from store memory, around
/// the batched reply buffer; pipelined replies must still come in order.
#[test]
fn pipelined_large_and_small_values_keep_their_order() {
    let server = Server::start(&[]);
    let big = pattern(100 * 1024, 3);
    let bulk = |v: &[u8]| {
        let mut out = format!("${}\r\n", v.len()).into_bytes();
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
        out
    };
    let mut request = strata_tests::encode(&[b"SET", b"big", &big]);
    request.extend(strata_tests::encode(&[b"SET", b"small", b"x"]));
    let mut expected = b"+OK\r\n+OK\r\n".to_vec();
    for _ in 0..50 {
        request.extend(strata_tests::encode(&[b"GET", b"small"]));
        request.extend(strata_tests::encode(&[b"GET", b"big"]));
        request.extend(strata_tests::encode(&[
            b"MGET", b"big", b"missing", b"small", b"big",
        ]));
        expected.extend(bulk(b"x"));
        expected.extend(bulk(&big));
        expected.extend(b"*4\r\n");
        expected.extend(bulk(&big));
        expected.extend(b"$-1\r\n");
        expected.extend(bulk(b"x"));
        expected.extend(bulk(&big));
    }
    request.extend(b"*1\r\n$4\r\nPING\r\n");
    expected.extend(b"+PONG\r\n");
    let reply = server.send_raw(&request);
    assert_eq!(reply.len(), expected.len());
    assert!(reply == expected, "replies differ from the expected order");
}
