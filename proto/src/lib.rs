//! strata's wire vocabulary: how requests are framed, how replies are
//! encoded (RESP2 and RESP3, through the `redis-protocol` crate), the stable
//! error codes, memory descriptors, and glob matching for `KEYS`/`SCAN`.
//!
//! This crate is pure: no sockets, no clocks, no tokio. Everything here is a
//! function from bytes to values and back, which is what makes it easy to
//! test exhaustively and to fuzz.

pub mod desc;
pub mod error;
pub mod glob;
pub mod reply;
pub mod request;

pub use desc::{Descriptor, TransportKind};
pub use error::{CommandError, ErrorCode};
pub use reply::{Reply, RespVersion};
pub use request::{Discard, DiscardStep, Limits, PendingBulk, ProtocolError, Scan};
