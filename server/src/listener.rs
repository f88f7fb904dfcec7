//! Accepts client connections and enforces `max_connections`: a client
//! over the limit gets Redis' error and is closed; nobody else notices.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::connection;
use crate::node::Node;

/// The kernel's accept queue; bursts of connects wait here.
const LISTEN_BACKLOG: u32 = 1024;
/// How long a refused client gets to read its error before we close.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn bind(node: &Node) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::new(node.cfg.bind, node.cfg.port);
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    sock.set_reuseaddr(true)?;
    // Accepted connections take the listener's congestion control.
    if let Some(name) = &node.tcp_congestion {
        strata_rdma::sockopt::set_congestion(&sock, name)
            .with_context(|| format!("tcp_congestion {name:?}"))?;
    }
    sock.bind(addr)
        .with_context(|| format!("cannot listen on {addr} (bind, port)"))?;
    Ok(sock.listen(LISTEN_BACKLOG)?)
}

pub async fn serve(node: Arc<Node>, listener: TcpListener) -> anyhow::Result<()> {
    loop {
        let (mut sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the
                // clients already connected keep being served.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = node.conn_slots.clone().try_acquire_owned() else {
            node.metrics
                .counters
                .rejected_connections_total
                .fetch_add(1, Relaxed);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    REFUSAL_WRITE_TIMEOUT,
                    sock.write_all(b"-ERR max number of clients reached\r\n"),
                )
                .await;
            });
            continue;
        };
        node.metrics
            .counters
            .connections_total
            .fetch_add(1, Relaxed);
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(e) = connection::serve(&node, sock).await {
                tracing::debug!(%peer, "connection closed: {e}");
            }
            drop(permit);
        });
    }
}
