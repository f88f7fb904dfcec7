//! RESP calls from this node to other nodes (replication, hand-off).
//!
//! Pooled connections per peer, bounded in number and in time; a connection
//! on which anything went wrong is dropped, never reused in an unknown
//! state. Replies to these internal commands are small, so reading one is
//! bounded too. In a TLS cluster (`tls_cluster`) every connection is TLS,
//! to the peer's advertised TLS port, checked against the cluster's CA.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::sockopt::reset_on_close;
use strata_rdma::tls::{ClientConfig, Stream};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Concurrent calls (and connections) to one peer.
const CONNS_PER_PEER: usize = 8;
/// An internal reply is an OK, an integer or an error line.
const MAX_REPLY_BYTES: usize = 64 * 1024;
/// Covers the peer pulling a large value from us before it answers.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum PeerError {
    #[error("peer {0}: {1}")]
    Io(String, std::io::Error),
    #[error("peer {0} timed out")]
    Timeout(String),
    #[error("peer {0} sent a malformed reply")]
    Protocol(String),
    #[error("peer {0} replied: {1}")]
    Refused(String, String),
}

struct Pool {
    slots: Semaphore,
    idle: Mutex<Vec<Stream>>,
}

/// Connections to the other nodes.
#[derive(Default)]
pub struct Peers {
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    password: Option<String>,
    /// `tcp_congestion` as resolved for this host (replicas and hand-offs
    /// send values on these connections).
    congestion: Option<String>,
    /// Set in a TLS cluster (`crate::tls::peer_config`).
    tls: Option<Arc<ClientConfig>>,
}

impl Peers {
    pub fn new(
        password: Option<String>,
        congestion: Option<String>,
        tls: Option<Arc<ClientConfig>>,
    ) -> Peers {
        Peers {
            pools: Mutex::new(HashMap::new()),
            password,
            congestion,
            tls,
        }
    }

    /// Connections of their own to the same peers, with the same password
    /// and TLS: calls on them never queue behind this set's.
    pub fn sibling(&self) -> Peers {
        Peers::new(
            self.password.clone(),
            self.congestion.clone(),
            self.tls.clone(),
        )
    }

    fn pool(&self, addr: &str) -> Arc<Pool> {
        self.pools
            .lock()
            .entry(addr.to_string())
            .or_insert_with(|| {
                Arc::new(Pool {
                    slots: Semaphore::new(CONNS_PER_PEER),
                    idle: Mutex::new(Vec::new()),
                })
            })
            .clone()
    }

    /// Sends one command and returns its reply frame; an error reply is
    /// `PeerError::Refused`.
    pub async fn call(&self, addr: &str, args: &[&[u8]]) -> Result<BytesFrame, PeerError> {
        let pool = self.pool(addr);
        let _permit = pool
            .slots
            .acquire()
            .await
            .map_err(|_| PeerError::Protocol(addr.into()))?;
        // A pooled connection may have died with the peer (a restart):
        // the internal commands are idempotent, so one retry on a fresh
        // connection is safe.
        let idle = pool.idle.lock().pop();
        let reused = idle.is_some();
        let mut sock = match idle {
            Some(s) => s,
            None => self.connect(addr).await?,
        };
        let mut result = tokio::time::timeout(CALL_TIMEOUT, exchange(&mut sock, args)).await;
        // A connection given up on closes with a reset: a forwarded `DEL`
        // it still holds must not reach the peer after a partition heals.
        if reused && matches!(result, Ok(Err(_))) {
            reset_on_close(&sock);
            sock = self.connect(addr).await?;
            result = tokio::time::timeout(CALL_TIMEOUT, exchange(&mut sock, args)).await;
        }
        let frame = match result {
            Ok(Ok(frame)) => frame,
            failed => {
                reset_on_close(&sock);
                return Err(match failed {
                    Ok(Err(e)) => PeerError::Io(addr.into(), e),
                    _ => PeerError::Timeout(addr.into()),
                });
            }
        };
        pool.idle.lock().push(sock);
        match frame {
            BytesFrame::Error(e) => Err(PeerError::Refused(addr.into(), e.to_string())),
            f => Ok(f),
        }
    }

    async fn connect(&self, addr: &str) -> Result<Stream, PeerError> {
        let sock = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| PeerError::Timeout(addr.into()))?
            .map_err(|e| PeerError::Io(addr.into(), e))?;
        sock.set_nodelay(true)
            .map_err(|e| PeerError::Io(addr.into(), e))?;
        if let Some(name) = &self.congestion {
            strata_rdma::sockopt::set_congestion(&sock, name)
                .map_err(|e| PeerError::Io(addr.into(), e))?;
        }
        let mut sock = match &self.tls {
            Some(tls) => {
                let io = |e| PeerError::Io(addr.into(), e);
                let name = strata_rdma::tls::server_name(addr).map_err(io)?;
                strata_rdma::tls::connect(tls, name, sock, CONNECT_TIMEOUT)
                    .await
                    .map_err(io)?
            }
            None => Stream::Plain(sock),
        };
        if let Some(pass) = &self.password {
            match tokio::time::timeout(
                CALL_TIMEOUT,
                exchange(&mut sock, &[b"AUTH", pass.as_bytes()]),
            )
            .await
            {
                Ok(Ok(BytesFrame::SimpleString(_))) => {}
                Ok(Ok(BytesFrame::Error(e))) => {
                    return Err(PeerError::Refused(addr.into(), e.to_string()))
                }
                Ok(Ok(_)) => return Err(PeerError::Protocol(addr.into())),
                Ok(Err(e)) => return Err(PeerError::Io(addr.into(), e)),
                Err(_) => return Err(PeerError::Timeout(addr.into())),
            }
        }
        Ok(sock)
    }
}

async fn exchange(sock: &mut Stream, args: &[&[u8]]) -> std::io::Result<BytesFrame> {
    let mut req = BytesMut::new();
    req.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    sock.write_all(&req).await?;
    sock.flush().await?;
    let mut buf = BytesMut::with_capacity(256);
    loop {
        match redis_protocol::resp2::decode::decode_bytes_mut(&mut buf) {
            Ok(Some((frame, _, _))) => return Ok(frame),
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
        if buf.len() > MAX_REPLY_BYTES {
            return Err(std::io::Error::other("reply too large"));
        }
        if sock.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}
