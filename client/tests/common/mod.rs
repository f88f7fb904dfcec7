//! Runs a real `strata-server` for the client tests: free loopback ports,
//! ready once it answers PING, killed and reaped on drop.

#![allow(dead_code)] // each test file uses a different part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_client::Client;

/// A debug build on a busy 2-core machine starts well within this.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Free ports are found by binding :0 and releasing them, so another test
/// may take one first; retry on fresh ones.
const START_ATTEMPTS: usize = 3;

/// `STRATA_SERVER_BIN`, else `target/<profile>/strata-server` beside the
/// test executable (`target/<profile>/deps/<test>`).
pub fn server_bin() -> PathBuf {
    let path = match std::env::var_os("STRATA_SERVER_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("current_exe");
            let profile = exe
                .parent()
                .and_then(|d| d.parent())
                .expect("target/<profile>/deps");
            profile.join("strata-server")
        }
    };
    assert!(
        path.is_file(),
        "strata-server not found at {}: `cargo build -p strata-server` first or set STRATA_SERVER_BIN",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Whether this build of the server has a data plane (`--data-port`).
fn has_data_plane() -> bool {
    let out = Command::new(server_bin())
        .arg("--help")
        .output()
        .expect("run --help");
    String::from_utf8_lossy(&out.stdout).contains("--data-port")
}

pub struct Node {
    child: Child,
    pub port: u16,
    stderr: tempfile::NamedTempFile,
    /// Every flag it was started with, for `restart`.
    args: Vec<String>,
}

impl Node {
    pub fn start(extra: &[&str]) -> Node {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match Node::try_start(extra) {
                Ok(n) => return n,
                Err(e) => last = e,
            }
        }
        panic!("strata-server did not start:\n{last}");
    }

    fn try_start(extra: &[&str]) -> Result<Node, String> {
        let port = free_port();
        let mut args: Vec<String> = vec!["--bind".into(), "127.0.0.1".into()];
        args.extend(["--port".into(), port.to_string()]);
        args.extend(["--metrics-port".into(), free_port().to_string()]);
        if has_data_plane() {
            args.extend(["--data-port".into(), free_port().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Node::spawn(port, args)
    }

    /// A sample from `/metrics`, named with its labels exactly as exported.
    pub fn metric(&self, name: &str) -> f64 {
        let at = self
            .args
            .iter()
            .position(|a| a == "--metrics-port")
            .expect("metrics port");
        let port: u16 = self.args[at + 1].parse().expect("port");
        let mut sock = TcpStream::connect(("127.0.0.1", port)).expect("connect /metrics");
        sock.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("request");
        let mut body = String::new();
        sock.read_to_string(&mut body).expect("read /metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
    }

    /// Kills the node and starts a fresh, empty one on the same ports.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let fresh = Node::spawn(self.port, self.args.clone()).expect("restart on the same ports");
        *self = fresh;
    }

    fn spawn(port: u16, args: Vec<String>) -> Result<Node, String> {
        let mut cmd = Command::new(server_bin());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("STRATA_") {
                cmd.env_remove(key);
            }
        }
        // No NVMe tier: nodes are killed with SIGKILL here.
        cmd.env("STRATA_SSD_POOL_SIZE", "0");
        cmd.args(&args);
        let stderr = tempfile::NamedTempFile::new().expect("temp file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr.reopen().expect("reopen"))
            .spawn()
            .expect("spawn strata-server");
        let mut node = Node {
            child,
            port,
            stderr,
            args,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = node.child.try_wait() {
                return Err(std::fs::read_to_string(node.stderr.path()).unwrap_or_default());
            }
            if ping(port) {
                return Ok(node);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("no PONG within {START_TIMEOUT:?}"))
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.addr()).await.expect("connect")
    }

    /// A client that keeps to the network data plane even on this host
    /// (no cross-memory attach): for tests of the TCP data plane itself.
    pub async fn network_client(&self) -> Client {
        let cfg = strata_client::ClientConfig {
            cma: false,
            ..strata_client::ClientConfig::new(self.addr())
        };
        Client::connect_with(cfg).await.expect("connect")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// Content for `key` of `len` bytes: differs by key, size and position,
/// so a value from another key or shifted bytes never compares equal.
pub fn pattern(key: &[u8], len: usize) -> Vec<u8> {
    let mut seed = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) ^ len as u64;
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub async fn wait_for<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A numeric field of `INFO <section>`.
pub async fn info_field(client: &Client, section: &str, field: &str) -> u64 {
    let text = client.info(section).await.expect("INFO");
    text.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
}

/// Puts `pattern(key, len)` and reads it back into a fresh buffer.
pub async fn round_trip(c: &Client, key: &str, len: usize) {
    let value = pattern(key.as_bytes(), len);
    let mut src = c.alloc(len).expect("alloc");
    src.as_mut_slice().copy_from_slice(&value);
    c.put_from(key.as_bytes(), &src, 0..len)
        .await
        .expect("put_from");
    // Read at an offset into a larger buffer, to check offsets are honoured.
    let mut dst = c.alloc(len + 100).expect("alloc");
    let n = c
        .get_into(key.as_bytes(), &mut dst, 100)
        .await
        .expect("get_into");
    assert_eq!(n, len, "{key}: length");
    assert!(
        dst.as_slice()[100..] == value[..],
        "{key}: content of {len} bytes differs"
    );
    assert!(
        dst.as_slice()[..100].iter().all(|&b| b == 0),
        "{key}: wrote before the offset"
    );
}
