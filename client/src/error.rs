//! The errors callers branch on, mapped from RESP code words and from the
//! transfer engine's errors.

use std::io;

use strata_rdma::TransferError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The key does not exist.
    #[error("key not found")]
    NotFound,
    /// A value over the node's limit, or a value larger than the destination.
    #[error("too large: {0}")]
    TooLarge(String),
    /// A descriptor or lease named a value that changed since.
    #[error("stale: {0}")]
    Stale(String),
    /// A descriptor was malformed or named memory the reader may not read.
    #[error("bad descriptor: {0}")]
    BadDescriptor(String),
    /// The node has no room for the value.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The node (or a transfer engine) is overloaded; retried a bounded
    /// number of times before it reaches the caller.
    #[error("busy: {0}")]
    Busy(String),
    /// The key's slot is served by another node (`-MOVED slot host:port`).
    /// The client follows these itself; one reaches the caller only after
    /// `retry_attempts` redirects in a row.
    #[error("moved: slot {slot} is at {addr}")]
    Moved { slot: u16, addr: String },
    /// Socket failure or timeout on the command connection or data plane.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// A reply that does not fit the protocol (wrong shape, bad RESP).
    #[error("protocol: {0}")]
    Protocol(String),
    /// Any other error reply: its code word and message.
    #[error("{code} {msg}")]
    Server { code: String, msg: String },
    /// The call itself was wrong (empty buffer, range outside the buffer).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
}

impl Error {
    /// Maps an error reply (`CODE message`) by its code word.
    pub(crate) fn from_reply(text: &str) -> Self {
        let (code, msg) = text.split_once(' ').unwrap_or((text, ""));
        let msg = msg.to_owned();
        match code {
            "NOTFOUND" => Self::NotFound,
            "TOOLARGE" => Self::TooLarge(msg),
            "STALE" => Self::Stale(msg),
            "BADDESC" => Self::BadDescriptor(msg),
            "NOSPACE" => Self::NoSpace(msg),
            "BUSY" => Self::Busy(msg),
            "MOVED" => match msg.split_once(' ').map(|(s, a)| (s.parse(), a)) {
                Some((Ok(slot), addr)) if !addr.is_empty() => Self::Moved {
                    slot,
                    addr: addr.to_owned(),
                },
                _ => Self::Server {
                    code: code.to_owned(),
                    msg,
                },
            },
            _ => Self::Server {
                code: code.to_owned(),
                msg,
            },
        }
    }

    /// The node could not be reached or stopped answering: try elsewhere.
    pub(crate) fn is_node_failure(&self) -> bool {
        matches!(self, Self::Io(_))
    }

    /// Certainly never delivered (refused connect): safe to send again even
    /// when the command is not idempotent.
    pub(crate) fn surely_unsent(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == io::ErrorKind::ConnectionRefused)
    }

    /// The cluster is changing under the request (a node not joined yet or
    /// fenced, a batch split differently by the node's ring, a write whose
    /// replica is down and about to be dropped): retry after a refresh.
    pub(crate) fn is_cluster_transient(&self) -> bool {
        matches!(self, Self::Server { code, .. }
            if matches!(code.as_str(), "CLUSTERDOWN" | "CROSSSLOT" | "TRYAGAIN" | "NOREPLICAS"))
    }

    /// A copy for each item of a batch that failed as a whole (`io::Error`
    /// is not `Clone`: kind and text are kept).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Self::NotFound => Self::NotFound,
            Self::TooLarge(m) => Self::TooLarge(m.clone()),
            Self::Stale(m) => Self::Stale(m.clone()),
            Self::BadDescriptor(m) => Self::BadDescriptor(m.clone()),
            Self::NoSpace(m) => Self::NoSpace(m.clone()),
            Self::Busy(m) => Self::Busy(m.clone()),
            Self::Moved { slot, addr } => Self::Moved {
                slot: *slot,
                addr: addr.clone(),
            },
            Self::Io(e) => Self::Io(io::Error::new(e.kind(), e.to_string())),
            Self::Protocol(m) => Self::Protocol(m.clone()),
            Self::Server { code, msg } => Self::Server {
                code: code.clone(),
                msg: msg.clone(),
            },
            Self::Invalid(m) => Self::Invalid(m),
        }
    }

    /// Whether the command connection is in an unknown state after this
    /// error and must be replaced.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(self, Self::Io(_) | Self::Protocol(_))
    }
}

impl From<TransferError> for Error {
    fn from(e: TransferError) -> Self {
        match e {
            TransferError::BadDescriptor(m) => Self::BadDescriptor(m.to_owned()),
            TransferError::Stale => Self::Stale("source descriptor epoch refused".into()),
            e @ TransferError::TooLarge { .. } => Self::TooLarge(e.to_string()),
            TransferError::Busy(m) => Self::Busy(m.to_owned()),
            TransferError::Io(e) => Self::Io(e),
            TransferError::Timeout => Self::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "data-plane read timed out",
            )),
            TransferError::PeerClosed => Self::Io(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "data-plane peer closed the connection",
            )),
            e @ (TransferError::LengthMismatch { .. } | TransferError::Protocol(_)) => {
                Self::Protocol(e.to_string())
            }
            // A setup problem (certificates, a plaintext peer): the text
            // says which.
            e @ TransferError::Tls(_) => Self::Io(io::Error::other(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_codes_map_to_variants() {
        assert!(matches!(
            Error::from_reply("NOTFOUND no such key"),
            Error::NotFound
        ));
        assert!(
            matches!(Error::from_reply("TOOLARGE value of 5 bytes"), Error::TooLarge(m) if m == "value of 5 bytes")
        );
        assert!(matches!(Error::from_reply("BADDESC"), Error::BadDescriptor(m) if m.is_empty()));
        assert!(matches!(Error::from_reply("STALE x"), Error::Stale(_)));
        assert!(matches!(Error::from_reply("NOSPACE x"), Error::NoSpace(_)));
        assert!(matches!(
            Error::from_reply("BUSY too many leases"),
            Error::Busy(_)
        ));
        assert!(
            matches!(Error::from_reply("MOVED 3999 10.0.0.2:7379"), Error::Moved { slot: 3999, addr } if addr == "10.0.0.2:7379")
        );
        assert!(
            matches!(Error::from_reply("MOVED junk"), Error::Server { code, .. } if code == "MOVED")
        );
        assert!(Error::from_reply("CROSSSLOT Keys in request").is_cluster_transient());
        assert!(
            matches!(Error::from_reply("ERR syntax error"), Error::Server { code, msg } if code == "ERR" && msg == "syntax error")
        );
    }

    #[test]
    fn transfer_errors_map_to_variants() {
        assert!(matches!(Error::from(TransferError::Stale), Error::Stale(_)));
        assert!(matches!(
            Error::from(TransferError::BadDescriptor("x")),
            Error::BadDescriptor(_)
        ));
        assert!(matches!(
            Error::from(TransferError::PeerClosed),
            Error::Io(_)
        ));
        assert!(matches!(
            Error::from(TransferError::LengthMismatch { want: 1, got: 2 }),
            Error::Protocol(_)
        ));
    }
}
