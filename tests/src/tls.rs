//! Certificates for the TLS tests, made by the openssl CLI in a temporary
//! directory: a CA, a node certificate (server and client use) for the
//! given names, a client certificate (also for 127.0.0.1, where its data
//! plane serves the nodes' pulls), and a second CA's client
//! certificate that nodes must refuse. Also a node started with its
//! plaintext port off, waited for over TLS with redis-cli.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::{server_command, wait_until, within, START_TIMEOUT};

/// A test PKI; the directory goes when this drops.
pub struct Certs {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A P-256 key and a certificate for it signed by `ca` (self-signed
/// when `None`), with `ext` lines as its extensions.
fn issue(dir: &Path, name: &str, ca: Option<&str>, ext: &str) {
    let (key, crt, csr) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("{name}.csr"),
    );
    let subj = format!("/CN=strata test {name}");
    let newkey = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let Some(ca) = ca else {
        let mut args = vec!["req", "-x509"];
        args.extend(newkey);
        args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
        openssl(dir, &args);
        return;
    };
    let mut args = vec!["req"];
    args.extend(newkey);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
    let extfile = format!("{name}.ext");
    std::fs::write(dir.join(&extfile), ext).expect("write ext");
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    );
}

impl Certs {
    /// `names`: the IP addresses and DNS names the node certificate is
    /// for (`IP:10.0.0.1`, `DNS:localhost`); 127.0.0.1 and localhost are
    /// always in.
    pub fn make(names: &[&str]) -> Certs {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path();
        issue(p, "ca", None, "");
        let mut san = vec!["IP:127.0.0.1", "DNS:localhost"];
        san.extend(names);
        let node_ext = format!(
            "subjectAltName={}\nextendedKeyUsage=serverAuth,clientAuth\n",
            san.join(",")
        );
        issue(p, "node", Some("ca"), &node_ext);
        // The client serves its data plane to the nodes that pull its PUT
        // payloads: a server certificate for its address too.
        issue(
            p,
            "client",
            Some("ca"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        );
        issue(p, "rogue-ca", None, "");
        issue(
            p,
            "rogue",
            Some("rogue-ca"),
            "extendedKeyUsage=clientAuth\n",
        );
        Certs { dir }
    }

    /// `<name>.crt` / `<name>.key` for `ca`, `node`, `client`, `rogue`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn s(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// The node flags of a TLS port checked against this CA.
    pub fn node_args(&self, tls_port: u16) -> Vec<String> {
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            self.s("node.crt"),
            "--tls-key-file".into(),
            self.s("node.key"),
            "--tls-ca-cert-file".into(),
            self.s("ca.crt"),
        ]
    }

    /// redis-cli against `port` over TLS with the client certificate.
    pub fn cli(&self, port: u16, args: &[&str]) -> Output {
        redis_cli_tls(
            port,
            &[
                "--cacert",
                &self.s("ca.crt"),
                "--cert",
                &self.s("client.crt"),
                "--key",
                &self.s("client.key"),
            ],
            args,
        )
    }
}

/// `redis-cli --tls -p port <tls_args> <args>`.
pub fn redis_cli_tls(port: u16, tls_args: &[&str], args: &[&str]) -> Output {
    Command::new("redis-cli")
        .args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(tls_args)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli (apt-get install redis-tools)")
}

/// A node with only a TLS port (`--port 0`), killed on drop.
pub struct TlsNode {
    child: Child,
    pub tls_port: u16,
    log: tempfile::NamedTempFile,
}

impl TlsNode {
    /// Starts `strata-server --port 0 <args>` and waits until `certs`'
    /// client gets PONG on `tls_port`.
    pub fn start(certs: &Certs, tls_port: u16, args: &[String]) -> TlsNode {
        TlsNode::start_with_env(certs, tls_port, args, &[])
    }

    /// Like [`TlsNode::start`], with extra environment variables.
    pub fn start_with_env(
        certs: &Certs,
        tls_port: u16,
        args: &[String],
        env: &[(&str, &str)],
    ) -> TlsNode {
        let log = tempfile::NamedTempFile::new().expect("temp file");
        let child = server_command()
            .args(["--port", "0", "--metrics-port", "0", "--data-port", "0"])
            .args(certs.node_args(tls_port))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("reopen"))
            .spawn()
            .expect("spawn strata-server");
        let mut node = TlsNode {
            child,
            tls_port,
            log,
        };
        let up = wait_until(within(START_TIMEOUT), || {
            if let Ok(Some(status)) = node.child.try_wait() {
                panic!("strata-server exited with {status}:\n{}", node.log());
            }
            let out = certs.cli(tls_port, &["ping"]);
            String::from_utf8_lossy(&out.stdout).contains("PONG")
        });
        assert!(up, "no PONG over TLS on {tls_port}:\n{}", node.log());
        node
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
