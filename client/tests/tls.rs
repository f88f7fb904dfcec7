//! The SDK over TLS (`ClientConfig::tls`) to a node whose only RESP port
//! is its TLS port and which requires client certificates: zero-copy and
//! inline puts and gets of 1 MiB go over the TLS command connection; a
//! client without a certificate, or trusting another CA, is refused.
//! Values above the inline limits go over the TLS data plane (the node
//! pulls PUTs from the client's TLS listener, the client reads GETs from
//! the node's), byte-exact; a plaintext descriptor is refused by name.

use std::sync::atomic::Ordering;
use std::time::Duration;

use strata_client::{Client, ClientConfig, Error, TlsOptions};
use strata_rdma::TransportKind;
use strata_tests::tls::{Certs, TlsNode};

const MIB: usize = 1 << 20;

fn config(certs: &Certs, port: u16, identity: bool, ca: &str) -> ClientConfig {
    let tls = TlsOptions {
        ca_file: certs.path(ca),
        cert_file: identity.then(|| certs.path("client.crt")),
        key_file: identity.then(|| certs.path("client.key")),
        server_name: Some("localhost".into()),
    };
    ClientConfig {
        // Same host: without this, payloads would skip the network.
        cma: false,
        timeout: Duration::from_secs(5),
        failover_timeout_ms: 2000,
        tls: Some(tls),
        ..ClientConfig::new(format!("127.0.0.1:{port}"))
    }
}

/// Certificates, a free port and a TLS-only node with a 64 MiB pool on it.
fn small_tls_node() -> (Certs, u16, TlsNode) {
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let node = TlsNode::start(
        &certs,
        port,
        &["--cpu-memory-pool-size".into(), "64MiB".into()],
    );
    (certs, port, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_gets_over_tls_with_a_client_certificate() {
    let (certs, port, _node) = small_tls_node();
    let c = Client::connect_with(config(&certs, port, true, "ca.crt"))
        .await
        .expect("connect over TLS");
    let mut b = c.alloc(2 * MIB).expect("alloc");
    let value: Vec<u8> = (0..MIB).map(|i| (i * 7 % 251) as u8).collect();
    b.as_mut_slice()[..MIB].copy_from_slice(&value);
    c.put_from(b"big", &b, 0..MIB).await.expect("put over TLS");
    let n = c.get_into(b"big", &mut b, MIB).await.expect("get over TLS");
    assert_eq!(n, MIB);
    assert!(b.as_slice()[MIB..] == value[..], "value changed over TLS");
    c.set(b"small", b"v").await.expect("set");
    assert_eq!(
        c.get(b"small").await.expect("get").as_deref(),
        Some(&b"v"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_or_the_ca_is_refused() {
    let (certs, port, _node) = small_tls_node();
    let no_cert = Client::connect_with(config(&certs, port, false, "ca.crt")).await;
    assert!(no_cert.is_err(), "a client without a certificate got in");
    let wrong_ca = Client::connect_with(config(&certs, port, true, "rogue-ca.crt")).await;
    assert!(wrong_ca.is_err(), "a client trusting another CA connected");
}

/// A TLS-only node with cross-memory attach off, so that same-host
/// payloads take the network, and room for 32 MiB values.
fn data_plane_node(certs: &Certs, port: u16, extra: &[&str]) -> TlsNode {
    let mut args: Vec<String> = ["--cpu-memory-pool-size", "160MiB", "--cma", "off"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    TlsNode::start(certs, port, &args)
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + seed) % 253) as u8).collect()
}

/// PUTs and GETs of `sizes` through `c`, every GET by the data plane
/// (`inline_get_max` is below them), compared byte for byte.
async fn round_trips(c: &Client, sizes: &[usize]) {
    for (seed, &len) in sizes.iter().enumerate() {
        let key = format!("v{len}");
        let value = pattern(len, seed);
        let mut b = c.alloc(2 * len).expect("alloc");
        b.as_mut_slice()[..len].copy_from_slice(&value);
        c.put_from(key.as_bytes(), &b, 0..len).await.expect("put");
        let n = c.get_into(key.as_bytes(), &mut b, len).await.expect("get");
        assert_eq!(n, len);
        assert!(b.as_slice()[len..] == value[..], "{len} bytes changed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_go_over_the_tls_data_plane_byte_exact() {
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let _node = data_plane_node(&certs, port, &[]);
    let cfg = ClientConfig {
        inline_get_max: MIB as u64,
        ..config(&certs, port, true, "ca.crt")
    };
    let c = Client::connect_with(cfg).await.expect("connect over TLS");
    let b = c.alloc(4096).expect("alloc");
    let desc = c.descriptor(&b, 0..4096).expect("descriptor");
    assert_eq!(desc.transport, TransportKind::Tls, "{desc}");
    round_trips(&c, &[8 * MIB, 32 * MIB]).await;
    let stats = c.data_plane_stats();
    // The node pulled both PUTs from this client's TLS listener, and this
    // client read both GETs from the node's.
    assert!(stats.reads_served.load(Ordering::Relaxed) >= 2);
    assert!(stats.connections_opened.load(Ordering::Relaxed) >= 1);
    assert_eq!(stats.tls_refused.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_node_refuses_a_plaintext_descriptor_by_name() {
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let _node = data_plane_node(&certs, port, &[]);
    let c = Client::connect_with(config(&certs, port, true, "ca.crt"))
        .await
        .expect("connect over TLS");
    let b = c.alloc(8 * MIB).expect("alloc");
    let mut desc = c.descriptor(&b, 0..8 * MIB).expect("descriptor");
    desc.transport = TransportKind::Tcp;
    match c.put_desc(b"plain", &desc, false).await {
        Err(Error::BadDescriptor(msg)) => assert!(msg.contains("speaks TLS"), "{msg}"),
        other => panic!("a plaintext descriptor was not refused clearly: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_puts_inline_and_reads_over_tls() {
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let _node = data_plane_node(&certs, port, &["--tls-auth-clients", "optional"]);
    let cfg = ClientConfig {
        inline_get_max: MIB as u64,
        ..config(&certs, port, false, "ca.crt")
    };
    let c = Client::connect_with(cfg).await.expect("connect over TLS");
    round_trips(&c, &[8 * MIB]).await;
    // Nothing pulled from this client: it has no certificate to serve with.
    assert_eq!(c.data_plane_stats().reads_served.load(Ordering::Relaxed), 0);
}
