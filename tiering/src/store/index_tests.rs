//! The index under a long random mix of operations, against a model: every
//! read, TTL, SCAN and count agrees with it, and the index's own orders
//! stay consistent (checked walk by walk).

use std::collections::HashMap;

use bytes::Bytes;

use super::{Condition, Expiry, Store, StoreConfig, Ttl};

const MIB: u64 = 1 << 20;

/// xorshift64*: deterministic, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Short keys stay inline in their node, long ones go to the heap.
fn key(i: u64) -> Bytes {
    if i.is_multiple_of(3) {
        Bytes::from(format!("a-long-key-that-does-not-fit-inline/{i:08}"))
    } else {
        Bytes::from(format!("k{i}"))
    }
}

/// A store roomy enough that nothing is evicted.
fn store() -> Store {
    Store::new(StoreConfig {
        capacity_bytes: 64 * MIB,
        max_value_bytes: MIB,
        high_watermark: 1.0,
        tombstone_ms: 0,
    })
    .unwrap()
}

fn put(s: &Store, k: &Bytes, tag: u8, expiry: Expiry, now: u64) {
    let mut r = s.reserve(1 + tag as u64 % 40).unwrap();
    r.as_mut_slice().fill(tag);
    assert!(s.commit(k.clone(), r, Condition::Always, expiry, now));
}

#[test]
fn random_operations_agree_with_a_model() {
    let s = store();
    let mut rng = Rng(0x5eed);
    // key → (fill byte, expire_at_ms)
    let mut model: HashMap<Bytes, (u8, Option<u64>)> = HashMap::new();
    let mut now = 1_000u64;
    for step in 0..30_000u64 {
        let k = key(rng.below(2_000));
        let live = |m: &HashMap<Bytes, (u8, Option<u64>)>, now: u64| {
            m.get(&k)
                .filter(|(_, at)| at.is_none_or(|at| at > now))
                .copied()
        };
        match rng.below(10) {
            0..=3 => {
                let tag = rng.below(250) as u8 + 1;
                let at = (rng.below(4) == 0).then(|| now + 1 + rng.below(50));
                put(&s, &k, tag, at.map_or(Expiry::Persist, Expiry::At), now);
                model.insert(k.clone(), (tag, at));
            }
            4..=6 => {
                let got = s.get(&k, now).unwrap().map(|v| v.as_slice()[0]);
                assert_eq!(got, live(&model, now).map(|(t, _)| t), "step {step}");
            }
            7 => {
                assert_eq!(
                    s.delete(&k, now),
                    live(&model, now).is_some(),
                    "step {step}"
                );
                model.remove(&k);
            }
            8 => {
                let at = (rng.below(2) == 0).then(|| now + 1 + rng.below(50));
                let present = live(&model, now).is_some();
                assert_eq!(s.set_expiry(&k, at, now), present, "step {step}");
                if present {
                    model.get_mut(&k).unwrap().1 = at;
                }
                let want = match live(&model, now) {
                    None => Ttl::Missing,
                    Some((_, None)) => Ttl::Persistent,
                    Some((_, Some(at))) => Ttl::Ms(at - now),
                };
                assert_eq!(s.ttl(&k, now), want, "step {step}");
            }
            _ => {
                now += rng.below(5);
                s.expire_some(now, 64);
            }
        }
        model.retain(|k, (_, at)| at.is_none_or(|at| at > now) || s.index.lock().contains(k));
        if step % 1_000 == 0 {
            s.index.lock().check_invariants();
            let mut scanned = Vec::new();
            let mut cursor = 0;
            loop {
                let (next, keys) = s.scan(cursor, 37, now, |_| true);
                scanned.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            scanned.sort();
            let mut want: Vec<Bytes> = model
                .iter()
                .filter(|(_, (_, at))| at.is_none_or(|at| at > now))
                .map(|(k, _)| k.clone())
                .collect();
            want.sort();
            assert_eq!(
                scanned, want,
                "step {step}: a full SCAN lists every live key once"
            );
        }
    }
    s.index.lock().check_invariants();
    s.flush(now);
    assert_eq!(s.len(), 0);
    s.index.lock().check_invariants();
}

#[test]
fn eviction_takes_the_least_recently_used_first() {
    let s = store();
    for i in 0..100 {
        put(&s, &key(i), 1, Expiry::Persist, 0);
    }
    // Reading a key moves it to the newest end.
    for i in [5, 0, 42] {
        assert!(s.get(&key(i), 0).unwrap().is_some());
    }
    let order = s.index.lock().oldest_unpinned_keys(super::Tier::Dram, 100);
    let want: Vec<Bytes> = (0..100)
        .filter(|i| ![5, 0, 42].contains(i))
        .chain([5, 0, 42])
        .map(key)
        .collect();
    assert_eq!(order, want);
    // A value being read is skipped, and comes back once let go.
    let pinned = s.get(&key(1), 0).unwrap().unwrap();
    let order = s.index.lock().oldest_unpinned_keys(super::Tier::Dram, 2);
    assert_eq!(order, vec![key(2), key(3)]);
    drop(pinned);
    s.index.lock().check_invariants();
}

#[test]
fn a_scan_across_table_growth_lists_every_key_present_throughout_once() {
    let s = store();
    let steady: Vec<Bytes> = (0..500).map(key).collect();
    for k in &steady {
        put(&s, k, 1, Expiry::Persist, 0);
    }
    let mut seen: HashMap<Bytes, u32> = HashMap::new();
    let (mut cursor, mut added) = (0, 1_000_000u64);
    loop {
        let (next, keys) = s.scan(cursor, 10, 0, |_| true);
        for k in keys {
            *seen.entry(k).or_default() += 1;
        }
        if next == 0 {
            break;
        }
        cursor = next;
        // Between steps the table grows (and keys come and go) under the cursor.
        for _ in 0..50 {
            put(&s, &key(added), 2, Expiry::Persist, 0);
            if added % 4 == 0 {
                s.delete(&key(added - 2), 0);
            }
            added += 1;
        }
    }
    s.index.lock().check_invariants();
    assert!(s.len() > 2_000, "the table grew a lot meanwhile");
    for k in &steady {
        assert_eq!(seen.get(k), Some(&1), "{k:?} listed exactly once");
    }
    assert!(seen.values().all(|&n| n == 1), "no key listed twice");
}
