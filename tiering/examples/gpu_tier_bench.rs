//! GPU tier copy speed next to the plain CUDA figure, on one GPU.
//!
//!   cargo run --release -p strata-tiering --features cuda --example gpu_tier_bench \
//!       -- [value size, default 1MiB] [GPU pool, default 4GiB]
//!
//! 1. Baseline: `cuMemcpyHtoD` / `cuMemcpyDtoH` of one value at a time
//!    between a `cuMemHostAlloc` (pinned) buffer and device memory, the
//!    best the tier's synchronous copies can do.
//! 2. The tier: a store with the GPU pool. Writes (commit = upload into the
//!    pool) and reads (get = copy into DRAM for the reader) of values that
//!    all fit on the GPU, timed without filling or checking; then every
//!    value is checked byte for byte. Then twice the pool is written, so
//!    the oldest values move down to DRAM, and all are checked again.
//!
//! Prints GB/s and the tier / baseline ratio. Exits non-zero on any wrong
//! byte or failed copy. Run by `bench/gpu-check.sh`.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cudarc::driver::{sys, CudaContext};
use strata_tiering::{gpu, Condition, Expiry, Store, StoreConfig, Tier};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn parse_size(s: &str) -> u64 {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("GiB") {
        (n, GIB)
    } else if let Some(n) = s.strip_suffix("MiB") {
        (n, MIB)
    } else if let Some(n) = s.strip_suffix("KiB") {
        (n, 1024)
    } else {
        (s, 1)
    };
    num.parse::<u64>().expect("a size like 1MiB") * mult
}

fn value_byte(i: u64, j: u64) -> u8 {
    (j.wrapping_mul(131) ^ i.wrapping_mul(0x9e37_79b9)) as u8
}

fn fill(buf: &mut [u8], i: u64) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = value_byte(i, j as u64);
    }
}

fn check(buf: &[u8], i: u64) -> bool {
    buf.iter()
        .enumerate()
        .all(|(j, b)| *b == value_byte(i, j as u64))
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn ok(r: sys::CUresult, what: &str) {
    if let Err(e) = r.result() {
        eprintln!("gpu_tier_bench: {what}: {e}");
        std::process::exit(1);
    }
}

/// Plain synchronous copies of `size` bytes, `rounds` times each way.
fn baseline(size: u64, rounds: u64) -> (f64, f64) {
    let ctx = CudaContext::new(0).expect("GPU 0");
    ctx.bind_to_thread().expect("bind");
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: plain allocations, checked; freed below.
    unsafe {
        ok(
            sys::cuMemHostAlloc(&mut host, size as usize, 0),
            "cuMemHostAlloc",
        );
        ok(sys::cuMemAlloc_v2(&mut dev, size as usize), "cuMemAlloc");
    }
    let time = |up: bool| {
        let t = Instant::now();
        for _ in 0..rounds {
            // SAFETY: both buffers are `size` bytes.
            let r = unsafe {
                if up {
                    sys::cuMemcpyHtoD_v2(dev, host, size as usize)
                } else {
                    sys::cuMemcpyDtoH_v2(host, dev, size as usize)
                }
            };
            ok(r, "cuMemcpy");
        }
        gbps(size * rounds, t.elapsed().as_secs_f64())
    };
    time(true); // warm up
    let h2d = time(true);
    let d2h = time(false);
    // SAFETY: allocated above, no longer used.
    unsafe {
        ok(sys::cuMemFreeHost(host), "cuMemFreeHost");
        ok(sys::cuMemFree_v2(dev), "cuMemFree");
    }
    (h2d, d2h)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size = args.get(1).map_or(MIB, |s| parse_size(s));
    let pool = args.get(2).map_or(4 * GIB, |s| parse_size(s));
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        eprintln!("gpu_tier_bench: no CUDA driver (libcuda.so) on this machine");
        std::process::exit(1);
    }
    let fits = (pool * 9 / 10 / size).max(1);
    println!("value {size} B, GPU pool {pool} B, {fits} values fit on the GPU");

    let (base_h2d, base_d2h) = baseline(size, fits.min(2000));
    println!("baseline pinned cuMemcpy: H2D {base_h2d:.2} GB/s, D2H {base_d2h:.2} GB/s");

    let device = gpu::open(0, pool).unwrap_or_else(|e| {
        eprintln!("gpu_tier_bench: {e}");
        std::process::exit(1);
    });
    println!("device: {}", device.describe());
    // DRAM holds twice the pool: the second round moves the GPU's contents
    // down into it, and readers' copies need room too.
    let store = Arc::new(
        Store::with_gpu(
            StoreConfig {
                capacity_bytes: 2 * pool + 64 * MIB,
                max_value_bytes: size,
                high_watermark: 0.95,
                tombstone_ms: 0,
            },
            Some(device),
        )
        .expect("store"),
    );
    let key = |i: u64| Bytes::from(format!("block:{i:08}"));
    let mut src = vec![0u8; size as usize];
    let mut bad = 0u64;

    // Writes: the timed part is commit (the upload), not the fill.
    let mut write_secs = 0.0;
    for i in 0..fits {
        let mut r = store.reserve(size).expect("reserve");
        fill(&mut src, i);
        r.as_mut_slice().copy_from_slice(&src);
        let t = Instant::now();
        store.commit(key(i), r, Condition::Always, Expiry::Persist, 1);
        write_secs += t.elapsed().as_secs_f64();
    }
    let st = store.stats();
    println!(
        "tier writes: {} values uploaded, {} on the GPU, {} errors",
        st.gpu.uploads, st.gpu.keys, st.gpu.errors
    );
    // Reads: the timed part is get (the copy into DRAM), not the check.
    let mut read_secs = 0.0;
    for i in 0..fits {
        let t = Instant::now();
        let v = store.get(&key(i), 1).expect("get").expect("present");
        read_secs += t.elapsed().as_secs_f64();
        if !check(v.as_slice(), i) {
            bad += 1;
        }
    }
    let h2d = gbps(size * fits, write_secs);
    let d2h = gbps(size * fits, read_secs);
    println!(
        "tier: H2D {h2d:.2} GB/s ({:.2} of baseline), D2H {d2h:.2} GB/s ({:.2} of baseline)",
        h2d / base_h2d,
        d2h / base_d2h
    );

    // Overflow: twice the pool, so the oldest move down to DRAM.
    for i in fits..2 * fits {
        let mut r = store.reserve(size).expect("reserve");
        fill(r.as_mut_slice(), i);
        store.commit(key(i), r, Condition::Always, Expiry::Persist, 1);
    }
    let (mut on_gpu, mut in_dram) = (0u64, 0u64);
    for i in 0..2 * fits {
        match store.meta(&key(i), 1).map(|m| m.tier) {
            Some(Tier::Gpu) => on_gpu += 1,
            Some(Tier::Dram) => in_dram += 1,
            None => bad += 1,
        }
        let v = store.get(&key(i), 1).expect("get");
        if !v.is_some_and(|v| check(v.as_slice(), i)) {
            bad += 1;
        }
    }
    let st = store.stats();
    println!(
        "overflow: {on_gpu} values on the GPU, {in_dram} in DRAM, {} moved down, {} copy errors",
        st.gpu.demotions, st.gpu.errors
    );
    if bad > 0 || st.gpu.errors > 0 {
        eprintln!("gpu_tier_bench: FAILED: {bad} wrong or missing values");
        std::process::exit(1);
    }
    println!("gpu_tier_bench: every value byte-exact: OK");
}
