//! The tiers under DRAM, as the node opens and uses them: today the NVMe
//! tier (`ssd_*` keys), through [`strata_tiering::spill::Spill`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use strata_proto::CommandError;
use strata_tiering::nvme::{NvmeConfig, NvmeEngine, NvmeError, NvmeTier};
use strata_tiering::spill::{PromoteError, Spill, SpillConfig, HEADER_BYTES};
use strata_tiering::Store;

use crate::config::Config;

/// Promotions of one request that run at once: enough to keep the device
/// busy for an MGET of many blocks, few enough not to flood DRAM.
const PROMOTE_CONCURRENCY: usize = 8;

/// Temporary NVMe directories are named `strata-nvme-*` and hold the
/// owning process id in this file.
const TEMP_PREFIX: &str = "strata-nvme-";
const OWNER_FILE: &str = "owner.pid";

/// Removes temporary NVMe directories whose node died without cleaning up
/// (kill -9, a crash): each holds up to `ssd_pool_size` of preallocated
/// files. One whose owner is alive, or whose owner cannot be told, is left.
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir(temp_base()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let Some(pid) = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(path = %dir.display(), pid, "removed the temporary NVMe directory of a node that died")
                }
                Err(e) => {
                    tracing::debug!(path = %dir.display(), error = %e, "cannot remove an orphaned NVMe directory")
                }
            }
        }
    }
}

/// Where the default NVMe directory goes: `$TMPDIR` if set, else
/// `/var/tmp` (on disk on every common distribution, where `/tmp` is often
/// tmpfs: preallocating the tier there would take RAM), else `/tmp`.
fn temp_base() -> PathBuf {
    if std::env::var_os("TMPDIR").is_some() {
        return std::env::temp_dir();
    }
    let var_tmp = PathBuf::from("/var/tmp");
    if var_tmp.is_dir() {
        var_tmp
    } else {
        std::env::temp_dir()
    }
}

/// An opened NVMe tier and, for the default configuration, the temporary
/// directory it lives in (removed when the node stops).
pub struct Lower {
    pub spill: Arc<Spill>,
    pub path: PathBuf,
    /// The default temporary directory (removed on drop); `None` for a
    /// configured `ssd_path`.
    temp: Option<tempfile::TempDir>,
}

/// Opens the NVMe tier the config asks for and attaches it under `store`.
/// `None` when `ssd_pool_size` is 0.
pub async fn open(cfg: &Config, store: &Store) -> anyhow::Result<Option<Lower>> {
    if cfg.ssd_pool_size == 0 {
        return Ok(None);
    }
    let (path, temp) = if cfg.ssd_path.is_empty() {
        remove_orphans();
        let temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempdir_in(temp_base())
            .context("ssd_path is empty and no temporary directory can be created for the NVMe tier (set ssd_path, or ssd_pool_size 0)")?;
        // So that a later node can tell this directory was orphaned by a
        // crash (the directory is removed on a graceful stop only).
        let _ = std::fs::write(temp.path().join(OWNER_FILE), std::process::id().to_string());
        (temp.path().to_path_buf(), Some(temp))
    } else {
        let path = PathBuf::from(&cfg.ssd_path);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("ssd_path {}: cannot create the directory", path.display()))?;
        (path, None)
    };
    let mut nvme = NvmeConfig::new(
        &path,
        cfg.ssd_pool_size,
        cfg.ssd_max_value_size + HEADER_BYTES,
    );
    nvme.engine = match cfg.ssd_engine.as_str() {
        "io_uring" => NvmeEngine::IoUring,
        _ => NvmeEngine::Psync,
    };
    nvme.direct_io = cfg.ssd_direct_io;
    // A temporary directory starts empty; a configured one is recovered.
    nvme.recover = temp.is_none();
    let tier = match NvmeTier::open(nvme.clone()).await {
        Ok(t) => t,
        // tmpfs (a common /tmp) refuses O_DIRECT; the default must still
        // start there.
        Err(NvmeError::Io { .. }) if temp.is_some() && nvme.direct_io => {
            tracing::warn!(
                path = %path.display(),
                "the temporary NVMe directory refuses O_DIRECT (tmpfs?); using buffered I/O. Set ssd_path to a real device for the NVMe tier"
            );
            nvme.direct_io = false;
            NvmeTier::open(nvme)
                .await
                .map_err(|e| nvme_open_error(&path, e))?
        }
        // The default must start on any machine: without room in the
        // temporary directory, run on DRAM alone and say so.
        Err(e @ NvmeError::NoSpace { .. }) if temp.is_some() => {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "no room for the default NVMe tier in the temporary directory; running on DRAM only (set ssd_path and ssd_pool_size to use one)"
            );
            return Ok(None);
        }
        Err(e) => return Err(nvme_open_error(&path, e)),
    };
    let spill = Spill::start(
        tier,
        SpillConfig {
            queue_bytes: cfg.ssd_spill_queue_size,
            ..SpillConfig::default()
        },
        Some(path.clone()),
    );
    store.attach_lower(spill.clone());
    tracing::info!(
        path = %path.display(),
        pool_bytes = cfg.ssd_pool_size,
        max_value = cfg.ssd_max_value_size,
        engine = %cfg.ssd_engine,
        "NVMe tier open"
    );
    Ok(Some(Lower { spill, path, temp }))
}

fn nvme_open_error(path: &std::path::Path, e: NvmeError) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot open the NVMe tier at ssd_path {}: {e} (set ssd_pool_size 0 to run without it)",
        path.display()
    )
}

/// Which keys below DRAM a command needs read back before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promote {
    /// Every key it names (it reads or changes values).
    All,
    /// Only keys the NVMe index cannot answer for (it asks existence).
    Unknown,
    None,
}

/// The keys a command names that are missing from DRAM, and where they
/// are: below it (NVMe), or on the nodes that held them before a ring
/// change that is still settling.
pub struct BringIn {
    /// On NVMe: promoted (see [`promote`]).
    pub below: Vec<Bytes>,
    /// On other nodes: fetched (`services::repair::fetch`).
    pub elsewhere: Vec<Bytes>,
}

impl BringIn {
    /// What to bring in before a command on `keys` runs: keys below DRAM
    /// (`spill`) as `promote` says, and with `transition` (a ring change
    /// still settling, and the command may ask peers) keys `store` does
    /// not hold at all. `None`: nothing.
    pub fn plan(
        store: &Store,
        spill: Option<&Spill>,
        keys: &[Bytes],
        promote: Promote,
        transition: bool,
        now_ms: u64,
    ) -> Option<BringIn> {
        let spill = spill.filter(|_| promote != Promote::None);
        if !transition && spill.is_none() {
            return None;
        }
        let (mut below, mut elsewhere) = (Vec::new(), Vec::new());
        for k in keys.iter().filter(|k| !store.exists(k, now_ms)) {
            let is_below = match (spill, promote) {
                (None, _) => false,
                (Some(s), Promote::Unknown) => match s.exists_below(k, now_ms) {
                    // Answered from the NVMe index: nothing to bring in.
                    Some(true) => continue,
                    Some(false) => false,
                    None => true,
                },
                (Some(s), _) => s.contains(k),
            };
            if is_below {
                below.push(k.clone());
            } else if transition {
                elsewhere.push(k.clone());
            }
        }
        (!below.is_empty() || !elsewhere.is_empty()).then_some(BringIn { below, elsewhere })
    }
}

/// Promotes `keys` from `spill` into `store`'s DRAM; returns how many were
/// found below. The first failure is the request's reply: `-NOSPACE` when
/// DRAM has no room, `-ERR io` for a device error or damaged bytes (never
/// the bytes themselves).
pub async fn promote(
    store: &Store,
    spill: &Spill,
    keys: Vec<Bytes>,
    now_ms: u64,
) -> Result<u64, CommandError> {
    use futures::StreamExt;
    let mut results = futures::stream::iter(keys)
        .map(|key| async move { spill.promote(store, &key, now_ms).await })
        .buffer_unordered(PROMOTE_CONCURRENCY);
    let (mut found, mut first_error) = (0, None);
    while let Some(r) = results.next().await {
        match r {
            Ok(true) => found += 1,
            Ok(false) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        None => Ok(found),
        Some(PromoteError::Store(e)) => Err(crate::errors::store_error(e)),
        Some(PromoteError::Nvme(e)) => Err(CommandError::err(format!(
            "io: cannot read the value from the NVMe tier: {e}"
        ))),
    }
}

/// Values moved down per step of a graceful stop: small enough that the
/// index lock is never held for long.
const DEMOTE_BATCH: usize = 16;

/// A graceful stop: with a configured `ssd_path`, `store`'s DRAM values
/// are moved to NVMe (so a restart finds them), then everything queued is
/// written and flushed. Gives up after `max`; what is not written by then
/// is lost, as on a crash.
pub async fn shut_down(store: &Store, lower: &Lower, max: std::time::Duration) {
    let spill = &lower.spill;
    let deadline = tokio::time::Instant::now() + max;
    let keep = lower.temp.is_none();
    let mut moved = 0usize;
    if keep {
        tracing::info!(
            keys = store.stats().keys,
            "moving DRAM values to NVMe before stopping"
        );
        while tokio::time::Instant::now() < deadline {
            let left = deadline - tokio::time::Instant::now();
            spill.wait_for_room(left).await;
            let n = store.demote_some(DEMOTE_BATCH);
            if n == 0 {
                break;
            }
            moved += n;
        }
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if let Err(e) = spill.drain(left).await {
        tracing::warn!(error = %e, "NVMe tier: final flush failed");
    }
    let s = spill.stats();
    if s.queued > 0 {
        tracing::warn!(
            values = s.queued,
            bytes = s.queued_bytes,
            "NVMe tier: stopped before every queued value was written; those are lost"
        );
    }
    if let Err(e) = spill.tier().close().await {
        tracing::warn!(error = %e, "NVMe tier: close failed");
    }
    tracing::info!(
        moved,
        spilled = s.spilled,
        dropped = s.dropped,
        "NVMe tier closed"
    );
}
