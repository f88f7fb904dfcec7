//! Storage tiers of a strata node.
//!
//! A tier holds value bytes and hands out plain memory (`addr`, `len`) that
//! the server registers with the transport and serves in place. Today there
//! is the DRAM tier: one pre-allocated arena per node with a size-class
//! allocator inside it. The NVMe tier (`nvme`, on foyer) sits under it:
//! `spill` moves evicted values down into it and promotes them back on a
//! read. The GPU tier (`gpu`, on cudarc, feature `cuda`) sits above DRAM:
//! new values go up to it and its least recently used values come back
//! down.
//!
//! This crate must never see RESP and never import the transport (`rdma`):
//! `server` is the only place where tiers and transports meet.

mod below;
pub mod checksum;
pub mod dram;
pub mod events;
pub mod gpu;
pub mod keylog;
pub mod nvme;
pub mod spill;
pub mod store;

#[cfg(test)]
mod gpu_tests;

pub use events::{Observer, TierEvent};
pub use store::{
    ArenaHandle, Condition, Evicted, Expiry, GpuStats, LowerTier, Meta, Reservation, Store,
    StoreConfig, StoreError, StoreStats, Tier, Ttl, Value,
};
