//! Inline commands (values through RESP) against a real node.

mod common;

use common::{pattern, Node};

#[tokio::test]
async fn set_get_del_exists_round_trip() {
    let node = Node::start(&[]);
    let c = node.client().await;
    assert_eq!(c.get(b"missing").await.expect("get"), None);
    assert!(!c.exists(b"k").await.expect("exists"));
    for len in [0usize, 1, 4096, 1 << 20] {
        let value = pattern(b"k", len);
        c.set(b"k", &value).await.expect("set");
        assert_eq!(c.get(b"k").await.expect("get").as_deref(), Some(&value[..]));
    }
    assert!(c.exists(b"k").await.expect("exists"));
    assert!(c.del(b"k").await.expect("del"));
    assert!(!c.del(b"k").await.expect("del"));
}

#[tokio::test]
async fn reconnects_after_the_node_restarts() {
    let mut node = Node::start(&[]);
    let c = node.client().await;
    c.set(b"a", b"1").await.expect("set");
    node.restart();
    // The old connection is dead; an idempotent command reconnects and
    // runs on the fresh (empty) node.
    assert_eq!(c.get(b"a").await.expect("get after restart"), None);
    c.set(b"a", b"2").await.expect("set");
    assert_eq!(c.get(b"a").await.expect("get").as_deref(), Some(&b"2"[..]));
}

#[tokio::test]
async fn concurrent_tasks_share_one_client() {
    let node = Node::start(&[]);
    let c = std::sync::Arc::new(node.client().await);
    tasks_set_and_get(&c, "t", 16, 20, 1000).await;
}

/// `tasks` tasks each SET and GET back `rounds` values of their own
/// (about `len` bytes) through the shared client `c`.
async fn tasks_set_and_get(
    c: &std::sync::Arc<strata_client::Client>,
    prefix: &'static str,
    tasks: usize,
    rounds: usize,
    len: usize,
) {
    let tasks: Vec<_> = (0..tasks)
        .map(|t| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..rounds {
                    let key = format!("{prefix}{t}-{i}");
                    let value = pattern(key.as_bytes(), len + t * 10 + i);
                    c.set(key.as_bytes(), &value).await.expect("set");
                    let got = c.get(key.as_bytes()).await.expect("get");
                    assert_eq!(got.as_deref(), Some(&value[..]), "{key}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

#[tokio::test]
async fn value_size_reports_length_or_absence() {
    let node = Node::start(&[]);
    let c = node.client().await;
    assert_eq!(c.value_size(b"missing").await.expect("size"), None);
    for len in [0usize, 7, 1 << 20] {
        c.set(b"k", &pattern(b"k", len)).await.expect("set");
        assert_eq!(c.value_size(b"k").await.expect("size"), Some(len as u64));
    }
}

/// Pipelined SETs and GETs: one result per item, in order; a value too
/// large fails alone; a missing key is `None`; more than one batch's worth
/// of items is split transparently.
#[tokio::test]
async fn set_many_and_get_many_inline_answer_per_item() {
    let node = Node::start(&["--max-value-size", "1MiB"]);
    let c = node.client().await;
    let mut items: Vec<(Vec<u8>, Vec<u8>)> = (0..1500)
        .map(|i| {
            let key = format!("many:{i}").into_bytes();
            let value = pattern(&key, i % 3000);
            (key, value)
        })
        .collect();
    items[7].1 = vec![1u8; (1 << 20) + 1];
    let done = c.set_many(&items).await;
    assert_eq!(done.len(), items.len());
    for (i, r) in done.iter().enumerate() {
        if i == 7 {
            assert!(r.is_err(), "item 7 is over the limit");
        } else {
            r.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        }
    }
    let mut keys: Vec<Vec<u8>> = items.iter().map(|(k, _)| k.clone()).collect();
    keys.push(b"many:missing".to_vec());
    let got = c.get_many_inline(&keys).await;
    assert_eq!(got.len(), keys.len());
    for (i, r) in got.into_iter().enumerate() {
        let v = r.unwrap_or_else(|e| panic!("item {i}: {e}"));
        match i {
            7 | 1500 => assert_eq!(v, None, "item {i}"),
            _ => assert_eq!(v.as_deref(), Some(&items[i].1[..]), "item {i}"),
        }
    }
}

/// `spin_us`: calls from many tasks, some spinning and the rest sleeping
/// (at most a quarter of the cores spin at once), on both runtimes, all
/// get their own values back; out of range is refused at connect. Node
/// side polling on too (`busy_poll_us`), as a deployment tuned for
/// latency would run both.
#[test]
fn spinning_calls_get_their_replies_on_either_runtime() {
    let node = Node::start(&["--busy-poll-us", "200"]);
    for flavor in ["current_thread", "multi_thread"] {
        let rt = match flavor {
            "current_thread" => tokio::runtime::Builder::new_current_thread(),
            _ => tokio::runtime::Builder::new_multi_thread(),
        }
        .enable_all()
        .build()
        .expect("runtime");
        rt.block_on(async {
            let cfg = strata_client::ClientConfig {
                spin_us: 1000,
                ..strata_client::ClientConfig::new(node.addr())
            };
            let c = std::sync::Arc::new(
                strata_client::Client::connect_with(cfg)
                    .await
                    .expect("connect"),
            );
            tasks_set_and_get(&c, flavor, 8, 50, 4096).await;
            let base = || strata_client::ClientConfig::new(node.addr());
            for (name, bad) in [
                (
                    "spin_us",
                    strata_client::ClientConfig {
                        spin_us: 1001,
                        ..base()
                    },
                ),
                (
                    "stream_spin_us",
                    strata_client::ClientConfig {
                        stream_spin_us: 1001,
                        ..base()
                    },
                ),
                (
                    "echo_spin_us",
                    strata_client::ClientConfig {
                        echo_spin_us: 1001,
                        ..base()
                    },
                ),
            ] {
                let err = strata_client::Client::connect_with(bad)
                    .await
                    .err()
                    .expect("refused");
                let want = format!("{name} 1001 is out of range (allowed 0 ..= 1000)");
                assert!(err.to_string().contains(&want), "{err}");
            }
        });
    }
}
