//! Whether this node may serve: proof that no other node serves its slots.
//!
//! Other nodes take over a member's slots once its record is gone from
//! etcd — its etcd lease expired, or a majority of its peers found it
//! unreachable and deleted it (`crate::services::detector`) — and only
//! [`Fence::takeover_wait`] after they saw it go. The member serves only
//! while it holds two proofs, each timed from when its check was sent:
//!
//! - its etcd lease is alive: the last renewal sent plus the lease's TTL
//!   (etcd deletes the record no earlier);
//! - nobody is deleting its record: a linearizable read of the record that
//!   found it, or — etcd unreachable — a majority of the other members
//!   saying they can reach this node (a member that says so is not among
//!   those who delete it until after it said so), at most `fence_ms` old.
//!
//! A check sent before the delete bounds the member's service to that send
//! time plus `fence_ms`, which is before anyone takes over; one sent after
//! it fails. So a member cut off stops answering for its slots before
//! another node starts, and two nodes never serve one slot. With etcd down
//! for everyone, members keep serving on each other's word until their
//! leases would have run out (`node_ttl_s`), then refuse until it is back.
//!
//! Times are on the monotonic clock (`Instant`), never the wall clock: what
//! matters is how long has passed, and two clocks' rates, not their
//! settings, must agree within [`TAKEOVER_MARGIN`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Added to every takeover wait: covers the two clocks' rate difference
/// over `fence_ms` and the scheduling delay of the member's own check.
pub const TAKEOVER_MARGIN: Duration = Duration::from_millis(100);

/// Milliseconds on the monotonic clock since the first call in this
/// process (never 0 after the first call, so 0 can mean "never").
pub fn mono_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(|| Instant::now() - Duration::from_millis(1));
    base.elapsed().as_millis() as u64
}

/// This node's proofs that it may serve.
#[derive(Debug)]
pub struct Fence {
    window: Duration,
    /// The etcd lease is alive until this monotonic ms (0: none).
    lease_until: AtomicU64,
    /// Nobody deletes the record before this monotonic ms (0: unproven).
    kept_until: AtomicU64,
    /// The last such proof was the peers' word (etcd unreachable).
    by_peers: AtomicBool,
}

impl Fence {
    pub fn new(window: Duration) -> Fence {
        Fence {
            window,
            lease_until: AtomicU64::new(0),
            kept_until: AtomicU64::new(0),
            by_peers: AtomicBool::new(false),
        }
    }

    /// `fence_ms`.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// A lease renewal sent at `sent_ms` (monotonic) that etcd answered
    /// with `ttl`, less [`TAKEOVER_MARGIN`] for the clocks' rates.
    pub fn lease_renewed(&self, sent_ms: u64, ttl: Duration) {
        let until =
            (sent_ms + ttl.as_millis() as u64).saturating_sub(TAKEOVER_MARGIN.as_millis() as u64);
        self.lease_until.fetch_max(until, Relaxed);
    }

    /// A check sent at `sent_ms` found the record (or, `by_peers`, a
    /// majority of peers vouched): proof for the window from then.
    pub fn kept(&self, sent_ms: u64, by_peers: bool) {
        let until = sent_ms + self.window.as_millis() as u64;
        if self.kept_until.fetch_max(until, Relaxed) < until {
            self.by_peers.store(by_peers, Relaxed);
        }
    }

    /// Gives up every proof at once (the record is gone).
    pub fn revoke(&self) {
        self.lease_until.store(0, Relaxed);
        self.kept_until.store(0, Relaxed);
    }

    pub fn serving(&self) -> bool {
        self.serving_at(mono_ms())
    }

    fn serving_at(&self, now_ms: u64) -> bool {
        self.remaining_at(now_ms) > 0
    }

    /// Whether the current proof came from the peers (etcd unreachable).
    pub fn by_peers(&self) -> bool {
        self.by_peers.load(Relaxed)
    }

    /// Milliseconds of service left on both proofs (0: fenced).
    pub fn remaining_ms(&self) -> u64 {
        self.remaining_at(mono_ms())
    }

    fn remaining_at(&self, now_ms: u64) -> u64 {
        let until = self
            .lease_until
            .load(Relaxed)
            .min(self.kept_until.load(Relaxed));
        until.saturating_sub(now_ms)
    }

    /// How long to wait before serving the slots of a member whose record
    /// is seen gone now.
    pub fn takeover_wait(&self) -> Duration {
        self.window + TAKEOVER_MARGIN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(5);

    #[test]
    fn a_node_serves_only_with_both_proofs_each_timed_from_its_check() {
        // Monotonic ms, far enough from 0 for checks in the past.
        let now = 100_000;
        let f = Fence::new(Duration::from_millis(300));
        assert!(!f.serving_at(now), "a node is fenced until it has proof");
        f.kept(now, false);
        assert!(!f.serving_at(now), "no lease yet");
        f.lease_renewed(now, TTL);
        assert!(f.serving_at(now) && f.serving_at(now + 299));
        assert!(!f.serving_at(now + 300), "the window is over");
        assert_eq!(f.remaining_at(now + 100), 200);
        // An older check's proof never shortens a newer one.
        f.kept(now - 1000, true);
        assert!(f.serving_at(now) && !f.by_peers());
        // A check sent a window ago proves nothing now.
        let g = Fence::new(Duration::from_millis(300));
        g.lease_renewed(now, TTL);
        g.kept(now - 300, false);
        assert!(!g.serving_at(now));
        // Nor does a lease renewed a TTL (less the margin) ago.
        let h = Fence::new(Duration::from_millis(300));
        h.lease_renewed(now - 4900, TTL);
        h.kept(now, false);
        assert!(!h.serving_at(now));
        f.revoke();
        assert!(!f.serving_at(now));
    }

    #[test]
    fn a_takeover_waits_past_the_window() {
        let f = Fence::new(Duration::from_millis(300));
        assert_eq!(
            f.takeover_wait(),
            Duration::from_millis(300) + TAKEOVER_MARGIN
        );
    }
}
