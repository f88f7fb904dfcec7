//! strata-bench against a real node: both APIs run clean, and a value
//! corrupted behind the bench's back fails the run.

#[path = "../../client/tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::Node;

fn bench(node: &Node, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["--addr", &node.addr(), "--keys", "8", "--workers", "2"])
        .args(args)
        .output()
        .expect("run strata-bench")
}

#[tokio::test]
async fn both_apis_run_clean_and_write_json_lines() {
    let node = Node::start(&[]);
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let path = json.path().to_str().expect("utf-8 path");
    for api in ["zerocopy", "inline"] {
        let out = bench(
            &node,
            &[
                "--api",
                api,
                "--sizes",
                "4KiB,64KiB",
                "--ops",
                "50",
                "-c",
                "2",
                "--json",
                path,
            ],
        );
        assert!(
            out.status.success(),
            "{api}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // stderr is a pipe here: no progress bar, no live figures.
        assert!(
            out.stderr.is_empty(),
            "{api}: stderr not quiet: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = bench(
        &node,
        &[
            "--sizes", "4KiB", "--ops", "50", "--mix", "3:1", "--dist", "zipf", "--json", path,
        ],
    );
    assert!(
        out.status.success(),
        "mix: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(json.path()).expect("read json");
    let rows: Vec<&str> = text.lines().collect();
    // 2 apis x 2 sizes x (put, get), then the mixed phase's put and get.
    assert_eq!(rows.len(), 10, "{text}");
    for field in [
        "\"system\":\"strata\"",
        "\"GBps\":",
        "\"p999_us\":",
        "\"errors\":0",
    ] {
        assert!(
            rows.iter().all(|r| r.contains(field)),
            "{field} missing:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_corrupted_value_fails_the_run() {
    let node = Node::start(&[]);
    let out = bench(&node, &["--sizes", "4KiB", "--phases", "put", "--keep"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = node.client().await;
    let mut value = c
        .get(b"bench:4096:3")
        .await
        .expect("get")
        .expect("kept")
        .to_vec();
    value[100] ^= 1;
    c.set(b"bench:4096:3", &value).await.expect("set");
    let out = bench(
        &node,
        &["--sizes", "4KiB", "--phases", "get", "--ops", "200"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("MISMATCH on bench:4096:3"), "{stderr}");
}

/// `--batch`: both APIs move batches clean, every value checked; rows
/// count values (not batches) and say the batch in their scenario.
#[tokio::test]
async fn batches_run_clean_and_count_values() {
    let node = Node::start(&[]);
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let path = json.path().to_str().expect("utf-8 path");
    for api in ["zerocopy", "inline"] {
        let out = bench(
            &node,
            &[
                "--api", api, "--sizes", "64KiB", "--ops", "20", "--batch", "4", "-c", "2",
                "--json", path,
            ],
        );
        assert!(
            out.status.success(),
            "{api}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(json.path()).expect("read json");
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 4, "{text}");
    for r in &rows {
        assert!(r.contains("\"scenario\":\"c2-b4\""), "{r}");
        assert!(
            r.contains("\"errors\":0") && r.contains("\"mismatches\":0"),
            "{r}"
        );
    }
    // 20 batches of 4 values per get phase (a put phase writes at least
    // every key once: 8 keys in 2 batches, then 20 batches).
    let gets: Vec<&&str> = rows
        .iter()
        .filter(|r| r.contains("\"op\":\"get\""))
        .collect();
    assert!(gets.iter().all(|r| r.contains("\"n\":80,")), "{text}");
    let out = bench(&node, &["--batch", "9", "--ops", "1"]);
    assert!(
        !out.status.success(),
        "a batch larger than --keys is refused"
    );
}
