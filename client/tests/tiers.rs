//! The zero-copy path over a node whose working set is three times its
//! DRAM: values on NVMe are promoted before a descriptor is handed out, so
//! `get_into`, `get_many` and `prefix` see every value, byte for byte.

mod common;

use common::{pattern, Node};

const MIB: usize = 1 << 20;
const KEYS: usize = 96;

#[tokio::test]
async fn zero_copy_reads_of_values_on_nvme() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_str().expect("utf-8 path");
    let node = Node::start(&[
        "--cpu-memory-pool-size",
        "32MiB",
        "--ssd-pool-size",
        "512MiB",
        "--ssd-max-value-size",
        "8MiB",
        "--ssd-path",
        path,
    ]);
    let c = node.client().await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("blk-{i:03}")).collect();
    let mut src = c.alloc(MIB).expect("alloc");
    for k in &keys {
        src.as_mut_slice()
            .copy_from_slice(&pattern(k.as_bytes(), MIB));
        c.put_from(k.as_bytes(), &src, 0..MIB)
            .await
            .expect("put_from");
    }
    // One by one: the oldest keys are on NVMe by now.
    let mut dst = c.alloc(MIB).expect("alloc");
    for k in keys.iter().take(KEYS / 2) {
        let n = c
            .get_into(k.as_bytes(), &mut dst, 0)
            .await
            .expect("get_into");
        assert_eq!(n, MIB);
        assert!(
            dst.as_slice() == pattern(k.as_bytes(), MIB),
            "{k}: wrong bytes"
        );
    }
    // A run of all keys is found whichever tier holds each.
    assert_eq!(c.prefix(&keys[..16]).await.expect("prefix"), 16);
    // Batched, in groups that fit DRAM together.
    for group in keys.chunks(8) {
        let mut bufs: Vec<_> = group.iter().map(|_| c.alloc(MIB).expect("alloc")).collect();
        let mut items: Vec<_> = group
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| (k.as_bytes(), b, 0usize))
            .collect();
        let results = c.get_many(&mut items).await;
        for ((k, r), b) in group.iter().zip(results).zip(bufs.iter()) {
            assert_eq!(r.expect("get_many"), MIB, "{k}");
            assert!(
                b.as_slice() == pattern(k.as_bytes(), MIB),
                "{k}: wrong bytes"
            );
        }
    }
    let info = c.info("tiers").await.expect("info");
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from INFO tiers:\n{info}"))
    };
    assert!(field("nvme_promoted") >= (KEYS / 2) as u64, "{info}");
    assert_eq!(field("nvme_read_errors"), 0);
}
