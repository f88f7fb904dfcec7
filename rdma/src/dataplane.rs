//! Start-time choice of the data plane: TCP, or RDMA verbs when built in
//! and a device works.
//!
//! [`Transport`] is not object-safe (its `read` returns `impl Future`), so
//! the choice is this enum rather than a `dyn Transport`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::tcp::{TcpConfig, TcpStats, TcpTls, TcpTransport};
#[cfg(feature = "rdma")]
use crate::verbs::{VerbsConfig, VerbsTransport};
use crate::{Descriptor, ReadGuard, ReadOp, Region, TransferError, Transport, TransportKind};

/// Which data plane to start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Tcp,
    /// RDMA READ over verbs.
    Rdma {
        /// Device to use; `None` auto-detects (first active port with a
        /// RoCEv2 GID).
        device_name: Option<String>,
        /// Start on TCP, with one warning, when no RDMA device works.
        fallback_tcp: bool,
    },
}

/// Why the data plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// RDMA was asked for but this binary has no verbs transport.
    #[error(
        "protocol rdma: this binary was built without RDMA support (rebuild with `--features rdma`)"
    )]
    NotBuilt,
    /// RDMA was asked for and no device works; the text says what was found.
    #[error("protocol rdma: {0}")]
    NoDevice(String),
    /// The listener could not bind (or another transport error).
    #[error("{0}")]
    Transport(#[from] TransferError),
}

/// The data plane this process runs.
pub enum DataPlane {
    Tcp(Arc<TcpTransport>),
    #[cfg(feature = "rdma")]
    Verbs(Arc<VerbsTransport>),
}

/// How a data plane presents itself on the network.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    /// Put in descriptors instead of the bound address.
    pub advertise_host: Option<String>,
    /// Congestion control of the TCP data plane's sockets; `None`: the
    /// host's default (see [`crate::sockopt`]).
    pub tcp_congestion: Option<String>,
    /// See [`TcpConfig::stream_spin`] (zero: off).
    pub stream_spin: Duration,
    /// TLS of the TCP data plane (not of RDMA, which has none).
    pub tls: TcpTls,
}

impl DataPlane {
    /// Starts the data plane `protocol` names on `addr`, with default
    /// limits.
    pub async fn start(
        addr: SocketAddr,
        protocol: &Protocol,
        listen: Listen,
    ) -> Result<DataPlane, StartError> {
        let advertise_host = listen.advertise_host;
        let congestion = listen.tcp_congestion;
        let stream_spin = listen.stream_spin;
        let tls = listen.tls;
        let tcp = |advertise_host| async move {
            let cfg = TcpConfig {
                advertise_host,
                congestion,
                stream_spin,
                tls,
                ..Default::default()
            };
            Ok(DataPlane::Tcp(TcpTransport::bind_with(addr, cfg).await?))
        };
        let Protocol::Rdma {
            device_name,
            fallback_tcp,
        } = protocol
        else {
            return tcp(advertise_host).await;
        };
        match start_verbs(addr, device_name, advertise_host.clone()).await {
            Err(why @ (StartError::NotBuilt | StartError::NoDevice(_))) if *fallback_tcp => {
                tracing::warn!(
                    reason = %why,
                    "RDMA unavailable: falling back to the TCP data plane (rdma_fallback_tcp)"
                );
                tcp(advertise_host).await
            }
            other => other,
        }
    }

    /// The running transport's counters.
    pub fn stats(&self) -> &TcpStats {
        match self {
            Self::Tcp(t) => t.stats(),
            #[cfg(feature = "rdma")]
            Self::Verbs(t) => t.stats(),
        }
    }
}

#[cfg(feature = "rdma")]
async fn start_verbs(
    addr: SocketAddr,
    device_name: &Option<String>,
    advertise_host: Option<String>,
) -> Result<DataPlane, StartError> {
    let cfg = VerbsConfig {
        device_name: device_name.clone(),
        advertise_host,
        ..Default::default()
    };
    match VerbsTransport::bind(addr, cfg).await {
        Ok(t) => Ok(DataPlane::Verbs(t)),
        Err(crate::verbs::BindError::NoDevice(e)) => Err(StartError::NoDevice(e.to_string())),
        Err(crate::verbs::BindError::Transport(e)) => Err(StartError::Transport(e)),
    }
}

#[cfg(not(feature = "rdma"))]
async fn start_verbs(
    _addr: SocketAddr,
    _device_name: &Option<String>,
    _advertise_host: Option<String>,
) -> Result<DataPlane, StartError> {
    Err(StartError::NotBuilt)
}

impl Transport for DataPlane {
    fn kind(&self) -> TransportKind {
        match self {
            Self::Tcp(t) => t.kind(),
            #[cfg(feature = "rdma")]
            Self::Verbs(t) => t.kind(),
        }
    }

    fn endpoint(&self) -> &str {
        match self {
            Self::Tcp(t) => t.endpoint(),
            #[cfg(feature = "rdma")]
            Self::Verbs(t) => t.endpoint(),
        }
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        // SAFETY: same contract, passed through unchanged.
        unsafe {
            match self {
                Self::Tcp(t) => t.register(addr, len, guard),
                #[cfg(feature = "rdma")]
                Self::Verbs(t) => t.register(addr, len, guard),
            }
        }
    }

    async fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), TransferError> {
        match self {
            Self::Tcp(t) => t.read(src, dst, dst_offset).await,
            #[cfg(feature = "rdma")]
            Self::Verbs(t) => t.read(src, dst, dst_offset).await,
        }
    }

    async fn read_many<'a>(&'a self, ops: &'a [ReadOp<'a>]) -> Vec<Result<(), TransferError>> {
        match self {
            Self::Tcp(t) => t.read_many(ops).await,
            #[cfg(feature = "rdma")]
            Self::Verbs(t) => t.read_many(ops).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_is_the_default() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let plane = DataPlane::start(addr, &Protocol::default(), Listen::default())
            .await
            .expect("tcp starts");
        assert_eq!(plane.kind(), TransportKind::Tcp);
    }

    /// On a machine without RDMA (or a build without it), asking for RDMA
    /// fails with a message that says why, and the fallback gives TCP.
    #[tokio::test]
    async fn rdma_without_a_device_fails_clearly_or_falls_back() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let strict = Protocol::Rdma {
            device_name: Some("no-such-device".into()),
            fallback_tcp: false,
        };
        let err = DataPlane::start(addr, &strict, Listen::default())
            .await
            .err()
            .expect("a device that does not exist cannot start");
        let text = err.to_string();
        assert!(
            text.contains("built without RDMA support") || text.contains("no RDMA device"),
            "unclear error: {text}"
        );
        let lenient = Protocol::Rdma {
            device_name: Some("no-such-device".into()),
            fallback_tcp: true,
        };
        let plane = DataPlane::start(addr, &lenient, Listen::default())
            .await
            .expect("falls back to tcp");
        assert_eq!(plane.kind(), TransportKind::Tcp);
    }
}
