//! Hostile and broken input against a real node. Every case also checks
//! that a well-behaved client, connected before the bad one, still gets
//! correct replies afterwards and that the server process is alive: bad
//! input may cost the sender its connection, never anyone else theirs.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use redis::Connection;
use strata_tests::{bulk_body, encode, wait_until, within, RawConn, Server};

const MIB: usize = 1 << 20;

/// A client that connected before the bad input and must not notice it.
struct Bystander {
    con: Connection,
}

impl Bystander {
    fn join(server: &Server) -> Bystander {
        let mut con = server.client(false);
        let _: () = redis::cmd("SET")
            .arg("bystander")
            .arg(b"still\x00here")
            .query(&mut con)
            .unwrap();
        Bystander { con }
    }

    fn assert_unaffected(mut self, server: &mut Server) {
        assert!(server.is_alive(), "server died:\n{}", server.stderr());
        let pong: String = redis::cmd("PING").query(&mut self.con).unwrap();
        assert_eq!(pong, "PONG");
        let v: Vec<u8> = redis::cmd("GET")
            .arg("bystander")
            .query(&mut self.con)
            .unwrap();
        assert_eq!(v, b"still\x00here");
    }
}

/// Sends `bytes` on its own connection, expects a protocol error that
/// starts with `want`, and then the close.
fn assert_protocol_error(server: &Server, bytes: &[u8], want: &str) {
    let mut c = server.conn();
    c.send(bytes);
    let reply = String::from_utf8_lossy(&c.read_reply()).into_owned();
    assert!(
        reply.starts_with(want),
        "{:?}: got {reply:?}, want {want:?}",
        String::from_utf8_lossy(bytes)
    );
    assert!(c.closed_by_peer(), "connection left open after {reply:?}");
}

#[test]
fn malformed_resp_is_a_protocol_error_and_closes_that_connection() {
    let mut server = Server::start(&[]);
    let bystander = Bystander::join(&server);
    for (bytes, want) in [
        (
            &b"*1\r\n:5\r\n"[..],
            "-ERR Protocol error: expected '$', got ':'",
        ),
        (b"*x\r\n", "-ERR Protocol error: invalid multibulk length"),
        (
            b"\x00\xff \"unbalanced\r\n",
            "-ERR Protocol error: unbalanced quotes",
        ),
        (b"*1\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length"),
        (
            b"*2\r\n$3\r\nGET\r\n$-1\r\n",
            "-ERR Protocol error: invalid bulk length",
        ),
        (
            b"*99999999999\r\n",
            "-ERR Protocol error: invalid multibulk length",
        ),
        (
            b"*1\r\n$99999999999999999999999\r\n",
            "-ERR Protocol error: invalid bulk length",
        ),
        // A payload longer than its header says: never run as a command.
        (
            b"*2\r\n$3\r\nGET\r\n$1\r\nkey\r\n",
            "-ERR Protocol error: expected '\\r\\n' after a bulk string of the length given",
        ),
    ] {
        assert_protocol_error(&server, bytes, want);
    }
    // A long line with no newline is not an endless wait.
    assert_protocol_error(
        &server,
        &vec![b'A'; 70 * 1024],
        "-ERR Protocol error: too big inline request",
    );
    bystander.assert_unaffected(&mut server);
}

/// 600 MiB: larger than the 256 MiB pool, hence than the effective limit.
const HUGE_BULK_HEADER: &[u8] = b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$629145600\r\n";

#[test]
fn oversized_bulk_is_refused_before_its_payload() {
    let mut server = Server::start(&["--cpu-memory-pool-size", "256MiB"]);
    let bystander = Bystander::join(&server);
    let rss_before = server.rss_bytes();
    let mut c = server.conn();
    c.send(HUGE_BULK_HEADER);
    // No payload was sent: the reply can only come from the header.
    let reply = String::from_utf8_lossy(&c.read_reply()).into_owned();
    assert!(reply.starts_with("-TOOLARGE "), "{reply:?}");
    // Part of the payload arrives and is thrown away, not buffered.
    c.send(&vec![b'x'; 8 * MIB]);
    let mut fresh = server.conn();
    assert_eq!(fresh.request(&[b"PING"]), b"+PONG\r\n");
    assert_eq!(fresh.request(&[b"EXISTS", b"huge"]), b":0\r\n");
    let grown = server.rss_bytes().saturating_sub(rss_before);
    assert!(grown < 64 * MIB as u64, "RSS grew by {grown} bytes");
    assert!(server.info_field("too_large_requests") >= 1);
    drop(c);
    bystander.assert_unaffected(&mut server);
}

#[test]
fn refused_value_is_discarded_and_the_connection_stays_usable() {
    let mut server = Server::start(&["--max-value-size", "1MiB"]);
    let bystander = Bystander::join(&server);
    let value = vec![b'v'; 2 * MIB];
    let mut request = encode(&[b"SET", b"big", &value]);
    request.extend(encode(&[b"PING"]));
    request.extend(encode(&[b"EXISTS", b"big"]));
    let reply = server.send_raw(&request);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("-TOOLARGE "), "{text:?}");
    assert!(text.ends_with("\r\n+PONG\r\n:0\r\n"), "{text:?}");
    assert_eq!(text.matches("\r\n").count(), 3, "{text:?}");
    bystander.assert_unaffected(&mut server);
}

#[test]
fn refused_bulk_mid_request_discards_the_rest_of_that_request() {
    let mut server = Server::start(&["--max-value-size", "1MiB", "--max-request-size", "2MiB"]);
    let bystander = Bystander::join(&server);
    let value = vec![b'v'; 2 * MIB];
    // Arguments after the refused bulk belong to the refused request.
    let mut request = encode(&[b"SET", b"big", &value, b"EX", b"100"]);
    // Each value fits, their sum does not (max_request_size).
    let third = vec![b't'; 900 * 1024];
    request.extend(encode(&[b"MSET", b"a", &third, b"b", &third, b"c", &third]));
    request.extend(encode(&[b"EXISTS", b"big", b"a", b"b", b"c"]));
    request.extend(encode(&[b"PING"]));
    let reply = String::from_utf8_lossy(&server.send_raw(&request)).into_owned();
    let lines: Vec<&str> = reply.split_terminator("\r\n").collect();
    assert_eq!(lines.len(), 4, "{reply:?}");
    assert!(lines[0].starts_with("-TOOLARGE "), "{reply:?}");
    assert!(lines[1].starts_with("-TOOLARGE "), "{reply:?}");
    assert_eq!(&lines[2..], [":0", "+PONG"]);
    assert_eq!(server.info_field("too_large_requests"), 2);
    bystander.assert_unaffected(&mut server);
}

#[test]
fn unknown_command_and_wrong_arity() {
    let mut server = Server::start(&[]);
    let bystander = Bystander::join(&server);
    let mut c = server.conn();
    let reply = c.request(&[b"NOPE", b"a"]);
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "-ERR unknown command 'NOPE', with args beginning with: 'a' \r\n"
    );
    assert_eq!(
        c.request(&[b"GET"]),
        b"-ERR wrong number of arguments for 'get' command\r\n"
    );
    assert_eq!(
        c.request(&[b"SET", b"k"]),
        b"-ERR wrong number of arguments for 'set' command\r\n"
    );
    assert_eq!(
        c.request(&[b"GET", b"a", b"b", b"c"]),
        b"-ERR wrong number of arguments for 'get' command\r\n"
    );
    // With a third argument GET is the zero-copy form: a bad descriptor.
    assert!(c.request(&[b"GET", b"a", b"b"]).starts_with(b"-BADDESC "));
    // Errors do not close the connection.
    assert_eq!(c.request(&[b"PING"]), b"+PONG\r\n");
    bystander.assert_unaffected(&mut server);
}

#[test]
fn non_utf8_keys_round_trip() {
    let mut server = Server::start(&[]);
    let bystander = Bystander::join(&server);
    let mut c = server.conn();
    let key: &[u8] = b"\xff\xfe\x00key\r\n\x80";
    assert_eq!(c.request(&[b"SET", key, b"value"]), b"+OK\r\n");
    assert_eq!(c.request(&[b"GET", key]), b"$5\r\nvalue\r\n");
    assert_eq!(c.request(&[b"EXISTS", key]), b":1\r\n");
    let mut listed = format!("*1\r\n${}\r\n", key.len()).into_bytes();
    listed.extend_from_slice(key);
    listed.extend_from_slice(b"\r\n");
    assert_eq!(c.request(&[b"KEYS", b"\xff*"]), listed);
    assert_eq!(c.request(&[b"DEL", key]), b":1\r\n");
    bystander.assert_unaffected(&mut server);
}

#[test]
fn abrupt_disconnect_mid_frame_creates_nothing() {
    let mut server = Server::start(&[]);
    let bystander = Bystander::join(&server);
    {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        let header = format!("*3\r\n$3\r\nSET\r\n$4\r\nhalf\r\n${MIB}\r\n");
        s.write_all(header.as_bytes()).unwrap();
        s.write_all(&vec![b'h'; MIB / 2]).unwrap();
    }
    // The bystander is the only client once the server has seen the close.
    let closed = wait_until(within(Duration::from_secs(10)), || {
        server.metric("strata_connected_clients") == 1.0
    });
    assert!(closed, "server still counts the dropped connection");
    assert_eq!(server.conn().request(&[b"EXISTS", b"half"]), b":0\r\n");
    bystander.assert_unaffected(&mut server);
}

#[test]
fn connections_beyond_max_connections_are_refused() {
    const LIMIT: usize = 64;
    const OPENED: usize = 200;
    const REFUSAL: &[u8] = b"-ERR max number of clients reached\r\n";
    let mut server = Server::start(&["--max-connections", "64"]);
    // No bystander here: it would hold one of the 64 slots. The first 64
    // connections below play its part.
    let settled = || server.metric("strata_connected_clients") == 0.0;
    assert!(wait_until(within(Duration::from_secs(10)), settled));
    // Connected one after another, so the server accepts them in order.
    let mut conns: Vec<RawConn> = (0..OPENED).map(|_| server.conn()).collect();
    for (i, c) in conns.iter_mut().enumerate().skip(LIMIT) {
        c.set_read_timeout(Duration::from_secs(5));
        assert_eq!(c.read_reply(), REFUSAL, "connection {i}");
        assert!(c.closed_by_peer(), "refused connection {i} left open");
    }
    for (i, c) in conns.iter_mut().enumerate().take(LIMIT) {
        assert_eq!(c.request(&[b"PING"]), b"+PONG\r\n", "connection {i}");
    }
    let rejected = (OPENED - LIMIT) as u64;
    assert_eq!(
        server.metric("strata_rejected_connections_total"),
        rejected as f64
    );
    drop(conns);
    assert!(wait_until(within(Duration::from_secs(10)), || server
        .metric("strata_connected_clients")
        == 0.0));
    let mut again: Vec<RawConn> = (0..LIMIT).map(|_| server.conn()).collect();
    for c in &mut again {
        assert_eq!(c.request(&[b"PING"]), b"+PONG\r\n");
    }
    drop(again);
    assert!(wait_until(within(Duration::from_secs(10)), || server
        .metric("strata_connected_clients")
        == 0.0));
    assert_eq!(server.info_field("rejected_connections"), rejected);
    assert!(server.is_alive());
}

#[test]
fn inline_commands() {
    let mut server = Server::start(&[]);
    let bystander = Bystander::join(&server);
    let mut c = server.conn();
    c.send(b"PING\r\n");
    assert_eq!(c.read_reply(), b"+PONG\r\n");
    c.send(b"SET a \"b c\"\r\n");
    assert_eq!(c.read_reply(), b"+OK\r\n");
    c.send(b"GET a\n");
    assert_eq!(c.read_reply(), b"$3\r\nb c\r\n");
    // Blank lines are skipped, not answered.
    c.send(b"\r\n\r\nEXISTS a\r\n");
    assert_eq!(c.read_reply(), b":1\r\n");
    bystander.assert_unaffected(&mut server);
}

/// A node with 8 MiB values and 8 MiB of request-buffer budget beyond each
/// connection's first MiB.
fn budgeted_server() -> Server {
    Server::start(&[
        "--max-request-size",
        "8MiB",
        "--max-value-size",
        "8MiB",
        "--max-buffered-requests-size",
        "8MiB",
    ])
}

#[test]
fn large_requests_beyond_the_node_wide_buffer_budget_get_busy() {
    let mut server = budgeted_server();
    let bystander = Bystander::join(&server);
    let value = vec![b'v'; 6 * MIB];
    // MSET: a large plain SET is read straight into the arena instead of
    // buffered (see the next test).
    let first = encode(&[b"MSET", b"slow", &value]);
    // A slow writer sends 3 MiB of a 6 MiB value and stalls: it holds
    // ~5 MiB of the budget for its value.
    let mut slow = server.conn();
    slow.send(&first[..3 * MIB]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(server.metric("strata_request_buffer_bytes") >= (4 * MIB) as f64);
    // A second large request cannot get its ~5 MiB within the wait: BUSY,
    // the rest of it is skipped, and the connection stays usable.
    let mut other = server.conn();
    other.set_read_timeout(std::time::Duration::from_secs(30));
    let mut second = encode(&[b"MSET", b"refused", &value]);
    second.extend(encode(&[b"PING"]));
    second.extend(encode(&[b"EXISTS", b"refused"]));
    other.send(&second);
    let busy = String::from_utf8_lossy(&other.read_reply()).into_owned();
    assert!(busy.starts_with("-BUSY "), "{busy:?}");
    assert_eq!(other.read_reply(), b"+PONG\r\n");
    assert_eq!(other.read_reply(), b":0\r\n");
    assert_eq!(server.info_field("request_buffer_busy"), 1);
    // Small requests never wait on the budget.
    bystander.assert_unaffected(&mut server);
    // The slow writer finishes and is served; the budget comes back.
    slow.send(&first[3 * MIB..]);
    assert_eq!(slow.read_reply(), b"+OK\r\n");
    assert_eq!(other.request(&[b"SET", b"after", &value]), b"+OK\r\n");
    assert_eq!(server.metric("strata_request_buffer_bytes"), 0.0);
}

#[test]
fn a_large_set_arriving_slowly_goes_straight_to_the_arena() {
    let mut server = budgeted_server();
    let bystander = Bystander::join(&server);
    let value: Vec<u8> = (0..6 * MIB).map(|i| (i * 7 + i / 4096) as u8).collect();
    // Options after the value, and a request pipelined behind it.
    let mut req = encode(&[b"SET", b"big", &value, b"PX", b"600000"]);
    req.extend(encode(&[b"PTTL", b"big"]));
    let mut slow = server.conn();
    slow.send(&req[..3 * MIB]);
    std::thread::sleep(Duration::from_millis(300));
    // Half a value in, nothing of it buffered against the budget, nothing
    // visible yet.
    assert_eq!(server.metric("strata_request_buffer_bytes"), 0.0);
    assert_eq!(server.conn().request(&[b"EXISTS", b"big"]), b":0\r\n");
    slow.send(&req[3 * MIB..]);
    assert_eq!(slow.read_reply(), b"+OK\r\n");
    let pttl = String::from_utf8_lossy(&slow.read_reply()).into_owned();
    let ms: u64 = pttl.trim_start_matches(':').trim().parse().unwrap();
    assert!((590_000..=600_000).contains(&ms), "{pttl:?}");
    let got = slow.request(&[b"GET", b"big"]);
    assert!(bulk_body(&got) == &value[..], "value read back differs");
    let used = server.info_field("used_memory");
    assert!(used >= (6 * MIB) as u64, "used_memory {used}");

    // Conditions and bad options are still the command's: NX on a present
    // key and a syntax error store nothing, the old value stays.
    let other: Vec<u8> = vec![b'o'; 2 * MIB];
    for (opts, want) in [
        (&[&b"NX"[..]][..], &b"$-1\r\n"[..]),
        (&[&b"BOGUS"[..]][..], &b"-ERR syntax error\r\n"[..]),
        (
            &[&b"XX"[..], &b"PX"[..], &b"0"[..]][..],
            &b"-ERR invalid expire time in 'set' command\r\n"[..],
        ),
    ] {
        let mut args: Vec<&[u8]> = vec![b"SET", b"big", &other];
        args.extend_from_slice(opts);
        let req = encode(&args);
        slow.send(&req[..MIB]);
        std::thread::sleep(Duration::from_millis(50));
        slow.send(&req[MIB..]);
        assert_eq!(slow.read_reply(), want, "{opts:?}");
    }
    assert!(bulk_body(&slow.request(&[b"GET", b"big"])) == &value[..]);
    // XX on a missing key stores nothing either.
    let req = encode(&[b"SET", b"absent", &other, b"XX"]);
    slow.send(&req[..MIB]);
    std::thread::sleep(Duration::from_millis(50));
    slow.send(&req[MIB..]);
    assert_eq!(slow.read_reply(), b"$-1\r\n");
    assert_eq!(slow.request(&[b"EXISTS", b"absent"]), b":0\r\n");
    // A writer that goes away mid-value stores nothing.
    {
        let mut cut = server.conn();
        cut.send(&encode(&[b"SET", b"big", &other])[..MIB]);
    }
    let closed = wait_until(within(Duration::from_secs(10)), || {
        server.metric("strata_connected_clients") == 2.0
    });
    assert!(closed, "server still counts the dropped connection");
    assert!(bulk_body(&slow.request(&[b"GET", b"big"])) == &value[..]);
    // Every chunk reserved for a write that did not apply went back.
    assert_eq!(server.info_field("used_memory"), used, "used_memory");
    bystander.assert_unaffected(&mut server);
}
