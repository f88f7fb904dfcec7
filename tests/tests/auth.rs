//! `--requirepass`: only PING, AUTH, HELLO and QUIT work before a client
//! authenticates; AUTH and HELLO ... AUTH both let it in.

use strata_tests::Server;

const PASSWORD: &str = "secret";

fn start() -> Server {
    Server::start(&["--requirepass", PASSWORD])
}

fn starts_with(reply: &[u8], prefix: &str) -> bool {
    reply.starts_with(prefix.as_bytes())
}

#[test]
fn commands_wait_for_auth() {
    let server = start();
    let mut c = server.conn();
    let r = c.request(&[b"GET", b"k"]);
    assert!(
        starts_with(&r, "-NOAUTH "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    // Unknown commands must not tell an unauthenticated client what exists.
    let r = c.request(&[b"NOPE"]);
    assert!(
        starts_with(&r, "-NOAUTH "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    assert_eq!(c.request(&[b"PING"]), b"+PONG\r\n");
    let r = c.request(&[b"AUTH", b"wrong"]);
    assert!(
        starts_with(&r, "-WRONGPASS "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    let r = c.request(&[b"AUTH", b"nobody", PASSWORD.as_bytes()]);
    assert!(
        starts_with(&r, "-WRONGPASS "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    let r = c.request(&[b"GET", b"k"]);
    assert!(
        starts_with(&r, "-NOAUTH "),
        "still locked after a failed AUTH"
    );
    assert_eq!(c.request(&[b"AUTH", PASSWORD.as_bytes()]), b"+OK\r\n");
    assert_eq!(c.request(&[b"SET", b"k", b"v"]), b"+OK\r\n");
    assert_eq!(c.request(&[b"GET", b"k"]), b"$1\r\nv\r\n");
    // Authentication belongs to the connection.
    let r = server.conn().request(&[b"GET", b"k"]);
    assert!(
        starts_with(&r, "-NOAUTH "),
        "{}",
        String::from_utf8_lossy(&r)
    );
}

#[test]
fn hello_3_with_auth_on_a_fresh_connection() {
    let server = start();
    let mut c = server.conn();
    let r = c.request(&[b"HELLO", b"3", b"AUTH", b"default", b"wrong"]);
    assert!(
        starts_with(&r, "-WRONGPASS "),
        "{}",
        String::from_utf8_lossy(&r)
    );
    let r = c.request(&[b"HELLO", b"3", b"AUTH", b"default", PASSWORD.as_bytes()]);
    let text = String::from_utf8_lossy(&r);
    assert!(text.starts_with('%'), "HELLO 3 must reply a map: {text}");
    assert!(text.contains("strata"), "{text}");
    assert_eq!(c.request(&[b"SET", b"k", b"v"]), b"+OK\r\n");
    assert_eq!(c.request(&[b"GET", b"k"]), b"$1\r\nv\r\n");
    // RESP3 null for a missing key.
    assert_eq!(c.request(&[b"GET", b"missing"]), b"_\r\n");
}

#[test]
fn redis_crate_authenticates_from_the_url() {
    let server = start();
    for q in ["", "?protocol=resp3"] {
        let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/{q}", server.port());
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("SET").arg("k").arg(q).query(&mut con).unwrap();
        let v: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(v, q);
    }
}
