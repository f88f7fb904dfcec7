//! What happens to keys inside the tiers without a command asking: the
//! store tells an [`Observer`] (the node's keyspace notifications) when a
//! value leaves, moves between tiers or expires.

/// A key's move or departure, named as strata publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierEvent {
    /// The value left this node to make room: no copy is kept.
    Evicted,
    /// The value left DRAM for the NVMe tier; it is still served.
    Spilled,
    /// The value's TTL passed and it was removed.
    Expired,
    /// The value moved down from the GPU pool to DRAM.
    Demoted,
    /// The value was read back from NVMe into DRAM.
    Promoted,
}

impl TierEvent {
    /// The event name (Redis' for `evicted` and `expired`).
    pub fn name(self) -> &'static str {
        match self {
            TierEvent::Evicted => "evicted",
            TierEvent::Spilled => "spilled",
            TierEvent::Expired => "expired",
            TierEvent::Demoted => "demoted",
            TierEvent::Promoted => "promoted",
        }
    }
}

/// Told of every [`TierEvent`]. Called from inside the store, sometimes
/// with its index lock held (lock order: index → the observer's own
/// locks): it must be quick, never block and never call back into the
/// store.
pub trait Observer: Send + Sync {
    fn tier_event(&self, event: TierEvent, key: &[u8]);
}
