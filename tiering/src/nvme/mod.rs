//! The NVMe tier: values that DRAM evicts, kept on local flash and found
//! again after a restart.
//!
//! Built on foyer 0.22's block engine ([`backend::FoyerBackend`]): a
//! directory of block files on `path`, one value never spans blocks, so the
//! block size is derived from `max_value_bytes` (see [`backend::block_bytes`])
//! and values above it are refused with [`NvmeError::TooLarge`]. When the
//! device is full foyer evicts whole blocks, oldest first (FIFO, or a block
//! that is mostly removed entries); it never refuses a write for space.
//! [`NvmeError::NoSpace`] comes only from `open`, when the filesystem cannot
//! hold `capacity_bytes` (block files are preallocated there).
//!
//! Every value is stored with its CRC32C, summed by `insert` just before
//! the write and checked on every read; a mismatch is
//! [`NvmeError::Corrupt`] and the entry is removed. Wrong bytes are never
//! returned.
//!
//! # Durability
//!
//! - `insert` returns `Ok` only after the value and its index entry are
//!   written to the block file (`pwrite`, or `O_DIRECT` with `direct_io`) and
//!   foyer indexed it. Such a value survives the process being killed
//!   (SIGKILL) and is found by `open` with `recover: true`.
//! - `remove` returns after its tombstone is written to foyer's tombstone
//!   log, so a removed key stays removed across a restart.
//! - Entries reach foyer's flusher in the order foyer numbered them (one
//!   lock around the enqueue): its recovery stops reading a block at an
//!   entry numbered below the one before it.
//! - Nothing is fsynced: foyer 0.22 never calls `fsync`/`fdatasync`. With
//!   `direct_io` the bytes have left the page cache but may sit in the
//!   drive's volatile write cache; without it they sit in the page cache.
//!   A power loss or kernel crash may lose recent writes.
//! - An `insert` still in progress when the process dies may or may not be
//!   found after restart; if found, it is whole (foyer writes a blob's index
//!   after its data and checks both on recovery).
//! - Overwriting a key first drops the old value: if the new write fails the
//!   key is absent, never the old value.
//! - Reopen a directory with the same `capacity_bytes` and `max_value_bytes`:
//!   they fix the block layout, and foyer 0.22 stores no superblock to check
//!   them against. A changed layout recovers garbage-free but loses entries
//!   (foyer's blob and entry checksums reject what no longer parses).
//!
//! This module is a standalone store: it never sees RESP, never imports a
//! transport, and knows nothing of the DRAM tier above it.

mod backend;
pub mod faulty;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use thiserror::Error;

pub use backend::{
    block_bytes, Backend, Entry, FoyerBackend, Usage, MAX_KEY_BYTES, MAX_VALUE_BYTES_LIMIT,
    MIN_BLOCKS,
};

/// Which foyer I/O engine moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NvmeEngine {
    /// `pread`/`pwrite` on tokio's blocking pool. Works everywhere.
    #[default]
    Psync,
    /// foyer's io_uring engine (Linux). `open` fails with `Io` where the
    /// kernel or a seccomp profile refuses io_uring.
    IoUring,
}

/// Settings of one NVMe tier, validated by [`NvmeTier::open`].
#[derive(Debug, Clone)]
pub struct NvmeConfig {
    /// Directory that holds the block files (`ssd_path`).
    pub path: PathBuf,
    /// Bytes of flash to use (`ssd_pool_size`); rounded down to whole blocks.
    pub capacity_bytes: u64,
    /// Largest value accepted; sets the block size.
    pub max_value_bytes: u64,
    pub engine: NvmeEngine,
    /// Rebuild the index from the block files at open. `false` starts empty
    /// and overwrites whatever the directory held.
    pub recover: bool,
    /// Open block files with `O_DIRECT`: bypasses the page cache, so reads
    /// measure the device and DRAM is not spent twice on one value.
    pub direct_io: bool,
}

impl NvmeConfig {
    /// Defaults: psync, recover, direct I/O.
    pub fn new(path: impl Into<PathBuf>, capacity_bytes: u64, max_value_bytes: u64) -> Self {
        NvmeConfig {
            path: path.into(),
            capacity_bytes,
            max_value_bytes,
            engine: NvmeEngine::Psync,
            recover: true,
            direct_io: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NvmeError {
    /// Only from `open`: the filesystem cannot hold `capacity_bytes`.
    #[error("no space: {requested} bytes requested, {available} available")]
    NoSpace { requested: u64, available: u64 },
    /// A device or foyer error; for a write, the value is not stored.
    #[error("nvme {op} failed: {reason}")]
    Io { op: &'static str, reason: String },
    /// The bytes do not match their CRC32C. On read the entry was removed.
    #[error("value does not match its checksum")]
    Corrupt,
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("invalid nvme config: {0}")]
    InvalidConfig(String),
    #[error("nvme tier is closed")]
    Closed,
}

/// A value read back, with the checksum it was stored with (verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeValue {
    pub bytes: Bytes,
    pub checksum: u32,
}

/// Figures of one tier since `open`.
///
/// Exact: `capacity_bytes`, `block_bytes`, `evicted_blocks`, and every
/// operation counter (`writes` … `corrupt`) for calls on this handle.
///
/// Block-granular: `used_bytes` = sealed blocks × block size. The block
/// being filled is not counted until it is sealed, and space freed by
/// `remove` inside a sealed block is not subtracted until foyer reclaims it.
///
/// Not exact: `entries` counts keys this handle inserted minus those it
/// removed. foyer 0.22 exposes no entry count: entries recovered at open and
/// entries dropped by block eviction are not reflected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmeStats {
    pub capacity_bytes: u64,
    pub block_bytes: u64,
    pub used_bytes: u64,
    pub entries: u64,
    pub evicted_blocks: u64,
    /// Live values copied forward out of reclaimed blocks, and live values
    /// a reclaim dropped (evictions: copying them forward would have cost
    /// more than `REINSERT_PER_WRITE`).
    pub reinserted: u64,
    pub reclaim_dropped: u64,
    /// Inserts acknowledged, and their value bytes.
    pub writes: u64,
    pub write_bytes: u64,
    /// `get` calls, and how they ended.
    pub reads: u64,
    pub hits: u64,
    pub misses: u64,
    pub read_bytes: u64,
    /// Failed inserts, gets and removes (I/O or corruption).
    pub errors: u64,
    /// Checksum mismatches found (on insert or read).
    pub corrupt: u64,
}

#[derive(Debug, Default)]
struct Counters {
    entries: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    reads: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    read_bytes: AtomicU64,
    errors: AtomicU64,
    corrupt: AtomicU64,
}

/// The NVMe tier. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct NvmeTier<B: Backend = FoyerBackend> {
    backend: B,
    max_value_bytes: u64,
    closed: AtomicBool,
    counters: Counters,
}

impl NvmeTier<FoyerBackend> {
    /// Opens (and with `recover`, recovers) the tier at `config.path`.
    /// Must run inside a tokio runtime: foyer spawns its flusher there.
    pub async fn open(config: NvmeConfig) -> Result<Self, NvmeError> {
        validate(&config)?;
        let backend = FoyerBackend::open(&config).await?;
        Ok(Self::with_backend(backend, config.max_value_bytes))
    }
}

fn validate(config: &NvmeConfig) -> Result<(), NvmeError> {
    if config.max_value_bytes == 0 || config.max_value_bytes > MAX_VALUE_BYTES_LIMIT {
        return Err(NvmeError::InvalidConfig(format!(
            "max_value_bytes {} must be in 1..={MAX_VALUE_BYTES_LIMIT}",
            config.max_value_bytes
        )));
    }
    let need = MIN_BLOCKS * block_bytes(config.max_value_bytes);
    if config.capacity_bytes < need {
        return Err(NvmeError::InvalidConfig(format!(
            "capacity_bytes {} is below {need} ({MIN_BLOCKS} blocks for max_value_bytes {})",
            config.capacity_bytes, config.max_value_bytes
        )));
    }
    Ok(())
}

impl<B: Backend> NvmeTier<B> {
    /// Wraps an opened backend (tests pass a `faulty::Faulty` here).
    pub fn with_backend(backend: B, max_value_bytes: u64) -> Self {
        NvmeTier {
            backend,
            max_value_bytes,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Largest value accepted.
    pub fn max_value_bytes(&self) -> u64 {
        self.max_value_bytes
    }

    /// Stores `value` under `key`, replacing any previous value, with the
    /// CRC32C of its bytes, summed here (the one pass over them before the
    /// write) and checked on every read. Returns once the value is on the
    /// device (see the module's durability notes); on any error it is
    /// absent.
    pub async fn insert(&self, key: Bytes, value: Bytes) -> Result<(), NvmeError> {
        self.check_open()?;
        check_len("key", key.len(), MAX_KEY_BYTES as u64)?;
        check_len("value", value.len(), self.max_value_bytes)?;
        let checksum = crate::checksum::crc32c(&value);
        let replaced = self.backend.contains(&key);
        if replaced {
            // So that a failed write leaves the key absent, not stale.
            self.backend.delete(&key);
        }
        let len = value.len() as u64;
        let entry = Entry {
            checksum,
            bytes: value,
        };
        match self.backend.put(key, entry).await {
            Ok(()) => {
                self.counters.writes.fetch_add(1, Relaxed);
                self.counters.write_bytes.fetch_add(len, Relaxed);
                if !replaced {
                    self.counters.entries.fetch_add(1, Relaxed);
                }
                Ok(())
            }
            Err(e) => {
                if replaced {
                    self.dec_entries();
                }
                Err(self.failed(e))
            }
        }
    }

    /// The value of `key`, verified against its checksum; `Ok(None)` when
    /// absent (never stored, removed, evicted, or dropped by foyer's own
    /// entry checksum on a damaged block).
    pub async fn get(&self, key: &Bytes) -> Result<Option<NvmeValue>, NvmeError> {
        self.check_open()?;
        self.counters.reads.fetch_add(1, Relaxed);
        let entry = match self.backend.load(key).await {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                self.counters.misses.fetch_add(1, Relaxed);
                return Ok(None);
            }
            Err(e) => return Err(self.failed(e)),
        };
        if crate::checksum::crc32c(&entry.bytes) != entry.checksum {
            tracing::warn!(
                key_len = key.len(),
                "nvme: checksum mismatch, entry removed"
            );
            self.backend.delete(key);
            self.backend.flush().await;
            self.dec_entries();
            self.counters.corrupt.fetch_add(1, Relaxed);
            return Err(self.failed(NvmeError::Corrupt));
        }
        self.counters.hits.fetch_add(1, Relaxed);
        self.counters
            .read_bytes
            .fetch_add(entry.bytes.len() as u64, Relaxed);
        Ok(Some(NvmeValue {
            bytes: entry.bytes,
            checksum: entry.checksum,
        }))
    }

    /// Removes `key`; returns whether it was present. Durable on return.
    pub async fn remove(&self, key: &Bytes) -> Result<bool, NvmeError> {
        self.check_open()?;
        let present = self.backend.contains(key);
        if present {
            self.backend.delete(key);
            self.backend.flush().await;
            self.dec_entries();
        }
        Ok(present)
    }

    /// Drops `key` from the index at once, without waiting for its
    /// tombstone to reach the device (the next insert or flush carries it).
    /// Returns whether it was indexed. For callers that cannot wait (under
    /// a lock); across a crash before the next flush the key may come back.
    pub fn forget(&self, key: &[u8]) -> bool {
        if self.closed.load(Relaxed) || !self.backend.contains(key) {
            return false;
        }
        self.backend.delete(key);
        self.dec_entries();
        true
    }

    /// Whether `key` is indexed. May say `true` for a key whose block is
    /// being evicted, or on a 64-bit hash collision; `get` is authoritative.
    pub fn contains(&self, key: &[u8]) -> bool {
        !self.closed.load(Relaxed) && self.backend.contains(key)
    }

    /// Keys whose live value a reclaim dropped since the last call (at most
    /// `max`; see [`Backend::take_lost`]).
    pub fn take_lost(&self, max: usize) -> Vec<Bytes> {
        self.backend.take_lost(max)
    }

    /// Waits until everything acknowledged so far is on the device. Inserts
    /// and removes already wait for this; `flush` covers corrupt-entry
    /// removals and is the barrier before a snapshot of the files.
    pub async fn flush(&self) -> Result<(), NvmeError> {
        self.check_open()?;
        self.backend.flush().await;
        Ok(())
    }

    /// Flushes and closes. Later calls return [`NvmeError::Closed`].
    pub async fn close(&self) -> Result<(), NvmeError> {
        if self.closed.swap(true, Relaxed) {
            return Ok(());
        }
        self.backend.close().await
    }

    pub fn stats(&self) -> NvmeStats {
        let c = &self.counters;
        let usage = self.backend.usage();
        NvmeStats {
            capacity_bytes: usage.capacity_bytes,
            block_bytes: usage.block_bytes,
            used_bytes: usage.sealed_blocks * usage.block_bytes,
            entries: c.entries.load(Relaxed),
            evicted_blocks: usage.evicted_blocks,
            reinserted: usage.reinserted,
            reclaim_dropped: usage.reclaim_dropped,
            writes: c.writes.load(Relaxed),
            write_bytes: c.write_bytes.load(Relaxed),
            reads: c.reads.load(Relaxed),
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            errors: c.errors.load(Relaxed),
            corrupt: c.corrupt.load(Relaxed),
        }
    }

    fn check_open(&self) -> Result<(), NvmeError> {
        if self.closed.load(Relaxed) {
            return Err(NvmeError::Closed);
        }
        Ok(())
    }

    fn failed(&self, e: NvmeError) -> NvmeError {
        self.counters.errors.fetch_add(1, Relaxed);
        e
    }

    fn dec_entries(&self) {
        let _ = self
            .counters
            .entries
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }
}

fn check_len(what: &'static str, len: usize, max: u64) -> Result<(), NvmeError> {
    if len as u64 > max {
        return Err(NvmeError::TooLarge {
            what,
            len: len as u64,
            max,
        });
    }
    Ok(())
}
