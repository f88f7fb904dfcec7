//! strata transfer engine: one-sided reads of registered memory.
//!
//! A process registers memory regions with a [`Transport`] and hands out
//! descriptors for them; a peer holding a descriptor pulls the bytes with
//! [`Transport::read`] without the owner's application code taking part.
//! [`tcp::TcpTransport`] emulates this over TCP; `verbs::VerbsTransport`
//! (cargo feature `rdma`) does it with RDMA READ. [`DataPlane`] picks one
//! at start-up from config.
//!
//! This crate moves bytes and checks bounds; it never decides what is stored,
//! never interprets payloads and never imports `tiering` (the store plugs in
//! through [`ReadGuard`]).

pub mod cma;
mod dataplane;
mod error;
pub mod faulty;
pub mod handshake;
mod region;
pub mod sockopt;
pub mod spin;
pub mod tcp;
pub mod tls;
mod transport;
#[cfg(feature = "rdma")]
pub mod verbs;
mod wire;

pub use dataplane::{DataPlane, Listen, Protocol, StartError};
pub use error::TransferError;
pub use region::{ReadGuard, Refusal, Region, REGIONS_MAX};
pub use strata_proto::desc::{Descriptor, TransportKind};
pub use transport::{ReadOp, Transport};
