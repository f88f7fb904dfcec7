//! The TCP data plane over TLS, on 127.0.0.1, with certificates the test
//! makes with the openssl CLI: large reads byte-exact both ways of
//! mutual authentication, and every mismatch (plaintext reader on a TLS
//! listener, TLS reader on a plaintext one, no CA, a rogue certificate)
//! refused with a clear error instead of a hang.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strata_rdma::tcp::{TcpConfig, TcpTls, TcpTransport, TlsListen};
use strata_rdma::tls::{self, ClientAuth, ClientFiles, PemFile, ServerFiles};
use strata_rdma::{Descriptor, Region, TransferError, Transport, TransportKind};

/// Bound on any single test step, so a hang fails instead of stalling CI.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// `<name>.crt`/`.key` signed by `ca` (self-signed when `None`).
fn issue(dir: &Path, name: &str, ca: Option<&str>) {
    let (key, crt, csr) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("{name}.csr"),
    );
    let subj = format!("/CN=strata {name}");
    let newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let Some(ca) = ca else {
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
        args.extend(newkey);
        args.extend(["-keyout", &key, "-out", &crt, "-subj", &subj]);
        return openssl(dir, &args);
    };
    let mut args = vec!["req", "-nodes"];
    args.extend(newkey);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("write ext");
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
            &ext,
        ],
    );
}

/// A CA with two parties it signs, and a rogue CA with one.
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    issue(dir.path(), "ca", None);
    issue(dir.path(), "a", Some("ca"));
    issue(dir.path(), "b", Some("ca"));
    issue(dir.path(), "rogue-ca", None);
    issue(dir.path(), "rogue", Some("rogue-ca"));
    dir
}

fn pem<'a>(dir: &'a Path, file: &str) -> PemFile<'a> {
    let path: &'a Path = Box::leak(dir.join(file).into_boxed_path());
    PemFile { what: "test", path }
}

/// TLS of party `name`, trusting `ca`, asking peers for certificates.
fn party(dir: &Path, name: &str, ca: &str) -> TcpTls {
    let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
    let server = tls::server_config(ServerFiles {
        cert: pem(dir, &crt),
        key: pem(dir, &key),
        ca: Some(pem(dir, &format!("{ca}.crt"))),
        auth: ClientAuth::Required,
    })
    .expect("server config");
    let dial = tls::client_config(ClientFiles {
        ca: pem(dir, &format!("{ca}.crt")),
        identity: Some((pem(dir, &crt), pem(dir, &key))),
    })
    .expect("client config");
    TcpTls {
        listen: TlsListen::Tls(server),
        dial: Some(dial),
        server_name: None,
    }
}

async fn transport(tls: TcpTls) -> Arc<TcpTransport> {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let cfg = TcpConfig {
        read_timeout: Duration::from_secs(10),
        tls,
        ..TcpConfig::default()
    };
    TcpTransport::bind_with(addr, cfg).await.expect("bind")
}

/// A registered buffer; the region drops before the bytes.
struct Mem {
    region: Region,
    buf: Vec<u8>,
}

impl Mem {
    fn new(t: &TcpTransport, mut buf: Vec<u8>) -> Mem {
        // SAFETY: `buf` is owned by the returned `Mem`, never resized, and
        // `region` drops first; the test reads it only between transfers.
        let region = unsafe { t.register(buf.as_mut_ptr() as u64, buf.len() as u64, None) }
            .expect("register");
        Mem { region, buf }
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn read(reader: &TcpTransport, src: &Descriptor, dst: &Mem) -> Result<(), TransferError> {
    tokio::time::timeout(STEP_TIMEOUT, reader.read(src, &dst.region, 0))
        .await
        .expect("a read ends, it does not hang")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_over_tls_are_byte_exact() {
    let dir = pki();
    let owner = transport(party(dir.path(), "a", "ca")).await;
    let reader = transport(party(dir.path(), "b", "ca")).await;
    assert_eq!(owner.kind(), TransportKind::Tls);
    for (len, seed) in [(8usize << 20, 1), (32 << 20, 2), (1000, 3)] {
        let src = Mem::new(&owner, pattern(len, seed));
        let desc = owner
            .describe(&src.region, 0, len as u64, None)
            .expect("describe");
        assert!(desc.to_string().starts_with("tls://127.0.0.1:"), "{desc}");
        let dst = Mem::new(&reader, vec![0; len]);
        read(&reader, &desc, &dst).await.expect("read over TLS");
        assert!(dst.buf == src.buf, "{len} bytes differ");
    }
    assert_eq!(owner.stats().tls_refused.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_plaintext_reader_on_a_tls_listener_is_told_so() {
    let dir = pki();
    let owner = transport(party(dir.path(), "a", "ca")).await;
    let reader = transport(TcpTls::default()).await;
    let src = Mem::new(&owner, pattern(4096, 4));
    let mut desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    desc.transport = TransportKind::Tcp;
    let dst = Mem::new(&reader, vec![0; 4096]);
    let err = read(&reader, &desc, &dst).await.expect_err("refused");
    assert!(matches!(err, TransferError::Tls(_)), "{err:?}");
    assert!(err.to_string().contains("speaks TLS"), "{err}");
    assert_eq!(err.code(), "TLS");
    assert_eq!(owner.stats().tls_refused.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_tls_reader_on_a_plaintext_listener_fails_clearly() {
    let dir = pki();
    let owner = transport(TcpTls::default()).await;
    let reader = transport(party(dir.path(), "b", "ca")).await;
    let src = Mem::new(&owner, pattern(4096, 5));
    let mut desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    assert_eq!(desc.transport, TransportKind::Tcp);
    desc.transport = TransportKind::Tls;
    let dst = Mem::new(&reader, vec![0; 4096]);
    let err = read(&reader, &desc, &dst).await.expect_err("refused");
    assert!(err.to_string().contains("does not speak TLS"), "{err}");
}

#[tokio::test]
async fn tls_descriptors_need_a_ca_and_the_right_one() {
    let dir = pki();
    let owner = transport(party(dir.path(), "a", "ca")).await;
    let src = Mem::new(&owner, pattern(4096, 6));
    let desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let plain = transport(TcpTls::default()).await;
    let dst = Mem::new(&plain, vec![0; 4096]);
    let err = read(&plain, &desc, &dst).await.expect_err("no CA");
    assert!(matches!(err, TransferError::BadDescriptor(_)), "{err:?}");
    let rogue = transport(party(dir.path(), "rogue", "rogue-ca")).await;
    let dst = Mem::new(&rogue, vec![0; 4096]);
    let err = read(&rogue, &desc, &dst).await.expect_err("unknown CA");
    assert!(matches!(err, TransferError::Tls(_)), "{err:?}");
    // The owner refused the rogue's certificate or the rogue the owner's:
    // either way nothing was served.
    assert_eq!(owner.stats().reads_served.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_closed_listener_serves_nobody() {
    let dir = pki();
    let mut tls = party(dir.path(), "a", "ca");
    tls.listen = TlsListen::Closed;
    let owner = transport(tls).await;
    let reader = transport(party(dir.path(), "b", "ca")).await;
    let src = Mem::new(&owner, pattern(4096, 7));
    let desc = owner
        .describe(&src.region, 0, 4096, None)
        .expect("describe");
    let dst = Mem::new(&reader, vec![0; 4096]);
    read(&reader, &desc, &dst).await.expect_err("closed");
    assert_eq!(owner.stats().reads_served.load(Ordering::Relaxed), 0);
}
