//! `/metrics` (Prometheus text format) and `/health` on the metrics port.
//!
//! A deliberately tiny HTTP/1.1 responder: one GET per connection, bounded
//! request size, time and concurrency. Scrapers and health probes need
//! nothing more, and it keeps a web framework out of the node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::node::Node;

/// A GET line plus headers; anything longer is not a scraper.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// A slow or stuck client gives up its slot after this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Concurrent HTTP connections; scrapers are few.
const MAX_HTTP_CONNECTIONS: usize = 64;

pub async fn bind(node: &Node) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::new(node.cfg.bind, node.cfg.metrics_port);
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr} (metrics_port)"))
}

pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
    loop {
        let (sock, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let node = node.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(&node, sock)).await;
            drop(permit);
        });
    }
}

async fn handle(node: &Node, mut sock: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() >= MAX_REQUEST_BYTES {
            return respond(
                &mut sock,
                "431 Request Header Fields Too Large",
                "text/plain",
                "too large\n",
            )
            .await;
        }
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = buf.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if method != b"GET" && method != b"HEAD" {
        return respond(
            &mut sock,
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n",
        )
        .await;
    }
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    match path {
        b"/metrics" => {
            let body = node.metrics.render(&node.scrape());
            respond(&mut sock, "200 OK", "text/plain; version=0.0.4", &body).await
        }
        b"/health" => {
            let cl = &node.cluster;
            let body = format!(
                "{{\"status\":\"ok\",\"mode\":\"{}\",\"etcd_healthy\":{},\"ring_nodes\":{},\"under_replicated_keys\":{},\"uptime_seconds\":{},\"keys\":{}}}\n",
                if cl.standalone() { "standalone" } else { "cluster" },
                // No etcd in standalone mode: neither healthy nor not.
                if cl.standalone() {
                    "null"
                } else if cl.etcd_healthy.load(std::sync::atomic::Ordering::Relaxed) {
                    "true"
                } else {
                    "false"
                },
                cl.ring().len(),
                cl.under_replicated.len(),
                node.started.elapsed().as_secs(),
                node.store.len()
            );
            respond(&mut sock, "200 OK", "application/json", &body).await
        }
        _ => {
            respond(
                &mut sock,
                "404 Not Found",
                "text/plain",
                "try /metrics or /health\n",
            )
            .await
        }
    }
}

async fn respond(
    sock: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}
