//! A cluster of real `strata-server` processes on one real etcd, and a
//! small cluster-aware client that routes the way Redis Cluster clients do
//! (slot table from `CLUSTER SLOTS`, follow `-MOVED`, refresh when a node
//! stops answering), with a bound on every retry.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use strata_ring::{key_slot, NodeRecord, Ring, SLOTS};

use crate::etcd::Etcd;
use crate::{info_value, parse_reply, wait_until, within, RawConn, Resp, Server};

/// etcd lease of every test node: a killed node leaves the ring within
/// about this long.
pub const NODE_TTL_S: u32 = 2;
/// Nodes agree on a new ring well within this (lease expiry, watch, a
/// debug build on 2 busy cores).
pub const RING_TIMEOUT: Duration = Duration::from_secs(30);
/// Socket timeout of the cluster client: a node that was killed is found
/// out by a refused connect at once; this only bounds a stuck one.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Tries of one command (each after a redirect, a refresh or a
/// CLUSTERDOWN) before the client gives up and says why.
const CLIENT_ATTEMPTS: usize = 6;
/// Pause before retrying after a failure that a redirect does not explain.
const CLIENT_BACKOFF: Duration = Duration::from_millis(20);

/// One node of a [`Cluster`]: how it was started, so that it can be
/// started again after a kill with the same id, host and ports.
pub struct ClusterNode {
    pub id: String,
    pub host: String,
    pub capacity_bytes: u64,
    args: Vec<String>,
    port: u16,
    metrics_port: u16,
    server: Option<Server>,
}

impl ClusterNode {
    pub fn server(&self) -> &Server {
        self.server
            .as_ref()
            .unwrap_or_else(|| panic!("node {} is not running", self.id))
    }

    pub fn is_running(&self) -> bool {
        self.server.is_some()
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// etcd plus nodes `n0`, `n1`, ... on failure domains `h0`, `h1`, ...
pub struct Cluster {
    pub etcd: Etcd,
    pub nodes: Vec<ClusterNode>,
    replica_num: u32,
    /// Flags every node gets besides the cluster's own.
    extra: Vec<String>,
}

impl Cluster {
    /// Starts etcd and one node per pool size, and waits until every node
    /// has all of them in its ring.
    pub fn start(pools: &[&str], replica_num: u32) -> Cluster {
        Cluster::start_with(pools, replica_num, &[])
    }

    /// etcd alone; add nodes with [`Cluster::spawn_node_with`].
    pub fn empty(replica_num: u32, extra: &[&str]) -> Cluster {
        Cluster {
            etcd: Etcd::start(),
            nodes: Vec::new(),
            replica_num,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Like [`Cluster::start`], with `extra` flags for every node.
    pub fn start_with(pools: &[&str], replica_num: u32, extra: &[&str]) -> Cluster {
        let mut c = Cluster {
            etcd: Etcd::start(),
            nodes: Vec::new(),
            replica_num,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for pool in pools {
            c.spawn_node(pool);
        }
        c.wait_ring(pools.len());
        c
    }

    /// Starts one more node (without waiting for the ring); its index.
    pub fn spawn_node(&mut self, pool: &str) -> usize {
        self.spawn_node_with(pool, &[])
    }

    /// Like [`Cluster::spawn_node`], with `own` flags for this node only
    /// (kept for [`Cluster::restart`], e.g. its own `--ssd-path`).
    pub fn spawn_node_with(&mut self, pool: &str, own: &[&str]) -> usize {
        let i = self.nodes.len();
        let id = format!("n{i}");
        let args: Vec<String> = [
            "--metadata-server",
            &self.etcd.url(),
            "--cluster-name",
            "test",
            "--node-id",
            &id,
            "--host-name",
            &format!("h{i}"),
            "--node-ttl-s",
            &NODE_TTL_S.to_string(),
            "--replica-num",
            &self.replica_num.to_string(),
            "--cpu-memory-pool-size",
            pool,
        ]
        .map(String::from)
        .to_vec();
        let args: Vec<String> = args
            .into_iter()
            .chain(self.extra.iter().cloned())
            .chain(own.iter().map(|s| s.to_string()))
            .collect();
        let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        self.nodes.push(ClusterNode {
            id,
            host: format!("h{i}"),
            capacity_bytes: pool_bytes(pool),
            args,
            port: server.port(),
            metrics_port: server.metrics_port(),
            server: Some(server),
        });
        i
    }

    /// SIGKILL: the node cannot leave; the others find out when its lease
    /// expires.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.nodes[i].server.take() {
            s.kill();
        }
    }

    /// Starts a killed node again: same id, host, pool and ports, empty.
    pub fn restart(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        assert!(n.server.is_none(), "node {} is running", n.id);
        let args: Vec<&str> = n.args.iter().map(String::as_str).collect();
        n.server = Some(Server::start_on(n.port, n.metrics_port, &args));
    }

    /// The ring the running nodes should agree on, computed here with the
    /// placement crate the servers use (placement reads only id, host and
    /// capacity): the reference for where copies must be.
    pub fn expected_ring(&self) -> Ring {
        Ring::new(
            self.nodes
                .iter()
                .filter(|n| n.is_running())
                .map(|n| NodeRecord {
                    id: n.id.clone(),
                    resp_addr: n.addr().to_string(),
                    data_addr: String::new(),
                    host: n.host.clone(),
                    capacity_bytes: n.capacity_bytes,
                    tiers: Vec::new(),
                    incarnation: 0,
                    process: None,
                })
                .collect(),
        )
    }

    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i].server()
    }

    /// The running nodes.
    pub fn live(&self) -> impl Iterator<Item = &Server> {
        self.nodes.iter().filter_map(|n| n.server.as_ref())
    }

    /// RESP addresses of the running nodes (seeds for a client).
    pub fn seeds(&self) -> Vec<SocketAddr> {
        self.live().map(Server::addr).collect()
    }

    /// A cluster client seeded with every node ever started (a dead seed
    /// is skipped).
    pub fn client(&self) -> ClusterClient {
        ClusterClient::new(self.nodes.iter().map(ClusterNode::addr).collect())
    }

    /// Panics unless every running node has `n` nodes on its ring within
    /// [`RING_TIMEOUT`].
    pub fn wait_ring(&self, n: usize) {
        self.wait_metric("strata_ring_nodes", n as f64);
    }

    /// Panics unless every running node exports `name value` on
    /// `/metrics` within [`RING_TIMEOUT`]. (Read from `/metrics`, not
    /// `INFO cluster`, which the tests check on their own.)
    pub fn wait_metric(&self, name: &str, value: f64) {
        let ok = wait_until(within(RING_TIMEOUT), || {
            self.live().all(|s| s.try_metric(name) == Some(value))
        });
        assert!(
            ok,
            "not every node reached {name} {value} within {RING_TIMEOUT:?}: {:?}",
            self.live()
                .map(|s| (s.port(), s.try_metric(name)))
                .collect::<Vec<_>>()
        );
    }

    /// A `/metrics` sample summed over the running nodes.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.live().filter_map(|s| s.try_metric(name)).sum()
    }
}

/// "64MiB", "40GiB" as bytes (the sizes the tests use).
fn pool_bytes(pool: &str) -> u64 {
    let (n, unit) = pool.split_at(pool.len() - 3);
    let n: u64 = n.parse().expect("pool size");
    match unit {
        "MiB" => n << 20,
        "GiB" => n << 30,
        _ => panic!("pool size {pool}: use MiB or GiB"),
    }
}

/// A request on a fresh connection that fails instead of panicking (the
/// node may be going away).
pub fn try_request(addr: SocketAddr, args: &[&[u8]]) -> io::Result<Vec<u8>> {
    RawConn::try_connect(addr, CLIENT_IO_TIMEOUT)?.try_request(args)
}

/// A field of `INFO cluster`, or None if the node did not answer.
pub fn info_cluster_field(s: &Server, field: &str) -> Option<u64> {
    let r = try_request(s.addr(), &[b"INFO", b"cluster"]).ok()?;
    match parse_reply(&r) {
        Resp::Bulk(b) => info_value(&String::from_utf8_lossy(&b), field),
        _ => None,
    }
}

pub fn dbsize(s: &Server) -> Option<u64> {
    match parse_reply(&try_request(s.addr(), &[b"DBSIZE"]).ok()?) {
        Resp::Int(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// One slot range of `CLUSTER SLOTS`: first and last slot, then the
/// owner's and the replicas' RESP addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub nodes: Vec<SocketAddr>,
}

/// `CLUSTER SLOTS` of one node, parsed.
pub fn cluster_slots(addr: SocketAddr) -> io::Result<Vec<SlotRange>> {
    let reply = try_request(addr, &[b"CLUSTER", b"SLOTS"])?;
    match parse_reply(&reply) {
        // A fenced node (or one not joined yet) has no map to give.
        Resp::Error(e) => Err(io::Error::other(e)),
        r => Ok(parse_slots(&r)),
    }
}

fn parse_slots(r: &Resp) -> Vec<SlotRange> {
    r.as_array()
        .iter()
        .map(|range| {
            let items = range.as_array();
            let slot = |r: &Resp| u16::try_from(r.as_int()).expect("slot number");
            SlotRange {
                start: slot(&items[0]),
                end: slot(&items[1]),
                nodes: items[2..]
                    .iter()
                    .map(|n| {
                        let n = n.as_array();
                        let port = u16::try_from(n[1].as_int()).expect("port");
                        format!("{}:{port}", n[0].as_text())
                            .parse()
                            .expect("node address")
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Owner of every slot, from a slot map; None where no range covers it.
pub fn owner_table(ranges: &[SlotRange]) -> Vec<Option<SocketAddr>> {
    let mut table = vec![None; usize::from(SLOTS)];
    for r in ranges {
        for s in r.start..=r.end {
            assert!(table[usize::from(s)].is_none(), "slot {s} is in two ranges");
            table[usize::from(s)] = r.nodes.first().copied();
        }
    }
    table
}

/// A cluster-aware client over raw RESP.
pub struct ClusterClient {
    seeds: Vec<SocketAddr>,
    owners: Vec<Option<SocketAddr>>,
    conns: HashMap<SocketAddr, RawConn>,
}

impl ClusterClient {
    pub fn new(seeds: Vec<SocketAddr>) -> ClusterClient {
        let mut c = ClusterClient {
            seeds,
            owners: vec![None; usize::from(SLOTS)],
            conns: HashMap::new(),
        };
        c.refresh();
        c
    }

    /// Reloads the slot map from the first seed that answers with one
    /// covering every slot; false if none did.
    pub fn refresh(&mut self) -> bool {
        for &seed in &self.seeds {
            if let Ok(ranges) = cluster_slots(seed) {
                let owners = owner_table(&ranges);
                if owners.iter().all(Option::is_some) {
                    self.owners = owners;
                    return true;
                }
            }
        }
        false
    }

    fn conn(&mut self, addr: SocketAddr) -> io::Result<&mut RawConn> {
        match self.conns.entry(addr) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                Ok(e.insert(RawConn::try_connect(addr, CLIENT_IO_TIMEOUT)?))
            }
        }
    }

    /// Sends `args` (whose keys live in `key`'s slot) to the owner,
    /// following redirects; the reply, or why it failed after
    /// [`CLIENT_ATTEMPTS`] tries.
    pub fn request(&mut self, key: &[u8], args: &[&[u8]]) -> Result<Vec<u8>, String> {
        let slot = usize::from(key_slot(key));
        let mut last = String::new();
        for _ in 0..CLIENT_ATTEMPTS {
            let Some(addr) = self.owners[slot].or_else(|| self.seeds.first().copied()) else {
                return Err("no seeds".into());
            };
            match self.conn(addr).and_then(|c| c.try_request(args)) {
                Err(e) => {
                    self.conns.remove(&addr);
                    last = format!("{addr}: {e}");
                    std::thread::sleep(CLIENT_BACKOFF);
                    self.refresh();
                }
                Ok(r) if r.starts_with(b"-MOVED ") => {
                    last = String::from_utf8_lossy(&r).trim_end().to_string();
                    let to = last.rsplit(' ').next().and_then(|a| a.parse().ok());
                    match to {
                        Some(to) => self.owners[slot] = Some(to),
                        None => return Err(format!("unreadable redirect: {last}")),
                    }
                }
                Ok(r) if r.starts_with(b"-CLUSTERDOWN") || r.starts_with(b"-TRYAGAIN") => {
                    last = String::from_utf8_lossy(&r).trim_end().to_string();
                    std::thread::sleep(CLIENT_BACKOFF);
                    self.refresh();
                }
                Ok(r) => return Ok(r),
            }
        }
        Err(format!("gave up after {CLIENT_ATTEMPTS} tries: {last}"))
    }

    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let r = self.request(key, &[b"SET", key, value])?;
        if r == b"+OK\r\n" {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&r).trim_end().to_string())
        }
    }

    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let r = self.request(key, &[b"GET", key])?;
        match parse_reply(&r) {
            Resp::Bulk(v) => Ok(Some(v)),
            Resp::Nil => Ok(None),
            other => Err(format!("{other:?}")),
        }
    }

    /// `DEL key`: whether it removed the key.
    pub fn del(&mut self, key: &[u8]) -> Result<bool, String> {
        let r = self.request(key, &[b"DEL", key])?;
        match parse_reply(&r) {
            Resp::Int(n) => Ok(n > 0),
            other => Err(format!("{other:?}")),
        }
    }

    /// The owner of `key` in the client's current slot map.
    pub fn owner(&self, key: &[u8]) -> Option<SocketAddr> {
        self.owners[usize::from(key_slot(key))]
    }
}
