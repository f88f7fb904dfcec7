//! Harness for the integration tests: runs the real `strata-server` binary
//! on free loopback ports and talks to it over TCP, raw RESP and HTTP, so
//! tests see exactly the bytes the server sends.
//!
//! Every wait is for a condition (PING answered, a figure reached) under a
//! deadline; nothing sleeps for a fixed time and hopes. Every server a test
//! starts is killed and reaped when its [`Server`] drops, panics included.
//! Everything binds 127.0.0.1 only.
//!
//! The binary is not built by these tests; run
//! `cargo build -p strata-server && cargo test -p strata-tests`.

pub mod cluster;
pub mod etcd;
pub mod tls;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A debug build on a busy 2-core machine starts in well under this.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Read/write timeout on every test socket: a missing reply fails the test
/// instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a condition is re-checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Free ports are found by binding :0 and releasing them, so another test
/// may grab one before the server binds it; retry on a fresh pair.
const START_ATTEMPTS: usize = 3;
/// Bounds a reply we are willing to buffer (the largest test value is
/// 1 MiB; a runaway reply must not eat the machine).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// The server binary: `STRATA_SERVER_BIN`, else `target/<profile>/strata-server`
/// beside this test executable (`target/<profile>/deps/<test>`).
pub fn server_bin() -> PathBuf {
    let path = match std::env::var_os("STRATA_SERVER_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("current_exe");
            let profile_dir = exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("test executable lives in target/<profile>/deps/");
            profile_dir.join("strata-server")
        }
    };
    assert!(
        path.is_file(),
        "strata-server binary not found at {}: run `cargo build -p strata-server` before \
         `cargo test -p strata-tests`, or set STRATA_SERVER_BIN to its path",
        path.display()
    );
    path
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A `Command` for the server binary with no `STRATA_*` settings inherited
/// from the environment the tests run in, and no NVMe tier: tests kill
/// nodes with SIGKILL, and each default tier preallocates 2 GiB. Tests of
/// the tier pass `--ssd-pool-size` (a flag wins over the environment).
pub fn server_command() -> Command {
    let mut cmd = Command::new(server_bin());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("STRATA_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("STRATA_SSD_POOL_SIZE", "0");
    cmd
}

/// How a short-lived run of the binary ended.
#[derive(Debug)]
pub struct Exit {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary to completion (config checks, `--print-config`); kills
/// it and panics if it is still running after `START_TIMEOUT`.
pub fn run_to_exit(mut cmd: Command) -> Exit {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let err = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen"))
        .stderr(err.reopen().expect("reopen"))
        .spawn()
        .expect("spawn strata-server");
    let deadline = Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("strata-server did not exit within {START_TIMEOUT:?}: {cmd:?}");
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    let read = |f: &tempfile::NamedTempFile| std::fs::read_to_string(f.path()).expect("read");
    Exit {
        status,
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// Polls `cond` until it holds or `deadline` passes; says which.
pub fn wait_until(deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// `now + d`, for [`wait_until`].
pub fn within(d: Duration) -> Instant {
    Instant::now() + d
}

/// One running `strata-server`; killed and reaped on drop.
pub struct Server {
    child: Child,
    port: u16,
    metrics_port: u16,
    stderr: tempfile::NamedTempFile,
}

impl Server {
    /// Starts a node with `--port P --metrics-port M` plus `extra_args` and
    /// returns once it answers PING.
    pub fn start(extra_args: &[&str]) -> Server {
        Server::start_with_env(extra_args, &[])
    }

    /// Like [`Server::start`], with extra environment variables.
    pub fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let (port, metrics_port) = {
                // Both held at once so they differ.
                let a = TcpListener::bind("127.0.0.1:0").expect("bind");
                let b = TcpListener::bind("127.0.0.1:0").expect("bind");
                (
                    a.local_addr().expect("addr").port(),
                    b.local_addr().expect("addr").port(),
                )
            };
            match Server::try_start(port, metrics_port, extra_args, env) {
                Ok(s) => return s,
                Err(stderr) => last = stderr,
            }
        }
        panic!("strata-server could not bind its ports {START_ATTEMPTS} times:\n{last}");
    }

    /// Starts a node on given ports (a restart of a node that was killed:
    /// same address, as an operator would bring it back).
    pub fn start_on(port: u16, metrics_port: u16, extra_args: &[&str]) -> Server {
        Server::try_start(port, metrics_port, extra_args, &[]).unwrap_or_else(|log| {
            panic!("strata-server could not bind {port}/{metrics_port}:\n{log}")
        })
    }

    /// `Err(stderr)` only when the ports were taken; any other failure to
    /// start panics with the server's stderr.
    fn try_start(
        port: u16,
        metrics_port: u16,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        let stderr = tempfile::NamedTempFile::new().expect("temp file");
        let (p, m) = (port.to_string(), metrics_port.to_string());
        let child = server_command()
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &p,
                "--metrics-port",
                &m,
                "--data-port",
                "0",
            ])
            .args(extra_args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr.reopen().expect("reopen"))
            .spawn()
            .expect("spawn strata-server");
        let mut server = Server {
            child,
            port,
            metrics_port,
            stderr,
        };
        let deadline = within(START_TIMEOUT);
        loop {
            if server.answers_ping() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait().expect("try_wait") {
                let log = server.stderr();
                if log.contains("cannot listen") {
                    return Err(log);
                }
                panic!("strata-server exited with {status} before answering PING:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "strata-server did not answer PING within {START_TIMEOUT:?}:\n{}",
                server.stderr()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), POLL_INTERVAL * 10) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        s.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
            && s.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:P/`, plus `?protocol=resp3` when asked.
    pub fn url(&self, resp3: bool) -> String {
        let q = if resp3 { "?protocol=resp3" } else { "" };
        format!("redis://127.0.0.1:{}/{q}", self.port)
    }

    /// A `redis` crate connection.
    pub fn client(&self, resp3: bool) -> redis::Connection {
        let client = redis::Client::open(self.url(resp3)).expect("redis url");
        let con = client
            .get_connection_with_timeout(IO_TIMEOUT)
            .expect("redis connect");
        con.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        con.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
        con
    }

    /// A raw RESP connection.
    pub fn conn(&self) -> RawConn {
        RawConn::connect(self.addr())
    }

    /// Writes `bytes` on a fresh connection, half-closes it, and returns
    /// everything the server sends until it closes. The write runs on its
    /// own thread so a large request cannot deadlock against the replies.
    pub fn send_raw(&self, bytes: &[u8]) -> Vec<u8> {
        let stream = connect(self.addr());
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = stream;
        std::thread::scope(|s| {
            s.spawn(move || {
                // The server may close first (protocol error); that is
                // what the reply says, not a harness failure.
                let _ = writer.write_all(bytes);
                let _ = writer.shutdown(Shutdown::Write);
            });
            let mut out = Vec::new();
            match reader.read_to_end(&mut out) {
                Ok(_) => {}
                // A close with unread input is a reset; keep what arrived.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                Err(e) => panic!("send_raw: {e} after {} bytes", out.len()),
            }
            out
        })
    }

    /// GET `path` on the metrics port: (status code, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        self.try_http_get(path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// [`Server::http_get`] that fails instead of panicking (the node may
    /// be going away).
    pub fn try_http_get(&self, path: &str) -> io::Result<(u16, String)> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.metrics_port));
        let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response");
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(bad)?;
        Ok((status, body.to_string()))
    }

    /// A sample from `/metrics`, or None if the node did not answer or
    /// does not export it.
    pub fn try_metric(&self, name_with_labels: &str) -> Option<f64> {
        let (status, body) = self.try_http_get("/metrics").ok()?;
        (status == 200).then(|| prometheus_value(&body, name_with_labels))?
    }

    /// A figure from `INFO everything`, e.g. `evicted_keys`.
    pub fn info_field(&self, name: &str) -> u64 {
        let text = self.info();
        info_value(&text, name)
            .unwrap_or_else(|| panic!("INFO has no numeric field {name}:\n{text}"))
    }

    /// The text of `INFO everything`.
    pub fn info(&self) -> String {
        let reply = self.conn().request(&[b"INFO", b"everything"]);
        String::from_utf8(bulk_body(&reply).to_vec()).expect("INFO is UTF-8")
    }

    /// A sample from `/metrics`, named with its labels exactly as exported:
    /// `strata_keys`, `strata_tier_used_bytes{tier="dram"}`.
    pub fn metric(&self, name_with_labels: &str) -> f64 {
        let (status, body) = self.http_get("/metrics");
        assert_eq!(status, 200, "/metrics: {body}");
        prometheus_value(&body, name_with_labels)
            .unwrap_or_else(|| panic!("/metrics has no sample {name_with_labels}:\n{body}"))
    }

    /// Resident memory of the server process (VmRSS), in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status");
        kib * 1024
    }

    /// SIGKILL and reap: the node gets no chance to leave the cluster.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits (up to `max`) for the node to stop gracefully;
    /// returns its exit status. Panics if it is still running after `max`.
    pub fn stop(&mut self, max: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        let deadline = within(max);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!(
                    "strata-server did not stop within {max:?} of SIGTERM:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether the process is still running (not exited, not a zombie).
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test failing against this server: show what the server said,
        // or the failure cannot be diagnosed from a CI log.
        if std::thread::panicking() {
            if let Ok(status) = self.child.try_wait() {
                eprintln!(
                    "strata-server on port {} exit status: {status:?}",
                    self.port
                );
            }
            let text = std::fs::read_to_string(self.stderr.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- strata-server stderr (last {} lines) ---", tail.len());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name:value` from INFO text.
pub fn info_value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// The value of the sample `name_with_labels` in Prometheus text format.
pub fn prometheus_value(body: &str, name_with_labels: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name_with_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    s
}

/// Encodes a request as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The payload of a bulk (`$`) or verbatim (`=`) reply.
pub fn bulk_body(reply: &[u8]) -> &[u8] {
    let nl = reply
        .iter()
        .position(|&b| b == b'\n')
        .expect("reply header");
    let body = &reply[nl + 1..reply.len() - 2];
    match reply[0] {
        b'$' => body,
        // Verbatim: "txt:" before the text.
        b'=' => &body[4..],
        _ => panic!("not a bulk reply: {:?}", String::from_utf8_lossy(reply)),
    }
}

/// Length of the first complete RESP2/RESP3 reply in `buf`, if complete.
pub fn reply_len(buf: &[u8]) -> Option<usize> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&buf[1..nl.saturating_sub(1)]).ok()?;
    let head = nl + 1;
    match *buf.first()? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(head),
        b'$' | b'=' | b'!' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(head);
            }
            let end = head + n as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n: i64 = line.parse().ok()?;
            let items = if matches!(buf[0], b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut pos = head;
            for _ in 0..items.max(0) {
                pos += reply_len(&buf[pos..])?;
            }
            Some(pos)
        }
        other => panic!("unknown RESP type byte {:?}", other as char),
    }
}

/// A RESP reply as a tree, for tests that look inside arrays (`CLUSTER
/// SLOTS`). Maps, sets and pushes read as arrays (a map's keys and values
/// alternate), verbatim strings as bulk strings without their format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
}

impl Resp {
    pub fn as_array(&self) -> &[Resp] {
        match self {
            Resp::Array(items) => items,
            other => panic!("not an array: {other:?}"),
        }
    }

    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(n) => *n,
            other => panic!("not an integer: {other:?}"),
        }
    }

    /// The text of a simple or bulk string.
    pub fn as_text(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("not a string: {other:?}"),
        }
    }
}

/// Parses one complete reply; panics on anything else.
pub fn parse_reply(buf: &[u8]) -> Resp {
    let (r, used) = parse_at(buf);
    assert_eq!(used, buf.len(), "trailing bytes after a reply");
    r
}

fn parse_at(buf: &[u8]) -> (Resp, usize) {
    let n = reply_len(buf).expect("a complete reply");
    let nl = buf.iter().position(|&b| b == b'\n').expect("header");
    let line = String::from_utf8_lossy(&buf[1..nl - 1]).into_owned();
    let r = match buf[0] {
        b'+' => Resp::Simple(line),
        b'-' | b'!' => Resp::Error(line),
        b':' => Resp::Int(line.parse().expect("integer reply")),
        b'_' => Resp::Nil,
        b'$' | b'=' if line.starts_with('-') => Resp::Nil,
        b'$' | b'=' => Resp::Bulk(bulk_body(&buf[..n]).to_vec()),
        b'*' | b'~' | b'>' | b'%' | b'|' if line.starts_with('-') => Resp::Nil,
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let count: usize = line.parse().expect("aggregate length");
            let count = if matches!(buf[0], b'%' | b'|') {
                2 * count
            } else {
                count
            };
            let mut pos = nl + 1;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let (item, used) = parse_at(&buf[pos..]);
                items.push(item);
                pos += used;
            }
            Resp::Array(items)
        }
        other => Resp::Simple(format!("{}{line}", other as char)),
    };
    (r, n)
}

/// A raw client connection that reads whole replies.
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> RawConn {
        RawConn {
            stream: connect(addr),
            buf: Vec::new(),
        }
    }

    /// Connects within `timeout`; an error instead of a panic, for
    /// clients that must survive a node going away.
    pub fn try_connect(addr: SocketAddr, timeout: Duration) -> io::Result<RawConn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(RawConn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends one request and reads its reply; a closed connection is an
    /// error (`UnexpectedEof`).
    pub fn try_request(&mut self, args: &[&[u8]]) -> io::Result<Vec<u8>> {
        self.stream.write_all(&encode(args))?;
        self.try_read_reply()?
            .ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
    }

    pub fn set_read_timeout(&self, d: Duration) {
        self.stream.set_read_timeout(Some(d)).expect("timeout");
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// The next reply; `Ok(None)` when the server closed the connection.
    pub fn try_read_reply(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(n) = reply_len(&self.buf) {
                return Ok(Some(self.buf.drain(..n).collect()));
            }
            assert!(self.buf.len() < MAX_REPLY_BYTES, "reply too large");
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// The next reply; panics on timeout or close.
    pub fn read_reply(&mut self) -> Vec<u8> {
        match self.try_read_reply() {
            Ok(Some(r)) => r,
            Ok(None) => panic!("server closed the connection instead of replying"),
            Err(e) => panic!("no reply: {e}"),
        }
    }

    /// Sends one request and reads its reply.
    pub fn request(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.send(&encode(args));
        self.read_reply()
    }

    /// True when the server closes the connection (within the read timeout)
    /// without sending anything more.
    pub fn closed_by_peer(&mut self) -> bool {
        matches!(self.try_read_reply(), Ok(None))
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lengths() {
        assert_eq!(reply_len(b"+OK\r\n+x"), Some(5));
        assert_eq!(reply_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(reply_len(b"$3\r\nab"), None);
        assert_eq!(reply_len(b"$-1\r\n"), Some(5));
        assert_eq!(reply_len(b"*2\r\n:1\r\n$1\r\na\r\n"), Some(15));
        assert_eq!(reply_len(b"%1\r\n+a\r\n:1\r\n"), Some(12));
        assert_eq!(reply_len(b"*2\r\n:1\r\n"), None);
    }

    #[test]
    fn parses_nested_replies() {
        let r = parse_reply(b"*2\r\n*3\r\n:0\r\n:5\r\n$2\r\nab\r\n$-1\r\n");
        assert_eq!(
            r,
            Resp::Array(vec![
                Resp::Array(vec![Resp::Int(0), Resp::Int(5), Resp::Bulk(b"ab".to_vec())]),
                Resp::Nil,
            ])
        );
        assert_eq!(
            parse_reply(b"-MOVED 1 a:2\r\n"),
            Resp::Error("MOVED 1 a:2".into())
        );
    }

    #[test]
    fn parses_figures() {
        let info = "# Stats\r\nevicted_keys:7\r\nevicted_keys_x:9\r\n";
        assert_eq!(info_value(info, "evicted_keys"), Some(7));
        let prom =
            "# TYPE strata_keys gauge\nstrata_keys 3\nstrata_tier_used_bytes{tier=\"dram\"} 4096\n";
        assert_eq!(prometheus_value(prom, "strata_keys"), Some(3.0));
        assert_eq!(
            prometheus_value(prom, "strata_tier_used_bytes{tier=\"dram\"}"),
            Some(4096.0)
        );
    }
}
