//! How many live values the NVMe tier loses under overwrite churn.
//!
//! A live set of `--live` (default ½) of the tier's capacity, in 64 KiB
//! values, overwritten at random `--rounds` (default 10) times over, the
//! way the spill does it (drop the old copy, write the new one). Before
//! each overwrite the old value is looked up: if it is gone while still
//! live, foyer reclaimed it. At the end every key is read back and
//! checked byte for byte. Prints the drop rate (drops / writes).
//!
//! `cargo run --release -p strata-tiering --example nvme_churn -- [--live 0.5] [--rounds 10] [--capacity-mib 256]`

use std::time::Instant;

use bytes::Bytes;
use strata_tiering::nvme::{NvmeConfig, NvmeTier};

const VALUE: usize = 64 << 10;
const MAX_VALUE: u64 = 256 << 10;

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
        })
        .unwrap_or(default)
}

fn value(key: u64, version: u64) -> Bytes {
    let mut x = (key << 20 | version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(VALUE);
    while out.len() < VALUE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let live_fraction = arg("--live", 0.5);
    let rounds = arg("--rounds", 10.0) as u64;
    let capacity = (arg("--capacity-mib", 256.0) as u64) << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let tier = NvmeTier::open(NvmeConfig::new(dir.path(), capacity, MAX_VALUE))
        .await
        .expect("open the tier");
    let keys = (capacity as f64 * live_fraction / VALUE as f64) as u64;
    let writes = keys * rounds;
    println!(
        "capacity {} MiB ({} blocks of {} KiB), live set {keys} × 64 KiB ({:.0} % of capacity), {writes} writes",
        capacity >> 20,
        tier.stats().capacity_bytes / tier.stats().block_bytes,
        tier.stats().block_bytes >> 10,
        100.0 * (keys * VALUE as u64) as f64 / capacity as f64,
    );
    let key = |k: u64| Bytes::from(format!("churn/{k:06}"));
    let mut version = vec![0u64; keys as usize];
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut drops = 0u64;
    let started = Instant::now();
    for i in 0..writes {
        // The first pass writes every key once; then random overwrites.
        let k = if i < keys {
            i
        } else {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % keys
        };
        if version[k as usize] > 0 {
            if !tier.contains(&key(k)) {
                drops += 1;
            }
            tier.forget(&key(k));
        }
        version[k as usize] += 1;
        let v = value(k, version[k as usize]);
        tier.insert(key(k), v).await.expect("insert");
    }
    let mut missing = 0u64;
    for k in 0..keys {
        match tier.get(&key(k)).await.expect("read") {
            Some(got) => assert!(
                got.bytes == value(k, version[k as usize]),
                "key {k}: wrong bytes"
            ),
            None => missing += 1,
        }
    }
    let s = tier.stats();
    let lost = drops + missing;
    println!(
        "{writes} writes in {:.1} s: {lost} live values lost ({drops} before their overwrite, {missing} at the end) = {:.2} % of writes",
        started.elapsed().as_secs_f64(),
        100.0 * lost as f64 / writes as f64,
    );
    println!(
        "{} blocks reclaimed; {} live values copied forward ({:.2} copies per write), {} dropped by reclaim (counted as evictions)",
        s.evicted_blocks,
        s.reinserted,
        s.reinserted as f64 / writes as f64,
        s.reclaim_dropped,
    );
    tier.close().await.expect("close");
}
