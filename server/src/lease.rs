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
//!
//! The epoch in a leased descriptor is not the value's store epoch but a
//! read token: 64 bits from a keyed PRF (SipHash with keys from the OS), one
//! per leased value. Reading the arena thus needs a descriptor that this
//! node handed to a session that may run `GET` (authenticated, with
//! `requirepass`); guessing one (rkey, address and token) is hopeless, and
//! every token dies with its last lease.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_rdma::{ReadGuard, Refusal, TransportKind};
use strata_tiering::Value;

use crate::clock::now_ms;

/// Expired leases are swept this often (they are also refused lazily).
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// At most this many leases are dropped per sweep so a mass expiry cannot
/// hold the table for long.
const SWEEP_BATCH_MAX: usize = 4096;

struct Lease {
    values: Vec<Value>,
    expires_ms: u64,
    /// A zero-copy GET's lease: when it was granted and over what, so its
    /// RELEASE can time the client's read.
    transfer: Option<(Instant, TransportKind)>,
}

/// Pins per epoch, for the data plane's lookups.
struct Pinned {
    value: Value,
    leases: u32,
    /// Latest expiry among the leases holding this epoch.
    expires_ms: u64,
    /// What readers must name instead of the epoch.
    token: u64,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    by_id: HashMap<u64, Lease>,
    /// Store epoch → the pinned value.
    by_epoch: HashMap<u64, Pinned>,
    /// Read token → store epoch.
    by_token: HashMap<u64, u64>,
    expiry: BTreeSet<(u64, u64)>,
    tokens_minted: u64,
}

impl Table {
    fn drop_lease(&mut self, id: u64) -> Option<Lease> {
        let lease = self.by_id.remove(&id)?;
        self.expiry.remove(&(lease.expires_ms, id));
        for v in &lease.values {
            if let Some(p) = self.by_epoch.get_mut(&v.epoch()) {
                p.leases -= 1;
                if p.leases == 0 {
                    let token = p.token;
                    self.by_epoch.remove(&v.epoch());
                    self.by_token.remove(&token);
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
    /// Keys of the token PRF, drawn from the OS once per node.
    keys: RandomState,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("live", &self.len()).finish()
    }
}

impl Leases {
    /// Pins `values` until `expires_ms` or release. Returns the lease id
    /// (never 0, which the protocol uses for "no lease") and, per value,
    /// the read token its descriptor must carry.
    pub fn grant(&self, values: Vec<Value>, expires_ms: u64) -> (u64, Vec<u64>) {
        self.grant_inner(values, expires_ms, None)
    }

    /// Like [`Leases::grant`], for a value a client reads over `transport`
    /// ([`Leases::release_timed`] then says how long it held it).
    pub fn grant_transfer(
        &self,
        values: Vec<Value>,
        expires_ms: u64,
        transport: TransportKind,
    ) -> (u64, Vec<u64>) {
        self.grant_inner(values, expires_ms, Some((Instant::now(), transport)))
    }

    fn grant_inner(
        &self,
        values: Vec<Value>,
        expires_ms: u64,
        transfer: Option<(Instant, TransportKind)>,
    ) -> (u64, Vec<u64>) {
        let mut t = self.table.lock();
        t.next_id += 1;
        let id = t.next_id;
        let mut tokens = Vec::with_capacity(values.len());
        for v in &values {
            let token = match t.by_epoch.get(&v.epoch()) {
                Some(p) => p.token,
                None => {
                    let token = self.mint(&mut t);
                    t.by_token.insert(token, v.epoch());
                    t.by_epoch.insert(
                        v.epoch(),
                        Pinned {
                            value: v.clone(),
                            leases: 0,
                            expires_ms,
                            token,
                        },
                    );
                    token
                }
            };
            let p = t.by_epoch.get_mut(&v.epoch()).expect("inserted above");
            p.leases += 1;
            p.expires_ms = p.expires_ms.max(expires_ms);
            tokens.push(token);
        }
        t.expiry.insert((expires_ms, id));
        t.by_id.insert(
            id,
            Lease {
                values,
                expires_ms,
                transfer,
            },
        );
        (id, tokens)
    }

    /// A fresh token: SipHash (keyed from the OS) of a counter, never one
    /// in use.
    fn mint(&self, t: &mut Table) -> u64 {
        loop {
            t.tokens_minted += 1;
            let token = self.keys.hash_one(t.tokens_minted);
            if !t.by_token.contains_key(&token) {
                return token;
            }
        }
    }

    /// Ends a lease; returns whether it was live.
    pub fn release(&self, id: u64) -> bool {
        self.release_timed(id).0
    }

    /// Ends a lease; returns whether it was live and, for a transfer's
    /// lease, its transport and how long since it was granted.
    pub fn release_timed(&self, id: u64) -> (bool, Option<(TransportKind, Duration)>) {
        // The pinned values are dropped after the lock is released.
        let lease = self.table.lock().drop_lease(id);
        let timed = lease
            .as_ref()
            .and_then(|l| l.transfer)
            .map(|(at, kind)| (kind, at.elapsed()));
        (lease.is_some(), timed)
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
        // Arena reads must name the read token of a leased value.
        let token = epoch.ok_or(Refusal::Stale)?;
        let t = self.0.table.lock();
        let epoch = t.by_token.get(&token).ok_or(Refusal::Stale)?;
        let p = t.by_epoch.get(epoch).ok_or(Refusal::Stale)?;
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
