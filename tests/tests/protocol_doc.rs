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
