//! The node's work across the cluster: keeping the ring in step with etcd
//! (`membership`), pushing writes to their replicas (`replicate`) and
//! restoring copies after a ring change or a failed push (`repair`).
//!
//! These act on the whole [`crate::node::Node`] (its store, tiers, peers
//! and ring), so they sit above it: the node owns the state they read
//! (`crate::cluster`), and never calls into them; commands and the
//! process's start-up do.

pub mod detector;
pub mod etcd_conn;
pub mod heartbeat;
pub mod membership;
pub mod repair;
pub mod replicate;
