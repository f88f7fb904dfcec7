//! `strata-bench`: runs one workload against strata (zero-copy or inline)
//! or Redis (inline), checks every value read, and reports throughput and
//! latency per (size, op) as a table and as JSON lines.
//!
//! Concurrency is C tasks, each with its own client. Latency covers only
//! the operation; filling and checking values happen outside the timing.
//! Any value read back wrong fails the run (exit code 1). On a terminal,
//! a progress bar per phase shows ops, ops/s, GB/s and p99 as it runs.
//!
//! `--addr a:7379,b:7379` seeds a cluster: the client learns the slot map
//! from any seed and routes every key to its owner (zero-copy and inline).

mod live;
mod report;
mod workload;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use strata_client::{Buffer, Client, ClientConfig, Error};

use live::{Live, Samples};
use report::{Row, RowMeta};
use workload::{check, fill, key_hash, parse_size, Dist, Picker, Rng, HEADER_BYTES};

/// Errors printed in full before the rest are only counted.
const ERRORS_SHOWN_MAX: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    Strata,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Api {
    Zerocopy,
    Inline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Put,
    Get,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
        }
    }
}

/// `--ops`: a number of operations per phase, or the phases themselves.
#[derive(Debug, Clone)]
enum OpsArg {
    Count(u64),
    Phases(Vec<Op>),
}

fn parse_ops(s: &str) -> Result<OpsArg, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(OpsArg::Count(n));
    }
    s.split(',')
        .map(|p| match p.trim() {
            "put" => Ok(Op::Put),
            "get" => Ok(Op::Get),
            other => Err(format!("unknown op {other:?} (put or get)")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(OpsArg::Phases)
}

/// `--mix get:put`, e.g. `9:1`.
fn parse_mix(s: &str) -> Result<(u32, u32), String> {
    let (g, p) = s.split_once(':').ok_or("mix is get:put, e.g. 9:1")?;
    let g: u32 = g.parse().map_err(|_| format!("bad get weight {g:?}"))?;
    let p: u32 = p.parse().map_err(|_| format!("bad put weight {p:?}"))?;
    if g + p == 0 {
        return Err("mix weights are both zero".into());
    }
    Ok((g, p))
}

#[derive(Debug, Parser)]
#[command(
    name = "strata-bench",
    about = "strata / Redis load generator with verification"
)]
struct Args {
    /// What runs at --addr (a strata node or cluster, or Redis).
    #[arg(long, value_enum, default_value = "strata")]
    target: Target,
    /// RESP address of the target: one node, or seed nodes of a cluster
    /// (comma-separated; any one that answers is enough, keys are routed
    /// to their owners and follow -MOVED).
    #[arg(
        long,
        visible_alias = "seeds",
        value_delimiter = ',',
        default_value = "127.0.0.1:7379"
    )]
    addr: Vec<String>,
    /// How long an operation keeps retrying while a cluster node is down.
    #[arg(long, default_value_t = 5000)]
    failover_timeout_ms: u64,
    /// Where this client's data plane listens (nodes connect to it to pull
    /// PUT payloads) [default: `STRATA_DATA_BIND`, else the local address
    /// of the route to the first `--addr`].
    #[arg(long)]
    data_bind: Option<std::net::SocketAddr>,
    /// Host the nodes dial for this client's data plane, when `--data-bind`
    /// is 0.0.0.0 (e.g. this container's address).
    #[arg(long)]
    data_advertise: Option<String>,
    /// zerocopy (strata only) or inline (SET/GET through RESP).
    #[arg(long, value_enum)]
    api: Option<Api>,
    /// Value sizes, one run each.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4KiB,64KiB,1MiB,4MiB,16MiB")]
    sizes: Vec<usize>,
    /// Distinct keys per size.
    #[arg(long, default_value_t = 64)]
    keys: usize,
    /// Key popularity: uniform or zipf[:s].
    #[arg(long, default_value = "uniform")]
    dist: Dist,
    /// One mixed phase with this get:put ratio instead of separate phases.
    #[arg(long, value_parser = parse_mix, conflicts_with = "phases")]
    mix: Option<(u32, u32)>,
    /// Phases in order (default put,get).
    #[arg(long, value_delimiter = ',', value_parser = ["put", "get"])]
    phases: Vec<String>,
    /// Concurrent tasks, each with its own client.
    #[arg(long, short = 'c', visible_alias = "threads", default_value_t = 1)]
    concurrency: usize,
    /// Seconds per phase (a put phase always writes every key at least once).
    #[arg(long)]
    duration: Option<f64>,
    /// Operations per phase (a number), or the phases (`put,get`).
    #[arg(long, value_parser = parse_ops)]
    ops: Option<OpsArg>,
    /// Check every value read (on by default; `--verify false` to skip).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    verify: bool,
    /// Append one JSON object per (size, op) to this file ("-" = stdout).
    #[arg(long)]
    json: Option<String>,
    /// Label for the `scenario` field (default `c<concurrency>`).
    #[arg(long)]
    scenario: Option<String>,
    /// Label for the `system` field (default the target).
    #[arg(long)]
    system: Option<String>,
    /// Leave the keys in the store (default: delete each size's keys after
    /// its phases, so sizes do not crowd each other out).
    #[arg(long)]
    keep: bool,
    /// Runtime worker threads (default: all cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Values per operation: each put and get moves this many keys in one
    /// batch call (zero-copy: `put_many`/`get_many`, MPUT and pipelined
    /// GETs; inline: pipelined SETs/GETs). Latency is per batch;
    /// throughput counts values.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Zero-copy with a node on this host: move payloads by cross-memory
    /// attach where both may (`false`: always the network data plane).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    cma: bool,
    /// Threads that copy one cross-memory read of 2 MiB or more (the
    /// client's `cma_lanes`; 1: the calling thread alone).
    #[arg(long, default_value_t = strata_client::DEFAULT_CMA_LANES)]
    cma_lanes: usize,
    /// Zero-copy GETs of values up to this size come back in the GET reply
    /// (the client's `inline_get_max`; 0: every value by the data plane).
    #[arg(long, value_parser = parse_size, default_value_t = strata_client::DEFAULT_INLINE_GET_MAX as usize)]
    inline_get_max: usize,
    /// Single zero-copy GETs over TCP into at least this many bytes (up to
    /// `--inline-get-max`) ask for the value's two halves at once on two
    /// connections (the client's `split_get_min`; 0: never).
    #[arg(long, value_parser = parse_size, default_value_t = strata_client::DEFAULT_SPLIT_GET_MIN as usize)]
    split_get_min: usize,
    /// Zero-copy PUTs over TCP of values up to this size send the payload
    /// with the command (the client's `inline_put_max`; 0: every value
    /// pulled by the node over the data plane).
    #[arg(long, value_parser = parse_size, default_value_t = strata_client::DEFAULT_INLINE_PUT_MAX as usize)]
    inline_put_max: usize,
    /// µs with nothing arriving after which an exchange with a node stops
    /// polling for its reply and sleeps (the client's `spin_us`, at most
    /// 1000; 0: off).
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
    /// µs with nothing arriving after which an exchange whose reply has
    /// begun stops polling for the rest and sleeps (the client's
    /// `stream_spin_us`, at most 1000; 0: off).
    #[arg(long, default_value_t = strata_client::DEFAULT_STREAM_SPIN_US)]
    stream_spin_us: u64,
    /// Most µs an exchange polls for its reply after a request that took
    /// 20 µs or more to write (as long again as the write took), or before
    /// a reply of 80 KiB or more into its buffers (as long as reading it
    /// at about 4 GB/s takes) (the client's `echo_spin_us`, at most 1000;
    /// 0: off).
    #[arg(long, default_value_t = strata_client::DEFAULT_ECHO_SPIN_US)]
    echo_spin_us: u64,
    /// Congestion control of this client's sockets: auto, host, or a name
    /// such as cubic (the client's `tcp_congestion`; default: auto).
    #[arg(long)]
    tcp_congestion: Option<String>,
    /// Talk TLS to the nodes' RESP ports (their tls_port), trusting this
    /// PEM CA (the client's `tls`).
    #[arg(long)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate for nodes that ask for one (with --tls-key-file).
    #[arg(long, requires = "tls_ca_file")]
    tls_cert_file: Option<std::path::PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<std::path::PathBuf>,
    /// The name the nodes' certificates carry [default: each node's host].
    #[arg(long, requires = "tls_ca_file")]
    tls_server_name: Option<String>,
}

/// Everything a phase needs, shared by its tasks.
struct Plan {
    client: ClientConfig,
    api: Api,
    size: usize,
    keys: Vec<Vec<u8>>,
    hashes: Vec<u64>,
    /// Latest version written per key (mixed phases bump it).
    versions: Vec<AtomicU64>,
    picker: Picker,
    verify: bool,
    concurrency: usize,
    batch: usize,
    deadline: Option<Instant>,
    ops_max: Option<u64>,
    /// Get and put weights for a mixed phase; `None` in a pure phase.
    mix: Option<(u32, u32)>,
    started: AtomicU64,
    done: AtomicU64,
    failed: AtomicBool,
}

/// One task's figures.
struct Tally {
    hist: [Histogram<u64>; 2],
    errors: [u64; 2],
    mismatches: u64,
}

/// Keeps glibc's allocator from handing the values of one batch back to
/// the kernel and faulting them in again for the next. Inline GETs return
/// each value in memory of its own; glibc trims its heap when a free
/// leaves more than 128 KiB on top, and whether a batch's frees do that
/// varies from run to run, and with it the speed of a batch of inline
/// GETs (docs/bench-notes/l3-domains.md). The load generator's
/// allocator is not what it measures, for strata or for Redis, so it is
/// held steady: no trimming, and no fresh mapping per value.
fn steady_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        // glibc's most for the mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

fn main() -> std::process::ExitCode {
    steady_allocator();
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = args.workers {
        rt.worker_threads(w.max(1));
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("strata-bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("strata-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs every size; `Ok(false)` if anything failed or read back wrong.
async fn run(args: Args) -> anyhow::Result<bool> {
    let api = args.api.unwrap_or(match args.target {
        Target::Strata => Api::Zerocopy,
        Target::Redis => Api::Inline,
    });
    if api == Api::Zerocopy && args.target == Target::Redis {
        bail!("--api zerocopy needs --target strata");
    }
    if args.keys == 0 || args.concurrency == 0 || args.batch == 0 {
        bail!("--keys, --concurrency and --batch must be positive");
    }
    if args.batch > args.keys {
        bail!("--batch {} is more than --keys {}", args.batch, args.keys);
    }
    if let Some(&small) = args.sizes.iter().find(|&&s| s < HEADER_BYTES) {
        bail!("size {small} is below the {HEADER_BYTES}-byte minimum that verification needs");
    }
    let (ops_max, phases) = match (&args.ops, args.phases.is_empty()) {
        (Some(OpsArg::Phases(p)), _) => (None, p.clone()),
        (Some(OpsArg::Count(n)), true) => (Some(*n), vec![Op::Put, Op::Get]),
        (Some(OpsArg::Count(n)), false) => (Some(*n), names_to_ops(&args.phases)),
        (None, true) => (None, vec![Op::Put, Op::Get]),
        (None, false) => (None, names_to_ops(&args.phases)),
    };
    let system = args.system.clone().unwrap_or_else(|| match args.target {
        Target::Strata => "strata".into(),
        Target::Redis => "redis".into(),
    });
    let scenario = args.scenario.clone().unwrap_or_else(|| match args.batch {
        1 => format!("c{}", args.concurrency),
        b => format!("c{}-b{b}", args.concurrency),
    });
    let api_name = match api {
        Api::Zerocopy => "zerocopy",
        Api::Inline => "inline",
    };
    let mut json: Option<Box<dyn Write>> = match args.json.as_deref() {
        None => None,
        Some("-") => Some(Box::new(std::io::stdout())),
        Some(path) => Some(Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {path}"))?,
        )),
    };
    report::print_header();
    let mut ok = true;
    for &size in &args.sizes {
        let meta = RowMeta {
            system: &system,
            scenario: &scenario,
            api: api_name,
            threads: args.concurrency,
            size,
            batch: args.batch,
        };
        let plan_for = |mix| Arc::new(new_plan(&args, api, size, ops_max, mix));
        // Versions live in the plan; one plan per size keeps them across
        // phases, so gets after puts check the latest version.
        let base = plan_for(args.mix);
        if args.mix.is_some() {
            // Gets in a mixed phase need every key present: fill first,
            // unreported.
            let fill = Arc::new(base.restart_fill(&args));
            let (tally, _) = run_phase(&fill, Some(Op::Put)).await?;
            if tally.errors[Op::Put as usize] > 0 {
                bail!("filling the keys before the mixed phase failed");
            }
            base.adopt_versions(&fill);
        }
        let phase_list: Vec<Option<Op>> = match args.mix {
            Some(_) => vec![None],
            None => phases.iter().copied().map(Some).collect(),
        };
        for phase in phase_list {
            let plan = Arc::new(base.restart(&args));
            let (tally, secs) = run_phase(&plan, phase).await?;
            base.adopt_versions(&plan);
            for op in [Op::Put, Op::Get] {
                let i = op as usize;
                if phase.is_some_and(|p| p != op)
                    || (phase.is_none() && tally.hist[i].is_empty() && tally.errors[i] == 0)
                {
                    continue;
                }
                let mismatches = if op == Op::Get { tally.mismatches } else { 0 };
                let row = Row::new(
                    &meta,
                    op.name(),
                    &tally.hist[i],
                    secs,
                    tally.errors[i],
                    mismatches,
                );
                report::print_row(&row);
                if let Some(out) = json.as_mut() {
                    writeln!(out, "{}", serde_json::to_string(&row)?)?;
                }
                ok &= row.errors == 0 && row.mismatches == 0;
            }
            if plan.failed.load(Ordering::Relaxed) {
                eprintln!("strata-bench: a value read back wrong; stopping");
                return Ok(false);
            }
        }
        if !args.keep {
            cleanup(&base.client, &base.keys).await?;
        }
    }
    Ok(ok)
}

fn names_to_ops(names: &[String]) -> Vec<Op> {
    names
        .iter()
        .map(|n| if n == "put" { Op::Put } else { Op::Get })
        .collect()
}

fn new_plan(
    args: &Args,
    api: Api,
    size: usize,
    ops_max: Option<u64>,
    mix: Option<(u32, u32)>,
) -> Plan {
    let keys: Vec<Vec<u8>> = (0..args.keys)
        .map(|i| format!("bench:{size}:{i}").into_bytes())
        .collect();
    let mut client = ClientConfig::with_seeds(args.addr.iter().cloned());
    client.failover_timeout_ms = args.failover_timeout_ms;
    client.data_bind = args.data_bind;
    client.data_advertise = args.data_advertise.clone();
    client.cma = args.cma;
    client.cma_lanes = args.cma_lanes;
    client.inline_get_max = args.inline_get_max as u64;
    client.split_get_min = args.split_get_min as u64;
    client.inline_put_max = args.inline_put_max as u64;
    client.tcp_congestion = args.tcp_congestion.clone();
    client.spin_us = args.spin_us;
    client.stream_spin_us = args.stream_spin_us;
    client.echo_spin_us = args.echo_spin_us;
    client.tls = args
        .tls_ca_file
        .clone()
        .map(|ca_file| strata_client::TlsOptions {
            ca_file,
            cert_file: args.tls_cert_file.clone(),
            key_file: args.tls_key_file.clone(),
            server_name: args.tls_server_name.clone(),
        });
    Plan {
        client,
        api,
        size,
        hashes: keys.iter().map(|k| key_hash(k)).collect(),
        versions: keys.iter().map(|_| AtomicU64::new(0)).collect(),
        keys,
        picker: Picker::new(&args.dist, args.keys),
        verify: args.verify,
        concurrency: args.concurrency,
        batch: args.batch,
        deadline: None,
        ops_max,
        mix,
        started: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicBool::new(false),
    }
}

impl Plan {
    /// A fresh phase over the same keys and versions.
    fn restart(&self, args: &Args) -> Plan {
        Plan {
            client: self.client.clone(),
            api: self.api,
            size: self.size,
            keys: self.keys.clone(),
            hashes: self.hashes.clone(),
            versions: self
                .versions
                .iter()
                .map(|v| AtomicU64::new(v.load(Ordering::Relaxed)))
                .collect(),
            picker: Picker::new(&args.dist, args.keys),
            verify: self.verify,
            concurrency: self.concurrency,
            batch: self.batch,
            deadline: args
                .duration
                .map(|s| Instant::now() + Duration::from_secs_f64(s)),
            ops_max: self.ops_max,
            mix: self.mix,
            started: AtomicU64::new(0),
            done: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// A put phase of exactly one pass over the keys.
    fn restart_fill(&self, args: &Args) -> Plan {
        let mut fill = self.restart(args);
        fill.deadline = None;
        fill.ops_max = Some(0);
        fill.mix = None;
        fill
    }

    /// Takes over the versions a finished phase wrote.
    fn adopt_versions(&self, phase: &Plan) {
        for (mine, theirs) in self.versions.iter().zip(&phase.versions) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Claims the next operation, or `None` when the phase is over. A put
    /// phase always completes one pass over the keys first.
    fn claim(&self, min_ops: u64) -> Option<u64> {
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        if n < min_ops {
            return Some(n);
        }
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let by_time = self.deadline.is_some_and(|d| Instant::now() >= d);
        let by_count = self.ops_max.is_some_and(|m| n >= m);
        let unbounded = self.deadline.is_none() && self.ops_max.is_none();
        if by_time || by_count || unbounded {
            return None;
        }
        Some(n)
    }
}

/// Runs one phase (`None`: mixed) on `concurrency` tasks; returns the merged
/// figures and the phase's wall time.
async fn run_phase(plan: &Arc<Plan>, phase: Option<Op>) -> anyhow::Result<(Tally, f64)> {
    let mut clients = Vec::with_capacity(plan.concurrency);
    for _ in 0..plan.concurrency {
        clients.push(Worker::connect(plan).await?);
    }
    let bar = progress(plan, phase);
    // No bar drawn (stderr is not a terminal): no live figures to feed.
    let live = (!bar.is_hidden()).then(|| Arc::new(Live::new(plan.size)));
    let t0 = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, worker)| {
            let plan = Arc::clone(plan);
            let live = live.clone();
            tokio::spawn(async move { worker.run(&plan, phase, t as u64, live).await })
        })
        .collect();
    let ticker = {
        let plan = Arc::clone(plan);
        let bar = bar.clone();
        tokio::spawn(async move {
            loop {
                let done = plan.done.load(Ordering::Relaxed);
                bar.set_position(done);
                if let Some(figures) = live.as_ref().and_then(|l| l.tick(done)) {
                    bar.set_message(figures);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut total = Tally::new();
    for task in tasks {
        let t = task.await.context("bench task panicked")?;
        total.merge(&t)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    ticker.abort();
    bar.finish_and_clear();
    Ok((total, secs))
}

fn progress(plan: &Plan, phase: Option<Op>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(plan.ops_max, ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{spinner} {prefix} {pos} ops {per_sec} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.set_prefix(format!(
        "{} {}",
        report::show_size(plan.size),
        phase.map_or("mix", Op::name)
    ));
    bar
}

impl Tally {
    fn new() -> Self {
        Self {
            hist: [report::histogram(), report::histogram()],
            errors: [0; 2],
            mismatches: 0,
        }
    }

    fn merge(&mut self, other: &Tally) -> anyhow::Result<()> {
        for i in 0..2 {
            self.hist[i]
                .add(&other.hist[i])
                .context("merge histograms")?;
            self.errors[i] += other.errors[i];
        }
        self.mismatches += other.mismatches;
        Ok(())
    }
}

/// One task's client and buffers.
struct Worker {
    client: Client,
    /// Zero-copy only: per value of a batch, the registered buffers puts
    /// read from and gets write into.
    bufs: Vec<(Buffer, Buffer)>,
    /// Inline puts: per value of a batch, the value to send.
    scratch: Vec<Vec<u8>>,
}

impl Worker {
    async fn connect(plan: &Plan) -> anyhow::Result<Self> {
        let client = Client::connect_with(plan.client.clone())
            .await
            .with_context(|| format!("connect to {}", plan.client.seeds.join(",")))?;
        let (bufs, scratch) = match plan.api {
            Api::Zerocopy => (
                (0..plan.batch)
                    .map(|_| Ok((client.alloc(plan.size)?, client.alloc(plan.size)?)))
                    .collect::<Result<Vec<_>, Error>>()?,
                Vec::new(),
            ),
            Api::Inline => (Vec::new(), vec![vec![0u8; plan.size]; plan.batch]),
        };
        Ok(Self {
            client,
            bufs,
            scratch,
        })
    }

    async fn run(
        mut self,
        plan: &Plan,
        phase: Option<Op>,
        task: u64,
        live: Option<Arc<Live>>,
    ) -> Tally {
        let mut tally = Tally::new();
        let mut live = live.map(|l| (l, Samples::new()));
        let mut rng = Rng::new(task + 1);
        // A put phase writes every key once first, each task its share
        // (in batches of consecutive keys).
        let min_ops = if phase == Some(Op::Put) {
            plan.keys.len().div_ceil(plan.batch) as u64
        } else {
            0
        };
        while let Some(n) = plan.claim(min_ops) {
            let op = match (phase, plan.mix) {
                (Some(op), _) => op,
                (None, Some((g, p))) => {
                    if rng.next() % u64::from(g + p) < u64::from(g) {
                        Op::Get
                    } else {
                        Op::Put
                    }
                }
                (None, None) => Op::Get,
            };
            let ks: Vec<usize> = if op == Op::Put && n < min_ops {
                let first = n as usize * plan.batch;
                (first..(first + plan.batch).min(plan.keys.len())).collect()
            } else {
                (0..plan.batch)
                    .map(|_| plan.picker.pick(&mut rng))
                    .collect()
            };
            let k = ks[0];
            let values = ks.len() as u64;
            let outcome = match (op, plan.batch) {
                (Op::Put, 1) => self.put(plan, k).await,
                (Op::Get, 1) => self.get(plan, k).await,
                (Op::Put, _) => self.put_batch(plan, &ks).await,
                (Op::Get, _) => self.get_batch(plan, &ks).await,
            };
            match outcome {
                Ok(Some(us)) => {
                    // One latency per batch, counted once per value.
                    let _ = tally.hist[op as usize].record_n(us.max(1), values);
                    if let Some((l, samples)) = live.as_mut() {
                        samples.record(l, us, values);
                    }
                }
                Ok(None) => {
                    tally.mismatches += 1;
                    plan.failed.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    let errors = &mut tally.errors[op as usize];
                    *errors += 1;
                    if *errors <= ERRORS_SHOWN_MAX {
                        eprintln!(
                            "strata-bench: {} {}: {e}",
                            op.name(),
                            String::from_utf8_lossy(&plan.keys[k])
                        );
                    }
                }
            }
            plan.done.fetch_add(values, Ordering::Relaxed);
        }
        tally
    }

    /// Writes the next version of every key in `ks` in one batch call.
    async fn put_batch(&mut self, plan: &Plan, ks: &[usize]) -> Result<Option<u64>, Error> {
        let versions: Vec<u64> = ks
            .iter()
            .map(|&k| plan.versions[k].fetch_add(1, Ordering::Relaxed) + 1)
            .collect();
        let t0;
        let results = if self.bufs.is_empty() {
            for ((&k, v), buf) in ks.iter().zip(&versions).zip(&mut self.scratch) {
                fill(buf, plan.hashes[k], *v);
            }
            let items: Vec<(&[u8], &[u8])> = ks
                .iter()
                .zip(&self.scratch)
                .map(|(&k, buf)| (plan.keys[k].as_slice(), buf.as_slice()))
                .collect();
            t0 = Instant::now();
            self.client.set_many(&items).await
        } else {
            for ((&k, v), (src, _)) in ks.iter().zip(&versions).zip(&mut self.bufs) {
                fill(src.as_mut_slice(), plan.hashes[k], *v);
            }
            let items: Vec<(&[u8], &Buffer, std::ops::Range<usize>)> = ks
                .iter()
                .zip(&self.bufs)
                .map(|(&k, (src, _))| (plan.keys[k].as_slice(), src, 0..plan.size))
                .collect();
            t0 = Instant::now();
            self.client.put_many(&items).await
        };
        let us = t0.elapsed().as_micros() as u64;
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
        Ok(Some(us))
    }

    /// Reads every key in `ks` in one batch call; `Ok(None)` if a value
    /// read back is wrong. Values are checked where they landed.
    async fn get_batch(&mut self, plan: &Plan, ks: &[usize]) -> Result<Option<u64>, Error> {
        let mismatch = |k: usize, v: &[u8]| match check(v, plan.hashes[k], plan.size) {
            Ok(_) => false,
            Err(m) => {
                eprintln!(
                    "strata-bench: MISMATCH on {}: {m}",
                    String::from_utf8_lossy(&plan.keys[k])
                );
                true
            }
        };
        let t0 = Instant::now();
        if self.bufs.is_empty() {
            let keys: Vec<&[u8]> = ks.iter().map(|&k| plan.keys[k].as_slice()).collect();
            let got = self.client.get_many_inline(&keys).await;
            let us = t0.elapsed().as_micros() as u64;
            for (&k, r) in ks.iter().zip(got) {
                let v = r?.ok_or(Error::NotFound)?;
                if plan.verify && mismatch(k, &v) {
                    return Ok(None);
                }
            }
            return Ok(Some(us));
        }
        let mut items: Vec<(&[u8], &mut Buffer, usize)> = ks
            .iter()
            .zip(self.bufs.iter_mut())
            .map(|(&k, (_, dst))| (plan.keys[k].as_slice(), dst, 0))
            .collect();
        let got = self.client.get_many(&mut items).await;
        let us = t0.elapsed().as_micros() as u64;
        drop(items);
        for ((&k, r), (_, dst)) in ks.iter().zip(got).zip(&self.bufs) {
            let n = r?;
            if plan.verify && mismatch(k, &dst.as_slice()[..n]) {
                return Ok(None);
            }
        }
        Ok(Some(us))
    }

    /// Writes the next version of key `k`; returns the latency in µs.
    async fn put(&mut self, plan: &Plan, k: usize) -> Result<Option<u64>, Error> {
        let version = plan.versions[k].fetch_add(1, Ordering::Relaxed) + 1;
        let key = &plan.keys[k];
        let us = match self.bufs.first_mut() {
            Some((src, _)) => {
                fill(src.as_mut_slice(), plan.hashes[k], version);
                let t0 = Instant::now();
                self.client.put_from(key, src, 0..plan.size).await?;
                t0.elapsed()
            }
            None => {
                fill(&mut self.scratch[0], plan.hashes[k], version);
                let t0 = Instant::now();
                self.client.set(key, &self.scratch[0]).await?;
                t0.elapsed()
            }
        };
        Ok(Some(us.as_micros() as u64))
    }

    /// Reads key `k`; `Ok(None)` if the value read back is wrong.
    async fn get(&mut self, plan: &Plan, k: usize) -> Result<Option<u64>, Error> {
        let key = &plan.keys[k];
        let t0 = Instant::now();
        let (us, verdict) = match self.bufs.first_mut() {
            Some((_, dst)) => {
                let n = self.client.get_into(key, dst, 0).await?;
                let us = t0.elapsed();
                (
                    us,
                    plan.verify
                        .then(|| check(&dst.as_slice()[..n], plan.hashes[k], plan.size)),
                )
            }
            None => {
                let value = self.client.get(key).await?.ok_or(Error::NotFound)?;
                let us = t0.elapsed();
                (
                    us,
                    plan.verify
                        .then(|| check(&value, plan.hashes[k], plan.size)),
                )
            }
        };
        if let Some(Err(m)) = verdict {
            eprintln!(
                "strata-bench: MISMATCH on {}: {m}",
                String::from_utf8_lossy(key)
            );
            return Ok(None);
        }
        Ok(Some(us.as_micros() as u64))
    }
}

/// Deletes a size's keys so the next size starts with an empty store.
async fn cleanup(cfg: &ClientConfig, keys: &[Vec<u8>]) -> anyhow::Result<()> {
    let client = Client::connect_with(cfg.clone()).await?;
    for key in keys {
        client.del(key).await?;
    }
    Ok(())
}
