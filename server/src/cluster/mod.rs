//! Where keys live: this node's view of the ring, and routing.
//!
//! Standalone, the ring is this node alone and owns every slot. With
//! `metadata_server` set, [`crate::services::membership`] keeps the ring in
//! step with the node records in etcd. Every key command is checked here
//! first: keys of one request must share a slot (`-CROSSSLOT`), and a slot
//! owned by another node is answered `-MOVED slot host:port`, as in Redis
//! Cluster, so cluster-aware Redis clients route by themselves.
//!
//! Only state lives here, owned by the node; the work that acts on the
//! whole node (membership, replication, repair) is in `crate::services`.

pub mod fence;
pub mod peer;
pub mod under_replicated;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_proto::{CommandError, ErrorCode};
use strata_ring::{key_slot, NodeRecord, Ring};

use crate::clock::now_ms;

/// This node's view of the cluster.
pub struct Cluster {
    /// This node's own record (usage figures are refreshed on publish).
    pub me: NodeRecord,
    standalone: bool,
    ring: RwLock<Arc<Ring>>,
    /// Bumped on every ring change; `CLUSTER INFO`'s epoch.
    pub ring_version: AtomicU64,
    /// Whether the last exchange with etcd succeeded.
    pub etcd_healthy: AtomicBool,
    /// Successful (re)registrations with etcd.
    pub etcd_sessions: AtomicU64,
    /// Keys with fewer copies than `replica_num`, pushed again until not.
    pub under_replicated: under_replicated::UnderReplicated,
    /// Bumped on every ring change; a repair stops when it is not current.
    repair_generation: AtomicU64,
    /// When the ring last changed (Unix ms).
    last_ring_change_ms: AtomicU64,
    /// The last ring every local key was repaired against.
    repaired_ring: Mutex<Arc<Ring>>,
    /// Whether this node may serve (see [`fence`]).
    pub fence: fence::Fence,
    /// Members this node cannot reach (`crate::services::detector`).
    pub suspects: Mutex<std::collections::BTreeSet<String>>,
    /// The etcd create revision of this node's record (0: not registered):
    /// the same record while it is, a new one once it was deleted.
    pub my_revision: std::sync::atomic::AtomicI64,
    /// The incarnation this node registers with: `me`'s (its start), or a
    /// later one once it dropped its copies (a new member to repair).
    pub incarnation: AtomicU64,
    /// The etcd revision of each member's record as last seen, so that a
    /// delete names the version it means and never a successor's; a member
    /// whose record was seen deleted is not here.
    pub member_revisions: Mutex<std::collections::HashMap<String, i64>>,
}

/// After a ring change, misses are read through to the previous holders
/// for this long: other nodes' repairs may still be pushing keys here.
const TRANSITION_GRACE_MS: u64 = 30_000;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("me", &self.me.id).finish()
    }
}

impl Cluster {
    pub fn new(me: NodeRecord, standalone: bool, fence_window: std::time::Duration) -> Cluster {
        let me_incarnation = me.incarnation;
        // A cluster member owns nothing until it has heard from etcd:
        // claiming every slot alone would serve writes nobody else can find.
        let ring = if standalone {
            Ring::single(me.clone())
        } else {
            Ring::new(Vec::new())
        };
        Cluster {
            me,
            standalone,
            ring: RwLock::new(Arc::new(ring)),
            ring_version: AtomicU64::new(1),
            etcd_healthy: AtomicBool::new(standalone),
            etcd_sessions: AtomicU64::new(0),
            under_replicated: Default::default(),
            repair_generation: AtomicU64::new(0),
            last_ring_change_ms: AtomicU64::new(0),
            repaired_ring: Mutex::new(Arc::new(Ring::new(Vec::new()))),
            fence: fence::Fence::new(fence_window),
            suspects: Default::default(),
            my_revision: Default::default(),
            incarnation: AtomicU64::new(me_incarnation),
            member_revisions: Default::default(),
        }
    }

    pub fn standalone(&self) -> bool {
        self.standalone
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.ring.read().clone()
    }

    /// Installs a new ring; returns the previous one.
    pub fn set_ring(&self, ring: Ring) -> Arc<Ring> {
        let old = std::mem::replace(&mut *self.ring.write(), Arc::new(ring));
        self.ring_version.fetch_add(1, Relaxed);
        old
    }

    /// A ring change at `now_ms` that a repair is about to handle: the
    /// repair's generation (any older repair stops) and the ring to diff
    /// from, the last one fully repaired.
    pub fn start_repair(&self, now_ms: u64) -> (u64, Arc<Ring>) {
        self.last_ring_change_ms.store(now_ms, Relaxed);
        let generation = self.repair_generation.fetch_add(1, Relaxed) + 1;
        (generation, self.repaired_ring())
    }

    /// Every local key was repaired against `ring`.
    pub fn repaired(&self, ring: Arc<Ring>) {
        *self.repaired_ring.lock() = ring;
    }

    /// The last ring every local key was repaired against.
    pub fn repaired_ring(&self) -> Arc<Ring> {
        self.repaired_ring.lock().clone()
    }

    pub fn repair_generation(&self) -> u64 {
        self.repair_generation.load(Relaxed)
    }

    /// Whether keys may still be on their way here after a ring change:
    /// this node's own repair has not finished, or the change is recent
    /// enough that other nodes may still be pushing (their repairs run on
    /// their own clocks; a node that just started has nothing to repair
    /// itself but everything to receive).
    pub fn in_transition(&self) -> bool {
        if self.standalone {
            return false;
        }
        let recent = self.last_ring_change_ms.load(Relaxed) + TRANSITION_GRACE_MS > now_ms();
        recent || !Arc::ptr_eq(&self.repaired_ring.lock(), &self.ring())
    }

    /// Checks that this node owns every key of a request. Keys may be in
    /// different slots as long as this node owns them all (a superset of
    /// Redis Cluster's same-slot rule that lets a batch of KV-cache blocks
    /// go to their owner in one request). Keys owned elsewhere get `-MOVED`
    /// to the first key's owner; keys split across nodes get `-CROSSSLOT`.
    pub fn route<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Result<(), CommandError> {
        if self.standalone {
            return Ok(());
        }
        self.check_fence()?;
        let ring = self.ring.read();
        let mut first: Option<(u16, &NodeRecord)> = None;
        for key in keys {
            let slot = key_slot(key);
            let Some(owner) = ring.owner(slot) else {
                return Err(CommandError::new(
                    ErrorCode::ClusterDown,
                    "Hash slot not served: this node has not joined the cluster yet",
                ));
            };
            match first {
                None => first = Some((slot, owner)),
                Some((_, o)) if o.id == owner.id => {}
                Some(_) => {
                    return Err(CommandError::new(
                        ErrorCode::CrossSlot,
                        "Keys in request don't hash to the same slot (nor to slots of one node)",
                    ))
                }
            }
        }
        match first {
            Some((slot, owner)) if owner.id != self.me.id => Err(CommandError::new(
                ErrorCode::Moved,
                format!("{slot} {}", owner.resp_addr),
            )),
            _ => Ok(()),
        }
    }
}

impl Cluster {
    /// `-CLUSTERDOWN` while this node cannot prove that no other node
    /// serves its slots (see [`fence`]); clients retry elsewhere.
    pub fn check_fence(&self) -> Result<(), CommandError> {
        if self.standalone || self.fence.serving() {
            return Ok(());
        }
        Err(CommandError::new(
            ErrorCode::ClusterDown,
            "fenced: this node cannot confirm with etcd (or a majority of its peers) that it still owns its slots; retry on another node",
        ))
    }
}

/// Redis Cluster node ids are 40 hex characters; clients parse them. This
/// derives one from the strata id, stable across restarts.
pub fn hex_id(id: &str) -> String {
    let a = xxhash_rust::xxh3::xxh3_128(id.as_bytes());
    let b = xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), 1);
    format!("{a:032x}{:08x}", b as u32)
}

/// Is `key`'s slot one of those this node holds a copy for (owner or
/// replica) under `ring` with `copies` copies?
pub fn holds(ring: &Ring, me: &str, slot: u16, copies: usize) -> bool {
    ring.replicas(slot, copies).iter().any(|n| n.id == me)
}

pub fn split_addr(addr: &str) -> (&str, u16) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse().unwrap_or(0),
        ),
        None => (addr, 0),
    }
}
