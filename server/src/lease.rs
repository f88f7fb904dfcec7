//! Leases: values pinned for a remote reader.
//!
//! A zero-copy `GET` (or `PREFIX ... PIN`) hands out a source descriptor that
//! points into the DRAM arena, and a lease that keeps the value there: while
//! the lease lives, the value cannot be evicted, freed or changed (it holds
//! a pinned [`Value`]). The data plane asks [`LeaseGuard`] before serving a
//! read of the arena: only a read that names the epoch of a value under a
//! live lease, and lies within that value, is served. Once the lease is
//! released or expires, the descriptor is `STALE` — a late reader can never
//! get bytes of whatever reused that memory.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use strata_rdma::{ReadGuard, Refusal};
use strata_tiering::Value;

use crate::node::now_ms;

/// Expired leases are swept this often (they are also refused lazily).
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// At most this many leases are dropped per sweep so a mass expiry cannot
/// hold the table for long.
const SWEEP_BATCH_MAX: usize = 4096;

struct Lease {
    values: Vec<Value>,
    expires_ms: u64,
}

/// Pins per epoch, for the data plane's lookups.
struct Pinned {
    value: Value,
    leases: u32,
    /// Latest expiry among the leases holding this epoch.
    expires_ms: u64,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    by_id: HashMap<u64, Lease>,
    by_epoch: HashMap<u64, Pinned>,
    expiry: BTreeSet<(u64, u64)>,
}

impl Table {
    fn drop_lease(&mut self, id: u64) -> Option<Lease> {
        let lease = self.by_id.remove(&id)?;
        self.expiry.remove(&(lease.expires_ms, id));
        for v in &lease.values {
            if let Some(p) = self.by_epoch.get_mut(&v.epoch()) {
                p.leases -= 1;
                if p.leases == 0 {
                    self.by_epoch.remove(&v.epoch());
                }
            }
        }
        Some(lease)
    }
}

/// All leases of a node.
#[derive(Default)]
pub struct Leases {
    table: Mutex<Table>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("live", &self.len()).finish()
    }
}

impl Leases {
    /// Pins `values` until `expires_ms` or release; returns the lease id
    /// (never 0, which the protocol uses for "no lease").
    pub fn grant(&self, values: Vec<Value>, expires_ms: u64) -> u64 {
        let mut t = self.table.lock();
        t.next_id += 1;
        let id = t.next_id;
        for v in &values {
            let p = t.by_epoch.entry(v.epoch()).or_insert_with(|| Pinned {
                value: v.clone(),
                leases: 0,
                expires_ms,
            });
            p.leases += 1;
            p.expires_ms = p.expires_ms.max(expires_ms);
        }
        t.expiry.insert((expires_ms, id));
        t.by_id.insert(id, Lease { values, expires_ms });
        id
    }

    /// Ends a lease; returns whether it was live.
    pub fn release(&self, id: u64) -> bool {
        // The pinned values are dropped after the lock is released.
        let lease = self.table.lock().drop_lease(id);
        lease.is_some()
    }

    /// Drops leases whose time has come; returns how many.
    pub fn sweep(&self, now_ms: u64) -> usize {
        let mut dropped = Vec::new();
        {
            let mut t = self.table.lock();
            while dropped.len() < SWEEP_BATCH_MAX {
                let Some(&(at, id)) = t.expiry.first() else {
                    break;
                };
                if at > now_ms {
                    break;
                }
                dropped.extend(t.drop_lease(id));
            }
        }
        dropped.len()
    }

    pub fn len(&self) -> usize {
        self.table.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The data plane's veto over reads of the arena.
pub struct LeaseGuard(pub std::sync::Arc<Leases>);

impl ReadGuard for LeaseGuard {
    fn pin(&self, addr: u64, len: u64, epoch: Option<u64>) -> Result<Box<dyn Any + Send>, Refusal> {
        // Arena reads must name the value they expect.
        let epoch = epoch.ok_or(Refusal::Stale)?;
        let t = self.0.table.lock();
        let p = t.by_epoch.get(&epoch).ok_or(Refusal::Stale)?;
        if p.expires_ms <= now_ms() {
            return Err(Refusal::Stale);
        }
        let start = p.value.addr() as u64;
        let end = start + p.value.len();
        match addr.checked_add(len) {
            Some(read_end) if addr >= start && read_end <= end => Ok(Box::new(p.value.clone())),
            _ => Err(Refusal::Gone),
        }
    }
}
