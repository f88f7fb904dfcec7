//! A strata store node: accepts RESP connections, runs commands against the
//! tiered store, and exports metrics. This crate is glue: framing and
//! encoding live in `strata-proto`, memory and eviction in
//! `strata-tiering`.
//!
//! Layout: `listener` accepts and bounds connections, `connection` frames
//! requests and writes replies, `cmd/` has one file per command, `node`
//! holds what all connections share, `metrics` and `http` export figures,
//! `pubsub` and `kv_events` tell subscribers and KV-aware routers of changes.

pub mod busy_poll;
pub mod clock;
pub mod cluster;
pub mod cma;
pub mod cmd;
pub mod config;
pub mod connection;
pub mod errors;
pub mod http;
pub mod kv_events;
pub mod lease;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod prefault;
pub mod pubsub;
pub mod services;
pub mod session;
pub mod tiers;
pub mod tls;

use std::sync::Arc;

use anyhow::Context;
use strata_rdma::Transport;

pub use node::Node;

/// How long a stopping node waits for queued evictions to reach NVMe.
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs a node until SIGINT or SIGTERM.
pub async fn run(cfg: config::Config) -> anyhow::Result<()> {
    let commands: Vec<&str> = cmd::COMMANDS.iter().map(|c| c.name).collect();
    let node = Node::start(cfg, &commands).await;
    let node = Arc::new(node.context("cannot start the node")?);
    node.publish_tier_events();
    let resp = match node.cfg.port {
        0 => None,
        port => Some(listener::bind(&node, port, "port").await?),
    };
    let tls_config = tls::server_config(&node.cfg).context("TLS")?;
    let tls_resp = match tls_config {
        Some(c) => Some((
            listener::bind(&node, node.cfg.tls_port, "tls_port").await?,
            tokio_rustls::TlsAcceptor::from(c),
        )),
        None => None,
    };
    let http = if node.cfg.metrics_port != 0 {
        Some(http::bind(&node).await?)
    } else {
        None
    };
    let metrics = match &http {
        Some(h) => h.local_addr()?.to_string(),
        None => "off".to_string(),
    };
    tracing::info!(
        resp = %local(resp.as_ref()),
        tls = %local(tls_resp.as_ref().map(|(l, _)| l)),
        metrics = %metrics,
        data = %node.transport.endpoint(),
        pool_bytes = node.cfg.cpu_memory_pool_size,
        tcp_congestion = %node
            .tcp_congestion
            .clone()
            .unwrap_or_else(|| format!("{} (host)", strata_rdma::sockopt::host_default())),
        busy_poll_us = node.cfg.busy_poll_us,
        stream_poll_us = node.cfg.stream_poll_us,
        echo_poll_us = node.cfg.echo_poll_us,
        "strata-server ready"
    );
    node.spawn_event_publisher();
    node.spawn_expiry();
    node.spawn_lease_sweeper();
    services::repair::spawn_sweeper(&node);
    if let Some(http) = http {
        tokio::spawn(http::serve(node.clone(), http));
    }
    if !node.cfg.standalone() {
        tokio::spawn(services::membership::run(node.clone()));
        tokio::spawn(services::heartbeat::run(node.clone()));
        tokio::spawn(services::detector::run(node.clone()));
        tokio::spawn(services::replicate::retry_loop(node.clone()));
    }
    let result = tokio::select! {
        r = serve_all(node.clone(), resp, tls_resp) => r,
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            Ok(())
        }
    };
    if !node.cfg.standalone() {
        services::membership::leave(&node).await;
    }
    if let Some(lower) = &node.lower {
        tiers::shut_down(&node.store, lower, SHUTDOWN_DRAIN).await;
    }
    result
}

/// Serves the plaintext and TLS ports, whichever are on, until one fails.
async fn serve_all(
    node: Arc<Node>,
    resp: Option<tokio::net::TcpListener>,
    tls: Option<(tokio::net::TcpListener, tokio_rustls::TlsAcceptor)>,
) -> anyhow::Result<()> {
    let plain = async {
        match resp {
            Some(l) => listener::serve(node.clone(), l, None).await,
            None => std::future::pending().await,
        }
    };
    let secure = async {
        match tls {
            Some((l, acceptor)) => listener::serve(node.clone(), l, Some(acceptor)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = plain => r,
        r = secure => r,
    }
}

fn local(l: Option<&tokio::net::TcpListener>) -> String {
    match l.map(|l| l.local_addr()) {
        Some(Ok(a)) => a.to_string(),
        Some(Err(e)) => e.to_string(),
        None => "off".into(),
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
