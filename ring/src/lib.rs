//! strata-ring: where a key lives.
//!
//! Maps keys to Redis Cluster hash slots (`slot`), describes cluster members
//! (`node`) and places slots on members with a capacity-weighted
//! consistent-hash ring (`ring`), so that servers and clients, in any process
//! on any platform and release, compute the same owner for every key.
//!
//! This crate must stay pure: no I/O, no sockets, no clocks, no tokio, no
//! randomness. Membership arrives as plain `NodeRecord`s from whoever watches
//! etcd; this crate only computes on them. That keeps placement fast,
//! deterministic and testable without a cluster.

pub mod node;
pub mod ring;
pub mod slot;

pub use node::{NodeRecord, ProcessRecord, TierUsage};
pub use ring::{points_for, Ring, SlotRange, MAX_POINTS, MIN_POINTS};
pub use slot::{key_slot, SLOTS};
