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
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let key = format!("t{t}-{i}");
                    let value = pattern(key.as_bytes(), 1000 + t * 10 + i);
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
