//! Zero-copy commands (PUT, MPUT, GET with descriptor, RELEASE, PREFIX)
//! against a real node: payloads move over the data plane only.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{info_field, pattern, round_trip, wait_for, Node};
use strata_client::{Client, ClientConfig, Error};

const MIB: usize = 1 << 20;

#[tokio::test]
async fn round_trips_sequential() {
    let node = Node::start(&[]);
    let c = node.client().await;
    for len in [1, 4096, MIB, 64 * MIB] {
        round_trip(&c, &format!("seq-{len}"), len).await;
    }
    // Overwrite with a different size, then read back.
    round_trip(&c, "seq-1", 4096).await;
    // The inline GET sees the same bytes.
    let inline = c.get(b"seq-4096").await.expect("get").expect("present");
    assert!(inline[..] == pattern(b"seq-4096", 4096)[..]);
}

#[tokio::test]
async fn round_trips_from_16_concurrent_tasks() {
    let node = Node::start(&["--cpu-memory-pool-size", "2GiB"]);
    let shared = Arc::new(node.client().await);
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let shared = shared.clone();
            let addr = node.addr();
            tokio::spawn(async move {
                // Half the tasks share one client, half have their own.
                let own;
                let c: &Client = if t % 2 == 0 {
                    &shared
                } else {
                    own = Client::connect(addr).await.expect("connect");
                    &own
                };
                for len in [1, 4096, MIB] {
                    round_trip(c, &format!("t{t}-{len}"), len).await;
                }
                if t < 2 {
                    round_trip(c, &format!("t{t}-big"), 64 * MIB).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

#[tokio::test]
async fn batch_of_32() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let keys: Vec<String> = (0..32).map(|i| format!("batch-{i}")).collect();
    let sizes: Vec<usize> = (0..32).map(|i| 1 + i * 4099).collect();
    let mut srcs = Vec::new();
    for (key, &len) in keys.iter().zip(&sizes) {
        let mut b = c.alloc(len).expect("alloc");
        b.as_mut_slice()
            .copy_from_slice(&pattern(key.as_bytes(), len));
        srcs.push(b);
    }
    let items: Vec<_> = keys
        .iter()
        .zip(&srcs)
        .map(|(k, b)| (k.as_str(), b, 0..b.len()))
        .collect();
    for (i, r) in c.put_many(&items).await.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let mut dsts: Vec<_> = sizes
        .iter()
        .map(|&len| c.alloc(len).expect("alloc"))
        .collect();
    let mut gets: Vec<_> = keys
        .iter()
        .zip(dsts.iter_mut())
        .map(|(k, b)| (k.as_str(), b, 0))
        .collect();
    // One missing key in the batch fails alone.
    let mut missing = c.alloc(16).expect("alloc");
    gets.push(("batch-missing", &mut missing, 0));
    let results = c.get_many(&mut gets).await;
    assert!(
        matches!(results[32], Err(Error::NotFound)),
        "{:?}",
        results[32]
    );
    for (i, r) in results.into_iter().take(32).enumerate() {
        assert_eq!(r.unwrap_or_else(|e| panic!("get {i}: {e}")), sizes[i]);
    }
    for ((key, b), len) in keys.iter().zip(&dsts).zip(&sizes) {
        assert!(b.as_slice() == &pattern(key.as_bytes(), *len)[..], "{key}");
    }
    // Every lease went back: the node holds none for this connection.
    let leases = info_field(&c, "all", "leases_out").await;
    assert_eq!(leases, 0);
}

#[tokio::test]
async fn prefix_counts_the_leading_present_keys() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let b = c.alloc(4096).expect("alloc");
    for k in ["p0", "p1", "p2", "p4"] {
        c.put_from(k.as_bytes(), &b, 0..4096).await.expect("put");
    }
    assert_eq!(
        c.prefix(&["p0", "p1", "p2", "p3", "p4"])
            .await
            .expect("prefix"),
        3
    );
    assert_eq!(c.prefix(&["p3", "p0"]).await.expect("prefix"), 0);
    assert_eq!(c.prefix::<&str>(&[]).await.expect("prefix"), 0);
    // A key named PIN followed by an integer key is not the PIN option.
    c.put_from(b"PIN", &b, 0..1).await.expect("put");
    c.put_from(b"5", &b, 0..1).await.expect("put");
    assert_eq!(c.prefix(&["p0", "PIN", "5"]).await.expect("prefix"), 3);
    assert_eq!(c.prefix(&["p0", "PIN", "6"]).await.expect("prefix"), 2);
}

#[tokio::test]
async fn missing_key_is_not_found() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let mut b = c.alloc(4096).expect("alloc");
    assert!(matches!(
        c.get_into(b"nope", &mut b, 0).await,
        Err(Error::NotFound)
    ));
}

#[tokio::test]
async fn too_large_values_are_refused() {
    let node = Node::start(&["--max-value-size", "1MiB"]);
    let c = node.client().await;
    let b = c.alloc(2 * MIB).expect("alloc");
    let r = c.put_from(b"big", &b, 0..2 * MIB).await;
    assert!(matches!(r, Err(Error::TooLarge(_))), "{r:?}");
    assert!(!c.exists(b"big").await.expect("exists"));
    // A value larger than the destination is refused before any transfer.
    c.put_from(b"fits", &b, 0..MIB).await.expect("put");
    let mut small = c.alloc(4096).expect("alloc");
    let r = c.get_into(b"fits", &mut small, 0).await;
    assert!(matches!(r, Err(Error::TooLarge(_))), "{r:?}");
    let r = c.get_into(b"fits", &mut small, 4096).await;
    assert!(matches!(r, Err(Error::TooLarge(_))), "{r:?}");
}

#[tokio::test]
async fn put_nx_keeps_the_first_value() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let mut b = c.alloc(64).expect("alloc");
    b.as_mut_slice().fill(1);
    assert!(c.put_from_nx(b"nx", &b, 0..64).await.expect("nx"));
    b.as_mut_slice().fill(2);
    assert!(!c.put_from_nx(b"nx", &b, 0..64).await.expect("nx"));
    let got = c.get(b"nx").await.expect("get").expect("present");
    assert!(got.iter().all(|&x| x == 1));
}

#[tokio::test]
async fn deregistered_buffer_is_bad_descriptor_and_stores_nothing() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let b = c.alloc(4096).expect("alloc");
    let desc = c.descriptor(&b, 0..4096).expect("descriptor");
    b.close().await;
    let r = c.put_desc(b"gone", &desc, false).await;
    assert!(matches!(r, Err(Error::BadDescriptor(_))), "{r:?}");
    assert!(!c.exists(b"gone").await.expect("exists"));
    // The connection is still good.
    c.set(b"after", b"x").await.expect("set");
}

/// Kills a client while the node is pulling a 64 MiB PUT from it: the old
/// value stays (never a partial new one) and the node's memory returns to
/// where it was. Retried when the transfer finished before the cut, which
/// would prove nothing.
#[tokio::test]
async fn client_dropped_mid_transfer_leaves_no_partial_value() {
    let node = Node::start(&[]);
    let observer = node.client().await;
    let old = pattern(b"cut", MIB);
    observer.set(b"cut", &old).await.expect("set old");
    let used_before = info_field(&observer, "tiers", "dram_used_bytes").await;
    let mut caught = 0;
    for _ in 0..5 {
        let addr = node.addr();
        let dialed = tokio::task::spawn_blocking(move || put_and_cut(addr, b"cut"))
            .await
            .expect("victim thread");
        assert!(
            dialed,
            "the node never connected to the client's data plane"
        );
        // The pull may still finish after the cut (the node may have read
        // every byte already): the node settles on the whole new value, or
        // on the old one with the reservation freed, and never shows
        // anything else.
        let mut settled = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let got = observer.get(b"cut").await.expect("get");
            let is_new = got.as_deref().is_some_and(|v| v.iter().all(|&x| x == 0xee));
            let is_old = got.as_deref() == Some(&old[..]);
            assert!(is_new || is_old, "partial value visible after a cut PUT");
            if is_new {
                settled = Some(false);
                break;
            }
            if info_field(&observer, "tiers", "dram_used_bytes").await == used_before {
                settled = Some(true);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match settled {
            // Cut: the old value, and the reservation freed.
            Some(true) => caught += 1,
            // The whole transfer landed before the cut.
            Some(false) => observer.set(b"cut", &old).await.expect("restore old"),
            None => panic!(
                "neither the new value nor the old one with dram_used_bytes back to {used_before}"
            ),
        }
    }
    assert!(caught > 0, "every 64 MiB transfer finished before the cut");
}

/// Starts a 64 MiB `put_from` of `0xee` bytes to `key` over the TCP data
/// plane, on a runtime of its own, and drops that runtime (the client's
/// tasks and sockets with it, as when an engine process dies) as soon as
/// the node dials the client's data plane. Blocks; whether the node
/// dialed.
///
/// The watch runs on this thread, apart from the runtime that serves the
/// pull, so the cut lands right after the dial. Watched from the
/// test's own runtime, which also ran the serving task, a loaded CI
/// machine let every pull finish first, even when polling every
/// millisecond.
fn put_and_cut(addr: String, key: &'static [u8]) -> bool {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let cfg = ClientConfig {
        cma: false,
        ..ClientConfig::new(addr)
    };
    let victim = Arc::new(rt.block_on(Client::connect_with(cfg)).expect("connect"));
    let mut b = victim.alloc(64 * MIB).expect("alloc");
    b.as_mut_slice().fill(0xee);
    let put = {
        let victim = victim.clone();
        rt.spawn(async move { victim.put_from(key, &b, 0..64 * MIB).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let accepted = || {
        victim
            .data_plane_stats()
            .connections_accepted
            .load(Ordering::SeqCst)
    };
    while accepted() == 0 && !put.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50));
    }
    let dialed = accepted() > 0;
    drop(victim);
    // Cancels every task (the put, the data plane's serving connection)
    // and closes their sockets, waiting until that is done.
    drop(rt);
    dialed
}

/// A buffer dropped outside any runtime while its memory is being sent
/// to the node (its put cancelled) returns at once, on a current-thread
/// runtime that nobody is driving. It used to wait there for the read to
/// end, which only a drive of that same runtime could bring about: a hang.
/// The memory is freed once the read ends.
#[test]
fn buffer_dropped_mid_read_outside_its_runtime_returns_at_once() {
    let node = Node::start(&[]);
    let (rt, victim) = tcp_client_on_its_own_runtime(&node);
    let mut caught = 0;
    for _ in 0..5 {
        let mut b = victim.alloc(64 * MIB).expect("alloc");
        b.as_mut_slice().fill(0xee);
        let stats = victim.data_plane_stats();
        // Runs the put until the data plane is sending the buffer; then
        // the put is dropped, and the serving task waits in the runtime
        // with the read half sent.
        let mid_read = rt.block_on(put_until_mid_read(&victim, b"dropped", &b));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(b);
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "dropping the buffer blocked on a read that only this thread's runtime can end"
        );
        caught += usize::from(mid_read);
        // Driven again, the read ends (the node hangs up on the cancelled
        // PUT, or takes every byte) and the memory is freed.
        let ended = rt.block_on(wait_for(Duration::from_secs(10), || async {
            stats.reads_in_progress.load(Ordering::SeqCst) == 0
        }));
        assert!(ended, "the read never ended");
    }
    assert!(caught > 0, "no try dropped its buffer mid-read");
}

/// A PUT given up while the node is pulling it, whose buffer is then
/// written again at once, never stores a mix of the old and new bytes:
/// the dropped call closes its connection, and the node, asked before it
/// publishes a pulled value, stores nothing for a client that has gone.
/// Before, every try stored a 64 MiB value of both patterns.
#[test]
fn put_given_up_mid_pull_then_reused_stores_no_mixed_value() {
    let node = Node::start(&[]);
    let (rt, victim) = tcp_client_on_its_own_runtime(&node);
    let observer = rt.block_on(node.client());
    let mut b = victim.alloc(64 * MIB).expect("alloc");
    let mut caught = 0;
    for round in 0..5u64 {
        let key = format!("reused-{round}");
        b.as_mut_slice().fill(0xee);
        let stats = victim.data_plane_stats();
        let mid_read = rt.block_on(put_until_mid_read(&victim, key.as_bytes(), &b));
        // The put is dropped: its buffer is the caller's again.
        b.as_mut_slice().fill(0x11);
        let got = rt.block_on(async {
            let ended = wait_for(Duration::from_secs(10), || async {
                stats.reads_in_progress.load(Ordering::SeqCst) == 0
            })
            .await;
            assert!(ended, "the read never ended");
            observer.get(key.as_bytes()).await.expect("get")
        });
        assert_whole_or_nothing(round, got.as_deref());
        caught += usize::from(mid_read);
        // The next call connects afresh and works.
        rt.block_on(victim.put_from(b"after", &b, 0..MIB))
            .expect("put after");
    }
    assert!(caught > 0, "no try gave its put up mid-read");
    let abandoned = rt.block_on(info_field(&observer, "stats", "puts_abandoned"));
    assert!(abandoned > 0, "the node counted no abandoned put");
}

/// The same over cross-memory attach (a client on the node's host, the
/// default there): the node copies the value straight out of the client's
/// memory, so only the node's question before publishing stands between a
/// given-up PUT and a mixed value. Before, most tries stored 64 MiB of
/// both patterns, or of the new one only.
#[test]
fn put_given_up_over_cma_then_reused_stores_no_mixed_value() {
    let node = Node::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let victim = rt.block_on(node.client());
    let observer = rt.block_on(node.client());
    let mut b = victim.alloc(64 * MIB).expect("alloc");
    for round in 0..8u64 {
        let key = format!("cma-reused-{round}");
        b.as_mut_slice().fill(0xee);
        // Given up after a limit that grows each round (`limit`), short
        // enough that the node is still copying the 64 MiB value.
        let limit = Duration::from_micros(500 * (round + 1));
        let put = victim.put_from(key.as_bytes(), &b, 0..64 * MIB);
        let _ = rt.block_on(async { tokio::time::timeout(limit, put).await });
        b.as_mut_slice().fill(0x11);
        let got = rt.block_on(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            observer.get(key.as_bytes()).await.expect("get")
        });
        assert_whole_or_nothing(round, got.as_deref());
    }
    let cma_reads = rt.block_on(info_field(&observer, "stats", "cma_reads"));
    assert!(
        cma_reads > 0,
        "the node never copied over cross-memory attach"
    );
    let abandoned = rt.block_on(info_field(&observer, "stats", "puts_abandoned"));
    assert!(abandoned > 0, "no put was given up mid-copy");
}

/// A put of 64 MiB of `0xee` that was given up, its buffer then filled
/// with `0x11`, stored nothing or all of its old bytes: never a mix.
fn assert_whole_or_nothing(round: u64, stored: Option<&[u8]>) {
    if let Some(v) = stored {
        let old = v.iter().filter(|&&x| x == 0xee).count();
        assert!(
            v.len() == 64 * MIB && old == v.len(),
            "round {round}: stored {} bytes, {old} of them from before the reuse",
            v.len()
        );
    }
}

/// A current-thread runtime, driven only inside `block_on`, and a client
/// on it that keeps to the TCP data plane: while nothing drives the
/// runtime, a read the client's data plane is serving stands still.
fn tcp_client_on_its_own_runtime(node: &Node) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cfg = ClientConfig {
        cma: false,
        ..ClientConfig::new(node.addr())
    };
    let client = rt.block_on(Client::connect_with(cfg)).expect("connect");
    (rt, client)
}

/// Runs a put of all of `b` until the client's data plane is sending it
/// to the node, then drops it there (`true`), or sees it finish first
/// (`false`).
async fn put_until_mid_read(client: &Client, key: &[u8], b: &strata_client::Buffer) -> bool {
    let stats = client.data_plane_stats();
    let put = client.put_from(key, b, 0..b.len());
    tokio::pin!(put);
    loop {
        tokio::select! {
            biased;
            _ = &mut put => return false,
            () = tokio::task::yield_now() => {
                if stats.reads_in_progress.load(Ordering::SeqCst) > 0 {
                    return true;
                }
            }
        }
    }
}

/// More GETs than the node allows leases: the refused ones come back
/// `BUSY` and are retried alone once the batch's leases are released.
#[tokio::test]
async fn batch_over_the_lease_limit_retries_busy_items() {
    let node = Node::start(&["--max-leases", "4"]);
    let c = node.client().await;
    let keys: Vec<String> = (0..16).map(|i| format!("lease-{i}")).collect();
    let mut src = c.alloc(256).expect("alloc");
    for key in &keys {
        src.as_mut_slice()
            .copy_from_slice(&pattern(key.as_bytes(), 256));
        c.put_from(key.as_bytes(), &src, 0..256).await.expect("put");
    }
    let mut dsts: Vec<_> = keys.iter().map(|_| c.alloc(256).expect("alloc")).collect();
    let mut gets: Vec<_> = keys
        .iter()
        .zip(dsts.iter_mut())
        .map(|(k, b)| (k.as_str(), b, 0))
        .collect();
    for (i, r) in c.get_many(&mut gets).await.into_iter().enumerate() {
        assert_eq!(r.unwrap_or_else(|e| panic!("get {i}: {e}")), 256);
    }
    for (key, b) in keys.iter().zip(&dsts) {
        assert!(b.as_slice() == &pattern(key.as_bytes(), 256)[..], "{key}");
    }
}

/// A batch larger than one MPUT is split, and every item lands.
#[tokio::test]
async fn put_many_splits_batches_over_the_mput_limit() {
    let node = Node::start(&[]);
    let c = node.client().await;
    let n = strata_client::BATCH_MAX + 100;
    let mut src = c.alloc(16 * n).expect("alloc");
    for (i, chunk) in src.as_mut_slice().chunks_mut(16).enumerate() {
        chunk.copy_from_slice(&(i as u128).to_le_bytes());
    }
    let keys: Vec<String> = (0..n).map(|i| format!("many-{i}")).collect();
    let items: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), &src, 16 * i..16 * (i + 1)))
        .collect();
    assert!(c.put_many(&items).await.iter().all(Result::is_ok));
    for i in [
        0,
        strata_client::BATCH_MAX - 1,
        strata_client::BATCH_MAX,
        n - 1,
    ] {
        let got = c
            .get(keys[i].as_bytes())
            .await
            .expect("get")
            .expect("present");
        assert_eq!(&got[..], &(i as u128).to_le_bytes());
    }
}

/// Values up to `inline_get_max` come back in the GET reply (no data-plane
/// read; a batch asks at most `BATCH_INLINE_GET_MAX`), larger ones by the
/// data plane; with the limit at 0 every value takes the data plane. Same
/// bytes either way, at an offset, one at a time and in mixed batches.
#[tokio::test]
async fn small_values_come_back_inline_and_large_ones_by_the_data_plane() {
    let node = Node::start(&[]);
    let inline = node.network_client().await;
    // The documented defaults.
    let limit = 8 * MIB;
    assert_eq!(inline.config().inline_get_max, limit as u64);
    assert_eq!(strata_client::BATCH_INLINE_GET_MAX, 256 * 1024);
    let leased = Client::connect_with(strata_client::ClientConfig {
        cma: false,
        inline_get_max: 0,
        ..strata_client::ClientConfig::new(node.addr())
    })
    .await
    .expect("connect");
    let sizes = [
        1usize,
        100,
        65536,
        256 * 1024,
        256 * 1024 + 1,
        limit,
        limit + 1,
    ];
    for len in sizes {
        round_trip(&inline, &format!("mix-{len}"), len).await;
    }
    let served = || info_field(&inline, "stats", "data_reads_served");
    // A single read from 1 MiB goes in pieces; a batch's reads do not.
    let singles: u64 = sizes.iter().map(|&l| pieces(l)).sum();
    let all = sizes.len() as u64;
    let over = pieces(limit + 1);
    // The round trips' own reads (only the value over the limit went by
    // the data plane) are counted before the figures below start.
    wait_for(Duration::from_secs(5), || async { served().await >= over }).await;
    assert_eq!(served().await, over, "the round trips' reads");
    for (c, singles, batched) in [(&inline, over, 3), (&leased, singles, all)] {
        let before = served().await;
        for len in sizes {
            let key = format!("mix-{len}");
            let mut dst = c.alloc(len + 7).expect("alloc");
            assert_eq!(
                c.get_into(key.as_bytes(), &mut dst, 7).await.expect("get"),
                len
            );
            assert!(
                dst.as_slice()[7..] == pattern(key.as_bytes(), len)[..],
                "{key}"
            );
            assert!(dst.as_slice()[..7].iter().all(|&b| b == 0), "{key}");
        }
        // The node counts a read once its write returns, which can be
        // after the reader has every byte.
        let want = before + singles;
        wait_for(Duration::from_secs(5), || async { served().await >= want }).await;
        assert_eq!(served().await - before, singles, "single GETs");
        let before = served().await;
        let mut bufs: Vec<_> = sizes.iter().map(|&l| c.alloc(l).expect("alloc")).collect();
        let mut items: Vec<_> = bufs
            .iter_mut()
            .zip(sizes)
            .map(|(b, l)| (format!("mix-{l}"), b, 0))
            .collect();
        for (r, len) in c.get_many(&mut items).await.into_iter().zip(sizes) {
            assert_eq!(r.expect("get_many"), len);
        }
        for ((key, b, _), len) in items.iter().zip(sizes) {
            assert!(b.as_slice() == &pattern(key.as_bytes(), len)[..], "{key}");
        }
        let want = before + batched;
        wait_for(Duration::from_secs(5), || async { served().await >= want }).await;
        assert_eq!(served().await - before, batched, "a batch");
        // A destination too small is refused the same way inline or not.
        let mut small = c.alloc(10).expect("alloc");
        let e = c.get_into(b"mix-100", &mut small, 0).await.unwrap_err();
        assert!(matches!(e, Error::TooLarge(_)), "{e:?}");
    }
    assert_eq!(info_field(&inline, "stats", "leases_out").await, 0);
}

/// PUTs over TCP of values up to `inline_put_max` carry their payload in
/// the command (the node never dials this client's data plane), larger
/// ones are pulled; with the limit at 0 every PUT is pulled. NX keeps its
/// meaning either way, and every byte lands, alone or in a mixed batch.
#[tokio::test]
async fn small_puts_go_inline_and_large_ones_are_pulled() {
    let node = Node::start(&[]);
    let inline = node.network_client().await;
    // The documented default.
    let limit = 4 * MIB;
    assert_eq!(inline.config().inline_put_max, limit as u64);
    let pulled = Client::connect_with(strata_client::ClientConfig {
        cma: false,
        inline_put_max: 0,
        ..strata_client::ClientConfig::new(node.addr())
    })
    .await
    .expect("connect");
    let sizes = [0usize, 1, 65536, limit, limit + 1, limit + 3 * MIB];
    let over: u64 = sizes[4..].iter().map(|&l| pieces(l)).sum();
    let every: u64 = sizes.iter().map(|&l| pieces(l)).sum();
    for (c, name, pulls) in [(&inline, "inl", over), (&pulled, "pull", every)] {
        let served = || c.data_plane_stats().reads_served.load(Ordering::SeqCst);
        let before = served();
        for len in sizes {
            let key = format!("{name}-{len}");
            let mut src = c.alloc(len + 5).expect("alloc");
            src.as_mut_slice()[5..].copy_from_slice(&pattern(key.as_bytes(), len));
            c.put_from(key.as_bytes(), &src, 5..5 + len)
                .await
                .expect("put");
            let got = c.get(key.as_bytes()).await.expect("get").expect("present");
            assert!(got[..] == pattern(key.as_bytes(), len)[..], "{key}");
            src.as_mut_slice().fill(9);
            let stored = c.put_from_nx(key.as_bytes(), &src, 5..5 + len).await;
            assert!(!stored.expect("put nx"), "{key}: NX over an existing key");
        }
        // Counted once the write of a read returns, maybe after the node
        // has acknowledged the PUT.
        let want = before + pulls;
        wait_for(Duration::from_secs(5), || async { served() >= want }).await;
        assert_eq!(served() - before, pulls, "{name}: data-plane reads");

        // A batch: the values up to the limit as pipelined SETs, the rest
        // in one MPUT (one read per pulled value), each byte where it
        // belongs whatever way it went.
        let before = served();
        let keys: Vec<String> = sizes.iter().map(|l| format!("{name}-batch-{l}")).collect();
        let total: usize = sizes.iter().sum();
        let mut src = c.alloc(total + 3).expect("alloc");
        let mut ranges = Vec::new();
        let mut at = 3;
        for (key, &len) in keys.iter().zip(&sizes) {
            src.as_mut_slice()[at..at + len].copy_from_slice(&pattern(key.as_bytes(), len));
            ranges.push(at..at + len);
            at += len;
        }
        let items: Vec<_> = keys
            .iter()
            .zip(&ranges)
            .map(|(k, r)| (k.as_str(), &src, r.clone()))
            .collect();
        for (r, key) in c.put_many(&items).await.into_iter().zip(&keys) {
            r.unwrap_or_else(|e| panic!("{key}: {e}"));
        }
        for (key, &len) in keys.iter().zip(&sizes) {
            let got = c.get(key.as_bytes()).await.expect("get").expect("present");
            assert!(got[..] == pattern(key.as_bytes(), len)[..], "{key}");
        }
        let pulled_in_batch = sizes
            .iter()
            .filter(|&&l| l > 0 && l as u64 > c.config().inline_put_max)
            .count() as u64;
        let want = before + pulled_in_batch;
        wait_for(Duration::from_secs(5), || async { served() >= want }).await;
        assert_eq!(
            served() - before,
            pulled_in_batch,
            "{name}: a batch's data-plane reads"
        );
    }
}

/// Data-plane reads that move one value of `len` bytes read alone: none
/// for an empty one, and from 1 MiB one per piece of at least 512 KiB, on
/// up to 4 connections.
fn pieces(len: usize) -> u64 {
    let piece = strata_rdma::tcp::SPLIT_PIECE_BYTES_MIN as usize;
    match len {
        0 => 0,
        _ => (len / piece).clamp(1, strata_rdma::tcp::CONNS_PER_PEER_MAX) as u64,
    }
}

/// A batch of inline PUTs far larger than the socket's buffers goes out
/// in one vectored write that the kernel takes piece by piece: every
/// value lands whole, none on the data plane.
#[tokio::test]
async fn an_inline_batch_larger_than_the_socket_buffers_lands_whole() {
    let node = Node::start(&["--cpu-memory-pool-size", "256MiB"]);
    let c = node.network_client().await;
    let n = 48;
    let keys: Vec<String> = (0..n).map(|i| format!("big-batch-{i}")).collect();
    let mut src = c.alloc(n * MIB).expect("alloc");
    for (key, chunk) in keys.iter().zip(src.as_mut_slice().chunks_mut(MIB)) {
        chunk.copy_from_slice(&pattern(key.as_bytes(), MIB));
    }
    let items: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), &src, i * MIB..(i + 1) * MIB))
        .collect();
    for (r, key) in c.put_many(&items).await.into_iter().zip(&keys) {
        r.unwrap_or_else(|e| panic!("{key}: {e}"));
    }
    assert_eq!(c.data_plane_stats().reads_served.load(Ordering::SeqCst), 0);
    for key in &keys {
        let got = c.get(key.as_bytes()).await.expect("get").expect("present");
        assert!(got[..] == pattern(key.as_bytes(), MIB)[..], "{key}");
    }
}

/// A single GET into a destination of at least `split_get_min` bytes asks
/// for the value's two halves on two connections at once: every byte lands
/// whatever the value's length within the destination (none past it), the
/// node sees one more connection, and no byte goes by the data plane. With
/// the split off the same reads go whole, on one connection.
#[tokio::test]
async fn large_single_gets_come_as_two_halves() {
    let node = Node::start(&[]);
    for split in [true, false] {
        let c = Client::connect_with(strata_client::ClientConfig {
            cma: false,
            split_get_min: if split { MIB as u64 } else { 0 },
            ..strata_client::ClientConfig::new(node.addr())
        })
        .await
        .expect("connect");
        let lens = [0usize, 1, 4096, 512 * 1024, 512 * 1024 + 1, MIB - 1, MIB];
        let clients = info_field(&c, "clients", "connected_clients").await;
        c.set(b"half-0", b"").await.expect("set");
        for len in &lens[1..] {
            round_trip(&c, &format!("half-{len}"), *len).await;
        }
        let served = info_field(&c, "stats", "data_reads_served").await;
        let mut dst = c.alloc(MIB + 7 + 5).expect("alloc");
        for len in lens {
            let key = format!("half-{len}");
            dst.as_mut_slice().fill(0xee);
            // A destination of exactly 1 MiB from offset 7 (5 bytes past it).
            let got = c.get_into(key.as_bytes(), &mut dst, 7).await;
            assert_eq!(got.expect("get"), len, "{key}");
            let b = dst.as_slice();
            assert!(b[7..7 + len] == pattern(key.as_bytes(), len)[..], "{key}");
            assert!(
                b[..7].iter().chain(&b[7 + len..]).all(|&x| x == 0xee),
                "{key}"
            );
        }
        let more = u64::from(split);
        let now = info_field(&c, "clients", "connected_clients").await;
        assert_eq!(now, clients + more, "split {split}");
        let reads = info_field(&c, "stats", "data_reads_served").await;
        assert_eq!(reads, served, "split {split}: every value inline");
        // Too small a destination is refused the same way.
        let e = c.get_into(b"half-1048576", &mut dst, 13).await.unwrap_err();
        assert!(matches!(e, Error::TooLarge(_)), "{e:?}");
        let e = c.get_into(b"half-none", &mut dst, 7).await.unwrap_err();
        assert!(matches!(e, Error::NotFound), "{e:?}");
    }
}

/// Halves read while another client overwrites the key come from one
/// write, never half of one value and half of another: halves of two
/// writes make the client read the value again, whole, so no GET fails.
/// Two values of one length, each filled with one byte, make a torn read
/// plain (without the check this test fails within a few hundred reads).
#[tokio::test]
async fn halves_of_a_value_overwritten_meanwhile_are_never_mixed() {
    let node = Node::start(&["--cpu-memory-pool-size", "1GiB"]);
    let reader = Client::connect_with(strata_client::ClientConfig {
        cma: false,
        split_get_min: MIB as u64,
        ..strata_client::ClientConfig::new(node.addr())
    })
    .await
    .expect("connect");
    let writer = node.network_client().await;
    let mut bufs = Vec::new();
    for fill in [0xa1u8, 0xb2] {
        let mut b = writer.alloc(MIB).expect("alloc");
        b.as_mut_slice().fill(fill);
        bufs.push(b);
    }
    writer
        .put_from(b"torn", &bufs[0], 0..MIB)
        .await
        .expect("put");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let b = &bufs[(n % 2) as usize];
                writer
                    .put_from(b"torn", b, 0..MIB)
                    .await
                    .expect("overwrite");
                n += 1;
            }
            n
        })
    };
    let mut dst = reader.alloc(MIB).expect("alloc");
    let mut seen = [0u32; 2];
    for _ in 0..300 {
        let len = reader.get_into(b"torn", &mut dst, 0).await.expect("get");
        assert_eq!(len, MIB);
        let first = dst.as_slice()[0];
        let mixed = dst.as_slice().iter().position(|&x| x != first);
        assert_eq!(mixed, None, "a read mixed two writes");
        match first {
            0xa1 => seen[0] += 1,
            0xb2 => seen[1] += 1,
            other => panic!("byte {other:#x}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let overwrites = writes.await.expect("writer");
    assert!(overwrites > 10, "{overwrites} writes");
    assert!(seen[0] > 0 && seen[1] > 0, "both values read: {seen:?}");
}
