//! Pins placement across versions.
//!
//! Every server and client computes placement on its own, so two releases
//! that disagree on a single slot's owner send requests to the wrong node
//! (endless `-MOVED`, or misses on data that is there). The numbers below
//! were generated once from this crate and are hard-coded on purpose: if a
//! change to this crate, to `hashring`, to `xxhash-rust` or to the
//! constants makes this test fail, that change is a BREAKING CHANGE TO
//! PLACEMENT. Do not update the numbers to make it pass; keep the old
//! placement, or ship the new one as an explicit, versioned migration.
//! (pingora-ketama pins its ring the same way.)

use strata_ring::{key_slot, points_for, NodeRecord, Ring, SLOTS};

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

/// The fixed reference ring: two equal nodes and one of twice the capacity.
fn reference_ring() -> Ring {
    Ring::new(vec![
        node("node-a", "host-a", 64 * GIB),
        node("node-b", "host-b", 128 * GIB),
        node("node-c", "host-c", 64 * GIB),
    ])
}

#[test]
fn pinned_hash_function() {
    // xxh64 of the empty input with seed 0, from the xxHash specification:
    // catches a hasher swapped or re-seeded underneath the ring.
    assert_eq!(xxhash_rust::xxh64::xxh64(b"", 0), 0xef46_db37_51d8_e999);
}

#[test]
fn pinned_key_slots() {
    assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(key_slot(b"bar"), 5061);
    assert_eq!(key_slot(b"{a}b"), key_slot(b"a"));
}

#[test]
fn pinned_point_weights() {
    assert_eq!(points_for(0, 128 * GIB), 16);
    assert_eq!(points_for(64 * GIB, 128 * GIB), 256);
    assert_eq!(points_for(128 * GIB, 128 * GIB), 512);
    assert_eq!(points_for(u64::MAX, u64::MAX), 512);
}

#[test]
fn pinned_slot_owners() {
    let ring = reference_ring();
    let expected: [(u16, &str); 20] = [
        (0, "node-b"),
        (1, "node-b"),
        (2, "node-b"),
        (100, "node-b"),
        (1000, "node-b"),
        (2047, "node-b"),
        (4096, "node-a"),
        (5061, "node-c"),
        (5460, "node-c"),
        (5461, "node-c"),
        (8191, "node-a"),
        (8192, "node-a"),
        (10000, "node-a"),
        (10922, "node-b"),
        (10923, "node-b"),
        (12182, "node-a"),
        (15000, "node-b"),
        (16000, "node-c"),
        (16382, "node-b"),
        (16383, "node-b"),
    ];
    for (slot, id) in expected {
        assert_eq!(
            ring.owner(slot).map(|n| n.id.as_str()),
            Some(id),
            "slot {slot}"
        );
    }
}

#[test]
fn pinned_slot_map() {
    let ring = reference_ring();
    let map = ring.slot_map();
    let head: Vec<(u16, u16, &str)> = map
        .iter()
        .take(5)
        .map(|r| (r.start, r.end, r.node.id.as_str()))
        .collect();
    assert_eq!(
        head,
        [
            (0, 40, "node-b"),
            (41, 55, "node-c"),
            (56, 58, "node-b"),
            (59, 61, "node-c"),
            (62, 115, "node-b"),
        ]
    );
    assert_eq!(map.len(), 629);
    // Digest of the whole map, one "start end id\n" line per range.
    let text: String = map
        .iter()
        .map(|r| format!("{} {} {}\n", r.start, r.end, r.node.id))
        .collect();
    assert_eq!(
        xxhash_rust::xxh64::xxh64(text.as_bytes(), 0),
        0xacc8_ceae_2415_5f6e
    );
    let count = |id: &str| {
        map.iter()
            .filter(|r| r.node.id == id)
            .map(|r| usize::from(r.end - r.start) + 1)
            .sum::<usize>()
    };
    assert_eq!(
        (count("node-a"), count("node-b"), count("node-c")),
        (4319, 8321, 3744)
    );
}

#[test]
fn pinned_replicas() {
    let ring = reference_ring();
    let ids = |slot| -> Vec<String> {
        ring.replicas(slot, 3)
            .iter()
            .map(|n| n.id.clone())
            .collect()
    };
    assert_eq!(ids(0), ["node-b", "node-c", "node-a"]);
    assert_eq!(ids(12182), ["node-a", "node-b", "node-c"]);
    assert_eq!(ids(16383), ["node-b", "node-c", "node-a"]);
}

#[test]
fn pinned_rebalance() {
    let old = reference_ring();
    let mut nodes = old.nodes().to_vec();
    nodes.push(node("node-d", "host-d", 64 * GIB));
    let moved = Ring::moved_slots(&old, &Ring::new(nodes));
    assert_eq!(moved.len(), 3313);
    assert_eq!(moved[..5], [167, 168, 169, 170, 283]);
}
