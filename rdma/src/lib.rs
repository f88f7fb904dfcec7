//! strata transfer engine: one-sided reads of registered memory.
//!
//! A process registers memory regions with a [`Transport`] and hands out
//! descriptors for them; a peer holding a descriptor pulls the bytes with
//! [`Transport::read`] without the owner's application code taking part.
//! [`tcp::TcpTransport`] emulates this over TCP; a verbs transport (RDMA
//! READ) will sit beside it behind the same trait.
//!
//! This crate moves bytes and checks bounds; it never decides what is stored,
//! never interprets payloads and never imports `tiering` (the store plugs in
//! through [`ReadGuard`]).

mod error;
pub mod faulty;
mod region;
pub mod tcp;
mod transport;
mod wire;

pub use error::TransferError;
pub use region::{ReadGuard, Refusal, Region, REGIONS_MAX};
pub use strata_proto::desc::{Descriptor, TransportKind};
pub use transport::Transport;
