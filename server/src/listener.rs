//! Accepts client connections and enforces `max_connections`: a client
//! over the limit gets Redis' error and is closed; nobody else notices.
//!
//! The TLS port (`tls_port`) handshakes each connection in its own task,
//! holding its connection slot and bounded by
//! [`strata_rdma::tls::HANDSHAKE_TIMEOUT`]; a plaintext client there is
//! told so in RESP and closed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use strata_rdma::tls::{AcceptError, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::connection;
use crate::node::Node;

/// The kernel's accept queue; bursts of connects wait here.
const LISTEN_BACKLOG: u32 = 1024;
/// How long a refused client gets to read its error before we close.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// What a plaintext client on the TLS port reads before it is closed:
/// redis-cli prints it as the reply to its first command.
const PLAINTEXT_REFUSAL: &[u8] =
    b"-ERR this port speaks TLS (tls_port): connect with TLS, e.g. redis-cli --tls\r\n";

/// Binds `port` (the plaintext `port` or `tls_port`), with the key named
/// in the error.
pub async fn bind(node: &Node, port: u16, key: &str) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::new(node.cfg.bind, port);
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
        .with_context(|| format!("cannot listen on {addr} (bind, {key})"))?;
    Ok(sock.listen(LISTEN_BACKLOG)?)
}

/// Serves `listener` until the process stops; `tls`: the TLS port's.
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
) -> anyhow::Result<()> {
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
        let node = node.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let stream = match tls {
                Some(acceptor) => handshake(&node, &acceptor, sock).await,
                None => Some(Stream::Plain(sock)),
            };
            if let Some(stream) = stream {
                node.metrics
                    .counters
                    .connections_total
                    .fetch_add(1, Relaxed);
                if let Err(e) = connection::serve(&node, stream).await {
                    tracing::debug!(%peer, "connection closed: {e}");
                }
            }
            drop(permit);
        });
    }
}

/// The TLS handshake of one connection; `None` (counted, and a plaintext
/// client told why) when it does not complete.
async fn handshake(node: &Node, acceptor: &TlsAcceptor, sock: TcpStream) -> Option<Stream> {
    let peer = sock.peer_addr().ok();
    let result =
        strata_rdma::tls::accept(acceptor, sock, strata_rdma::tls::HANDSHAKE_TIMEOUT).await;
    let e = match result {
        Ok(stream) => return Some(stream),
        Err(e) => e,
    };
    node.metrics
        .counters
        .tls_handshake_failures_total
        .fetch_add(1, Relaxed);
    tracing::debug!(?peer, "TLS port: {e}");
    if let AcceptError::Plaintext(sock) = e {
        refuse_plaintext(sock).await;
    }
    None
}

/// Tells a plaintext client why it is closed. Its request is read and
/// dropped first, and the socket drained until the client closes (for
/// [`REFUSAL_WRITE_TIMEOUT`] at most): closing with its bytes unread would
/// send a reset, which can discard the refusal before the client reads it.
async fn refuse_plaintext(mut sock: TcpStream) {
    let mut junk = [0u8; 4096];
    let _ = sock.try_read(&mut junk);
    let refuse = async {
        sock.write_all(PLAINTEXT_REFUSAL).await?;
        sock.shutdown().await?;
        while sock.read(&mut junk).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, refuse).await;
}
