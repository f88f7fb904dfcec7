//! strata's Rust SDK.
//!
//! A [`Client`] routes by itself: it learns the slot map (`CLUSTER SLOTS`)
//! from any seed node, sends each key to its slot's owner over one RESP
//! command connection per node, follows `-MOVED`, splits batches by node,
//! and while a node is down serves reads from replicas and retries writes
//! on the new owner (`failover_timeout_ms`). A standalone node is a cluster
//! of one. It runs its own data-plane listener
//! ([`strata_rdma::tcp::TcpTransport`]). On the zero-copy path a payload
//! moves between a registered client [`Buffer`] and the node's memory with
//! no copy in user space: for a PUT the node pulls the bytes from the
//! buffer; for a GET the node leases the value and the client pulls it into
//! the buffer, then releases the lease. Over TCP, where such a pull costs a
//! round trip more than a reply, a single value up to 1 MiB travels with
//! the command instead, still straight from and into the buffer
//! ([`ClientConfig::inline_put_max`], [`ClientConfig::inline_get_max`]).
//! Inline `set`/`get` exist for small values and tools.
//!
//! ```no_run
//! # async fn demo() -> strata_client::Result<()> {
//! let client = strata_client::Client::connect("127.0.0.1:7379").await?;
//! let mut buf = client.alloc(1 << 20)?;
//! buf.as_mut_slice().fill(7);
//! client.put_from(b"block-0", &buf, 0..1 << 20).await?;
//! let n = client.get_into(b"block-0", &mut buf, 0).await?;
//! assert_eq!(n, 1 << 20);
//! # Ok(())
//! # }
//! ```
//!
//! This crate never depends on the server; everything it knows about a node
//! is in `docs/PROTOCOL.md`.

mod buffer;
mod client;
mod cma;
mod config;
mod conn;
mod error;
mod node;
mod ops;
mod route;
mod router;
mod slots;
mod spin;

pub use buffer::Buffer;
pub use client::{Client, BATCH_MAX};
pub use config::{
    ClientConfig, TlsOptions, BATCH_INLINE_GET_MAX, DEFAULT_INLINE_GET_MAX, DEFAULT_INLINE_PUT_MAX,
    DEFAULT_SPLIT_GET_MIN, ONE_SIDED_INLINE_GET_MAX,
};
pub use error::{Error, Result};
pub use route::{DATA_ADVERTISE_ENV, DATA_BIND_ENV};
pub use spin::{DEFAULT_ECHO_SPIN_US, DEFAULT_STREAM_SPIN_US, SPIN_MAX};
pub use strata_rdma::cma::{DEFAULT_LANES as DEFAULT_CMA_LANES, LANES_MAX as CMA_LANES_MAX};
pub use strata_rdma::{Descriptor, Protocol};
