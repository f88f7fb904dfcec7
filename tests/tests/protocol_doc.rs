//! The replies docs/PROTOCOL.md documents for the edges of the zero-copy
//! commands, one assertion per documented sentence, against a real node.

use redis::{Connection, RedisError, Value};
use strata_tests::Server;

/// A descriptor of a client buffer at a port nothing listens on.
const NOWHERE: &str = "tcp://127.0.0.1:1/1000+10#00000001";

fn err(con: &mut Connection, cmd: &mut redis::Cmd) -> String {
    let e: RedisError = cmd.query::<Value>(con).expect_err("an error reply");
    format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))
}

fn lease(con: &mut Connection, key: &str, dst: &str) -> (String, i64) {
    let v: Vec<Value> = redis::cmd("GET")
        .arg(key)
        .arg(dst)
        .query(con)
        .expect("GET key desc");
    match (&v[0], &v[1]) {
        (Value::BulkString(d), Value::Int(id)) => (String::from_utf8(d.clone()).unwrap(), *id),
        other => panic!("GET reply {other:?}"),
    }
}

#[test]
fn zero_copy_edges_reply_as_documented() {
    let server = Server::start(&["--max-leases", "3"]);
    let mut c = server.client(false);
    for (k, v) in [("a", "1"), ("b", "2")] {
        let _: () = redis::cmd("SET").arg(k).arg(v).query(&mut c).unwrap();
    }

    // PUT: a closed port in the descriptor is an I/O error, named.
    let e = err(&mut c, redis::cmd("PUT").arg("x").arg(NOWHERE));
    assert!(
        e.starts_with("ERR io:") && e.contains("Connection refused"),
        "{e}"
    );
    // PUT: an epoch in the source descriptor is refused.
    let e = err(
        &mut c,
        redis::cmd("PUT").arg("x").arg(format!("{NOWHERE}@5")),
    );
    assert!(e.starts_with("BADDESC"), "{e}");
    // PUT TTL 0 is refused like Redis' SET EX 0.
    let e = err(
        &mut c,
        redis::cmd("PUT").arg("x").arg(NOWHERE).arg("TTL").arg(0),
    );
    assert!(e.contains("invalid expire time"), "{e}");
    // A zero-length PUT dials nothing and stores the empty value.
    let ok: String = redis::cmd("PUT")
        .arg("empty")
        .arg("tcp://127.0.0.1:1/1000+0#00000001")
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");
    let v: Vec<u8> = redis::cmd("GET").arg("empty").query(&mut c).unwrap();
    assert!(v.is_empty());
    let exists: i64 = redis::cmd("EXISTS").arg("empty").query(&mut c).unwrap();
    assert_eq!(exists, 1);

    // GET over TCP never dials the destination (only its len matters), and
    // ignores an epoch on it.
    let (d1, l1) = lease(&mut c, "a", NOWHERE);
    let (d2, l2) = lease(&mut c, "a", &format!("{NOWHERE}@3"));
    assert_ne!(l1, l2, "two leases");
    // Two leases on one value share its read token (the epoch).
    assert_eq!(d1.rsplit('@').next(), d2.rsplit('@').next(), "{d1} {d2}");
    // PREFIX ... PIN takes a lease from the same max_leases budget.
    let v: Vec<Value> = redis::cmd("PREFIX")
        .arg("a")
        .arg("b")
        .arg("PIN")
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!(v[0], Value::Int(2));
    let e = err(&mut c, redis::cmd("PREFIX").arg("a").arg("PIN").arg(100));
    assert!(e.starts_with("BUSY"), "{e}");
    let e = err(&mut c, redis::cmd("GET").arg("b").arg(NOWHERE));
    assert!(e.starts_with("BUSY"), "{e}");
    let released: i64 = redis::cmd("RELEASE").arg(l1).arg(l2).query(&mut c).unwrap();
    assert_eq!(released, 2);
    // PIN out of [1, lease_ttl_ms] is refused with the range.
    for ms in ["0", "-1", "5001"] {
        let e = err(&mut c, redis::cmd("PREFIX").arg("a").arg("PIN").arg(ms));
        assert!(
            e.contains("PIN must be between 1 and lease_ttl_ms (5000)"),
            "PIN {ms}: {e}"
        );
    }

    // MPUT over 1024 pairs is refused whole.
    let mut mput = redis::cmd("MPUT");
    for i in 0..1025 {
        mput.arg(format!("k{i}")).arg(NOWHERE);
    }
    let e = err(&mut c, &mut mput);
    assert!(e.contains("at most 1024 pairs per MPUT"), "{e}");
}

/// `GET key desc INLINE n RANGE off len`: `[version, len, bytes]` for a
/// value of at most `n` bytes, clipped to the value; the version is
/// `STRATA.META`'s and changes with a write; a larger value is leased whole
/// as without `RANGE`; the errors are `GET key desc INLINE n`'s.
#[test]
fn ranged_gets_reply_as_documented() {
    let server = Server::start(&[]);
    let mut c = server.client(false);
    let value: Vec<u8> = (0..100u8).collect();
    let _: () = redis::cmd("SET")
        .arg("r")
        .arg(&value)
        .query(&mut c)
        .unwrap();
    let dst = "tcp://127.0.0.1:1/1000+4096#00000001";
    let ranged = |c: &mut Connection, n: i64, off: i64, len: i64| -> Vec<Value> {
        redis::cmd("GET")
            .arg("r")
            .arg(dst)
            .arg("INLINE")
            .arg(n)
            .arg("range")
            .arg(off)
            .arg(len)
            .query(c)
            .expect("ranged GET")
    };
    let meta = |c: &mut Connection| -> i64 {
        let m: Vec<Value> = redis::cmd("STRATA.META").arg("r").query(c).unwrap();
        let at = m
            .iter()
            .position(|v| matches!(v, Value::BulkString(b) if b == b"version"))
            .expect("a version field");
        match m[at + 1] {
            Value::Int(v) => v,
            ref other => panic!("version {other:?}"),
        }
    };
    let version = meta(&mut c);
    for (off, len, want) in [
        (10, 20, &value[10..30]),
        (0, 100, &value[..]),
        (90, 50, &value[90..]),
        (100, 5, &value[..0]),
        (5000, 5, &value[..0]),
        (7, 0, &value[..0]),
    ] {
        let v = ranged(&mut c, 4096, off, len);
        assert_eq!(
            v,
            vec![
                Value::Int(version),
                Value::Int(100),
                Value::BulkString(want.to_vec())
            ],
            "RANGE {off} {len}"
        );
    }
    // A new write: a new version.
    let _: () = redis::cmd("SET")
        .arg("r")
        .arg(&value)
        .query(&mut c)
        .unwrap();
    let v = ranged(&mut c, 4096, 0, 1);
    assert_ne!(v[0], Value::Int(version));
    assert_eq!(v[0], Value::Int(meta(&mut c)));
    // Over INLINE's limit: the whole value under a lease, RANGE aside.
    let v = ranged(&mut c, 99, 10, 20);
    assert!(
        matches!(
            (&v[0], &v[1], &v[2]),
            (Value::BulkString(_), Value::Int(_), Value::Int(100))
        ),
        "{v:?}"
    );

    let get = |args: &[&str]| {
        let mut cmd = redis::cmd("GET");
        cmd.arg("r").arg(dst);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    };
    let cases: [(&[&str], &str); 7] = [
        (
            &["INLINE", "4096", "RANGE", "-1", "5"],
            "ERR RANGE must be 0 or more bytes",
        ),
        (
            &["INLINE", "4096", "RANGE", "0", "-5"],
            "ERR RANGE must be 0 or more bytes",
        ),
        (
            &["INLINE", "4096", "RANGE", "x", "5"],
            "ERR value is not an integer",
        ),
        (
            &["INLINE", "-1", "RANGE", "0", "5"],
            "ERR INLINE must be 0 or more bytes",
        ),
        (&["INLINE", "4096", "SPAN", "0", "5"], "ERR syntax error"),
        (
            &["INLINE", "4096", "RANGE", "0"],
            "ERR wrong number of arguments",
        ),
        (
            &["INLINE", "4096", "RANGE", "0", "5", "6"],
            "ERR wrong number of arguments",
        ),
    ];
    for (args, want) in cases {
        let e = err(&mut c, &mut get(args));
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
    // The destination is checked first, and a missing key is NOTFOUND.
    let small = "tcp://127.0.0.1:1/1000+99#00000001";
    let mut cmd = redis::cmd("GET");
    cmd.arg("r")
        .arg(small)
        .arg("INLINE")
        .arg(4096)
        .arg("RANGE")
        .arg(0)
        .arg(1);
    assert!(err(&mut c, &mut cmd).starts_with("TOOLARGE"));
    let mut cmd = redis::cmd("GET");
    cmd.arg("nope")
        .arg(dst)
        .arg("INLINE")
        .arg(4096)
        .arg("RANGE")
        .arg(0)
        .arg(1);
    assert!(err(&mut c, &mut cmd).starts_with("NOTFOUND"));
}
