//! A real single-member etcd (Debian's `/usr/bin/etcd`) on free loopback
//! ports with a private data directory, for the cluster tests.
//!
//! `stop` kills it and keeps the data directory; `restart` brings it back
//! on the same ports and directory, so nodes see the etcd they knew come
//! back with its state (leases included). Killed on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until, within};

/// etcd's first start (WAL creation, leader election) on a busy 2-core
/// machine takes a few seconds at most.
pub const ETCD_START_TIMEOUT: Duration = Duration::from_secs(20);

/// The etcd binary: `STRATA_TEST_ETCD`, else `/usr/bin/etcd`.
fn etcd_bin() -> PathBuf {
    let path = std::env::var_os("STRATA_TEST_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    assert!(
        path.is_file(),
        "etcd not found at {} (apt-get install etcd-server, or set STRATA_TEST_ETCD)",
        path.display()
    );
    path
}

pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    log: tempfile::NamedTempFile,
    /// Set: clients are served over TLS with these etcd flags
    /// (`--cert-file`, `--client-cert-auth`, ...).
    tls: Option<Vec<String>>,
}

impl Etcd {
    /// Starts etcd and returns once it reports itself healthy.
    pub fn start() -> Etcd {
        Etcd::start_with_tls(None)
    }

    /// Starts etcd serving clients over TLS with `flags` (its
    /// `--cert-file`, `--key-file`, `--trusted-ca-file`, ...).
    pub fn start_tls(flags: &[String]) -> Etcd {
        Etcd::start_with_tls(Some(flags.to_vec()))
    }

    fn start_with_tls(tls: Option<Vec<String>>) -> Etcd {
        let (client_port, peer_port) = loop {
            let (c, p) = (free_port(), free_port());
            if c != p {
                break (c, p);
            }
        };
        let mut etcd = Etcd {
            child: None,
            client_port,
            peer_port,
            dir: tempfile::tempdir().expect("temp dir"),
            log: tempfile::NamedTempFile::new().expect("temp file"),
            tls,
        };
        etcd.spawn();
        etcd
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(etcd_bin())
            .arg("--name")
            .arg("default")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(self.tls.iter().flatten())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log.reopen().expect("reopen"))
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let up = wait_until(within(ETCD_START_TIMEOUT), || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("etcd exited with {status}:\n{}", self.log());
            }
            self.healthy()
        });
        assert!(
            up,
            "etcd not healthy within {ETCD_START_TIMEOUT:?}:\n{}",
            self.log()
        );
    }

    /// Kills etcd (SIGKILL, as a crash), keeping its data directory.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// `etcd://127.0.0.1:PORT`, as `--metadata-server` takes it.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// etcd's own `/health` on the client port says `"health":"true"` once
    /// it has a leader and serves requests (what `etcdctl endpoint health`
    /// checks, without needing etcdctl installed).
    /// Over TLS: that it accepts connections (its clients retry until it
    /// serves).
    pub fn healthy(&self) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.replace(' ', "").contains("\"health\":\"true\"")
    }

    /// What etcd wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
