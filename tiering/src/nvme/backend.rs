//! The storage boundary under [`NvmeTier`](super::NvmeTier), and its real
//! implementation on foyer 0.22's block engine.
//!
//! [`Backend`] is the seam where faults are injected (see `faulty.rs`): foyer
//! 0.22 seals its own `Device` and `IoEngine` traits (their signatures name
//! types from private modules), so a faulty device cannot be plugged under it.
//!
//! [`FoyerBackend`] drives `foyer::Store` (the disk half of foyer's hybrid
//! cache) directly, with no in-memory cache in front: the `Cache` it is built
//! with only mints the `Piece`s that `Store::enqueue` takes, and each is
//! removed from it at once.
//!
//! foyer is a cache, not a store: its flusher silently drops an entry when its
//! write buffer or submit queue is full, and drops a whole batch when a write
//! fails. [`FoyerBackend::put`] therefore never trusts an enqueue: it bounds
//! the bytes in flight so the buffer cannot overflow, waits for the flush, and
//! then checks foyer's index. An entry missing there is reported as an error.
//!
//! # Reclaim and the live values it drops
//!
//! foyer frees space by reclaiming whole blocks, strictly oldest first
//! here (FIFO only). That drops every value in the block, live or not:
//! under overwrite churn even a live set of half the capacity keeps
//! losing values (`examples/nvme_churn.rs`,
//! docs/bench-notes/nvme.md). The reclaimer's reinsertion filter ([`Residents`])
//! knows, per key, how many copies are on the device and whether the key is
//! live, so it tells a key's current entry from its older copies (met
//! oldest first) and counts every live value a reclaim drops
//! ([`Usage::reclaim_dropped`], an eviction).
//!
//! Live values are copied forward before their block comes up for
//! reclaim, by this backend and not by foyer: after each put, entries of
//! this process whose block is within [`COPY_MARGIN_BLOCKS`] of the
//! reclaim point (blocks go strictly in the order they were sealed) are
//! read and written again, as new entries, within a budget of
//! [`REINSERT_PER_WRITE`] bytes per byte written. A copy is written only if
//! the key is still live and unchanged since the write it copies, checked
//! under the lock that also orders deletes, so a copy never brings back a
//! deleted or older value. foyer's own reinsertion is never used: it keeps
//! the entry's old sequence number, and foyer's recovery takes an entry
//! numbered below the one before it for the end of the block, so every
//! value written after a reinserted one in that block was lost after a
//! restart. Values recovered at open (written by an earlier process) are
//! not copied: this process does not know their keys.
//!
//! This module never sees checksums of values, RESP or transports.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::BuildHasher;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use foyer::{
    BlockEngineConfig, Cache, CacheBuilder, Code, DeviceBuilder, EvictionInfo, EvictionPicker,
    FifoPicker, FsDeviceBuilder, IoEngineConfig, Load, PsyncIoEngineConfig, RecoverMode,
    Statistics, StorageFilter, StorageFilterCondition, StorageFilterResult, Store, StoreBuilder,
};
use foyer_common::metrics::Metrics;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use super::{NvmeConfig, NvmeEngine, NvmeError};

/// foyer's I/O alignment; every entry on disk is padded to it.
pub const PAGE_BYTES: u64 = 4096;
/// Largest key accepted. Bounds the block-size overhead per entry.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest `max_value_bytes` accepted: one value must fit in one block, and
/// two blocks are held in DRAM as the flusher's write buffers.
pub const MAX_VALUE_BYTES_LIMIT: u64 = 256 << 20;
/// Fewest data blocks a device may have. foyer keeps one block being written
/// and reclaims when fewer than one is clean; below this, eviction thrashes.
pub const MIN_BLOCKS: u64 = 4;
/// foyer's per-blob index (its default), written in front of each blob.
const BLOB_INDEX_BYTES: u64 = 4096;
/// foyer's `EntryHeader` (36 bytes) plus the length prefixes of key and
/// value (8 each) plus our checksum (4), rounded up generously.
const ENTRY_OVERHEAD_BYTES: u64 = 128;
/// Write buffer size in blocks. In-flight puts are bounded by one block's
/// bytes so that foyer's buffer can never overflow (and drop an entry).
const WRITE_BUFFER_BLOCKS: u64 = 2;
/// io_uring: one submission thread (the node's cores serve the network) and
/// a queue deep enough for a block's worth of page writes.
const URING_THREADS: usize = 1;
const URING_IO_DEPTH: usize = 64;
/// Bytes that may be copied forward per byte written, on average: bounds
/// the write amplification at 1 + this. When the live set is too large
/// for that (near the capacity), the oldest live values are dropped
/// instead, as in any FIFO cache, and counted.
pub const REINSERT_PER_WRITE: f64 = 1.0;
/// How many blocks before its block is reclaimed a live entry is copied
/// forward. foyer reclaims the oldest sealed block when it takes its last
/// clean one, so an entry written while `s` blocks were sealed goes once
/// about `s + blocks - 1` are; its recorded `s` may be one late (its batch
/// sealed the block), hence one block of slack on top of one of warning.
pub const COPY_MARGIN_BLOCKS: u64 = 2;
/// Most copies one put makes, so that a burst of aging entries spreads
/// over several writes instead of stalling one.
const MAX_COPIES_PER_PUT: usize = 16;

/// A value as stored: the bytes and the CRC32C the writer vouched for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub checksum: u32,
    pub bytes: Bytes,
}

impl Code for Entry {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        writer
            .write_all(&self.checksum.to_le_bytes())
            .map_err(foyer::Error::io_error)?;
        self.bytes.encode(writer)
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        let mut checksum = [0u8; 4];
        reader
            .read_exact(&mut checksum)
            .map_err(foyer::Error::io_error)?;
        Ok(Entry {
            checksum: u32::from_le_bytes(checksum),
            bytes: Bytes::decode(reader)?,
        })
    }

    fn estimated_size(&self) -> usize {
        4 + self.bytes.estimated_size()
    }
}

/// Space figures a backend can give. Block-granular: foyer exposes neither
/// its entry count nor the fill of the block being written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of data blocks (exact: blocks × block size).
    pub capacity_bytes: u64,
    /// Size of one block = the eviction unit.
    pub block_bytes: u64,
    /// Blocks that hold data and are sealed (full, or recovered at open).
    pub sealed_blocks: u64,
    /// Blocks reclaimed since open.
    pub evicted_blocks: u64,
    /// Live entries copied forward before their block was reclaimed.
    pub reinserted: u64,
    /// Live entries a reclaim dropped (copying them would have exceeded
    /// [`REINSERT_PER_WRITE`], or they were recovered at open): evictions.
    pub reclaim_dropped: u64,
}

/// What [`NvmeTier`](super::NvmeTier) needs from storage. Implementations
/// store bytes; they never check value checksums.
pub trait Backend: Send + Sync + 'static {
    /// Writes `entry` under `key` and returns once it is on the device (or
    /// returns the reason it is not). Replaces an existing entry.
    fn put(&self, key: Bytes, entry: Entry) -> impl Future<Output = Result<(), NvmeError>> + Send;
    /// Reads the entry of `key`; `Ok(None)` when absent.
    fn load(&self, key: &Bytes) -> impl Future<Output = Result<Option<Entry>, NvmeError>> + Send;
    /// Drops `key` from the index at once; the tombstone reaches the device
    /// with the next [`Backend::flush`] or `put`.
    fn delete(&self, key: &[u8]);
    /// Whether `key` is indexed (true on a 64-bit hash collision too).
    fn contains(&self, key: &[u8]) -> bool;
    /// Waits until every write and tombstone submitted so far is on the device.
    fn flush(&self) -> impl Future<Output = ()> + Send;
    /// Flushes and stops accepting writes.
    fn close(&self) -> impl Future<Output = Result<(), NvmeError>> + Send;
    fn usage(&self) -> Usage;
    /// Up to `max` keys whose live value a reclaim dropped since the last
    /// call (oldest first), so the layers above can say the value is gone.
    fn take_lost(&self, max: usize) -> Vec<Bytes> {
        let _ = max;
        Vec::new()
    }
}

/// Block geometry for a configuration: one block holds the largest value.
pub fn block_bytes(max_value_bytes: u64) -> u64 {
    let entry = max_value_bytes + MAX_KEY_BYTES as u64 + ENTRY_OVERHEAD_BYTES;
    entry.div_ceil(PAGE_BYTES) * PAGE_BYTES + BLOB_INDEX_BYTES
}

/// Bytes an entry occupies in foyer's write buffer (page-aligned).
fn buffered_bytes(key: &Bytes, entry: &Entry) -> u64 {
    let len = (key.len() + entry.bytes.len()) as u64 + ENTRY_OVERHEAD_BYTES;
    len.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

type FoyerStore = Store<Bytes, Entry, foyer::DefaultHasher, foyer::CacheProperties>;

/// foyer 0.22 block engine on a directory of block files (`FsDevice`).
pub struct FoyerBackend {
    store: FoyerStore,
    /// Mints `Piece`s for `Store::enqueue`; holds nothing between calls.
    pieces: Cache<Bytes, Entry>,
    /// Bytes that may sit in foyer's write buffer at once.
    in_flight: Semaphore,
    /// Held across `Store::enqueue`. foyer numbers an entry (an atomic
    /// counter) and then sends it to the flusher; two writers between those
    /// steps put a block's entries out of sequence order, and foyer's
    /// recovery stops reading a block at the first entry numbered below
    /// the one before it: every later value in that block was lost after a
    /// restart (`concurrent_writers_are_all_recovered_after_a_restart`).
    enqueue: Mutex<()>,
    block_bytes: u64,
    counts: Arc<BlockCounts>,
    residents: Arc<Residents>,
}

impl FoyerBackend {
    pub async fn open(config: &NvmeConfig) -> Result<Self, NvmeError> {
        let block = block_bytes(config.max_value_bytes);
        check_space(&config.path, config.capacity_bytes)?;

        let device = FsDeviceBuilder::new(&config.path)
            .with_capacity(config.capacity_bytes as usize)
            .with_direct(config.direct_io)
            .build()
            .map_err(io("open device"))?;
        let counts = Arc::new(BlockCounts::default());
        let residents = Arc::new(Residents::new(config.capacity_bytes));
        let buffer = block * WRITE_BUFFER_BLOCKS;
        let engine = BlockEngineConfig::new(device)
            .with_block_size(block as usize)
            .with_flushers(1)
            .with_reclaimers(1)
            .with_buffer_pool_size(buffer as usize)
            .with_submit_queue_size_threshold(2 * buffer as usize)
            // Without it a removed key comes back after a restart.
            .with_tombstone_log(true)
            // FIFO only: see the module notes on reclaim.
            .with_eviction_pickers(vec![
                Box::new(CountingPicker(counts.clone())),
                Box::<FifoPicker>::default(),
            ])
            .with_reinsertion_filter(
                StorageFilter::new().with_condition(ReinsertLive(residents.clone())),
            );

        let pieces: Cache<Bytes, Entry> = CacheBuilder::new(64).with_shards(8).build();
        let builder = StoreBuilder::new("strata-nvme", pieces.clone(), Arc::new(Metrics::noop()))
            .with_engine_config(engine)
            .with_recover_mode(if config.recover {
                // Quiet: a torn blob (killed mid-write) is skipped, not fatal.
                RecoverMode::Quiet
            } else {
                RecoverMode::None
            });
        let builder = match config.engine {
            NvmeEngine::Psync => builder.with_io_engine_config(PsyncIoEngineConfig::new()),
            NvmeEngine::IoUring => builder.with_io_engine_config(
                foyer::UringIoEngineConfig::new()
                    .with_threads(URING_THREADS)
                    .with_io_depth(URING_IO_DEPTH)
                    .boxed() as Box<dyn IoEngineConfig>,
            ),
        };
        let store = builder.build().await.map_err(io("open store"))?;

        let blocks = counts.blocks.load(Relaxed);
        if blocks < MIN_BLOCKS {
            store.close().await.map_err(io("close"))?;
            return Err(NvmeError::InvalidConfig(format!(
                "capacity_bytes {} holds {blocks} blocks of {block} bytes (max_value_bytes {}); at least {MIN_BLOCKS} are needed",
                config.capacity_bytes, config.max_value_bytes
            )));
        }
        preallocate(&config.path)?;
        Ok(FoyerBackend {
            store,
            pieces,
            // One block, not the whole pool: entries in flight then fill at
            // most the block being written plus the next one, whatever the
            // padding foyer adds per blob. Budgeting the whole pool let
            // concurrent puts overflow it (and foyer dropped them).
            in_flight: Semaphore::new(block as usize),
            enqueue: Mutex::new(()),
            block_bytes: block,
            counts,
            residents,
        })
    }
}

impl FoyerBackend {
    /// Writes one entry and waits for it to be indexed. `copy` is the block
    /// ordinal of the write being copied forward: the copy is enqueued only
    /// if the key is live and unchanged since then.
    async fn write(&self, key: Bytes, entry: Entry, copy: Option<u64>) -> Result<(), NvmeError> {
        let need = buffered_bytes(&key, &entry) as u32;
        let hash = hash_of(&key);
        let _permit = self
            .in_flight
            .acquire_many(need)
            .await
            .map_err(|_| NvmeError::Closed)?;
        let piece = self.pieces.insert(key.clone(), entry).piece();
        self.pieces.remove(&key);
        {
            let _in_order = self.enqueue.lock();
            if !self.residents.enqueuing(hash, copy) {
                return Ok(());
            }
            self.store.enqueue(piece, true);
        }
        self.store.wait().await;
        if self.store.may_contains(&key) {
            let block = self.counts.sealed_total.load(Relaxed);
            self.residents.written(&key, hash, need, block, copy);
            Ok(())
        } else {
            self.residents.not_written(hash);
            // Dropped by foyer: a failed device write, a closed store, or the
            // block evicted before we looked. Either way it is not there.
            Err(NvmeError::Io {
                op: "write",
                reason: "entry not indexed after flush (device write failed or evicted at once)"
                    .into(),
            })
        }
    }

    /// Copies forward the live entries whose block is about to be
    /// reclaimed, as far as the budget allows (module notes).
    async fn copy_forward(&self) {
        let blocks = self.counts.blocks.load(Relaxed);
        let horizon = blocks.saturating_sub(1 + COPY_MARGIN_BLOCKS).max(1);
        for _ in 0..MAX_COPIES_PER_PUT {
            let now = self.counts.sealed_total.load(Relaxed);
            let Some((key, block)) = self.residents.next_to_copy(now, horizon) else {
                return;
            };
            // Read outside every lock; a change meanwhile is caught by the
            // check in `write`.
            let entry = match self.store.load(&key).await {
                Ok(Load::Entry { value, .. }) => value,
                Ok(Load::Piece { piece, .. }) => piece.value().clone(),
                Ok(_) | Err(_) => continue,
            };
            if self.write(key, entry, Some(block)).await.is_err() {
                return;
            }
        }
    }
}

impl Backend for FoyerBackend {
    async fn put(&self, key: Bytes, entry: Entry) -> Result<(), NvmeError> {
        self.write(key, entry, None).await?;
        self.copy_forward().await;
        Ok(())
    }

    async fn load(&self, key: &Bytes) -> Result<Option<Entry>, NvmeError> {
        match self.store.load(key).await.map_err(io("read"))? {
            Load::Entry { value, .. } => Ok(Some(value)),
            Load::Piece { piece, .. } => Ok(Some(piece.value().clone())),
            // Throttled needs a read throttle, which is never configured.
            Load::Miss | Load::Throttled => Ok(None),
        }
    }

    fn delete(&self, key: &[u8]) {
        // Under the enqueue lock: a copy forward of this key either is
        // enqueued before the tombstone (which then wins) or sees it gone.
        let _in_order = self.enqueue.lock();
        self.residents.deleted(hash_of(key));
        self.store.delete(key);
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.store.may_contains(key)
    }

    async fn flush(&self) {
        self.store.wait().await;
    }

    async fn close(&self) -> Result<(), NvmeError> {
        self.in_flight.close();
        self.store.close().await.map_err(io("close"))
    }

    fn usage(&self) -> Usage {
        Usage {
            capacity_bytes: self.counts.blocks.load(Relaxed) * self.block_bytes,
            block_bytes: self.block_bytes,
            sealed_blocks: self.counts.sealed.load(Relaxed),
            evicted_blocks: self.counts.evicted.load(Relaxed),
            reinserted: self.residents.reinserted.load(Relaxed),
            reclaim_dropped: self.residents.dropped.load(Relaxed),
        }
    }

    fn take_lost(&self, max: usize) -> Vec<Bytes> {
        let mut lost = self.residents.lost.lock();
        let n = lost.len().min(max);
        lost.drain(..n).collect()
    }
}

fn io(op: &'static str) -> impl Fn(foyer::Error) -> NvmeError {
    move |e| NvmeError::Io {
        op,
        reason: e.to_string(),
    }
}

#[derive(Debug, Default)]
struct BlockCounts {
    blocks: AtomicU64,
    sealed: AtomicU64,
    /// Blocks sealed since open (recovered ones included): the ordinal of
    /// the block being written, for aging entries.
    sealed_total: AtomicU64,
    evicted: AtomicU64,
}

/// Never picks; only observes block life cycles for [`Usage`].
#[derive(Debug)]
struct CountingPicker(Arc<BlockCounts>);

impl EvictionPicker for CountingPicker {
    fn init(&mut self, blocks: &[u32], _block_size: usize) {
        self.0.blocks.store(blocks.len() as u64, Relaxed);
    }

    fn pick(&mut self, _: EvictionInfo<'_>) -> Option<u32> {
        None
    }

    fn on_block_evictable(&mut self, info: EvictionInfo<'_>, _: u32) {
        self.0.sealed.store(info.evictable.len() as u64, Relaxed);
        self.0.sealed_total.fetch_add(1, Relaxed);
    }

    fn on_block_evict(&mut self, info: EvictionInfo<'_>, _: u32) {
        // `info.evictable` still lists the victim here.
        self.0
            .sealed
            .store(info.evictable.len().saturating_sub(1) as u64, Relaxed);
        self.0.evicted.fetch_add(1, Relaxed);
    }
}

/// foyer's hash of a key (its index is keyed by it; `Bytes` hashes as its
/// slice, so `&[u8]` and `Bytes` agree).
fn hash_of(key: &[u8]) -> u64 {
    foyer::DefaultHasher::default().hash_one(key)
}

/// What this process wrote, per foyer key hash: enough for the reclaimer
/// to tell a key's current entry from its older copies (module notes), the
/// order of the writes for copying forward, and the budget that bounds it.
#[derive(Debug)]
struct Residents {
    inner: Mutex<ResidentsInner>,
    /// Most credit saved up (bytes): a burst of copies after a quiet spell.
    max_credit: u64,
    reinserted: AtomicU64,
    dropped: AtomicU64,
    /// Keys of live values a reclaim dropped, until `take_lost` (at most
    /// [`MAX_LOST`]; past that only `dropped` counts them).
    lost: Mutex<VecDeque<Bytes>>,
}

/// Dropped keys kept for `take_lost`: the node asks every 100 ms, so this
/// covers bursts far beyond a device's reclaim rate.
const MAX_LOST: usize = 65_536;

#[derive(Debug, Default)]
struct ResidentsInner {
    keys: HashMap<u64, Resident>,
    /// Writes of this process, oldest first: one per entry on the device
    /// (stale ones are skipped when they come up), so bounded by what the
    /// device holds. The key shares the caller's buffer.
    order: VecDeque<Write>,
    /// Bytes that may still be copied forward: every byte written adds
    /// [`REINSERT_PER_WRITE`], every byte copied takes one.
    credit: u64,
}

#[derive(Debug)]
struct Write {
    key: Bytes,
    hash: u64,
    block: u64,
}

#[derive(Debug, Clone)]
struct Resident {
    /// Entries of this key on the device, current and older.
    copies: u32,
    /// Written and not deleted since.
    live: bool,
    bytes: u32,
    /// Block ordinal (sealed blocks at the time) of the current entry;
    /// [`PENDING`] while a new value is being written.
    block: u64,
    /// The key, once an entry of it is written (shares the caller's
    /// buffer): a reclaim that drops its live value reports it.
    key: Option<Bytes>,
}

/// [`Resident::block`] of a key whose new value is not on the device yet.
const PENDING: u64 = u64::MAX;

impl Residents {
    fn new(capacity_bytes: u64) -> Self {
        let max_credit = capacity_bytes / 4;
        Residents {
            inner: Mutex::new(ResidentsInner {
                keys: HashMap::new(),
                order: VecDeque::new(),
                credit: max_credit,
            }),
            max_credit,
            reinserted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            lost: Mutex::new(VecDeque::new()),
        }
    }

    /// An entry of `hash` is about to be enqueued (under the enqueue lock):
    /// a new value, or a copy of the write at ordinal `copy_of`, which goes
    /// ahead only if that write is still the key's live, current one.
    /// Counted as a copy on the device from here, so that a reclaim of the
    /// old copy meanwhile does not take it for the last one.
    fn enqueuing(&self, hash: u64, copy_of: Option<u64>) -> bool {
        let mut inner = self.inner.lock();
        match copy_of {
            None => {
                let r = inner.keys.entry(hash).or_insert(Resident {
                    copies: 0,
                    live: false,
                    bytes: 0,
                    block: PENDING,
                    key: None,
                });
                r.copies += 1;
                // No copy of an older write may land after this one.
                r.block = PENDING;
                true
            }
            Some(from) => match inner.keys.get_mut(&hash) {
                Some(r) if r.live && r.block == from => {
                    r.copies += 1;
                    true
                }
                _ => false,
            },
        }
    }

    /// An enqueued entry of `hash` did not reach the device.
    fn not_written(&self, hash: u64) {
        let mut inner = self.inner.lock();
        if let Some(r) = inner.keys.get_mut(&hash) {
            r.copies = r.copies.saturating_sub(1);
            if r.copies == 0 {
                inner.keys.remove(&hash);
            }
        }
    }

    /// The entry of `key` (`hash`) enqueued by [`Residents::enqueuing`] is
    /// on the device, in block ordinal `block`. One that is now the key's
    /// current entry is queued for aging.
    fn written(&self, key: &Bytes, hash: u64, bytes: u32, block: u64, copy_of: Option<u64>) {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let Some(r) = inner.keys.get_mut(&hash) else {
            // Its block was reclaimed before we looked: counted there.
            return;
        };
        let current = match copy_of {
            None => {
                r.live = true;
                r.bytes = bytes;
                r.block = block;
                if r.key.is_none() {
                    r.key = Some(key.clone());
                }
                let earned = (f64::from(bytes) * REINSERT_PER_WRITE) as u64;
                inner.credit = (inner.credit + earned).min(self.max_credit);
                true
            }
            // A delete or a newer write since the check leaves this copy an
            // older one.
            Some(from) if r.live && r.block == from => {
                r.block = block;
                self.reinserted.fetch_add(1, Relaxed);
                true
            }
            Some(_) => false,
        };
        if current {
            inner.order.push_back(Write {
                key: key.clone(),
                hash,
                block,
            });
        }
    }

    fn deleted(&self, hash: u64) {
        if let Some(r) = self.inner.lock().keys.get_mut(&hash) {
            r.live = false;
        }
    }

    /// The oldest write due for copying (its block at most `horizon` blocks
    /// from the one being written, `now`) that is still current, with the
    /// budget for it taken; stale writes are skipped, and one the budget
    /// cannot cover is left to the reclaimer (which counts it).
    fn next_to_copy(&self, now: u64, horizon: u64) -> Option<(Bytes, u64)> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        while inner
            .order
            .front()
            .is_some_and(|w| w.block + horizon <= now)
        {
            let w = inner.order.pop_front().expect("front checked");
            let Some(r) = inner.keys.get(&w.hash) else {
                continue;
            };
            if !r.live || r.block != w.block {
                continue;
            }
            if take(&mut inner.credit, u64::from(r.bytes)) {
                return Some((w.key, w.block));
            }
        }
        None
    }

    /// The reclaimer met an entry of `hash`: counts a live value dropped.
    /// Never admits: foyer's reinsertion would break recovery (module
    /// notes); live values were copied ahead of it where the budget
    /// allowed.
    fn reclaiming(&self, hash: u64) -> bool {
        let mut inner = self.inner.lock();
        let Some(r) = inner.keys.get_mut(&hash) else {
            // Written before this process started.
            return false;
        };
        r.copies = r.copies.saturating_sub(1);
        if r.copies > 0 {
            // An older copy: the newer one is further on.
            return false;
        }
        if r.live {
            self.dropped.fetch_add(1, Relaxed);
            if let Some(key) = r.key.take() {
                let mut lost = self.lost.lock();
                if lost.len() < MAX_LOST {
                    lost.push_back(key);
                }
            }
        }
        inner.keys.remove(&hash);
        false
    }
}

fn take(credit: &mut u64, bytes: u64) -> bool {
    match credit.checked_sub(bytes) {
        Some(left) => {
            *credit = left;
            true
        }
        None => false,
    }
}

#[derive(Debug)]
struct ReinsertLive(Arc<Residents>);

impl StorageFilterCondition for ReinsertLive {
    fn filter(&self, _: &Arc<Statistics>, hash: u64, _len: usize) -> StorageFilterResult {
        if self.0.reclaiming(hash) {
            StorageFilterResult::Admit
        } else {
            StorageFilterResult::Reject
        }
    }
}

/// Files foyer's `FsDevice` creates, one per block (plus the tombstone log).
const FOYER_FILE_PREFIX: &str = "foyer-storage-direct-fs-";

/// Refuses a capacity the filesystem cannot hold, before foyer creates
/// (sparse) block files for it.
fn check_space(dir: &Path, capacity_bytes: u64) -> Result<(), NvmeError> {
    std::fs::create_dir_all(dir).map_err(os("create dir"))?;
    let free = free_bytes(dir)?;
    let held = foyer_files(dir)?
        .iter()
        .map(|(_, allocated)| allocated)
        .sum::<u64>();
    if capacity_bytes > free + held {
        return Err(NvmeError::NoSpace {
            requested: capacity_bytes,
            available: free + held,
        });
    }
    Ok(())
}

/// Allocates every block file now, so that a full filesystem shows as
/// `NoSpace` at open and never as a failed write later.
fn preallocate(dir: &Path) -> Result<(), NvmeError> {
    use std::os::fd::AsRawFd;
    for (path, _) in foyer_files(dir)? {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(os("open block file"))?;
        let len = file.metadata().map_err(os("stat block file"))?.len();
        // SAFETY: `file` is an open descriptor owned for this whole call;
        // posix_fallocate reads no memory of ours.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        match rc {
            0 => {}
            libc::ENOSPC => {
                return Err(NvmeError::NoSpace {
                    requested: len,
                    available: free_bytes(dir)?,
                })
            }
            // Filesystems without fallocate keep sparse files: still correct,
            // only the early NoSpace guarantee is lost.
            libc::EOPNOTSUPP | libc::EINVAL => {}
            rc => {
                return Err(NvmeError::Io {
                    op: "preallocate",
                    reason: std::io::Error::from_raw_os_error(rc).to_string(),
                })
            }
        }
    }
    Ok(())
}

fn foyer_files(dir: &Path) -> Result<Vec<(std::path::PathBuf, u64)>, NvmeError> {
    use std::os::unix::fs::MetadataExt;
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).map_err(os("list dir"))? {
        let entry = entry.map_err(os("list dir"))?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(FOYER_FILE_PREFIX)
        {
            let meta = entry.metadata().map_err(os("stat block file"))?;
            files.push((entry.path(), meta.blocks() * 512));
        }
    }
    Ok(files)
}

fn free_bytes(dir: &Path) -> Result<u64, NvmeError> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| NvmeError::InvalidConfig("path contains a NUL byte".into()))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and outlives the call; `stat` is a
    // valid, exclusively borrowed out-parameter.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(os("statvfs")(std::io::Error::last_os_error()));
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

fn os(op: &'static str) -> impl Fn(std::io::Error) -> NvmeError {
    move |e| NvmeError::Io {
        op,
        reason: e.to_string(),
    }
}
