//! Capacity-weighted consistent-hash placement of hash slots onto nodes.
//!
//! Every node and client builds its own `Ring` from the same membership and
//! must get the same answer, so placement is a pure function of the node
//! records: the virtual points are hashed with a pinned hash (xxh64, seed 0)
//! over a documented byte encoding, never with `std`'s randomly keyed or
//! unspecified hashers. A `Ring` is an immutable snapshot; a membership change
//! builds a new one and `moved_slots` says what has to move. This module does
//! no I/O, reads no clock and never panics on any slot number.
//!
//! Virtual point `i` of node `id` sits at `xxh64(id ‖ 0xFF ‖ i as u32 LE, 0)`
//! on the 64-bit ring; 0xFF never occurs in UTF-8, so no two (id, i) pairs
//! share an encoding. Slot `s` is not hashed again (the slot already is a
//! hash of the key): it sits at `s << 50`, so the 16384 slots lie in order on
//! equal arcs, and belongs to the first point at or after that position
//! (wrapping). Laying slots in order keeps each node's slots in runs, so
//! `CLUSTER SLOTS` lists at most one range per point (629 for the 3-node
//! reference ring) rather than one for nearly every slot (~10k when slots
//! are hashed), and a node's share of slots is its share of the ring. Changing any of
//! this is a breaking change to placement: see `tests/backwards_compat.rs`.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};

use hashring::HashRing;
use xxhash_rust::xxh64::Xxh64;

use crate::node::NodeRecord;
use crate::slot::{key_slot, SLOTS};

/// Floor on virtual points per node: a node 32× smaller than the largest
/// still gets a fair share, and a misreported tiny or zero capacity cannot
/// starve a member out of the ring.
pub const MIN_POINTS: u64 = 16;

/// Virtual points of the largest node; the others get points in proportion
/// to their capacity relative to it. A node's share of slots varies by about
/// `1/sqrt(points)` (4% at 512). It also bounds `CLUSTER SLOTS` (about one
/// range per point) and the ring's build time.
///
/// Weights are relative to the largest member so that they stay
/// proportional at any scale (64 MiB test nodes and 1 TiB servers alike).
/// Point `i` of a node always sits at the same position, so a change of
/// weight adds or removes a node's last points: only the slots of those
/// points move. A node joining or leaving with less capacity than the
/// largest changes no one else's points.
pub const MAX_POINTS: u64 = 512;

/// Seed of the pinned xxh64 hash: fixed forever, see the module header.
const HASH_SEED: u64 = 0;

/// Slot `s` sits at ring position `s << SLOT_SHIFT`: 2^64 / SLOTS apart.
const SLOT_SHIFT: u32 = u64::BITS - SLOTS.trailing_zeros();
const _: () = assert!(SLOTS.is_power_of_two(), "slots must tile the ring exactly");

/// Separator between node id and point number in a point's name. It never
/// occurs in UTF-8, so the first 0xFF always ends the id and two different
/// (id, point) pairs never share a name.
const POINT_NAME_SEPARATOR: u8 = 0xFF;

/// Number of virtual points a node of `capacity_bytes` gets.
pub fn points_for(capacity_bytes: u64, largest_bytes: u64) -> u64 {
    if largest_bytes == 0 {
        return MAX_POINTS;
    }
    let scaled = (u128::from(capacity_bytes) * u128::from(MAX_POINTS)
        + u128::from(largest_bytes) / 2)
        / u128::from(largest_bytes);
    (scaled.min(u128::from(MAX_POINTS)) as u64).max(MIN_POINTS)
}

/// One virtual point as handed to `hashring`. Its `Hash` writes exactly the
/// documented name bytes with one `write`, so the position does not depend
/// on `std`'s encodings of integers (native endian) or slices (length prefix
/// of platform width).
#[derive(Clone, Debug)]
struct Point {
    /// Index into `Ring::nodes`.
    node: usize,
    /// Index of this point among all points, in build order; lets a point
    /// returned by `hashring` be mapped back to its clockwise position.
    flat: usize,
    /// `id ‖ 0xFF ‖ i as u32 LE`.
    name: Box<[u8]>,
}

impl Hash for Point {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.name);
    }
}

/// The lookup key of a slot: its fixed ring position (see module header).
struct SlotKey(u16);

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from(self.0) << SLOT_SHIFT);
    }
}

/// The pinned hasher plugged into `hashring`: bytes given to `write` are
/// hashed with xxh64 (seed `HASH_SEED`), a spec'd hash with published test
/// vectors, so positions are the same in every process, platform and
/// release; a `write_u64` is taken as an exact ring position instead, which
/// is how slots are placed without being hashed. Only `Point` and `SlotKey`
/// are ever hashed with it.
#[derive(Clone, Copy, Debug, Default)]
struct PlacementHash;

impl BuildHasher for PlacementHash {
    type Hasher = PlacementHasher;

    fn build_hasher(&self) -> PlacementHasher {
        PlacementHasher {
            xxh: Xxh64::new(HASH_SEED),
            position: None,
        }
    }
}

struct PlacementHasher {
    xxh: Xxh64,
    position: Option<u64>,
}

impl Hasher for PlacementHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.xxh.update(bytes);
    }

    fn write_u64(&mut self, position: u64) {
        self.position = Some(position);
    }

    fn finish(&self) -> u64 {
        self.position.unwrap_or_else(|| self.xxh.digest())
    }
}

/// A run of consecutive slots with one owner, as `CLUSTER SLOTS` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRange<'a> {
    /// First slot of the run.
    pub start: u16,
    /// Last slot of the run, inclusive (Redis' convention).
    pub end: u16,
    /// Owner of every slot in `start..=end`.
    pub node: &'a NodeRecord,
}

/// Immutable placement snapshot for one membership.
#[derive(Clone, Default)]
pub struct Ring {
    /// Members sorted by id, ids unique: the order is canonical so the ring
    /// does not depend on the order records were read from etcd.
    nodes: Vec<NodeRecord>,
    /// Owning node index of each virtual point, in clockwise ring order.
    clockwise: Vec<usize>,
    /// For each slot, the index in `clockwise` of the point that owns it.
    /// Slots are finite, so every lookup is resolved once at build time.
    /// Empty when the ring has no nodes.
    slot_points: Vec<usize>,
    /// Distinct hosts among `nodes`: [`Ring::replicas`] stops its lap over
    /// the points for new hosts once it has one node of each.
    hosts: usize,
}

impl Ring {
    /// Builds the ring for `nodes`. Input order does not matter; of several
    /// records with the same id, the first one given is kept.
    pub fn new(mut nodes: Vec<NodeRecord>) -> Ring {
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        // `dedup_by` drops the later duplicate; the sort is stable, so the
        // first record given for an id is the one kept.
        nodes.dedup_by(|later, earlier| later.id == earlier.id);
        if nodes.is_empty() {
            return Ring::default();
        }

        let (clockwise, slot_points) = place(&nodes);
        let hosts = distinct_hosts(&nodes);
        Ring {
            nodes,
            clockwise,
            slot_points,
            hosts,
        }
    }

    /// The standalone ring: one node owning every slot.
    pub fn single(node: NodeRecord) -> Ring {
        Ring::new(vec![node])
    }

    /// Number of member nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no members: every lookup answers `None`.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Members, sorted by id.
    pub fn nodes(&self) -> &[NodeRecord] {
        &self.nodes
    }

    /// Owner of `slot`; `None` on an empty ring or for `slot >= SLOTS` (slot
    /// numbers come from clients, so a bad one is an answer, not a panic).
    pub fn owner(&self, slot: u16) -> Option<&NodeRecord> {
        let point = *self.slot_points.get(usize::from(slot))?;
        Some(&self.nodes[self.clockwise[point]])
    }

    /// Owner of the slot of `key`.
    pub fn owner_of_key(&self, key: &[u8]) -> Option<&NodeRecord> {
        self.owner(key_slot(key))
    }

    /// Up to `n` nodes to hold `slot`, `n` counting the owner: the owner
    /// first, then the next nodes clockwise whose `host` differs from every
    /// node already chosen; when there are fewer hosts than `n`, the next
    /// nodes clockwise not yet chosen (copies on distinct nodes of a shared
    /// host still survive the loss of one node). Fewer than `n` only when
    /// the ring has fewer nodes.
    pub fn replicas(&self, slot: u16, n: usize) -> Vec<&NodeRecord> {
        let Some(&start) = self.slot_points.get(usize::from(slot)) else {
            return Vec::new();
        };
        let want = n.min(self.nodes.len());
        let mut chosen: Vec<&NodeRecord> = Vec::with_capacity(want);
        let lap = || {
            (0..self.clockwise.len())
                .map(|step| &self.nodes[self.clockwise[(start + step) % self.clockwise.len()]])
        };
        // Hosts first: one lap at most, after that no new host can appear,
        // and none once every host has a node chosen (on a ring of one host
        // that is at once, not after a lap over every point of every slot).
        let by_host = want.min(self.hosts);
        for node in lap() {
            if chosen.len() == by_host {
                break;
            }
            if chosen.iter().all(|c| c.host != node.host) {
                chosen.push(node);
            }
        }
        // Then nodes: a second lap over the ones not chosen yet.
        for node in lap() {
            if chosen.len() == want {
                break;
            }
            if chosen.iter().all(|c| c.id != node.id) {
                chosen.push(node);
            }
        }
        chosen
    }

    /// How many distinct hosts (failure domains) the ring spans.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// All slots as maximal runs with one owner, in slot order, covering
    /// `0..SLOTS` exactly once; empty for an empty ring.
    pub fn slot_map(&self) -> Vec<SlotRange<'_>> {
        let mut ranges: Vec<SlotRange<'_>> = Vec::new();
        for slot in 0..SLOTS {
            let Some(node) = self.owner(slot) else {
                break;
            };
            match ranges.last_mut() {
                Some(last) if last.node.id == node.id => last.end = slot,
                _ => ranges.push(SlotRange {
                    start: slot,
                    end: slot,
                    node,
                }),
            }
        }
        ranges
    }

    /// Slots whose owner (by id) differs between `old` and `new`, ascending.
    /// A slot gained from or lost to an empty ring counts as moved.
    pub fn moved_slots(old: &Ring, new: &Ring) -> Vec<u16> {
        (0..SLOTS)
            .filter(|&slot| old.owner(slot).map(|n| &n.id) != new.owner(slot).map(|n| &n.id))
            .collect()
    }
}

fn distinct_hosts(nodes: &[NodeRecord]) -> usize {
    let mut hosts: Vec<&str> = nodes.iter().map(|n| n.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts.len()
}

/// Kept short: a ring holds tens of thousands of entries nobody wants in a log.
impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| &n.id).collect::<Vec<_>>(),
            )
            .field("points", &self.clockwise.len())
            .finish()
    }
}

/// Puts the virtual points of `nodes` on a `hashring` and resolves every
/// slot: returns the clockwise node index of each point, and for each slot
/// the clockwise index of the point that owns it.
fn place(nodes: &[NodeRecord]) -> (Vec<usize>, Vec<usize>) {
    let points = virtual_points(nodes);
    let point_count = points.len();
    let mut ring = HashRing::with_hasher(PlacementHash);
    ring.batch_add(points);

    // `get_with_replicas` with more replicas than points yields every
    // point exactly once, clockwise: the only ordered walk `hashring`
    // exposes under a custom hasher.
    let ordered = ring
        .get_with_replicas(&SlotKey(0), usize::MAX)
        .unwrap_or_default();
    assert_eq!(
        ordered.len(),
        point_count,
        "ring walk must visit every point once"
    );
    let mut position = vec![0; point_count];
    let mut clockwise = Vec::with_capacity(point_count);
    for (i, point) in ordered.iter().enumerate() {
        position[point.flat] = i;
        clockwise.push(point.node);
    }

    let slot_points = (0..SLOTS)
        .map(|slot| {
            ring.get(&SlotKey(slot))
                .map_or(0, |point| position[point.flat])
        })
        .collect();
    (clockwise, slot_points)
}

/// Every virtual point of `nodes` (sorted, unique ids), numbered flat.
fn virtual_points(nodes: &[NodeRecord]) -> Vec<Point> {
    let mut points = Vec::new();
    let largest = nodes.iter().map(|n| n.capacity_bytes).max().unwrap_or(0);
    for (node, record) in nodes.iter().enumerate() {
        // points_for() <= MAX_POINTS, far below u32::MAX.
        for i in 0..points_for(record.capacity_bytes, largest) as u32 {
            let mut name = Vec::with_capacity(record.id.len() + 5);
            name.extend_from_slice(record.id.as_bytes());
            name.push(POINT_NAME_SEPARATOR);
            name.extend_from_slice(&i.to_le_bytes());
            points.push(Point {
                node,
                flat: points.len(),
                name: name.into_boxed_slice(),
            });
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn node(id: &str, host: &str, capacity_bytes: u64) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            resp_addr: format!("{id}:6379"),
            data_addr: format!("{id}:7000"),
            host: host.into(),
            capacity_bytes,
            tiers: Vec::new(),
            incarnation: 0,
            process: None,
        }
    }

    fn owned_by(ring: &Ring, id: &str) -> usize {
        (0..SLOTS)
            .filter(|&s| ring.owner(s).map(|n| n.id.as_str()) == Some(id))
            .count()
    }

    fn equal_nodes(count: usize) -> Vec<NodeRecord> {
        (0..count)
            .map(|i| node(&format!("node-{i}"), &format!("host-{i}"), 100 * GIB))
            .collect()
    }

    #[test]
    fn points_are_weighted_and_clamped() {
        assert_eq!(points_for(0, 100 * GIB), MIN_POINTS);
        assert_eq!(points_for(100 * GIB, 200 * GIB), 256);
        assert_eq!(points_for(200 * GIB, 200 * GIB), MAX_POINTS);
        // Proportional at any scale: 64 MiB vs 128 MiB as 64 GiB vs 128 GiB.
        assert_eq!(points_for(64 << 20, 128 << 20), 256);
        assert_eq!(points_for(1, u64::MAX), MIN_POINTS);
        assert_eq!(points_for(u64::MAX, u64::MAX), MAX_POINTS);
        assert_eq!(points_for(5, 0), MAX_POINTS);
    }

    #[test]
    fn empty_ring_answers_none() {
        let ring = Ring::new(Vec::new());
        assert!(ring.is_empty());
        assert_eq!(ring.len(), 0);
        assert_eq!(ring.owner(0), None);
        assert_eq!(ring.owner_of_key(b"foo"), None);
        assert!(ring.replicas(0, 3).is_empty());
        assert!(ring.slot_map().is_empty());
    }

    #[test]
    fn single_node_owns_everything() {
        let ring = Ring::single(node("solo", "h", 0));
        assert_eq!(ring.len(), 1);
        let map = ring.slot_map();
        assert_eq!(map.len(), 1);
        assert_eq!((map[0].start, map[0].end), (0, SLOTS - 1));
        assert_eq!(map[0].node.id, "solo");
        assert_eq!(ring.replicas(123, 3).len(), 1);
    }

    #[test]
    fn out_of_range_slot_is_none() {
        let ring = Ring::new(equal_nodes(3));
        assert_eq!(ring.owner(SLOTS), None);
        assert_eq!(ring.owner(u16::MAX), None);
        assert!(ring.replicas(SLOTS, 2).is_empty());
    }

    #[test]
    fn input_order_and_duplicates_do_not_matter() {
        let nodes = equal_nodes(4);
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        shuffled.push(node("node-1", "elsewhere", 1));
        let a = Ring::new(nodes);
        let b = Ring::new(shuffled);
        assert_eq!(b.len(), 4);
        assert!(Ring::moved_slots(&a, &b).is_empty());
        // The first record given for a duplicated id wins.
        assert_eq!(b.nodes()[1].host, "host-1");
    }

    #[test]
    fn capacity_weighting() {
        let ring = Ring::new(vec![
            node("small-a", "h1", 100 * GIB),
            node("big", "h2", 200 * GIB),
            node("small-b", "h3", 100 * GIB),
        ]);
        let big = owned_by(&ring, "big") as f64;
        let small = (owned_by(&ring, "small-a") + owned_by(&ring, "small-b")) as f64 / 2.0;
        let ratio = big / small;
        assert!((1.7..=2.3).contains(&ratio), "big/small = {ratio}");
    }

    #[test]
    fn equal_nodes_share_evenly() {
        let ring = Ring::new(equal_nodes(4));
        for i in 0..4 {
            let share = owned_by(&ring, &format!("node-{i}")) as f64 / f64::from(SLOTS);
            assert!((0.2..=0.3).contains(&share), "node-{i}: {share}");
        }
    }

    #[test]
    fn adding_a_node_moves_only_its_new_slots() {
        let old = Ring::new(equal_nodes(3));
        let new = Ring::new(equal_nodes(4));
        let moved = Ring::moved_slots(&old, &new);
        // Only slots the newcomer took move; nothing shuffles between old members.
        for &slot in &moved {
            assert_eq!(new.owner(slot).map(|n| n.id.as_str()), Some("node-3"));
        }
        assert_eq!(moved.len(), owned_by(&new, "node-3"));
        let share = moved.len() as f64 / f64::from(SLOTS);
        assert!((0.18..=0.32).contains(&share), "moved share {share}");
    }

    #[test]
    fn removing_a_node_moves_only_its_slots() {
        let old = Ring::new(equal_nodes(4));
        let mut nodes = equal_nodes(4);
        nodes.remove(2);
        let new = Ring::new(nodes);
        let moved = Ring::moved_slots(&old, &new);
        let had: Vec<u16> = (0..SLOTS)
            .filter(|&s| old.owner(s).map(|n| n.id.as_str()) == Some("node-2"))
            .collect();
        assert_eq!(moved, had);
    }

    #[test]
    fn moved_slots_against_empty_ring_is_everything() {
        let ring = Ring::new(equal_nodes(2));
        assert_eq!(
            Ring::moved_slots(&Ring::default(), &ring).len(),
            usize::from(SLOTS)
        );
        assert_eq!(
            Ring::moved_slots(&ring, &Ring::default()).len(),
            usize::from(SLOTS)
        );
    }

    #[test]
    fn replicas_are_on_distinct_hosts() {
        // Two nodes per host: a naive "next n nodes" would double up hosts.
        let nodes: Vec<NodeRecord> = (0..6)
            .map(|i| node(&format!("n{i}"), &format!("host-{}", i / 2), 100 * GIB))
            .collect();
        let ring = Ring::new(nodes);
        for slot in (0..SLOTS).step_by(97) {
            let replicas = ring.replicas(slot, 3);
            assert_eq!(replicas.len(), 3);
            assert_eq!(Some(replicas[0]), ring.owner(slot));
            let mut hosts: Vec<&str> = replicas.iter().map(|n| n.host.as_str()).collect();
            hosts.sort_unstable();
            hosts.dedup();
            assert_eq!(hosts.len(), 3, "slot {slot}: {replicas:?}");
            // Only three hosts exist: past three, copies go to distinct
            // nodes sharing a host, never twice to one node.
            let five = ring.replicas(slot, 5);
            assert_eq!(five.len(), 5);
            assert_eq!(&five[..3], &replicas[..]);
            let mut ids: Vec<&str> = five.iter().map(|n| n.id.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 5);
            assert_eq!(ring.replicas(slot, 9).len(), 6);
            assert!(ring.replicas(slot, 0).is_empty());
        }
    }

    #[test]
    fn nodes_sharing_one_host_still_get_every_copy() {
        // Several nodes on one machine with the default host name.
        let nodes: Vec<NodeRecord> = (0..3)
            .map(|i| node(&format!("n{i}"), "same-host", 100 * GIB))
            .collect();
        let ring = Ring::new(nodes);
        assert_eq!(ring.hosts(), 1);
        for slot in (0..SLOTS).step_by(89) {
            let two = ring.replicas(slot, 2);
            assert_eq!(two.len(), 2, "slot {slot}");
            assert_eq!(Some(two[0]), ring.owner(slot));
            assert_ne!(two[0].id, two[1].id);
        }
    }

    /// The placement rule spelled out the slow way: a full lap for new
    /// hosts, then one for new nodes.
    fn replicas_by_full_laps(ring: &Ring, slot: u16, n: usize) -> Vec<String> {
        let start = ring.slot_points[usize::from(slot)];
        let lap: Vec<&NodeRecord> = (0..ring.clockwise.len())
            .map(|step| &ring.nodes[ring.clockwise[(start + step) % ring.clockwise.len()]])
            .collect();
        let mut chosen: Vec<&NodeRecord> = Vec::new();
        for node in &lap {
            if chosen.len() < n && chosen.iter().all(|c| c.host != node.host) {
                chosen.push(node);
            }
        }
        for node in &lap {
            if chosen.len() < n && chosen.iter().all(|c| c.id != node.id) {
                chosen.push(node);
            }
        }
        chosen.iter().map(|c| c.id.clone()).collect()
    }

    #[test]
    fn stopping_the_host_lap_early_places_as_the_full_laps_do() {
        // One host; hosts of one, two and three nodes; every node its own.
        let layouts: [&[usize]; 3] = [&[0, 0, 0], &[0, 1, 1, 2, 2, 2], &[0, 1, 2, 3]];
        for hosts in layouts {
            let nodes: Vec<NodeRecord> = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| node(&format!("n{i}"), &format!("host-{h}"), (i as u64 + 1) * GIB))
                .collect();
            let ring = Ring::new(nodes);
            for slot in (0..SLOTS).step_by(61) {
                for n in 1..=hosts.len() + 1 {
                    let got: Vec<String> = ring
                        .replicas(slot, n)
                        .iter()
                        .map(|c| c.id.clone())
                        .collect();
                    assert_eq!(
                        got,
                        replicas_by_full_laps(&ring, slot, n),
                        "{hosts:?} slot {slot} n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn slot_map_is_contiguous_and_matches_owner() {
        let ring = Ring::new(equal_nodes(3));
        let map = ring.slot_map();
        let mut next = 0u32;
        for (i, range) in map.iter().enumerate() {
            assert_eq!(u32::from(range.start), next);
            assert!(range.start <= range.end);
            if i > 0 {
                assert_ne!(map[i - 1].node.id, range.node.id, "runs must be maximal");
            }
            for slot in range.start..=range.end {
                assert_eq!(ring.owner(slot), Some(range.node));
            }
            next = u32::from(range.end) + 1;
        }
        assert_eq!(next, u32::from(SLOTS));
    }

    #[test]
    fn keys_of_one_slot_share_an_owner() {
        let ring = Ring::new(equal_nodes(5));
        assert_eq!(
            ring.owner_of_key(b"{user1000}.following"),
            ring.owner_of_key(b"{user1000}.followers")
        );
        assert_eq!(ring.owner_of_key(b"foo"), ring.owner(12182));
    }
}
