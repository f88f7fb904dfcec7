//! The command table and dispatch. Each command lives in its own file with
//! one `run` function that parses its arguments, applies them to the node
//! and builds the reply.
//!
//! The table is the single list of commands: dispatch, arity checks,
//! `COMMAND`, `COMMAND DOCS`, per-command metrics and `INFO commandstats`
//! all read it, so they can never disagree.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};
use strata_tiering::Value;

use crate::clock::RunClock;
pub use crate::errors::{store_error, transfer_error};
use crate::node::Node;
use crate::pubsub::keyspace::Event;
use crate::session::Session;
use crate::tiers::{BringIn, Promote};

mod auth;
mod client;
mod cluster;
mod command;
mod config;
mod dbsize;
mod del;
mod echo;
mod exists;
mod expire;
mod flushall;
mod get;
mod hello;
mod info;
mod keys;
mod mget;
mod mput;
mod mset;
mod ping;
mod prefix;
mod publish;
mod pubsub;
mod put;
mod quit;
mod release;
mod scan;
mod select;
mod set;
mod strata_apply;
mod strata_cma;
mod strata_handoff;
mod strata_meta;
mod strata_replicate;
mod strata_vouch;
mod strlen;
mod subscribe;
mod ttl;
mod unsubscribe;

/// What a command produces: a reply, or values to be written straight from
/// store memory.
pub enum Out {
    Reply(Reply),
    Value(Option<Value>),
    Values(Vec<Option<Value>>),
    /// Bytes `start..end` of a value, with the value's version and length:
    /// `[version, len, bulk]` (`GET key desc INLINE n RANGE off len`).
    Range {
        value: Value,
        start: usize,
        end: usize,
    },
    /// Work that waits on a transfer (PUT): the connection awaits it
    /// before the next request, so replies stay in order.
    Later(Later),
    /// Work before the request can run: missing keys are fetched from the
    /// previous holders of their slot or promoted from NVMe, or a writer
    /// waits for room in the spill queue. Then the request runs again
    /// (once); an error is the reply instead.
    Rerun(Rerun),
}

pub type Later = Pin<Box<dyn Future<Output = Reply> + Send + 'static>>;
pub type Rerun = Pin<Box<dyn Future<Output = Result<(), CommandError>> + Send + 'static>>;

/// How long a writer waits for the spill queue before writing anyway (its
/// evictions may then be dropped rather than kept on NVMe).
const SPILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Reply(r) => f.debug_tuple("Reply").field(r).finish(),
            Out::Value(v) => f.debug_tuple("Value").field(v).finish(),
            Out::Values(v) => f.debug_tuple("Values").field(v).finish(),
            Out::Range { value, start, end } => f
                .debug_struct("Range")
                .field("value", value)
                .field("start", start)
                .field("end", end)
                .finish(),
            Out::Later(_) => f.write_str("Later"),
            Out::Rerun(_) => f.write_str("Rerun"),
        }
    }
}

impl Out {
    fn is_error(&self) -> bool {
        matches!(self, Out::Reply(Reply::Error(_)))
    }
}

impl From<Reply> for Out {
    fn from(r: Reply) -> Out {
        Out::Reply(r)
    }
}

impl From<CommandError> for Out {
    fn from(e: CommandError) -> Out {
        Out::Reply(Reply::Error(e))
    }
}

/// Everything a command may touch.
pub struct Ctx<'a> {
    pub node: &'a Arc<Node>,
    pub session: &'a mut Session,
    pub now_ms: u64,
    /// Applied on behalf of another node (`STRATA.APPLY`): never routed or
    /// replicated again.
    pub internal: bool,
    /// Second execution after a hand-off: do not ask again.
    pub rerun: bool,
}

impl Ctx<'_> {
    /// Publishes a keyspace event for a client's command (never for one
    /// applied on behalf of another node: its owner published it).
    pub fn notify(&self, event: Event, key: &[u8]) {
        if !self.internal {
            self.node.notify_owned(event, key);
        }
    }

    /// For commands that read keys: any of `keys` missing from DRAM is
    /// brought in first, then the request runs again. A key below DRAM is
    /// promoted from NVMe; one missing while this node is still receiving
    /// the slots of a ring change is fetched from its previous holders.
    /// `None` = go ahead.
    pub fn fetch_missing(&self, keys: &[Bytes]) -> Option<Out> {
        self.bring_in(keys, Promote::All)
    }

    /// For reads that looked `keys` up in DRAM and missed
    /// (`Store::get_present`): brings them in as [`Ctx::fetch_missing`]
    /// does (`Some`: run again), or else counts each as a miss and
    /// notifies it. Looking first costs a hit one index lookup, not two.
    pub fn missed(&self, keys: &[Bytes]) -> Option<Out> {
        if let Some(out) = self.fetch_missing(keys) {
            return Some(out);
        }
        for key in keys {
            self.node.store.note_miss();
            self.notify(Event::KeyMiss, key);
        }
        None
    }

    /// Like [`Ctx::fetch_missing`], without promoting from NVMe: for
    /// commands that handle a key below DRAM themselves (`DEL`).
    pub fn fetch_from_peers(&self, keys: &[Bytes]) -> Option<Out> {
        self.bring_in(keys, Promote::None)
    }

    /// Promotes `keys` from NVMe only, never asking other nodes (for
    /// `STRATA.HANDOFF`, which another node sends while it fetches).
    pub fn fetch_from_nvme(&self, keys: &[Bytes]) -> Option<Out> {
        self.bring_in_from(keys, Promote::All, false)
    }

    /// For commands that only ask whether keys exist (`EXISTS`, `PREFIX`
    /// without `PIN`): keys below DRAM are answered from the NVMe index by
    /// [`Ctx::exists`]; only those it cannot tell about (recovered at
    /// start) are promoted first.
    pub fn fetch_for_existence(&self, keys: &[Bytes]) -> Option<Out> {
        self.bring_in(keys, Promote::Unknown)
    }

    /// Whether `key` exists in DRAM or, by the NVMe index, below it.
    pub fn exists(&self, key: &[u8]) -> bool {
        self.node.store.exists(key, self.now_ms)
            || self
                .node
                .spill
                .as_ref()
                .is_some_and(|s| s.exists_below(key, self.now_ms) == Some(true))
    }

    fn bring_in(&self, keys: &[Bytes], promote: Promote) -> Option<Out> {
        self.bring_in_from(keys, promote, true)
    }

    /// Keys missing from DRAM are promoted from NVMe (as `promote` says)
    /// and, with `peers` while a ring change is settling, fetched from
    /// their previous holders; then the request runs again.
    fn bring_in_from(&self, keys: &[Bytes], promote: Promote, peers: bool) -> Option<Out> {
        if self.rerun || self.internal {
            return None;
        }
        let node = self.node;
        let transition = peers && node.cluster.in_transition();
        let spill = node.spill.as_deref();
        let plan = BringIn::plan(&node.store, spill, keys, promote, transition, self.now_ms)?;
        let node = node.clone();
        let now = self.now_ms;
        Some(Out::Rerun(Box::pin(async move {
            if !plan.elsewhere.is_empty() {
                crate::services::repair::fetch(&node, plan.elsewhere).await;
            }
            let Some(spill) = &node.spill else {
                return Ok(());
            };
            let found = crate::tiers::promote(&node.store, spill, plan.below, now).await?;
            let hits = &node.metrics.counters.nvme_hits_total;
            hits.fetch_add(found, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })))
    }

    /// For writes: while the spill queue is nearly full, wait for room
    /// first (once), so that the values this write evicts are kept on NVMe
    /// instead of dropped. `None` = go ahead.
    pub fn wait_for_room(&self) -> Option<Out> {
        let spill = self.node.spill.as_ref()?;
        if self.rerun || self.internal || !spill.congested() {
            return None;
        }
        let spill = spill.clone();
        Some(Out::Rerun(Box::pin(async move {
            spill.wait_for_room(SPILL_WAIT).await;
            Ok(())
        })))
    }

    /// After a local write of `keys` succeeded with `reply`: copies the
    /// values to the rest of their replica set, then replies. The reply
    /// waits for the replicas so an acknowledged value survives the loss
    /// of any `copies - 1` nodes: a copy that could not be made turns it
    /// into `-NOREPLICAS`.
    pub fn replicate(&self, keys: Vec<Bytes>, copies: Option<u32>, reply: Reply) -> Out {
        use crate::services::replicate;
        let copies = copies.unwrap_or(self.node.cfg.replica_num) as usize;
        if self.internal || self.node.cluster.standalone() || copies <= 1 {
            return reply.into();
        }
        let node = self.node.clone();
        let now = self.now_ms;
        Out::Later(Box::pin(async move {
            let mut all = true;
            for key in keys {
                let targets = replicate::targets(&node, &key, copies);
                match node.store.peek_with_expiry(&key, now) {
                    Ok(Some((value, expire))) => {
                        all &=
                            replicate::push_write(&node, key, value, expire, targets, copies).await;
                    }
                    Ok(None) => {}
                    Err(e) => return store_error(e).into(),
                }
            }
            replicate::write_reply(&node, all, reply)
        }))
    }

    /// Forwards a delete (`DEL`/`UNLINK`, key by key) or a TTL change to
    /// each key's replicas.
    pub fn forward(&self, args: &[Bytes], reply: Reply) -> Out {
        use crate::services::replicate;
        if self.internal || self.node.cluster.standalone() || args.len() < 2 {
            return reply.into();
        }
        let copies = self.node.cfg.replica_num as usize;
        let per_key = matches!(args[0].to_ascii_uppercase().as_slice(), b"DEL" | b"UNLINK");
        let calls: Vec<(Vec<_>, Vec<Bytes>)> = if per_key {
            // A delete goes to every other node, not only the key's replica
            // set: a node outside the set may still hold a copy from a ring
            // change (about to be handed back), and a copy that outlives
            // the delete would come back. Deletes are rare next to reads
            // and writes of KV-cache blocks, so the fan-out is cheap.
            let others: Vec<_> = self
                .node
                .cluster
                .ring()
                .nodes()
                .iter()
                .filter(|n| n.id != self.node.cluster.me.id)
                .cloned()
                .collect();
            vec![(others, args.to_vec())]
        } else {
            vec![(
                replicate::targets(self.node, &args[1], copies),
                args.to_vec(),
            )]
        };
        if calls.iter().all(|(t, _)| t.is_empty()) {
            return reply.into();
        }
        let node = self.node.clone();
        Out::Later(Box::pin(async move {
            for (targets, args) in calls {
                replicate::forward(&node, targets, args).await;
            }
            reply
        }))
    }
}

/// How a command is dispatched and described.
#[derive(Debug)]
pub struct Spec {
    /// Upper case, as matched.
    pub name: &'static str,
    /// Redis convention: N = exactly N arguments including the name,
    /// -N = at least N.
    pub arity: i32,
    /// Allowed before AUTH.
    pub no_auth: bool,
    pub write: bool,
    /// First key, last key (-1 = last argument), step — what cluster
    /// clients read from `COMMAND` to route.
    pub keys: (i32, i32, i32),
    pub group: &'static str,
    pub summary: &'static str,
    pub run: fn(&mut Ctx<'_>, &[Bytes]) -> Out,
}

const fn spec(
    name: &'static str,
    arity: i32,
    keys: (i32, i32, i32),
    group: &'static str,
    summary: &'static str,
    run: fn(&mut Ctx<'_>, &[Bytes]) -> Out,
) -> Spec {
    Spec {
        name,
        arity,
        no_auth: false,
        write: false,
        keys,
        group,
        summary,
        run,
    }
}

const fn open(mut s: Spec) -> Spec {
    s.no_auth = true;
    s
}

const fn write(mut s: Spec) -> Spec {
    s.write = true;
    s
}

const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
const ONE_KEY: (i32, i32, i32) = (1, 1, 1);
const ALL_KEYS: (i32, i32, i32) = (1, -1, 1);

/// Sorted by name: looked up by binary search.
#[rustfmt::skip]
pub static COMMANDS: &[Spec] = &[
    open(spec("AUTH", -2, NO_KEYS, "connection", "Authenticates the connection.", auth::run)),
    spec("CLIENT", -2, NO_KEYS, "connection", "Connection name, id and library info.", client::run),
    spec("CLUSTER", -2, NO_KEYS, "cluster", "The ring in Redis Cluster form: SHARDS, SLOTS, NODES, INFO, KEYSLOT, MYID.", cluster::run),
    spec("COMMAND", -1, NO_KEYS, "server", "Describes the commands.", command::run),
    spec("CONFIG", -2, NO_KEYS, "server", "Reads configuration values (CONFIG GET); CONFIG SET changes notify-keyspace-events.", config::run),
    spec("DBSIZE", 1, NO_KEYS, "server", "Number of keys.", dbsize::run),
    write(spec("DEL", -2, ALL_KEYS, "generic", "Deletes keys.", del::run)),
    spec("ECHO", 2, NO_KEYS, "connection", "Returns its argument.", echo::run),
    spec("EXISTS", -2, ALL_KEYS, "generic", "Counts the given keys that exist.", exists::run),
    write(spec("EXPIRE", -3, ONE_KEY, "generic", "Sets a key's time to live in seconds.", expire::run)),
    write(spec("FLUSHALL", -1, NO_KEYS, "server", "Deletes every key.", flushall::run)),
    write(spec("FLUSHDB", -1, NO_KEYS, "server", "Deletes every key (one database).", flushall::run)),
    spec("GET", -2, ONE_KEY, "string", "A key's value; with a descriptor, a source descriptor and lease.", get::run),
    open(spec("HELLO", -1, NO_KEYS, "connection", "Handshake: protocol version, auth, name.", hello::run)),
    spec("INFO", -1, NO_KEYS, "server", "Node figures by section.", info::run),
    spec("KEYS", 2, NO_KEYS, "generic", "Keys matching a pattern.", keys::run),
    spec("MGET", -2, ALL_KEYS, "string", "Values of several keys.", mget::run),
    write(spec("MPUT", -3, (1, -1, 2), "strata", "Zero-copy PUT of several keys.", mput::run)),
    write(spec("MSET", -3, (1, -1, 2), "string", "Sets several keys atomically.", mset::run)),
    write(spec("PEXPIRE", -3, ONE_KEY, "generic", "Sets a key's time to live in milliseconds.", expire::run)),
    open(spec("PING", -1, NO_KEYS, "connection", "Replies PONG.", ping::run)),
    spec("PREFIX", -2, ALL_KEYS, "strata", "Length of the run of present keys from the first.", prefix::run),
    spec("PSUBSCRIBE", -2, NO_KEYS, "pubsub", "Receives messages on channels matching glob patterns.", subscribe::run),
    spec("PTTL", 2, ONE_KEY, "generic", "A key's time to live in milliseconds.", ttl::run),
    spec("PUBLISH", 3, NO_KEYS, "pubsub", "Sends a message to this node's subscribers of a channel.", publish::run),
    spec("PUBSUB", -2, NO_KEYS, "pubsub", "Channels, subscriber and pattern counts (CHANNELS, NUMSUB, NUMPAT).", pubsub::run),
    spec("PUNSUBSCRIBE", -1, NO_KEYS, "pubsub", "Ends pattern subscriptions.", unsubscribe::run),
    write(spec("PUT", -3, ONE_KEY, "strata", "Stores a value pulled from a memory descriptor.", put::run)),
    open(spec("QUIT", -1, NO_KEYS, "connection", "Closes the connection.", quit::run)),
    spec("RELEASE", -2, NO_KEYS, "strata", "Ends leases.", release::run),
    spec("SCAN", -2, NO_KEYS, "generic", "Iterates over keys with a cursor.", scan::run),
    spec("SELECT", 2, NO_KEYS, "connection", "Selects database 0 (the only one).", select::run),
    write(spec("SET", -3, ONE_KEY, "string", "Sets a key's value.", set::run)),
    write(spec("STRATA.APPLY", -3, NO_KEYS, "strata", "Internal: applies a forwarded delete or TTL change.", strata_apply::run)),
    spec("STRATA.CMA", -2, NO_KEYS, "strata", "Sets up cross-memory attach for a same-host client (HELLO, PROVE).", strata_cma::run),
    spec("STRATA.HANDOFF", 3, NO_KEYS, "strata", "Internal: pushes a key to the node now holding its slot.", strata_handoff::run),
    spec("STRATA.META", 2, ONE_KEY, "strata", "Size, tier, creation time, checksum, epoch and version of a value.", strata_meta::run),
    write(spec("STRATA.REPLICATE", -5, NO_KEYS, "strata", "Internal: pulls a copy of a value from its owner.", strata_replicate::run)),
    spec("STRATA.VOUCH", 2, NO_KEYS, "strata", "Internal: whether this node can reach a member (1) or suspects it (0).", strata_vouch::run),
    spec("STRLEN", 2, ONE_KEY, "string", "Length of a key's value.", strlen::run),
    spec("SUBSCRIBE", -2, NO_KEYS, "pubsub", "Receives messages published on channels (and keyspace events).", subscribe::run),
    spec("TTL", 2, ONE_KEY, "generic", "A key's time to live in seconds.", ttl::run),
    write(spec("UNLINK", -2, ALL_KEYS, "generic", "Deletes keys.", del::run)),
    spec("UNSUBSCRIBE", -1, NO_KEYS, "pubsub", "Ends channel subscriptions.", unsubscribe::run),
];

/// Longest command name in the table; longer input cannot match.
const MAX_NAME_LEN: usize = 16;

/// Looks a command up for `STRATA.APPLY`.
pub fn spec_of(name: &[u8]) -> Option<&'static Spec> {
    lookup(name).map(|i| &COMMANDS[i])
}

fn lookup(name: &[u8]) -> Option<usize> {
    let bucket = BY_LEN.get(name.len())?;
    bucket
        .iter()
        .map(|&i| usize::from(i))
        .find(|&i| COMMANDS[i].name.as_bytes().eq_ignore_ascii_case(name))
}

/// The table's indices by name length: a lookup compares the name with
/// the few commands of its length (at most a handful), case-insensitively
/// in place, instead of copying it to upper case and binary-searching
/// the table (a visible share of a pipelined GET's CPU,
/// docs/bench-notes/request-path.md).
static BY_LEN: std::sync::LazyLock<[Vec<u8>; MAX_NAME_LEN + 1]> = std::sync::LazyLock::new(|| {
    let mut by_len: [Vec<u8>; MAX_NAME_LEN + 1] = Default::default();
    for (i, spec) in COMMANDS.iter().enumerate() {
        let i = u8::try_from(i).expect("the command table fits u8 indices");
        by_len[spec.name.len()].push(i);
    }
    by_len
});

fn arity_ok(arity: i32, n: usize) -> bool {
    if arity >= 0 {
        n == arity as usize
    } else {
        n >= arity.unsigned_abs() as usize
    }
}

/// Runs one request (`args[0]` is the command name). The request starts
/// at `clock`'s mark and takes its wall time from there; a reply given at
/// once ends it (`RunClock::tick`), a later one is timed until it is ready.
pub fn execute(
    node: &Arc<Node>,
    session: &mut Session,
    args: &[Bytes],
    clock: &mut RunClock,
    rerun: bool,
) -> Out {
    let Some((name, rest)) = args.split_first() else {
        return CommandError::err("empty command").into();
    };
    let Some(idx) = lookup(name) else {
        if !session.authed {
            return no_auth();
        }
        return CommandError::unknown_command(name, rest).into();
    };
    let spec = &COMMANDS[idx];
    if !session.authed && !spec.no_auth {
        return no_auth();
    }
    if !arity_ok(spec.arity, args.len()) {
        return CommandError::wrong_arity(spec.name).into();
    }
    // RESP2 has no out-of-band frames: a subscribed connection's replies
    // and messages share one stream, so Redis allows only these there.
    if session.subscribed_resp2()
        && !matches!(
            spec.name,
            "SUBSCRIBE" | "PSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "PING" | "QUIT"
        )
    {
        return CommandError::err(format!(
            "Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            spec.name.to_ascii_lowercase()
        ))
        .into();
    }
    if spec.keys.0 > 0 && !node.cluster.standalone() {
        if let Err(e) = node.cluster.route(keys_of(spec, args)) {
            return e.into();
        }
    }
    let start = clock.mark();
    let mut ctx = Ctx {
        node,
        session,
        now_ms: clock.now_ms(),
        internal: false,
        rerun,
    };
    match (spec.run)(&mut ctx, args) {
        // Transfers are timed until they complete.
        Out::Later(work) => {
            let node = node.clone();
            Out::Later(Box::pin(async move {
                let reply = work.await;
                node.metrics.commands[idx].record(start.elapsed(), reply.is_error());
                reply
            }))
        }
        out => {
            node.metrics.commands[idx].record(clock.tick(), out.is_error());
            out
        }
    }
}

/// The key arguments of a request, by the table's key positions.
fn keys_of<'a>(spec: &Spec, args: &'a [Bytes]) -> impl Iterator<Item = &'a [u8]> {
    let (first, last, step) = spec.keys;
    let mut end = if last < 0 {
        args.len() as i64 + i64::from(last)
    } else {
        i64::from(last)
    };
    // PREFIX's trailing `PIN ms` is an option, not two keys.
    if spec.name == "PREFIX" && args.len() >= 4 && args[args.len() - 2].eq_ignore_ascii_case(b"PIN")
    {
        end -= 2;
    }
    (first as usize..=end.max(0) as usize)
        .step_by(step.max(1) as usize)
        .filter_map(move |i| args.get(i).map(|b| &b[..]))
}

fn no_auth() -> Out {
    CommandError::new(ErrorCode::NoAuth, "Authentication required.").into()
}

/// Parses a decimal integer argument with Redis' error.
pub fn int_arg(b: &[u8]) -> Result<i64, CommandError> {
    strata_proto::request::parse_i64(b).ok_or_else(CommandError::not_integer)
}

/// Parses a descriptor argument.
pub fn desc_arg(b: &[u8]) -> Result<strata_rdma::Descriptor, CommandError> {
    strata_rdma::Descriptor::parse(b)
        .map_err(|e| CommandError::new(ErrorCode::BadDesc, format!("descriptor: {e}")))
}

/// Checks a network descriptor's transport against this node's data
/// plane. Its own kind always fits. A plaintext (`tcp`) node also takes
/// `tls` ones: a GET's destination is never dialled over TCP, and a
/// `pulled` one (a PUT's source, a replica's) is read over TLS where the
/// node has a CA and certificate to do so. A TLS node (`tls_data_plane`)
/// refuses plaintext ones: its payloads are never sent in the clear.
pub fn network_desc(
    node: &Node,
    kind: strata_rdma::TransportKind,
    pulled: bool,
) -> Result<(), CommandError> {
    use strata_rdma::{Transport, TransportKind as K};
    let own = node.transport.kind();
    let dials = !pulled || crate::tls::dials_data_plane(&node.cfg);
    let msg = match (own, kind) {
        _ if kind == own => return Ok(()),
        (K::Tcp, K::Tls) if dials => return Ok(()),
        (K::Tls, K::Tcp) => "this node's data plane speaks TLS (tls_data_plane yes) and refuses a plaintext tcp descriptor: connect with TLS (the SDKs' tls options)".to_string(),
        (K::Tcp, K::Tls) => "a tls descriptor, and this node has no tls_ca_cert_file, tls_cert_file and tls_key_file to read it with".to_string(),
        _ => return Err(crate::errors::wrong_transport(kind, own)),
    };
    Err(CommandError::new(ErrorCode::BadDesc, msg))
}

/// Copies a key out of the request buffer: a stored key must not keep the
/// whole read buffer it arrived in alive.
pub fn own_key(key: &Bytes) -> Bytes {
    Bytes::copy_from_slice(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_names_fit() {
        for w in COMMANDS.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
        for s in COMMANDS {
            assert!(s.name.len() <= MAX_NAME_LEN);
            assert_eq!(s.name, s.name.to_ascii_uppercase());
        }
    }

    #[test]
    fn lookup_is_case_insensitive() {
        assert_eq!(lookup(b"get").map(|i| COMMANDS[i].name), Some("GET"));
        assert_eq!(
            lookup(b"StRaTa.MeTa").map(|i| COMMANDS[i].name),
            Some("STRATA.META")
        );
        assert_eq!(lookup(b"nope"), None);
        assert_eq!(lookup(&[b'a'; 100]), None);
    }
}
