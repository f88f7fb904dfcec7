//! Registered memory: the rkey table every transport checks reads against.
//!
//! A [`Region`] is the owner's handle on registered memory; the
//! [`RegionTable`] maps rkeys to live regions and is the only place that
//! decides whether `(addr, len, rkey, epoch)` may be served. It never touches
//! the memory itself: transports do, and only with a [`ServeTicket`] in hand.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::TransferError;

/// Most regions one transport keeps registered at once. The store registers
/// a few arenas and clients a few buffers each, so this is generous; it
/// bounds the table and makes a fresh random rkey cheap to find.
pub const REGIONS_MAX: usize = 1 << 16;

/// Why a [`ReadGuard`] refused to serve a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The descriptor's epoch is not the current one for that memory.
    Stale,
    /// The memory no longer holds a readable value (freed, being moved).
    Gone,
}

/// Lets the memory's owner veto or pin each read before it is served.
///
/// The data plane calls [`ReadGuard::pin`] after its own rkey and bounds
/// checks and holds the returned token until the last byte has been handed
/// to the socket, so the store can refuse stale epochs and keep the value
/// from being evicted or overwritten while it is being sent.
pub trait ReadGuard: Send + Sync {
    /// Called on the data plane's task: must not block.
    fn pin(&self, addr: u64, len: u64, epoch: Option<u64>) -> Result<Box<dyn Any + Send>, Refusal>;
}

/// Registered memory `[addr, addr + len)`, readable by peers under `rkey`.
///
/// Dropping the handle deregisters the region: reads that have not started
/// are refused from then on. Reads already being served finish; use
/// [`Region::close`] to also wait for them before freeing the memory.
pub struct Region {
    addr: u64,
    len: u64,
    rkey: u32,
    entry: Arc<Entry>,
    table: Arc<RegionTable>,
    /// The NIC's registration when a verbs transport made this region:
    /// dropped (deregistered) with the handle, after the table entry.
    hw: Option<HwKey>,
}

/// A memory registration held by the NIC: its local key and the handle
/// whose drop deregisters it (so the rkey stops working).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) struct HwKey {
    pub(crate) lkey: u32,
    pub(crate) _mr: Box<dyn Any + Send + Sync>,
}

impl Region {
    /// First byte of the region.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: empty regions cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Key peers must present to read this region.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The NIC's local key, for regions a verbs transport registered.
    pub(crate) fn lkey(&self) -> Option<u32> {
        self.hw.as_ref().map(|h| h.lkey)
    }

    /// Deregisters now, without waiting for reads in progress.
    pub fn deregister(self) {
        drop(self);
    }

    /// Deregisters, then waits until no read of this region is being served,
    /// after which the memory may be freed or reused.
    pub async fn close(self) {
        self.table.remove(self.rkey, &self.entry);
        loop {
            let drained = self.entry.drained.notified();
            tokio::pin!(drained);
            // Register interest before checking, so a ticket dropped in
            // between still wakes us.
            drained.as_mut().enable();
            if self.entry.serving.load(Ordering::Acquire) == 0 {
                return;
            }
            drained.await;
        }
    }

    /// Deregisters, then runs `then` once no read of this region is being
    /// served: right here if none is, else on the thread that ends the
    /// last one. Never blocks and needs no runtime, for owners that cannot
    /// await (a `Drop`). Blocking there instead could wait forever when the
    /// read is served by a task of a current-thread runtime that nobody is
    /// driving; spawning the wait could lose it (and the memory) to a
    /// runtime that is shutting down.
    pub fn close_then(self, then: impl FnOnce() + Send + 'static) {
        let entry = Arc::clone(&self.entry);
        // Removes the entry (and the NIC's registration): no read is
        // counted from here on.
        drop(self);
        // Checked under the slot's lock, which the last ticket takes after
        // counting itself out: either this sees zero and runs `then`, or
        // that ticket finds `then` in the slot.
        let mut slot = entry.on_drained.lock();
        if entry.serving.load(Ordering::Acquire) == 0 {
            drop(slot);
            then();
        } else {
            *slot = Some(Box::new(then));
        }
    }

    /// Raw pointer to `offset` within the region, after checking that
    /// `[offset, offset + len)` lies inside it.
    pub(crate) fn slice_ptr(&self, offset: u64, len: u64) -> Result<*mut u8, TransferError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok((self.addr + offset) as *mut u8),
            _ => Err(TransferError::BadDescriptor(
                "range outside the local region",
            )),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.table.remove(self.rkey, &self.entry);
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey", &format_args!("{:08x}", self.rkey))
            .finish()
    }
}

/// One registered region, shared by its [`Region`] handle, the table and the
/// tickets of reads being served from it.
pub(crate) struct Entry {
    addr: u64,
    len: u64,
    guard: Option<Arc<dyn ReadGuard>>,
    /// Reads being served right now; `close` waits for zero.
    serving: AtomicUsize,
    drained: Notify,
    /// What `close_then` left to run when the last read ends.
    on_drained: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// Permission to send `[addr, addr + len)` of a live region: the rkey and
/// bounds were checked and the guard (if any) pinned the memory. Hold it
/// until the last byte is written.
pub(crate) struct ServeTicket {
    entry: Arc<Entry>,
    _token: Option<Box<dyn Any + Send>>,
}

impl Drop for ServeTicket {
    fn drop(&mut self) {
        if self.entry.serving.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.entry.drained.notify_waiters();
            let then = self.entry.on_drained.lock().take();
            if let Some(then) = then {
                then();
            }
        }
    }
}

/// Why the table refused to serve a read; travels as a wire status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    UnknownRkey,
    OutOfRange,
    Stale,
    Gone,
}

impl From<Denied> for TransferError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::UnknownRkey => Self::BadDescriptor("unknown or deregistered rkey"),
            Denied::OutOfRange => Self::BadDescriptor("range outside the region"),
            Denied::Stale => Self::Stale,
            Denied::Gone => {
                Self::BadDescriptor("range outside the leased value, or memory no longer readable")
            }
        }
    }
}

/// rkey → live region. One per transport.
pub(crate) struct RegionTable {
    regions: RwLock<HashMap<u32, Arc<Entry>>>,
    /// xorshift64 state for rkeys. rkeys are unpredictable enough to catch
    /// stale or mistyped descriptors, but they are NOT a security boundary:
    /// anyone who can reach the data plane and guess or sniff an rkey can
    /// read the region.
    rng: Mutex<u64>,
}

impl RegionTable {
    pub(crate) fn new() -> Arc<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let pid = u64::from(std::process::id());
        // std's per-process random hasher keys come from the OS: containers
        // that all run as pid 1 and start in the same instant still get
        // different rkeys.
        let os_random = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(nanos);
            h.finish()
        };
        Arc::new_cyclic(|me: &std::sync::Weak<Self>| Self {
            regions: RwLock::new(HashMap::new()),
            // Mixing in the table's own address separates transports that
            // were created in the same nanosecond by the same process.
            rng: Mutex::new((nanos ^ pid.rotate_left(32) ^ me.as_ptr() as u64 ^ os_random) | 1),
        })
    }

    /// Adds a region under a fresh rkey that no live region uses.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be valid for reads and writes until the
    /// returned [`Region`] is dropped and no read of it is being served (see
    /// [`Region::close`]), and nothing else may access a range while a
    /// transfer into or out of it is in flight.
    pub(crate) unsafe fn register(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.insert(addr, len, guard, None) }
    }

    /// Adds a region the NIC registered, under the NIC's rkey. The NIC
    /// serves reads itself, so no guard is asked per read (see
    /// `docs/OPERATIONS.md`, "RDMA and leases").
    ///
    /// # Safety
    /// As [`RegionTable::register`].
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) unsafe fn register_hw(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        hw: HwKey,
        rkey: u32,
    ) -> Result<Region, TransferError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.insert(addr, len, None, Some((hw, rkey))) }
    }

    /// # Safety
    /// As [`RegionTable::register`].
    unsafe fn insert(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
        hw: Option<(HwKey, u32)>,
    ) -> Result<Region, TransferError> {
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(TransferError::BadDescriptor(
                "region is null, empty or wraps the address space",
            ));
        }
        let entry = Arc::new(Entry {
            addr,
            len,
            guard,
            serving: AtomicUsize::new(0),
            drained: Notify::new(),
            on_drained: Mutex::new(None),
        });
        let mut regions = self.regions.write();
        if regions.len() >= REGIONS_MAX {
            return Err(TransferError::Busy("region table full"));
        }
        let (rkey, hw) = match hw {
            // The NIC issues unique rkeys for live registrations.
            Some((hw, rkey)) if !regions.contains_key(&rkey) => (rkey, Some(hw)),
            Some(_) => return Err(TransferError::Busy("NIC reissued a live rkey")),
            None => loop {
                let candidate = self.next_random() as u32;
                if candidate != 0 && !regions.contains_key(&candidate) {
                    break (candidate, None);
                }
            },
        };
        regions.insert(rkey, Arc::clone(&entry));
        Ok(Region {
            addr,
            len,
            rkey,
            entry,
            table: Arc::clone(self),
            hw,
        })
    }

    /// Checks a peer's read and pins the memory for it.
    pub(crate) fn admit(
        &self,
        addr: u64,
        len: u64,
        rkey: u32,
        epoch: Option<u64>,
    ) -> Result<ServeTicket, Denied> {
        // Counted under the table's lock: `close` removes the entry under
        // the write lock and then waits for zero, so a read either counted
        // itself first (and `close` waits for it) or finds the rkey gone.
        // Counted after the lock was let go, a read could slip in after
        // `close` had seen zero and returned, and send memory its owner
        // was already freeing (a test below caught that).
        let entry = {
            let regions = self.regions.read();
            let entry = regions.get(&rkey).ok_or(Denied::UnknownRkey)?;
            entry.serving.fetch_add(1, Ordering::AcqRel);
            Arc::clone(entry)
        };
        // From here the ticket's drop gives the count back, on every path.
        let mut ticket = ServeTicket {
            entry,
            _token: None,
        };
        let e = &ticket.entry;
        let inside = addr >= e.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= e.addr + e.len);
        if !inside {
            return Err(Denied::OutOfRange);
        }
        if let Some(guard) = &ticket.entry.guard {
            ticket._token = Some(guard.pin(addr, len, epoch).map_err(|r| match r {
                Refusal::Stale => Denied::Stale,
                Refusal::Gone => Denied::Gone,
            })?);
        }
        Ok(ticket)
    }

    /// Removes `rkey` if it still names `entry` (the rkey may have been
    /// reissued after an earlier removal).
    fn remove(&self, rkey: u32, entry: &Arc<Entry>) {
        let mut regions = self.regions.write();
        if regions.get(&rkey).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            regions.remove(&rkey);
        }
    }

    fn next_random(&self) -> u64 {
        let mut s = self.rng.lock();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Epoch(u64);

    impl ReadGuard for Epoch {
        fn pin(
            &self,
            _addr: u64,
            _len: u64,
            epoch: Option<u64>,
        ) -> Result<Box<dyn Any + Send>, Refusal> {
            match epoch {
                Some(e) if e != self.0 => Err(Refusal::Stale),
                _ => Ok(Box::new(())),
            }
        }
    }

    #[test]
    fn admits_only_live_in_range_reads() {
        let mem = vec![0u8; 4096];
        let table = RegionTable::new();
        // SAFETY: `mem` outlives `region` (dropped at the end of the test
        // after it) and nothing reads it concurrently.
        let region = unsafe { table.register(mem.as_ptr() as u64, 4096, Some(Arc::new(Epoch(3)))) }
            .expect("register");
        let (a, k) = (region.addr(), region.rkey());
        assert!(table.admit(a, 4096, k, Some(3)).is_ok());
        assert!(table.admit(a + 4095, 1, k, None).is_ok());
        let denied = |addr, len, rkey, epoch| table.admit(addr, len, rkey, epoch).err();
        assert_eq!(denied(a, 4097, k, None), Some(Denied::OutOfRange));
        assert_eq!(denied(a - 1, 1, k, None), Some(Denied::OutOfRange));
        assert_eq!(denied(a, u64::MAX, k, None), Some(Denied::OutOfRange));
        assert_eq!(denied(a, 1, k ^ 1, None), Some(Denied::UnknownRkey));
        assert_eq!(denied(a, 1, k, Some(2)), Some(Denied::Stale));
        assert_eq!(region.entry.serving.load(Ordering::Acquire), 0);
        drop(region);
        assert_eq!(denied(a, 1, k, None), Some(Denied::UnknownRkey));
    }

    #[test]
    fn rkeys_are_distinct_while_live() {
        let mem = [0u8; 64];
        let table = RegionTable::new();
        let regions: Vec<Region> = (0..1000)
            // SAFETY: `mem` outlives every region (they drop first).
            .map(|_| unsafe { table.register(mem.as_ptr() as u64, 64, None) }.expect("register"))
            .collect();
        let mut keys: Vec<u32> = regions.iter().map(Region::rkey).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), regions.len());
    }

    /// A read admitted while its region is closing keeps `close` waiting:
    /// `close` never returns while a ticket for the region is out, so the
    /// owner never frees memory that is still being sent. Two threads race
    /// admits against register/close cycles and check that invariant.
    #[test]
    fn close_never_returns_while_a_read_is_admitted() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let mem = [0u8; 64];
        let addr = mem.as_ptr() as u64;
        let table = RegionTable::new();
        // (generation << 32 | rkey) of the region being raced; the
        // generation's close has returned once `closed` holds it.
        let current = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (table, current, closed, stop) =
                (table.clone(), current.clone(), closed.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut admitted, mut violations) = (0u64, 0u64);
                while !stop.load(Ordering::Acquire) {
                    let cur = current.load(Ordering::Acquire);
                    let (gen, rkey) = (cur >> 32, cur as u32);
                    if let Ok(ticket) = table.admit(addr, 64, rkey, None) {
                        admitted += 1;
                        if closed.load(Ordering::Acquire) >= gen {
                            violations += 1;
                        }
                        drop(ticket);
                    }
                }
                (admitted, violations)
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1500);
        let mut gen = 0u64;
        while std::time::Instant::now() < deadline {
            gen += 1;
            // SAFETY: `mem` outlives every region, closed in this loop.
            let region = unsafe { table.register(addr, 64, None) }.expect("register");
            current.store(gen << 32 | u64::from(region.rkey()), Ordering::Release);
            std::thread::yield_now();
            futures::executor::block_on(region.close());
            closed.store(gen, Ordering::Release);
        }
        stop.store(true, Ordering::Release);
        let (admitted, violations) = reader.join().expect("reader");
        assert!(admitted > 0, "no read was admitted in {gen} cycles");
        assert_eq!(
            violations, 0,
            "close returned under {violations} of {admitted} admitted reads"
        );
    }

    #[test]
    fn close_then_runs_once_the_last_read_ends() {
        use std::sync::atomic::AtomicU32;
        let mem = [0u8; 64];
        let addr = mem.as_ptr() as u64;
        let table = RegionTable::new();
        let ran = Arc::new(AtomicU32::new(0));
        let count = |ran: &Arc<AtomicU32>| {
            let ran = ran.clone();
            move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        // No read in progress: at once.
        // SAFETY: `mem` outlives the regions, closed before it drops.
        let idle = unsafe { table.register(addr, 64, None) }.expect("register");
        idle.close_then(count(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        // Two reads admitted: deregistered at once, run when both end.
        // SAFETY: as above.
        let busy = unsafe { table.register(addr, 64, None) }.expect("register");
        let rkey = busy.rkey();
        let a = table.admit(addr, 64, rkey, None).expect("admit a");
        let b = table.admit(addr, 8, rkey, None).expect("admit b");
        busy.close_then(count(&ran));
        assert_eq!(
            table.admit(addr, 1, rkey, None).err(),
            Some(Denied::UnknownRkey)
        );
        drop(a);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "ran with a read still out");
        // The last read ends on another thread, which runs it.
        std::thread::spawn(move || drop(b)).join().expect("thread");
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
