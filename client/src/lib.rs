//! strata's Rust SDK.
//!
//! A [`Client`] holds one RESP command connection to a node and its own
//! data-plane listener ([`strata_rdma::tcp::TcpTransport`]). Payloads never
//! cross the command connection on the zero-copy path: for a PUT the node
//! pulls the bytes from a registered client [`Buffer`]; for a GET the node
//! leases the value and the client pulls it into a registered buffer, then
//! releases the lease. Inline `set`/`get` exist for small values and tools.
//!
//! This crate never depends on the server; everything it knows about a node
//! is in `docs/PROTOCOL.md`.

mod buffer;
mod client;
mod conn;
mod error;

pub use buffer::Buffer;
pub use client::{Client, ClientConfig, BATCH_MAX};
pub use error::{Error, Result};
pub use strata_rdma::Descriptor;
