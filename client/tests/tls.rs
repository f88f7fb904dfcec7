//! The SDK over TLS (`ClientConfig::tls`) to a node whose only RESP port
//! is its TLS port and which requires client certificates: zero-copy and
//! inline puts and gets of 1 MiB go over the TLS command connection; a
//! client without a certificate, or trusting another CA, is refused.

use std::time::Duration;

use strata_client::{Client, ClientConfig, TlsOptions};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_gets_over_tls_with_a_client_certificate() {
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let _node = TlsNode::start(
        &certs,
        port,
        &["--cpu-memory-pool-size".into(), "64MiB".into()],
    );
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
    let certs = Certs::make(&[]);
    let port = strata_tests::free_port();
    let _node = TlsNode::start(
        &certs,
        port,
        &["--cpu-memory-pool-size".into(), "64MiB".into()],
    );
    let no_cert = Client::connect_with(config(&certs, port, false, "ca.crt")).await;
    assert!(no_cert.is_err(), "a client without a certificate got in");
    let wrong_ca = Client::connect_with(config(&certs, port, true, "rogue-ca.crt")).await;
    assert!(wrong_ca.is_err(), "a client trusting another CA connected");
}
