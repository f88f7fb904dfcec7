//! Routing: the slot map, one [`Node`] per address, and the retry loop that
//! sends each item to its slot's owner, follows `-MOVED`, and fails over to
//! replicas (reads) or to the new owner (writes) while a node is down.
//!
//! The map is learnt from any node (`CLUSTER SLOTS`), refreshed on a
//! redirect, on a failure, and every `health_check_interval_ms` by a
//! background task that also re-probes nodes marked down.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use futures::FutureExt;
use redis_protocol::resp2::types::BytesFrame;

use crate::config::ClientConfig;
use crate::node::{backoff, Idempotent, Node};
use crate::slots::SlotMap;
use crate::{Error, Result};

/// Refreshes of the map caused by failures are at least this far apart
/// (one caused by a redirect runs at once).
const REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(20);

/// Reads may be served by a replica while the owner is down; writes wait
/// for the cluster to hand the slot to a new owner.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Access {
    Read,
    Write,
}

/// The map and its generation (bumped on every install), so that tasks
/// that saw the same stale map refresh it once.
#[derive(Clone)]
struct Snapshot {
    map: Arc<SlotMap>,
    generation: u64,
}

/// One node's part of a round of `routed_batch`: the node, the indices of
/// its items, and what the operation answered for them.
type Answered<T> = (Arc<Node>, Vec<usize>, Result<Vec<Result<T>>>);

/// What one round of `routed_batch` leaves to do: the items to send again,
/// the error that sent the last of them back, and whether each is only a
/// redirect to a node that is up.
struct Retry {
    again: Vec<usize>,
    why: Option<Error>,
    only_redirects: bool,
}

pub(crate) struct Router {
    cfg: ClientConfig,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    map: RwLock<Snapshot>,
    /// Held while a refresh runs; when the last one started.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// This process's side of cross-memory attach (`ClientConfig::cma`).
    pub(crate) cma: Option<Arc<crate::cma::Local>>,
    /// `ClientConfig::tls`, loaded.
    tls: Option<Arc<crate::conn::Tls>>,
}

impl Router {
    /// Learns the map from the first seed that answers; fails only if no
    /// seed can be reached.
    pub(crate) async fn connect(cfg: ClientConfig) -> Result<Arc<Self>> {
        let first = cfg
            .seeds
            .first()
            .ok_or(Error::Invalid("no seed address"))?
            .clone();
        let tls = cfg.tls.as_ref().map(crate::conn::Tls::load).transpose()?;
        let router = Arc::new(Self {
            tls: tls.map(Arc::new),
            map: RwLock::new(Snapshot {
                map: Arc::new(SlotMap::single(&first, true)),
                generation: 0,
            }),
            cma: cfg
                .cma
                .then(|| crate::cma::Local::new(cfg.cma_lanes))
                .flatten()
                .map(Arc::new),
            cfg,
            nodes: Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(None),
        });
        let mut last = None;
        for seed in &router.cfg.seeds {
            let node = router.node(seed);
            match router.fetch_map(&node).await {
                Ok(map) => {
                    router.install(map);
                    return Ok(router);
                }
                // Reachable but not serving slots yet: keep the seed as the
                // owner of everything until a refresh knows better.
                Err(e) if !e.is_node_failure() => {
                    tracing::debug!(seed, error = %e, "no slot map yet");
                    router.install(SlotMap::single(seed, true));
                    return Ok(router);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(Error::Invalid("no seed address")))
    }

    /// Refreshes the map and probes down nodes every
    /// `health_check_interval_ms` until the router is dropped.
    pub(crate) fn spawn_health_check(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let every = Duration::from_millis(self.cfg.health_check_interval_ms);
        if every.is_zero() {
            return None;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(router) = weak.upgrade() else {
                    return;
                };
                router.health_check().await;
            }
        }))
    }

    async fn health_check(&self) {
        let snap = self.snapshot();
        if snap.map.cluster {
            self.refresh(snap.generation, true).await;
        }
        let down: Vec<Arc<Node>> = self
            .lock_nodes()
            .values()
            .filter(|n| n.is_down())
            .cloned()
            .collect();
        for node in down {
            // Success marks it up again.
            let _ = node.exchange(&[&[b"PING"]], Idempotent::Yes).await;
        }
    }

    fn lock_nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Node>>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node at `addr`, created on first use (its connection opens on
    /// its first request).
    pub(crate) fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = self.lock_nodes();
        if let Some(n) = nodes.get(addr) {
            return Arc::clone(n);
        }
        let io_timeout = self.cfg.timeout;
        let connect_timeout = if self.cfg.failover_enabled {
            io_timeout.min(self.failover_timeout())
        } else {
            io_timeout
        };
        let node = Arc::new(Node::new(
            addr,
            io_timeout,
            connect_timeout,
            self.cma.clone(),
            self.tls.clone(),
            self.cfg.tcp_congestion.clone(),
            crate::spin::Windows::of(&self.cfg),
        ));
        nodes.insert(addr.to_owned(), Arc::clone(&node));
        node
    }

    fn snapshot(&self) -> Snapshot {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn install(&self, map: SlotMap) {
        let mut snap = self.map.write().unwrap_or_else(|e| e.into_inner());
        snap.generation += 1;
        snap.map = Arc::new(map);
    }

    fn failover_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.failover_timeout_ms)
    }

    /// Owner, then replicas, of `slot` in the current map.
    pub(crate) fn slot_nodes(&self, slot: u16) -> Vec<String> {
        self.snapshot().map.nodes(slot).to_vec()
    }

    /// Every node of the current map.
    pub(crate) fn addrs(&self) -> Vec<String> {
        self.snapshot().map.addrs()
    }

    /// Where a request for `slot` goes now: its owner, or for a read whose
    /// owner just failed, the first replica that did not.
    fn target(&self, map: &SlotMap, slot: u16, access: Access) -> Arc<Node> {
        let set = map.nodes(slot);
        let Some(owner) = set.first() else {
            // Not served by anyone we know: a node will redirect us.
            return self.node(&self.cfg.seeds[0]);
        };
        let owner = self.node(owner);
        if !self.cfg.failover_enabled || !owner.down_recently() || access == Access::Write {
            return owner;
        }
        set[1..]
            .iter()
            .map(|a| self.node(a))
            .find(|n| !n.down_recently())
            .unwrap_or(owner)
    }

    /// Asks a live node for the map (a dead one last), unless another task
    /// did since `seen` or (`force` off) one ran very recently.
    pub(crate) async fn refresh(&self, seen: u64, force: bool) {
        let mut last = self.refreshing.lock().await;
        if self.snapshot().generation != seen {
            return;
        }
        if !force && last.is_some_and(|t| t.elapsed() < REFRESH_MIN_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        let mut addrs = self.snapshot().map.addrs();
        for seed in &self.cfg.seeds {
            if !addrs.contains(seed) {
                addrs.push(seed.clone());
            }
        }
        let mut nodes: Vec<Arc<Node>> = addrs.iter().map(|a| self.node(a)).collect();
        nodes.sort_by_key(|n| n.is_down());
        for node in nodes {
            match self.fetch_map(&node).await {
                Ok(map) => {
                    self.install(map);
                    return;
                }
                Err(e) => tracing::debug!(node = %node.addr, error = %e, "slot map refresh"),
            }
        }
    }

    /// `CLUSTER SLOTS` of `node`, else `CLUSTER SHARDS`; a node with
    /// neither (plain Redis) owns every slot.
    async fn fetch_map(&self, node: &Node) -> Result<SlotMap> {
        let slots: &[&[u8]] = &[b"CLUSTER", b"SLOTS"];
        let shards: &[&[u8]] = &[b"CLUSTER", b"SHARDS"];
        match node.call(slots, Idempotent::Yes, 0).await {
            Ok(frame) => SlotMap::from_slots(&frame, &node.addr),
            // A cluster member that cannot vouch for its map (fenced, or
            // not joined yet): ask another.
            Err(e) if e.is_cluster_transient() => Err(e),
            Err(Error::Server { .. }) => match node.call(shards, Idempotent::Yes, 0).await {
                Ok(frame) => SlotMap::from_shards(&frame, &node.addr),
                Err(Error::Server { .. }) => Ok(SlotMap::single(&node.addr, false)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Whether a failed item may be sent again (within the budget).
    fn retryable(&self, e: &Error, idem: Idempotent) -> bool {
        match e {
            Error::Moved { .. } => true,
            e if e.is_cluster_transient() => true,
            e if e.is_node_failure() => idem == Idempotent::Yes || e.surely_unsent(),
            _ => false,
        }
    }

    /// Runs `op` for a key's slot until it succeeds, fails for good, or the
    /// retry budget ends (see [`Router::routed_batch`]).
    pub(crate) async fn routed<T, F, Fut>(
        &self,
        slot: u16,
        access: Access,
        idem: Idempotent,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        // `map`, not `async move { fut.await }`: an async block keeps the
        // future it captured and, apart, the one it awaits, twice the
        // size (8 -> 17 KiB for `get_into`), and moves one into the other.
        let mut out = self
            .routed_batch(&[slot], access, idem, |node, _| {
                op(node).map(|r| r.map(|v| vec![Ok(v)]))
            })
            .await;
        out.pop()
            .unwrap_or_else(|| Err(Error::Protocol("no result".into())))
    }

    /// Sends the items (given by their slots) to their nodes, one `op` per
    /// node with the indices of its items, concurrently; `op` returns one
    /// result per index, or one error for all.
    ///
    /// Items that failed for a routing reason go again: at once to the node
    /// a `-MOVED` named (at most `retry_attempts` redirects in a row), else
    /// after a map refresh and a backoff. Socket failures and a cluster in
    /// transition are retried until `failover_timeout_ms` has passed with
    /// failover on, `retry_attempts` times with it off.
    pub(crate) async fn routed_batch<T, F, Fut>(
        &self,
        slots: &[u16],
        access: Access,
        idem: Idempotent,
        mut op: F,
    ) -> Vec<Result<T>>
    where
        F: FnMut(Arc<Node>, Vec<usize>) -> Fut,
        Fut: Future<Output = Result<Vec<Result<T>>>>,
    {
        let started = Instant::now();
        let mut out: Vec<Option<Result<T>>> = slots.iter().map(|_| None).collect();
        let mut redirect: Vec<Option<Arc<Node>>> = slots.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..slots.len()).collect();
        let (mut rounds, mut redirects) = (0u32, 0u32);
        while !pending.is_empty() {
            let snap = self.snapshot();
            let groups = self.group(&snap.map, slots, access, &pending, &mut redirect);
            // One node (every single-key call): awaited in place. Through
            // `join_all` the op's future (several KiB) would be moved into
            // and out of a `Vec` of `MaybeDone`s, a memcpy per call that
            // shows in a small PUT's CPU time.
            let done = if groups.len() == 1 {
                let (node, items) = groups.into_values().next().expect("one group");
                let outcome = match self.hold_write(&node, access) {
                    Some(wait) => Err(wait),
                    None => op(Arc::clone(&node), items.clone()).await,
                };
                vec![(node, items, outcome)]
            } else {
                let sends = groups.into_values().map(|(node, items)| {
                    let send = match self.hold_write(&node, access) {
                        Some(wait) => futures::future::Either::Left(std::future::ready(Err(wait))),
                        None => {
                            futures::future::Either::Right(op(Arc::clone(&node), items.clone()))
                        }
                    };
                    send.map(move |r| (node, items, r))
                });
                futures::future::join_all(sends).await
            };
            let Retry {
                again,
                why,
                only_redirects,
            } = self.settle(done, idem, &mut out, &mut redirect);
            let Some(why) = why else { break };
            rounds += 1;
            redirects = if only_redirects { redirects + 1 } else { 0 };
            if !self.in_budget(only_redirects, redirects, rounds, started) {
                let why = self.give_up(why);
                for &i in &again[1..] {
                    out[i] = Some(Err(why.duplicate()));
                }
                out[again[0]] = Some(Err(why));
                break;
            }
            self.refresh(snap.generation, only_redirects).await;
            if !only_redirects {
                backoff(rounds).await;
            }
            pending = again;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Protocol("no reply for an item".into()))))
            .collect()
    }

    /// The `pending` items by the node each goes to: the one a `-MOVED`
    /// named for it (taken from `redirect`), else its slot's in `map`.
    fn group(
        &self,
        map: &SlotMap,
        slots: &[u16],
        access: Access,
        pending: &[usize],
        redirect: &mut [Option<Arc<Node>>],
    ) -> BTreeMap<String, (Arc<Node>, Vec<usize>)> {
        let mut groups: BTreeMap<String, (Arc<Node>, Vec<usize>)> = BTreeMap::new();
        for &i in pending {
            let node = redirect[i]
                .take()
                .unwrap_or_else(|| self.target(map, slots[i], access));
            groups
                .entry(node.addr.clone())
                .or_insert_with(|| (node, Vec::new()))
                .1
                .push(i);
        }
        groups
    }

    /// Sorts one round's outcomes: the final ones into `out`, the items to
    /// send again into the [`Retry`] (with the node a `-MOVED` named in
    /// `redirect`). A node that failed is marked down.
    fn settle<T>(
        &self,
        done: Vec<Answered<T>>,
        idem: Idempotent,
        out: &mut [Option<Result<T>>],
        redirect: &mut [Option<Arc<Node>>],
    ) -> Retry {
        let mut again = Vec::new();
        let mut why: Option<Error> = None;
        // Every retry is a redirect to a node that is up: no waiting.
        let mut only_redirects = true;
        for (node, items, outcome) in done {
            let per_item: Vec<(usize, Result<T>)> = match outcome {
                Ok(results) => items.into_iter().zip(results).collect(),
                Err(e) => {
                    if e.is_node_failure() {
                        node.mark_down();
                    }
                    let mut per = Vec::with_capacity(items.len());
                    for &i in &items[1..] {
                        per.push((i, Err(e.duplicate())));
                    }
                    per.push((items[0], Err(e)));
                    per
                }
            };
            for (i, result) in per_item {
                match result {
                    Err(e) if self.retryable(&e, idem) => {
                        match &e {
                            Error::Moved { addr, .. } => {
                                let to = self.node(addr);
                                if self.cfg.failover_enabled && to.down_recently() {
                                    // The cluster has not failed over yet.
                                    only_redirects = false;
                                } else {
                                    redirect[i] = Some(to);
                                }
                            }
                            _ => only_redirects = false,
                        }
                        again.push(i);
                        why = Some(e);
                    }
                    result => out[i] = Some(result),
                }
            }
        }
        Retry {
            again,
            why,
            only_redirects,
        }
    }

    /// Whether `routed_batch` may send its items again: a run of
    /// `redirects` in a row up to `retry_attempts`; other failures until
    /// `failover_timeout_ms` since it `started` with failover on, else up to
    /// `retry_attempts` `rounds`.
    fn in_budget(
        &self,
        only_redirects: bool,
        redirects: u32,
        rounds: u32,
        started: Instant,
    ) -> bool {
        if only_redirects {
            redirects <= self.cfg.retry_attempts
        } else if self.cfg.failover_enabled {
            started.elapsed() < self.failover_timeout()
        } else {
            rounds <= self.cfg.retry_attempts
        }
    }

    /// A write for an owner that failed a moment ago is not sent into the
    /// same failure (a dead or cut-off host costs a whole `timeout` per
    /// try): it waits, refreshing the map, for the cluster to fail over or
    /// the hold to pass. The error it retries on instead.
    fn hold_write(&self, node: &Node, access: Access) -> Option<Error> {
        (access == Access::Write && self.cfg.failover_enabled && node.down_recently()).then(|| {
            Error::Server {
                code: "TRYAGAIN".into(),
                msg: format!(
                    "{} failed just now; waiting for the cluster to fail over",
                    node.addr
                ),
            }
        })
    }

    /// The error a caller sees when retries ran out: a redirect to a node
    /// that is down means the slot had no reachable owner in time.
    fn give_up(&self, why: Error) -> Error {
        match why {
            Error::Moved { slot, addr } if self.node(&addr).is_down() => Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("slot {slot}: owner {addr} is unreachable and no node took over in time"),
            )),
            why => why,
        }
    }

    /// A command about no key (`INFO`): the first node that answers.
    pub(crate) async fn any_node_call(&self, args: &[&[u8]]) -> Result<BytesFrame> {
        let mut nodes: Vec<Arc<Node>> = self
            .cfg
            .seeds
            .iter()
            .chain(&self.snapshot().map.addrs())
            .map(|a| self.node(a))
            .collect();
        nodes.sort_by_key(|n| n.is_down());
        let mut last = Error::Invalid("no node to ask");
        for node in nodes {
            match node
                .call(args, Idempotent::Yes, self.cfg.retry_attempts)
                .await
            {
                Err(e) if e.is_node_failure() => last = e,
                other => return other,
            }
        }
        Err(last)
    }
}
