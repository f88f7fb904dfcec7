//! TLS the way Redis does it, with the real clients: redis-cli `--tls`
//! against the TLS port, client certificates required, optional and
//! refused, a plaintext client on the TLS port told so, bad TLS settings
//! refused at start naming their key, and a TLS-only cluster whose nodes
//! call each other and etcd over TLS. Certificates come from the openssl
//! CLI (`strata_tests::tls::Certs`); everything binds 127.0.0.1.

use std::net::TcpStream;
use std::process::Output;

use strata_tests::etcd::Etcd;
use strata_tests::tls::{redis_cli_tls, Certs, TlsNode};
use strata_tests::{free_port, run_to_exit, server_command, wait_until, within, Server};

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn start(certs: &Certs, extra: &[&str]) -> (Server, u16) {
    let tls_port = free_port();
    let mut args = certs.node_args(tls_port);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (Server::start(&args), tls_port)
}

#[test]
fn redis_cli_speaks_tls_and_a_plaintext_client_is_refused() {
    let certs = Certs::make(&[]);
    let (s, tls_port) = start(&certs, &["--tls-auth-clients", "no"]);
    // A client that connects and says nothing holds no one up.
    let _silent = TcpStream::connect(("127.0.0.1", tls_port)).expect("connect");
    let ca = certs.s("ca.crt");
    let cli = |args: &[&str]| text(&redis_cli_tls(tls_port, &["--cacert", &ca], args));
    assert_eq!(cli(&["set", "k", "over tls"]).trim(), "OK");
    assert_eq!(cli(&["get", "k"]).trim(), "over tls");
    let plain = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &tls_port.to_string(), "ping"])
        .output()
        .expect("redis-cli");
    let said = text(&plain);
    assert!(
        said.contains("this port speaks TLS (tls_port)"),
        "plaintext client on the TLS port: {said}"
    );
    // The plaintext port is unaffected and sees what TLS clients wrote.
    let mut c = s.conn();
    assert_eq!(c.request(&[b"GET", b"k"]), b"$8\r\nover tls\r\n");
    assert!(s.metric("strata_tls_handshake_failures_total") >= 1.0);
    assert_eq!(cli(&["ping"]).trim(), "PONG");
}

#[test]
fn client_certificates_required_optional_and_refused() {
    let certs = Certs::make(&[]);
    let ca = certs.s("ca.crt");
    let with = |name: &str| {
        vec![
            "--cacert".to_string(),
            ca.clone(),
            "--cert".into(),
            certs.s(&format!("{name}.crt")),
            "--key".into(),
            certs.s(&format!("{name}.key")),
        ]
    };
    let ping = |port: u16, tls: &[String]| {
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        text(&redis_cli_tls(port, &tls, &["ping"]))
    };
    let bare = vec!["--cacert".to_string(), ca.clone()];
    // A CA given: certificates required by default, as in Redis.
    let (_required, port) = start(&certs, &[]);
    assert!(ping(port, &with("client")).contains("PONG"));
    assert!(!ping(port, &bare).contains("PONG"), "no certificate let in");
    assert!(
        !ping(port, &with("rogue")).contains("PONG"),
        "another CA's certificate let in"
    );
    let (_optional, port) = start(&certs, &["--tls-auth-clients", "optional"]);
    assert!(ping(port, &with("client")).contains("PONG"));
    assert!(ping(port, &bare).contains("PONG"));
    assert!(
        !ping(port, &with("rogue")).contains("PONG"),
        "optional still checks a certificate"
    );
}

#[test]
fn bad_tls_settings_stop_the_node_naming_the_key() {
    let certs = Certs::make(&[]);
    let refused = |args: &[&str], want: &str| {
        let mut cmd = server_command();
        cmd.args(["--port", &free_port().to_string(), "--metrics-port", "0"]);
        cmd.args(args);
        let exit = run_to_exit(cmd);
        assert_eq!(exit.status.code(), Some(2), "{args:?}: {}", exit.stderr);
        assert!(
            exit.stderr.contains(want),
            "{args:?}: want {want:?} in {}",
            exit.stderr
        );
    };
    let (crt, key, client_key) = (
        certs.s("node.crt"),
        certs.s("node.key"),
        certs.s("client.key"),
    );
    let port = free_port().to_string();
    refused(
        &["--tls-port", &port],
        "tls_port: needs tls_cert_file and tls_key_file",
    );
    refused(
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            "/nonexistent.crt",
            "--tls-key-file",
            &key,
        ],
        "tls_cert_file: /nonexistent.crt",
    );
    refused(
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &crt,
            "--tls-key-file",
            &crt,
        ],
        "tls_key_file:",
    );
    refused(
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &crt,
            "--tls-key-file",
            &client_key,
        ],
        "is not the key of the certificate",
    );
    refused(
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &crt,
            "--tls-key-file",
            &key,
            "--tls-auth-clients",
            "yes",
        ],
        "tls_auth_clients: yes needs tls_ca_cert_file",
    );
    refused(
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &crt,
            "--tls-key-file",
            &key,
            "--tls-data-plane",
            "yes",
        ],
        "tls_data_plane: needs tls_ca_cert_file",
    );
    refused(
        &["--etcd-ca-cert-file", "/nonexistent.pem"],
        "etcd_ca_cert_file: /nonexistent.pem",
    );
}

/// etcd over TLS requiring client certificates, as `etcd --client-cert-auth`.
fn tls_etcd(certs: &Certs) -> Etcd {
    Etcd::start_tls(&[
        "--cert-file".into(),
        certs.s("node.crt"),
        "--key-file".into(),
        certs.s("node.key"),
        "--trusted-ca-file".into(),
        certs.s("ca.crt"),
        "--client-cert-auth".into(),
    ])
}

fn cluster_info(certs: &Certs, port: u16, field: &str) -> Option<u64> {
    let out = text(&certs.cli(port, &["cluster", "info"]));
    strata_tests::info_value(&out, field)
}

#[test]
fn a_tls_only_cluster_replicates_and_redirects_over_tls() {
    let certs = Certs::make(&[]);
    let etcd = tls_etcd(&certs);
    let url = etcd.url();
    let nodes: Vec<TlsNode> = (0..3)
        .map(|i| {
            let args: Vec<String> = [
                "--metadata-server",
                &url,
                "--etcd-ca-cert-file",
                &certs.s("ca.crt"),
                "--etcd-cert-file",
                &certs.s("client.crt"),
                "--etcd-key-file",
                &certs.s("client.key"),
                "--replica-num",
                "2",
                "--host-name",
                &format!("host{i}"),
                "--cpu-memory-pool-size",
                "64MiB",
                // Copies between processes of one host would otherwise
                // skip the network (cross-memory attach).
                "--cma",
                "off",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            TlsNode::start(&certs, free_port(), &args)
        })
        .collect();
    for n in &nodes {
        let ring = wait_until(within(std::time::Duration::from_secs(20)), || {
            cluster_info(&certs, n.tls_port, "cluster_known_nodes") == Some(3)
        });
        assert!(
            ring,
            "node on {} never saw 3 nodes:\n{}",
            n.tls_port,
            n.log()
        );
    }
    // CLUSTER SLOTS names the TLS ports: the only ones there are.
    let slots = text(&certs.cli(nodes[0].tls_port, &["cluster", "slots"]));
    for n in &nodes {
        assert!(
            slots.contains(&n.tls_port.to_string()),
            "{} not in {slots}",
            n.tls_port
        );
    }
    const KEYS: usize = 30;
    for i in 0..KEYS {
        let out = text(&certs.cli(
            nodes[0].tls_port,
            &["-c", "set", &format!("k{i}"), &format!("v{i}")],
        ));
        assert!(out.contains("OK"), "set k{i} through redirects: {out}");
    }
    for i in 0..KEYS {
        let out = text(&certs.cli(nodes[1].tls_port, &["-c", "get", &format!("k{i}")]));
        assert!(out.contains(&format!("v{i}")), "get k{i}: {out}");
    }
    // Each key's second copy went to a peer over TLS.
    let copies = || -> u64 {
        nodes
            .iter()
            .map(|n| {
                let out = text(&certs.cli(n.tls_port, &["dbsize"]));
                out.trim().parse::<u64>().unwrap_or(0)
            })
            .sum()
    };
    assert!(
        wait_until(within(std::time::Duration::from_secs(20)), || copies()
            == 2 * KEYS as u64),
        "copies: {} of {}",
        copies(),
        2 * KEYS
    );
    // ... and its bytes over the TLS data plane (implied by port 0), none
    // in plaintext.
    let pulled = |transport: &str| -> u64 {
        let field = format!("transfer_replica_{transport}_count");
        nodes
            .iter()
            .map(|n| {
                let out = text(&certs.cli(n.tls_port, &["info", "stats"]));
                strata_tests::info_value(&out, &field).unwrap_or(0)
            })
            .sum()
    };
    assert!(
        pulled("tls") >= KEYS as u64,
        "tls copies: {}",
        pulled("tls")
    );
    assert_eq!(pulled("tcp"), 0, "copies in plaintext");
}

#[test]
fn etcd_with_a_user_and_password_over_tls() {
    let certs = Certs::make(&[]);
    let etcd = Etcd::start_tls(&[
        "--cert-file".into(),
        certs.s("node.crt"),
        "--key-file".into(),
        certs.s("node.key"),
    ]);
    let endpoint = format!("https://127.0.0.1:{}", etcd.client_port());
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .args(["--endpoints", &endpoint, "--cacert", &certs.s("ca.crt")])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("run etcdctl (apt-get install etcd-client)");
        assert!(out.status.success(), "etcdctl {args:?}: {}", text(&out));
    };
    ctl(&["user", "add", "root:s3cret"]);
    ctl(&["auth", "enable"]);
    let args: Vec<String> = [
        "--metadata-server",
        &etcd.url(),
        "--etcd-ca-cert-file",
        &certs.s("ca.crt"),
        "--etcd-user",
        "root",
        "--cpu-memory-pool-size",
        "64MiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The password comes from the environment, as operators pass it.
    let port = free_port();
    let good = TlsNode::start_with_env(&certs, port, &args, &[("STRATA_ETCD_PASSWORD", "s3cret")]);
    let joined = wait_until(within(std::time::Duration::from_secs(20)), || {
        cluster_info(&certs, good.tls_port, "cluster_known_nodes") == Some(1)
    });
    assert!(
        joined,
        "node with the right password never joined:\n{}",
        good.log()
    );
    // At debug, each failed session is logged ("etcd still unreachable").
    let mut args = args;
    args.extend(["--log-level".to_string(), "strata_server=debug".into()]);
    let bad = TlsNode::start_with_env(
        &certs,
        free_port(),
        &args,
        &[("STRATA_ETCD_PASSWORD", "wrong")],
    );
    let refused = wait_until(within(std::time::Duration::from_secs(20)), || {
        bad.log().contains("etcd still unreachable")
    });
    assert!(refused, "a wrong password was not refused:\n{}", bad.log());
    assert_eq!(
        cluster_info(&certs, bad.tls_port, "cluster_known_nodes"),
        Some(0),
        "a wrong password joined:\n{}",
        bad.log()
    );
}
