//! Store behaviour: writes, conditions, expiry, eviction, pinning, scan and
//! exact accounting.

use std::collections::HashSet;

use bytes::Bytes;
use strata_tiering::{Condition, Expiry, Store, StoreConfig, StoreError, Ttl};

const MIB: u64 = 1 << 20;

fn store(capacity: u64) -> Store {
    Store::new(StoreConfig {
        capacity_bytes: capacity,
        max_value_bytes: capacity,
        high_watermark: 0.95,
        tombstone_ms: 0,
    })
    .unwrap()
}

fn put(s: &Store, key: &str, val: &[u8], now: u64) -> Result<bool, StoreError> {
    put_with(s, key, val, Condition::Always, Expiry::Persist, now)
}

fn put_with(
    s: &Store,
    key: &str,
    val: &[u8],
    cond: Condition,
    exp: Expiry,
    now: u64,
) -> Result<bool, StoreError> {
    let mut r = s.reserve(val.len() as u64)?;
    r.as_mut_slice().copy_from_slice(val);
    Ok(s.commit(Bytes::copy_from_slice(key.as_bytes()), r, cond, exp, now))
}

fn value(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

/// STRATA.META's checksum is summed when asked, over the bytes as stored
/// now: right for every size, for the newest of several writes, and
/// absent for a missing key; the facts alone (`meta`) match.
#[test]
fn the_checksum_is_of_the_bytes_stored_now() {
    let s = store(16 * MIB);
    for (i, len) in [0usize, 1, 4095, 65_536, (3 * MIB) as usize + 12_345]
        .into_iter()
        .enumerate()
    {
        let key = format!("k{i}");
        for version in 0..2 {
            let val = value(i as u64 * 2 + version, len);
            assert!(put(&s, &key, &val, 1).unwrap());
            let (m, sum) = s.meta_summed(key.as_bytes(), 1).unwrap().unwrap();
            assert_eq!(sum, crc32c::crc32c(&val), "{len} bytes, write {version}");
            assert_eq!(m.len, len as u64);
            assert_eq!(Some(m), s.meta(key.as_bytes(), 1));
        }
    }
    assert_eq!(s.meta_summed(b"nope", 1).unwrap(), None);
    // Summing reads nothing into the index's view of use.
    assert_eq!(s.stats().hits, 0);
}

#[test]
fn round_trip_and_meta() {
    let s = store(16 * MIB);
    assert!(put(&s, "k", b"hello", 10).unwrap());
    let v = s.get(b"k", 11).unwrap().unwrap();
    assert_eq!(v.as_slice(), b"hello");
    let m = s.meta(b"k", 11).unwrap();
    assert_eq!(m.len, 5);
    assert_eq!(m.created_ms, 10);
    let (_, sum) = s.meta_summed(b"k", 11).unwrap().unwrap();
    assert_eq!(sum, crc32c::crc32c(b"hello"));
    assert_eq!(m.addr, v.addr());
    assert!(put(&s, "empty", b"", 10).unwrap());
    assert_eq!(s.get(b"empty", 10).unwrap().unwrap().as_slice(), b"");
    assert!(s.get(b"nope", 10).unwrap().is_none());
    let st = s.stats();
    assert_eq!((st.hits, st.misses, st.keys, st.value_bytes), (2, 1, 2, 5));
}

#[test]
fn conditions() {
    let s = store(16 * MIB);
    assert!(!put_with(&s, "k", b"a", Condition::IfPresent, Expiry::Persist, 0).unwrap());
    assert!(s.get(b"k", 0).unwrap().is_none());
    assert!(put_with(&s, "k", b"a", Condition::IfAbsent, Expiry::Persist, 0).unwrap());
    assert!(!put_with(&s, "k", b"b", Condition::IfAbsent, Expiry::Persist, 0).unwrap());
    assert_eq!(s.get(b"k", 0).unwrap().unwrap().as_slice(), b"a");
    assert!(put_with(&s, "k", b"c", Condition::IfPresent, Expiry::Persist, 0).unwrap());
    assert_eq!(s.get(b"k", 0).unwrap().unwrap().as_slice(), b"c");
    // A refused write frees its reservation.
    assert_eq!(s.stats().value_bytes, 1);
}

#[test]
fn expiry_lazy_active_and_keep() {
    let s = store(16 * MIB);
    put_with(&s, "t", b"v", Condition::Always, Expiry::At(100), 0).unwrap();
    assert_eq!(s.ttl(b"t", 40), Ttl::Ms(60));
    put_with(&s, "t", b"w", Condition::Always, Expiry::Keep, 50).unwrap();
    assert_eq!(s.ttl(b"t", 50), Ttl::Ms(50));
    assert!(s.get(b"t", 99).unwrap().is_some());
    assert!(
        s.get(b"t", 100).unwrap().is_none(),
        "expired at its deadline"
    );
    assert_eq!(s.ttl(b"t", 100), Ttl::Missing);

    put_with(&s, "a", b"v", Condition::Always, Expiry::At(10), 0).unwrap();
    put(&s, "p", b"v", 0).unwrap();
    assert_eq!(s.ttl(b"p", 0), Ttl::Persistent);
    assert_eq!(s.expire_some(9, 100), 0);
    assert_eq!(s.expire_some(10, 100), 1);
    assert_eq!(s.len(), 1);
    assert_eq!(s.stats().expired, 2);

    // NX on an expired key succeeds.
    put_with(&s, "n", b"v", Condition::Always, Expiry::At(5), 0).unwrap();
    assert!(put_with(&s, "n", b"x", Condition::IfAbsent, Expiry::Persist, 6).unwrap());

    assert!(s.set_expiry(b"p", Some(1000), 0));
    assert_eq!(s.ttl(b"p", 0), Ttl::Ms(1000));
    assert!(s.set_expiry(b"p", None, 0));
    assert_eq!(s.ttl(b"p", 0), Ttl::Persistent);
    assert!(s.set_expiry(b"p", Some(0), 1), "past expiry deletes");
    assert!(!s.exists(b"p", 1));
    assert!(!s.set_expiry(b"missing", Some(10), 0));
}

#[test]
fn eviction_keeps_accounting_within_capacity() {
    let cap = 8 * MIB;
    let s = store(cap);
    let n = 200u64;
    for i in 0..n {
        put(&s, &format!("k{i}"), &value(i, 100 * 1024), i).unwrap();
        let st = s.stats();
        assert!(st.reserved_bytes <= cap, "{st:?}");
        assert!(st.used_bytes <= st.reserved_bytes);
    }
    let st = s.stats();
    assert!(st.evictions > 0);
    assert_eq!(st.keys + st.evictions, n);
    // The most recent writes survive and are intact; evicted ones are gone.
    for i in (n - 20)..n {
        assert_eq!(
            s.get(format!("k{i}").as_bytes(), n)
                .unwrap()
                .unwrap()
                .as_slice(),
            &value(i, 100 * 1024)[..]
        );
    }
    assert!(s.get(b"k0", n).unwrap().is_none());
    assert_eq!(st.value_bytes, st.keys * 100 * 1024);
}

#[test]
fn lru_order_respects_reads() {
    let s = store(4 * MIB);
    put(&s, "old", &value(1, 512 * 1024), 0).unwrap();
    for i in 0..5 {
        put(&s, &format!("f{i}"), &value(i, 512 * 1024), 0).unwrap();
    }
    // Touch "old" so it is the most recent, then force evictions.
    assert!(s.get(b"old", 0).unwrap().is_some());
    put(&s, "big", &value(9, 1536 * 1024), 0).unwrap();
    assert!(s.exists(b"old", 0));
    assert!(!s.exists(b"f0", 0));
}

#[test]
fn pinned_values_are_never_evicted() {
    let s = store(4 * MIB);
    put(&s, "a", &value(1, 1800 * 1024), 0).unwrap();
    put(&s, "b", &value(2, 1800 * 1024), 0).unwrap();
    let pa = s.get(b"a", 0).unwrap().unwrap();
    let pb = s.get(b"b", 0).unwrap().unwrap();
    match s.reserve(1800 * 1024) {
        Err(StoreError::NoSpace { .. }) => {}
        other => panic!("expected NoSpace, got {other:?}"),
    }
    drop(pb);
    let mut r = s.reserve(1800 * 1024).unwrap();
    r.as_mut_slice().fill(7);
    assert!(s.commit(
        Bytes::from_static(b"c"),
        r,
        Condition::Always,
        Expiry::Persist,
        0
    ));
    assert!(!s.exists(b"b", 0));
    assert_eq!(pa.as_slice(), &value(1, 1800 * 1024)[..]);
}

#[test]
fn overwrite_and_delete_while_read_keep_the_old_bytes() {
    let s = store(16 * MIB);
    put(&s, "k", &value(1, 4096), 0).unwrap();
    let reader = s.get(b"k", 0).unwrap().unwrap();
    let before = s.stats().used_bytes;
    put(&s, "k", &value(2, 4096), 0).unwrap();
    assert!(s.delete(b"k", 0) || !s.exists(b"k", 0));
    assert_eq!(reader.as_slice(), &value(1, 4096)[..]);
    assert!(s.stats().used_bytes >= before, "still held by the reader");
    drop(reader);
    assert_eq!(s.stats().used_bytes, 0);
    assert_eq!(s.stats().value_bytes, 0);
}

#[test]
fn dropped_reservation_leaves_nothing() {
    let s = store(16 * MIB);
    let r = s.reserve(MIB).unwrap();
    assert!(s.stats().used_bytes >= MIB);
    drop(r);
    let st = s.stats();
    assert_eq!((st.used_bytes, st.reserved_bytes, st.keys), (0, 0, 0));
}

#[test]
fn too_large_is_refused_before_allocation() {
    let s = Store::new(StoreConfig {
        capacity_bytes: 8 * MIB,
        max_value_bytes: MIB,
        high_watermark: 0.95,
        tombstone_ms: 0,
    })
    .unwrap();
    assert_eq!(
        s.reserve(MIB + 1).unwrap_err(),
        StoreError::TooLarge {
            len: MIB + 1,
            max: MIB
        }
    );
    assert!(s.check_len(MIB).is_ok());
    assert_eq!(s.stats().reserved_bytes, 0);
}

#[test]
fn scan_returns_every_stable_key_once() {
    let s = store(64 * MIB);
    let keys: HashSet<String> = (0..1000).map(|i| format!("key:{i}")).collect();
    for k in &keys {
        put(&s, k, b"v", 0).unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = 0;
    let mut steps = 0;
    loop {
        let (next, batch) = s.scan(cursor, 7, 0, |_| true);
        // Churn during the scan: keys added and removed must not disturb
        // the keys present throughout.
        put(&s, &format!("churn:{steps}"), b"v", 0).unwrap();
        s.delete(format!("churn:{}", steps.max(1) - 1).as_bytes(), 0);
        seen.extend(
            batch
                .into_iter()
                .map(|b| String::from_utf8(b.to_vec()).unwrap()),
        );
        steps += 1;
        if next == 0 {
            break;
        }
        assert!(next < (1 << 63));
        cursor = next;
    }
    let got: HashSet<String> = seen
        .iter()
        .filter(|k| k.starts_with("key:"))
        .cloned()
        .collect();
    assert_eq!(got, keys);
    let dupes = seen.len() - seen.iter().collect::<HashSet<_>>().len();
    assert_eq!(dupes, 0);
    assert!(steps > 100, "COUNT bounds the work per call");
    let (_, only) = s.scan(0, 10_000, 0, |k| k == b"key:7");
    assert_eq!(only, vec![Bytes::from_static(b"key:7")]);
}

#[test]
fn flush_frees_everything() {
    let s = store(16 * MIB);
    for i in 0..100 {
        put(&s, &format!("k{i}"), &value(i, 10_000), 0).unwrap();
    }
    s.flush(0);
    let st = s.stats();
    assert_eq!(
        (st.keys, st.used_bytes, st.reserved_bytes, st.value_bytes),
        (0, 0, 0, 0)
    );
}

#[test]
fn commit_all_is_atomic_and_replaces() {
    let s = store(16 * MIB);
    put(&s, "a", b"old", 0).unwrap();
    let items = ["a", "b"]
        .iter()
        .map(|k| {
            let mut r = s.reserve(3).unwrap();
            r.as_mut_slice().copy_from_slice(b"new");
            (Bytes::copy_from_slice(k.as_bytes()), r)
        })
        .collect();
    s.commit_all(items, 0);
    assert_eq!(s.get(b"a", 0).unwrap().unwrap().as_slice(), b"new");
    assert_eq!(s.get(b"b", 0).unwrap().unwrap().as_slice(), b"new");
    assert_eq!(s.stats().value_bytes, 6);
}

#[test]
fn tombstones_refuse_older_copies_of_deleted_keys() {
    let s = Store::new(StoreConfig {
        capacity_bytes: 16 * MIB,
        max_value_bytes: MIB,
        high_watermark: 0.95,
        tombstone_ms: 60_000,
    })
    .unwrap();
    let copy = |s: &Store, version: u64, now: u64| {
        let mut r = s.reserve(3).unwrap();
        r.as_mut_slice().copy_from_slice(b"old");
        s.commit_copy(Bytes::from_static(b"k"), r, version, None, now)
    };
    // A key deleted at t=1000 (even one this node never held)...
    assert!(!s.delete(b"k", 1000));
    // ...refuses a copy written before the delete, and reports the
    // delete's version so senders skip the transfer.
    assert!(!copy(&s, 999 << 20, 1001));
    assert!(!s.exists(b"k", 1001));
    assert!(s.version_of(b"k", 1001).unwrap() > (1000 << 20));
    // A copy written after the delete is accepted.
    assert!(copy(&s, 1002 << 20, 1003));
    assert!(s.exists(b"k", 1003));
    // A local write clears the tombstone.
    s.delete(b"k", 2000);
    put(&s, "k", b"new", 2001).unwrap();
    assert_eq!(s.get(b"k", 2001).unwrap().unwrap().as_slice(), b"new");
    // Tombstones are forgotten after tombstone_ms.
    s.delete(b"k", 3000);
    s.delete(b"other", 70_000);
    assert!(copy(&s, 3001 << 20, 70_001));
}
