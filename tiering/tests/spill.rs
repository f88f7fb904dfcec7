//! DRAM over NVMe against real files: a working set four times DRAM stays
//! readable byte for byte, writes and deletes are never undone by a lower
//! copy, expiry and FLUSHALL hold below DRAM, copies survive a reopen, and
//! injected I/O faults are reported without wrong bytes or DRAM damage.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_tiering::nvme::faulty::{Faults, Faulty};
use strata_tiering::nvme::{Backend, FoyerBackend, NvmeConfig, NvmeTier};
use strata_tiering::spill::{PromoteError, Spill, SpillConfig, HEADER_BYTES};
use strata_tiering::{Condition, Expiry, Store, StoreConfig};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const MAX_VALUE: u64 = 256 * KIB;
const NOW: u64 = 1_000_000;

fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn key(i: u64) -> Bytes {
    Bytes::from(format!("block/{i:05}"))
}

fn store(dram: u64) -> Store {
    Store::new(StoreConfig {
        capacity_bytes: dram,
        max_value_bytes: MAX_VALUE,
        high_watermark: 0.9,
        tombstone_ms: 0,
    })
    .unwrap()
}

async fn open_tier(dir: &Path, capacity: u64) -> FoyerBackend {
    FoyerBackend::open(&NvmeConfig::new(dir, capacity, MAX_VALUE + HEADER_BYTES))
        .await
        .unwrap()
}

/// A 32 MiB tier in `dir`, recovering what it holds.
async fn reopen(dir: &Path) -> NvmeTier<FoyerBackend> {
    NvmeTier::with_backend(open_tier(dir, 32 * MIB).await, MAX_VALUE + HEADER_BYTES)
}

fn attach<B: Backend>(store: &Store, tier: NvmeTier<B>, dir: Option<&Path>) -> Arc<Spill<B>> {
    let spill = Spill::start(tier, SpillConfig::default(), dir.map(Path::to_path_buf));
    assert!(store.attach_lower(spill.clone()));
    spill
}

async fn set(store: &Store, spill: &Spill<impl Backend>, i: u64, len: usize, expiry: Expiry) {
    spill.wait_for_room(Duration::from_secs(10)).await;
    let mut res = store.reserve(len as u64).unwrap();
    res.as_mut_slice().copy_from_slice(&value(i, len));
    assert!(store.commit(key(i), res, Condition::Always, expiry, NOW));
}

/// The value of `i` from DRAM, promoting it first if it is below.
async fn read(store: &Store, spill: &Spill<impl Backend>, i: u64) -> Option<Vec<u8>> {
    if store.get(&key(i), NOW).unwrap().is_none() && spill.contains(&key(i)) {
        spill.promote(store, &key(i), NOW).await.unwrap();
    }
    store
        .get(&key(i), NOW)
        .unwrap()
        .map(|v| v.as_slice().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_set_four_times_dram_reads_back_exact() {
    let dir = tempfile::tempdir().unwrap();
    let dram = 8 * MIB;
    let store = store(dram);
    let tier = NvmeTier::with_backend(
        open_tier(dir.path(), 64 * MIB).await,
        MAX_VALUE + HEADER_BYTES,
    );
    let spill = attach(&store, tier, Some(dir.path()));
    let len = 200 * KIB as usize;
    let n = (4 * dram) / len as u64;
    for i in 0..n {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    let s = spill.stats();
    assert!(
        s.spilled > 0 && s.dropped == 0 && s.write_errors == 0,
        "{s:?}"
    );
    assert_eq!(s.queued_bytes, 0);
    // Every value, in two passes (the second re-promotes what the first
    // pushed back down).
    for _ in 0..2 {
        for i in 0..n {
            let got = read(&store, &spill, i)
                .await
                .unwrap_or_else(|| panic!("key {i} lost"));
            assert!(got == value(i, len), "key {i}: wrong bytes");
        }
    }
    let s = spill.stats();
    assert!(s.promoted >= n, "promotions: {s:?}");
    assert_eq!(s.read_errors, 0);
    // Values read back and evicted again unchanged were not rewritten.
    assert!(s.kept >= n / 2, "kept: {s:?}");
    assert!(s.spilled < n + s.kept, "{s:?}");
    // DRAM never went over its capacity.
    assert!(store.stats().reserved_bytes <= dram);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_deletes_win_over_lower_copies() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(4 * MIB);
    let tier = reopen(dir.path()).await;
    let spill = attach(&store, tier, None);
    let len = 128 * KIB as usize;
    // Keys 0..8 go below once 64 more are written.
    for i in 0..72 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(store.get(&key(0), NOW).unwrap().is_none() && spill.contains(&key(0)));

    // Overwrite of a key that is below: the new bytes, never the old.
    set(&store, &spill, 0, 1000, Expiry::Persist).await;
    assert!(!spill.contains(&key(0)), "the write forgot the lower copy");
    assert_eq!(read(&store, &spill, 0).await.unwrap(), value(0, 1000));

    // Delete of a key that is only below: reported, and gone for good.
    assert!(spill.contains(&key(1)));
    assert!(store.delete(&key(1), NOW), "DEL counts a key below DRAM");
    assert!(!spill.contains(&key(1)));
    assert_eq!(read(&store, &spill, 1).await, None);
    assert!(!store.delete(&key(1), NOW));

    // A key whose TTL ran out below DRAM does not come back.
    set(&store, &spill, 500, len, Expiry::At(NOW + 5)).await;
    for i in 600..640 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(store.get(&key(500), NOW).unwrap().is_none());
    let later = NOW + 10;
    assert!(!spill.promote(&store, &key(500), later).await.unwrap());
    assert!(store.get(&key(500), later).unwrap().is_none());
    // ...while one still alive keeps its TTL through the round trip.
    set(&store, &spill, 501, len, Expiry::At(NOW + 60_000)).await;
    for i in 700..740 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(spill.promote(&store, &key(501), NOW).await.unwrap());
    assert_eq!(
        store.ttl(&key(501), NOW),
        strata_tiering::Ttl::Ms(60_000),
        "expiry survives the trip"
    );

    // FLUSHALL empties the lower tier too.
    assert!(spill.contains(&key(700)));
    store.flush(NOW);
    assert!(!spill.promote(&store, &key(700), NOW + 1).await.unwrap());
    assert!(store.get(&key(700), NOW + 1).unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let len = 100 * KIB as usize;
    {
        let store = store(4 * MIB);
        let tier = reopen(dir.path()).await;
        let spill = attach(&store, tier, Some(dir.path()));
        for i in 0..80 {
            set(&store, &spill, i, len, Expiry::Persist).await;
        }
        spill.drain(Duration::from_secs(30)).await.unwrap();
        assert!(spill.stats().spilled >= 30);
        // Deleted before the restart: must stay deleted after it.
        assert!(store.delete(&key(3), NOW));
        spill.drain(Duration::from_secs(30)).await.unwrap();
        spill.tier().close().await.unwrap();
    }
    let store = store(4 * MIB);
    let tier = reopen(dir.path()).await;
    let spill = attach(&store, tier, Some(dir.path()));
    let mut found = 0;
    for i in 0..80 {
        if i == 3 {
            assert!(
                !spill.promote(&store, &key(3), NOW).await.unwrap(),
                "delete survives restart"
            );
            continue;
        }
        if spill.promote(&store, &key(i), NOW).await.unwrap() {
            assert!(store.get(&key(i), NOW).unwrap().unwrap().as_slice() == value(i, len));
            found += 1;
        }
    }
    // Everything evicted before the close was written: keys 0..~30.
    assert!(found >= 30, "recovered {found}");
}

async fn faulty_spill(
    dir: &Path,
    store: &Store,
) -> (Arc<Spill<Faulty<FoyerBackend>>>, Arc<Faults>) {
    let (backend, faults) = Faulty::new(open_tier(dir, 32 * MIB).await);
    let tier = NvmeTier::with_backend(backend, MAX_VALUE + HEADER_BYTES);
    (attach(store, tier, None), faults)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_reported_and_nothing_wrong_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(4 * MIB);
    let (spill, faults) = faulty_spill(dir.path(), &store).await;
    let len = 128 * KIB as usize;
    for i in 0..60 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(spill.contains(&key(0)));

    // Failing reads: an error, the key not in DRAM, the copy kept.
    faults.fail_reads.store(true, Relaxed);
    let err = spill.promote(&store, &key(0), NOW).await.unwrap_err();
    assert!(matches!(err, PromoteError::Nvme(_)), "{err:?}");
    assert!(store.get(&key(0), NOW).unwrap().is_none());
    faults.clear();
    assert!(spill.promote(&store, &key(0), NOW).await.unwrap());
    assert!(store.get(&key(0), NOW).unwrap().unwrap().as_slice() == value(0, len));

    // Damaged bytes: refused, never published.
    faults.corrupt_reads.store(true, Relaxed);
    assert!(spill.promote(&store, &key(1), NOW).await.is_err());
    assert!(store.get(&key(1), NOW).unwrap().is_none());
    faults.clear();

    // Failing writes: evictions are lost from the cache (counted), DRAM
    // contents are untouched and readable.
    faults.fail_writes.store(true, Relaxed);
    let before = spill.stats().write_errors;
    for i in 100..140 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(spill.stats().write_errors > before);
    faults.clear();
    for i in 120..140 {
        assert!(
            store.get(&key(i), NOW).unwrap().unwrap().as_slice() == value(i, len),
            "DRAM key {i}"
        );
    }
    assert_eq!(spill.stats().queued_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinsert_after_forget_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = Bytes::from(value(1, 5000));
    let v2 = Bytes::from(value(2, 5000));
    {
        let tier = reopen(dir.path()).await;
        tier.insert(key(1), v1.clone()).await.unwrap();
        assert!(tier.forget(&key(1)));
        tier.insert(key(1), v2.clone()).await.unwrap();
        tier.close().await.unwrap();
    }
    let tier = reopen(dir.path()).await;
    let got = tier
        .get(&key(1))
        .await
        .unwrap()
        .expect("present after reopen");
    assert_eq!(got.bytes, v2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_keys_forgotten_and_rewritten_survive_another_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let v = |i| Bytes::from(value(i, 100_000));
    {
        let tier = reopen(dir.path()).await;
        for i in 0..20 {
            tier.insert(key(i), v(i)).await.unwrap();
        }
        tier.close().await.unwrap();
    }
    let tier = reopen(dir.path()).await;
    for i in 0..20 {
        assert!(tier.forget(&key(i)), "forget {i}");
    }
    let mut errs = vec![];
    for round in 0..3 {
        for i in 0..20 {
            if round > 0 {
                assert!(tier.forget(&key(i)), "forget {i} in round {round}");
            }
            if let Err(e) = tier.insert(key(i), v(i + 100)).await {
                errs.push((i, e));
            }
        }
    }
    assert!(errs.is_empty(), "{errs:?}");
    tier.close().await.unwrap();
    let tier = reopen(dir.path()).await;
    let mut lost = vec![];
    for i in 0..20 {
        match tier.get(&key(i)).await.unwrap() {
            Some(got) if got.bytes == v(i + 100) => {}
            other => lost.push((i, other.map(|o| o.bytes.len()))),
        }
    }
    assert!(lost.is_empty(), "{lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_changes_on_promoted_values_reach_the_copy_below() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(4 * MIB);
    let spill = attach(&store, reopen(dir.path()).await, None);
    let len = 128 * KIB as usize;
    for i in 0..60 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    // Below DRAM, known without reading it.
    assert_eq!(spill.exists_below(&key(0), NOW), Some(true));
    assert_eq!(spill.exists_below(b"never-written", NOW), Some(false));
    // Promoted: in DRAM, and its copy below stays.
    assert!(spill.promote(&store, &key(0), NOW).await.unwrap());
    assert!(spill.promote(&store, &key(1), NOW).await.unwrap());
    assert_eq!(spill.exists_below(&key(0), NOW), Some(true));
    // An expiry in the past deletes the key: the copy below must not bring
    // it back.
    assert!(store.set_expiry(&key(0), Some(NOW - 1), NOW));
    assert_eq!(spill.exists_below(&key(0), NOW), Some(false));
    assert!(!spill.promote(&store, &key(0), NOW).await.unwrap());
    // A new TTL on a promoted value: evicted again, it goes down with it.
    assert!(store.set_expiry(&key(1), Some(NOW + 1000), NOW));
    for i in 100..140 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    assert!(store.get(&key(1), NOW).unwrap().is_none(), "evicted");
    assert_eq!(spill.exists_below(&key(1), NOW), Some(true));
    assert_eq!(
        spill.exists_below(&key(1), NOW + 1000),
        Some(false),
        "expired below"
    );
    assert!(!spill.promote(&store, &key(1), NOW + 1000).await.unwrap());
}

/// After a restart the key log names what NVMe holds: `EXISTS`/`PREFIX`
/// (`exists_below`) answer without a read and repair (`keys_below`) sees
/// the keys; deleted and flushed keys stay gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_keys_are_known_without_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let len = 100 * KIB as usize;
    {
        let store = store(4 * MIB);
        let spill = attach(&store, reopen(dir.path()).await, Some(dir.path()));
        for i in 0..80 {
            set(&store, &spill, i, len, Expiry::Persist).await;
        }
        spill.drain(Duration::from_secs(30)).await.unwrap();
        assert!(store.delete(&key(3), NOW));
        spill.drain(Duration::from_secs(30)).await.unwrap();
        spill.tier().close().await.unwrap();
    }
    let restarted = store(4 * MIB);
    let spill = attach(&restarted, reopen(dir.path()).await, Some(dir.path()));
    let listed = spill.keys_below(|_| true);
    let mut known = 0;
    for i in 0..80 {
        let answer = spill.exists_below(&key(i), NOW);
        assert_ne!(answer, None, "key {i}: unknown until read");
        if i == 3 {
            assert_eq!(answer, Some(false), "deleted before the restart");
            continue;
        }
        let promoted = spill.promote(&restarted, &key(i), NOW).await.unwrap();
        assert_eq!(
            answer,
            Some(promoted),
            "key {i}: the answer without a read is the read's"
        );
        assert_eq!(
            listed.contains(&key(i)),
            promoted,
            "key {i} listed for repair"
        );
        known += usize::from(promoted);
    }
    assert!(known >= 30, "{known} keys recovered");
    spill.tier().close().await.unwrap();
    drop(spill);

    // FLUSHALL, then a restart: nothing is known below.
    let store2 = store_with_flush(dir.path()).await;
    drop(store2);
    let fresh = store(4 * MIB);
    let spill = attach(&fresh, reopen(dir.path()).await, Some(dir.path()));
    assert!(spill.keys_below(|_| true).is_empty());
    for i in 0..80 {
        // foyer still indexes the flushed copies: not known live, and a
        // read finds them dead.
        assert_ne!(
            spill.exists_below(&key(i), NOW),
            Some(true),
            "key {i} after FLUSHALL"
        );
        assert!(
            !spill.promote(&fresh, &key(i), NOW).await.unwrap(),
            "key {i} after FLUSHALL"
        );
    }
}

/// Opens the tier in `dir` under a fresh store and runs `FLUSHALL`.
async fn store_with_flush(dir: &Path) -> Store {
    let store = store(4 * MIB);
    let spill = attach(&store, reopen(dir).await, Some(dir));
    store.flush(NOW + 10);
    spill.drain(Duration::from_secs(30)).await.unwrap();
    spill.tier().close().await.unwrap();
    store
}

/// A full SCAN with a small COUNT: every key it returns, in call order.
fn scan_all(store: &Store, count: usize, now_ms: u64) -> Vec<Bytes> {
    let (mut cursor, mut out) = (0, Vec::new());
    loop {
        let (next, keys) = store.scan(cursor, count, now_ms, |_| true);
        out.extend(keys);
        if next == 0 {
            return out;
        }
        assert!(next > cursor, "the cursor moves forward");
        cursor = next;
    }
}

fn sorted(mut keys: Vec<Bytes>) -> Vec<Bytes> {
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_and_dbsize_cover_every_tier_once() {
    let dir = tempfile::tempdir().unwrap();
    let len = 100 * KIB as usize;
    let n = 80;
    let all = |skip: &[u64]| -> Vec<Bytes> {
        sorted((0..n).filter(|i| !skip.contains(i)).map(key).collect())
    };
    {
        let store = store(4 * MIB);
        let spill = attach(&store, reopen(dir.path()).await, Some(dir.path()));
        for i in 0..n {
            let expiry = if i == 7 {
                Expiry::At(NOW + 100)
            } else {
                Expiry::Persist
            };
            set(&store, &spill, i, len, expiry).await;
        }
        spill.drain(Duration::from_secs(30)).await.unwrap();
        let in_dram = store.stats().keys;
        assert!(
            in_dram < n / 2,
            "most keys are below DRAM ({in_dram} in DRAM)"
        );
        assert_eq!(store.len(), n, "DBSIZE counts every tier");
        assert_eq!(sorted(scan_all(&store, 7, NOW)), all(&[]));
        // Promoted keys are in both tiers: counted and listed once.
        for i in 0..10 {
            assert_eq!(read(&store, &spill, i).await.unwrap(), value(i, len));
        }
        assert!(spill.stats().promoted >= 10);
        assert_eq!(store.len(), n);
        assert_eq!(sorted(scan_all(&store, 7, NOW)), all(&[]));
        // Keys move between tiers during the walk: each is still returned
        // exactly once (a key's place in the order never changes).
        let (mut cursor, mut walked, mut i) = (0, Vec::new(), 0);
        loop {
            let (next, keys) = store.scan(cursor, 5, NOW, |_| true);
            walked.extend(keys);
            if next == 0 {
                break;
            }
            cursor = next;
            for _ in 0..3 {
                i = (i + 17) % n;
                assert_eq!(read(&store, &spill, i).await.unwrap(), value(i, len));
            }
        }
        assert_eq!(walked.len(), n as usize, "no key twice");
        assert_eq!(sorted(walked), all(&[]));
        // Deletes, in DRAM and below; an expired key is counted (as Redis'
        // DBSIZE does) but not listed.
        assert!(store.delete(&key(3), NOW));
        assert!(store.delete(&key(70), NOW));
        assert_eq!(store.len(), n - 2);
        assert_eq!(sorted(scan_all(&store, 7, NOW + 200)), all(&[3, 7, 70]));
        // A graceful stop: everything goes down to NVMe.
        while store.demote_some(8) > 0 {}
        spill.drain(Duration::from_secs(30)).await.unwrap();
        spill.tier().close().await.unwrap();
    }
    // After a restart every recovered key is counted and listed.
    let restarted = store(4 * MIB);
    let _spill = attach(&restarted, reopen(dir.path()).await, Some(dir.path()));
    assert_eq!(restarted.stats().keys, 0, "nothing in DRAM yet");
    // (Key 7 expired: recovery, on the wall clock, drops it.)
    assert_eq!(restarted.len(), n - 3);
    assert_eq!(sorted(scan_all(&restarted, 9, NOW)), all(&[3, 7, 70]));
}

/// Records every tier event the store reports.
#[derive(Default)]
struct Events(parking_lot::Mutex<Vec<(strata_tiering::TierEvent, Bytes)>>);

impl strata_tiering::Observer for Events {
    fn tier_event(&self, event: strata_tiering::TierEvent, key: &[u8]) {
        self.0.lock().push((event, Bytes::copy_from_slice(key)));
    }
}

impl Events {
    fn of(&self, event: strata_tiering::TierEvent) -> Vec<Bytes> {
        let all = self.0.lock();
        all.iter()
            .filter(|(e, _)| *e == event)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_reports_spills_promotions_evictions_and_expiries() {
    use strata_tiering::TierEvent::{Evicted, Expired, Promoted, Spilled};
    // Without a lower tier, a value pushed out of DRAM is evicted.
    let alone = store(2 * MIB);
    let events = Arc::new(Events::default());
    assert!(alone.observe(events.clone()));
    let len = 200 * KIB as usize;
    for i in 0..20 {
        let mut res = alone.reserve(len as u64).unwrap();
        res.as_mut_slice().copy_from_slice(&value(i, len));
        assert!(alone.commit(key(i), res, Condition::Always, Expiry::Persist, NOW));
    }
    let evicted = events.of(Evicted);
    assert!(!evicted.is_empty(), "nothing evicted");
    for k in &evicted {
        assert!(
            !alone.exists(k, NOW),
            "{k:?} reported evicted but still there"
        );
    }
    assert!(events.of(Spilled).is_empty());

    // Over NVMe the same pressure spills instead, and a read brings the
    // value back (promoted).
    let dir = tempfile::tempdir().unwrap();
    let store = store(2 * MIB);
    let events = Arc::new(Events::default());
    assert!(store.observe(events.clone()));
    assert!(
        !store.observe(events.clone()),
        "a second observer is refused"
    );
    let tier = NvmeTier::with_backend(
        open_tier(dir.path(), 32 * MIB).await,
        MAX_VALUE + HEADER_BYTES,
    );
    let spill = attach(&store, tier, None);
    for i in 0..20 {
        set(&store, &spill, i, len, Expiry::Persist).await;
    }
    spill.drain(Duration::from_secs(30)).await.unwrap();
    let spilled = events.of(Spilled);
    assert!(!spilled.is_empty(), "nothing spilled");
    assert!(events.of(Evicted).is_empty(), "{:?}", events.of(Evicted));
    let first = spilled[0].clone();
    let i: u64 = std::str::from_utf8(&first[6..]).unwrap().parse().unwrap();
    assert_eq!(read(&store, &spill, i).await.unwrap(), value(i, len));
    assert_eq!(events.of(Promoted), vec![first]);

    // A value whose TTL passes is reported once, by the periodic sweep.
    set(&store, &spill, 99, 16, Expiry::At(NOW + 5)).await;
    assert_eq!(store.expire_some(NOW + 10, 100), 1);
    assert_eq!(events.of(Expired), vec![key(99)]);
}
