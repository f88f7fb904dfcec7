//! Transfer errors, each with a stable code word the server maps to RESP.

use std::io;

/// Why a transfer or registration failed. Callers branch on the variant
/// (retry on another replica after `PeerClosed`/`Timeout`, answer `-STALE`,
/// ...); [`TransferError::code`] is the stable word for the wire.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The descriptor does not name live readable memory: unknown or
    /// deregistered rkey, range outside the region, wrong transport, or a
    /// destination range outside the local region.
    #[error("bad descriptor: {0}")]
    BadDescriptor(&'static str),
    /// The owner refused the read because the epoch is no longer current.
    #[error("stale descriptor epoch")]
    Stale,
    /// The read is longer than the transport allows in one request.
    #[error("read of {len} bytes is over the limit of {max}")]
    TooLarge { len: u64, max: u64 },
    /// A bound was hit (region table, peer table); try again later.
    #[error("transfer engine busy: {0}")]
    Busy(&'static str),
    /// Socket-level failure other than the peer going away.
    #[error("transfer I/O error: {0}")]
    Io(io::Error),
    /// The read did not finish within the transport's read timeout.
    #[error("transfer timed out")]
    Timeout,
    /// The peer closed the connection before the read finished.
    #[error("peer closed the connection")]
    PeerClosed,
    /// The peer announced a payload of a different length than requested.
    #[error("peer sent {got} bytes, {want} were requested")]
    LengthMismatch { want: u64, got: u64 },
    /// The peer spoke something that is not this transport's wire format.
    #[error("transfer protocol violation: {0}")]
    Protocol(&'static str),
    /// TLS on the data plane failed: a handshake (certificate, name,
    /// timeout), or one side speaks TLS and the other does not.
    #[error("data-plane TLS: {0}")]
    Tls(String),
}

impl TransferError {
    /// Stable code word, first word of the RESP error the server sends.
    pub const fn code(&self) -> &'static str {
        match self {
            Self::BadDescriptor(_) => "BADDESC",
            Self::Stale => "STALE",
            Self::TooLarge { .. } => "TOOLARGE",
            Self::Busy(_) => "BUSY",
            Self::Io(_) => "IO",
            Self::Timeout => "TIMEOUT",
            Self::PeerClosed => "PEERCLOSED",
            Self::LengthMismatch { .. } => "LENGTH",
            Self::Protocol(_) => "PROTOCOL",
            Self::Tls(_) => "TLS",
        }
    }
}

impl TransferError {
    /// The same error again, for every read of a batch that one failure
    /// ended (`io::Error` is not `Clone`: its kind and text are kept).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::BadDescriptor(s) => Self::BadDescriptor(s),
            Self::Stale => Self::Stale,
            Self::TooLarge { len, max } => Self::TooLarge {
                len: *len,
                max: *max,
            },
            Self::Busy(s) => Self::Busy(s),
            Self::Io(e) => Self::Io(io::Error::new(e.kind(), e.to_string())),
            Self::Timeout => Self::Timeout,
            Self::PeerClosed => Self::PeerClosed,
            Self::LengthMismatch { want, got } => Self::LengthMismatch {
                want: *want,
                got: *got,
            },
            Self::Protocol(s) => Self::Protocol(s),
            Self::Tls(s) => Self::Tls(s.clone()),
        }
    }
}

impl From<io::Error> for TransferError {
    /// A connection that ends early is `PeerClosed`, whatever way the kernel
    /// reports it; everything else stays `Io`.
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Self::PeerClosed,
            _ => Self::Io(e),
        }
    }
}
