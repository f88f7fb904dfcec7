//! The store with a GPU pool. CI has no GPU, so by default the pool is host
//! memory behind the same trait; with `--features cuda` and
//! `STRATA_TEST_GPU=1` (what `bench/gpu-check.sh` runs) every test but the
//! fault-injection ones runs on GPU 0. What is checked here is the store's
//! side: placement, eviction order, exact accounting per tier, and that a
//! failed copy never serves wrong bytes.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;

use crate::gpu::host::HostDevice;
use crate::gpu::DeviceMemory;
use crate::store::{Condition, Evicted, Expiry, LowerTier, Store, StoreConfig, StoreError, Tier};

const MIB: u64 = 1 << 20;
const NOW: u64 = 1_000;

/// A store on GPU 0 when asked for (see the module comment), else on host
/// memory.
fn store(dram: u64, gpu: u64) -> Store {
    #[cfg(feature = "cuda")]
    if std::env::var_os("STRATA_TEST_GPU").is_some() {
        let dev = crate::gpu::open(0, gpu).expect("STRATA_TEST_GPU is set: GPU 0 must open");
        return with_device(dram, dev);
    }
    with_device(dram, Arc::new(HostDevice::new(gpu)))
}

/// A store on host memory whose copies can be made to fail.
fn faulty_store(dram: u64, gpu: u64) -> (Store, Arc<HostDevice>) {
    let dev = Arc::new(HostDevice::new(gpu));
    (with_device(dram, dev.clone()), dev)
}

fn with_device(dram: u64, dev: Arc<dyn DeviceMemory>) -> Store {
    Store::with_gpu(
        StoreConfig {
            capacity_bytes: dram,
            max_value_bytes: 4 * MIB,
            high_watermark: 1.0,
            tombstone_ms: 0,
        },
        Some(dev),
    )
    .unwrap()
}

fn value(i: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(0x9e37)) as u8)
        .collect()
}

fn key(i: u64) -> Bytes {
    Bytes::from(format!("k{i}"))
}

fn put(s: &Store, i: u64, len: u64) {
    let mut r = s.reserve(len).unwrap();
    r.as_mut_slice().copy_from_slice(&value(i, len));
    assert!(s.commit(key(i), r, Condition::Always, Expiry::Persist, NOW));
}

fn read(s: &Store, i: u64) -> Option<Vec<u8>> {
    s.get(&key(i), NOW).unwrap().map(|v| v.as_slice().to_vec())
}

#[test]
fn writes_go_to_the_gpu_and_reads_get_exact_bytes() {
    let s = store(8 * MIB, 8 * MIB);
    for i in 0..4 {
        put(&s, i, 256 * 1024);
    }
    let st = s.stats();
    assert_eq!(st.gpu.keys, 4);
    assert_eq!(st.gpu.value_bytes, 4 * 256 * 1024);
    assert_eq!(st.gpu.uploads, 4);
    // Nothing is left in DRAM once the values went up.
    assert_eq!(st.value_bytes, 0);
    assert_eq!(st.used_bytes, 0);
    assert_eq!(s.meta(&key(2), NOW).unwrap().tier, Tier::Gpu);
    for i in 0..4 {
        assert_eq!(read(&s, i).unwrap(), value(i, 256 * 1024));
    }
    let st = s.stats();
    assert_eq!(st.gpu.staged_reads, 4);
    // The readers' copies are gone with the readers.
    assert_eq!(st.used_bytes, 0);
    // A value read stays on the GPU.
    assert_eq!(s.meta(&key(0), NOW).unwrap().tier, Tier::Gpu);
}

#[test]
fn a_full_gpu_moves_its_oldest_values_down_to_dram() {
    let s = store(16 * MIB, 4 * MIB);
    let n = 12u64;
    for i in 0..n {
        put(&s, i, MIB);
    }
    let st = s.stats();
    assert_eq!(st.keys, n);
    assert_eq!(st.gpu.keys, 4);
    assert_eq!(st.gpu.demotions, n - 4);
    assert_eq!(st.gpu.value_bytes, 4 * MIB);
    assert_eq!(st.value_bytes, (n - 4) * MIB);
    // The newest are on the GPU, the oldest in DRAM.
    for i in 0..n {
        let want = if i >= n - 4 { Tier::Gpu } else { Tier::Dram };
        assert_eq!(s.meta(&key(i), NOW).unwrap().tier, want, "key {i}");
    }
    for i in 0..n {
        assert_eq!(read(&s, i).unwrap(), value(i, MIB), "key {i}");
    }
}

#[test]
fn deletes_overwrites_ttls_and_flush_free_gpu_memory_exactly() {
    let s = store(8 * MIB, 8 * MIB);
    for i in 0..6 {
        put(&s, i, 100_000);
    }
    let used = s.stats().gpu.used_bytes;
    assert!(used >= 6 * 100_000);
    assert!(s.delete(&key(0), NOW));
    put(&s, 1, 100_000); // overwrite
    assert!(s.set_expiry(&key(2), Some(NOW + 10), NOW));
    assert_eq!(s.expire_some(NOW + 20, 100), 1);
    let st = s.stats();
    assert_eq!(st.gpu.keys, 4);
    assert_eq!(st.gpu.value_bytes, 4 * 100_000);
    assert_eq!(st.gpu.used_bytes, used / 6 * 4);
    assert!(read(&s, 0).is_none());
    assert!(read(&s, 2).is_none());
    assert_eq!(read(&s, 1).unwrap(), value(1, 100_000));
    s.flush(NOW);
    let st = s.stats();
    assert_eq!(
        (st.gpu.keys, st.gpu.used_bytes, st.gpu.value_bytes),
        (0, 0, 0)
    );
    assert_eq!((st.used_bytes, st.value_bytes), (0, 0));
}

#[test]
fn a_reader_keeps_its_copy_while_the_value_moves_or_goes() {
    let s = store(8 * MIB, 2 * MIB);
    put(&s, 0, MIB);
    let held = s.get(&key(0), NOW).unwrap().unwrap();
    // Push key 0 down to DRAM, then delete it.
    put(&s, 1, MIB);
    put(&s, 2, MIB);
    assert_eq!(s.meta(&key(0), NOW).unwrap().tier, Tier::Dram);
    assert!(s.delete(&key(0), NOW));
    assert_eq!(held.as_slice(), &value(0, MIB)[..]);
    drop(held);
    assert_eq!(s.stats().value_bytes, 0);
}

#[test]
fn a_failed_upload_leaves_the_value_in_dram() {
    let (s, dev) = faulty_store(8 * MIB, 8 * MIB);
    dev.fail_uploads.store(true, Relaxed);
    put(&s, 0, 300_000);
    let st = s.stats();
    assert_eq!(st.gpu.errors, 1);
    assert_eq!(st.gpu.keys, 0);
    assert_eq!(st.gpu.used_bytes, 0);
    assert_eq!(s.meta(&key(0), NOW).unwrap().tier, Tier::Dram);
    assert_eq!(read(&s, 0).unwrap(), value(0, 300_000));
    dev.fail_uploads.store(false, Relaxed);
    put(&s, 1, 300_000);
    assert_eq!(s.meta(&key(1), NOW).unwrap().tier, Tier::Gpu);
}

#[test]
fn a_failed_download_is_an_error_never_wrong_bytes() {
    let (s, dev) = faulty_store(8 * MIB, 8 * MIB);
    put(&s, 0, 300_000);
    put(&s, 1, 300_000);
    dev.fail_downloads.store(true, Relaxed);
    let err = s.get(&key(0), NOW).unwrap_err();
    assert!(matches!(err, StoreError::Device(_)), "{err:?}");
    assert!(err.to_string().contains("injected"), "{err}");
    // The value whose bytes could not be read is gone, not served later.
    dev.fail_downloads.store(false, Relaxed);
    assert!(read(&s, 0).is_none());
    assert_eq!(read(&s, 1).unwrap(), value(1, 300_000));
    let st = s.stats();
    assert_eq!(st.gpu.errors, 1);
    assert_eq!(st.gpu.keys, 1);
    assert_eq!(st.used_bytes, 0, "the failed reader's DRAM copy was freed");
}

/// A GPU value's checksum is summed through a bounded host buffer: right
/// across the buffer's piece boundary, with no DRAM taken and no staged
/// read counted; a failed copy is an error and drops the value, as a read.
#[test]
fn a_gpu_value_is_summed_without_taking_dram() {
    let (s, dev) = faulty_store(4 * MIB, 8 * MIB);
    put(&s, 0, 3 * MIB + 17);
    put(&s, 1, 300_000);
    let before = s.stats();
    assert_eq!(before.used_bytes, 0, "both values went up");
    let (m, sum) = s.meta_summed(&key(0), NOW).unwrap().unwrap();
    assert_eq!(m.tier, Tier::Gpu);
    assert_eq!(sum, crc32c::crc32c(&value(0, 3 * MIB + 17)));
    let after = s.stats();
    assert_eq!((after.used_bytes, after.gpu.staged_reads), (0, 0));
    dev.fail_downloads.store(true, Relaxed);
    let err = s.meta_summed(&key(1), NOW).unwrap_err();
    assert!(matches!(err, StoreError::Device(_)), "{err:?}");
    dev.fail_downloads.store(false, Relaxed);
    assert!(
        s.meta(&key(1), NOW).is_none(),
        "the unreadable value is gone"
    );
    assert_eq!(s.stats().gpu.errors, 1);
}

#[test]
fn values_too_large_for_the_gpu_stay_in_dram() {
    let s = store(16 * MIB, 2 * MIB);
    put(&s, 0, 2 * MIB); // the whole pool
    put(&s, 1, 3 * MIB); // more than the pool
    assert_eq!(s.meta(&key(0), NOW).unwrap().tier, Tier::Gpu);
    assert_eq!(s.meta(&key(1), NOW).unwrap().tier, Tier::Dram);
    assert_eq!(read(&s, 1).unwrap(), value(1, 3 * MIB));
    assert_eq!(read(&s, 0).unwrap(), value(0, 2 * MIB));
}

#[test]
fn a_read_needs_dram_room_and_says_so() {
    // DRAM can hold one copy; a reader holds it. The other GPU value then
    // has nowhere to be copied to.
    let s = store(4 * MIB, 8 * MIB);
    put(&s, 0, 3 * MIB);
    put(&s, 1, 3 * MIB);
    let held = s.get(&key(0), NOW).unwrap().unwrap();
    let err = s.get(&key(1), NOW).unwrap_err();
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err:?}");
    drop(held);
    assert_eq!(read(&s, 1).unwrap(), value(1, 3 * MIB));
    assert_eq!(read(&s, 0).unwrap(), value(0, 3 * MIB));
}

/// Records what DRAM evicts, to check the order GPU → DRAM → below.
#[derive(Default)]
struct Below {
    keys: parking_lot::Mutex<Vec<(Bytes, Vec<u8>)>>,
}

impl LowerTier for Below {
    fn evicted(&self, key: &Bytes, value: &[u8], _info: Evicted) -> bool {
        self.keys.lock().push((key.clone(), value.to_vec()));
        true
    }
    fn forget(&self, _key: &[u8]) -> bool {
        false
    }
    fn clear(&self, _now_ms: u64) {}
    fn scan(&self, _: u64, _: usize, _: u64, _: &mut dyn FnMut(u64, &Bytes)) -> u64 {
        0
    }
    fn len_only_below(&self) -> u64 {
        0
    }
}

#[test]
fn values_flow_down_through_every_tier() {
    let s = store(4 * MIB, 4 * MIB);
    let below = Arc::new(Below::default());
    assert!(s.attach_lower(below.clone()));
    for i in 0..12 {
        put(&s, i, MIB);
    }
    // 4 on the GPU, 3 in DRAM (a write needs room for its own bytes in
    // DRAM on the way up), the 5 oldest handed down, in age order.
    let st = s.stats();
    assert_eq!((st.gpu.keys, st.keys - st.gpu.keys), (4, 3));
    let gone: Vec<Bytes> = below.keys.lock().iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(gone, (0..5).map(key).collect::<Vec<_>>());
    for (k, v) in below.keys.lock().iter() {
        let i: u64 = std::str::from_utf8(&k[1..]).unwrap().parse().unwrap();
        assert_eq!(v, &value(i, MIB));
    }
    // A graceful stop moves everything down, GPU values included.
    while s.demote_some(3) > 0 {}
    assert_eq!(s.stats().keys, 0);
    assert_eq!(below.keys.lock().len(), 12);
    for (k, v) in below.keys.lock().iter() {
        let i: u64 = std::str::from_utf8(&k[1..]).unwrap().parse().unwrap();
        assert_eq!(v, &value(i, MIB), "key {i}");
    }
}

#[test]
fn concurrent_writers_and_readers_see_exact_values() {
    // DRAM roomy enough for every size class's slabs: nothing is evicted
    // out of the store, so every key must still be there at the end.
    let s = store(64 * MIB, 4 * MIB);
    let s = Arc::new(s);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for round in 0..200u64 {
                    let i = t * 1000 + round % 20;
                    let len = 1000 + (round * 7919 % 200_000);
                    let mut r = s.reserve(len).unwrap();
                    r.as_mut_slice().copy_from_slice(&value(i ^ round, len));
                    s.commit(key(i), r, Condition::Always, Expiry::Persist, NOW);
                    let got = s.get(&key(i), NOW).unwrap().unwrap();
                    assert_eq!(got.as_slice(), &value(i ^ round, len)[..]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = s.stats();
    assert_eq!((st.keys, st.evictions), (80, 0));
    assert!(st.gpu.keys > 0 && st.gpu.demotions > 0, "{st:?}");
    s.flush(NOW);
    let st = s.stats();
    assert_eq!((st.used_bytes, st.gpu.used_bytes), (0, 0));
}

/// Writers, deleters and readers on the same keys: moves up and down race
/// with overwrites and deletes. A read returns a whole value some writer
/// wrote (its bytes derive from the tag in its first 8), never a mix, and
/// no chunk leaks in either pool.
#[test]
fn moves_racing_writes_and_deletes_never_mix_or_leak() {
    let s = Arc::new(store(32 * MIB, 2 * MIB));
    let tagged = |tag: u64, len: usize| -> Vec<u8> {
        let mut v = value(tag, len as u64);
        v[..8].copy_from_slice(&tag.to_le_bytes());
        v
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                for round in 0..400u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = key(rng % 8);
                    match rng % 5 {
                        0 => {
                            s.delete(&k, NOW);
                        }
                        1 | 2 => {
                            let tag = t << 32 | round;
                            let len = 64 + (rng >> 8) as usize % 600_000;
                            let mut r = s.reserve(len as u64).unwrap();
                            r.as_mut_slice().copy_from_slice(&tagged(tag, len));
                            s.commit(k, r, Condition::Always, Expiry::Persist, NOW);
                        }
                        _ => {
                            if let Some(v) = s.get(&k, NOW).unwrap() {
                                let b = v.as_slice();
                                let tag = u64::from_le_bytes(b[..8].try_into().unwrap());
                                assert!(b == &tagged(tag, b.len())[..], "mixed value under {k:?}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = s.stats();
    assert_eq!(st.evictions, 0);
    assert!(st.gpu.uploads > 0 && st.gpu.demotions > 0, "{st:?}");
    s.flush(NOW);
    let st = s.stats();
    assert_eq!(
        (
            st.used_bytes,
            st.value_bytes,
            st.gpu.used_bytes,
            st.gpu.value_bytes
        ),
        (0, 0, 0, 0),
        "{st:?}"
    );
}
