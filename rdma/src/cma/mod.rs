//! Same-host one-sided reads by cross-memory attach (`process_vm_readv`):
//! the party that wants the bytes copies them straight out of the other
//! process's memory, in one kernel copy, with no work on the other side.
//!
//! A `cma` descriptor names the owner by pid and start time (clock ticks
//! after boot, `/proc/<pid>/stat` field 22), so a recycled pid is never
//! read: a reader opens a pidfd, checks the start time, and after every
//! read checks that the process has not exited meanwhile (a pid is not
//! reused while its process lives, so a read that finished before the exit
//! read the right process).
//!
//! The kernel allows the read only where the reader may `ptrace` the owner
//! (same user and no Yama restriction, or `CAP_SYS_PTRACE`): such a reader
//! can already read all of the owner's memory, so CMA gives it nothing new.
//! Callers never offer it across users ([`same_user`]). Reads are checked
//! against nothing on the owner's side (it cannot see them): a lease's
//! epoch is confirmed afterwards, as over RDMA.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Descriptor, TransferError, TransportKind};

mod lanes;
pub use lanes::{DEFAULT_LANES, LANES_MAX, SPLIT_MIN_BYTES};

/// Most owner processes kept open at once.
const PEERS_MAX: usize = 4096;

/// This process as a `cma` descriptor names it, and what a peer compares
/// to tell whether it is on the same host, in the same pid namespace and
/// of the same user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub pid: u32,
    /// Clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
    /// `/proc/sys/kernel/random/boot_id`: one value per running kernel.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid`.
    pub pid_ns: u64,
    /// Real user id.
    pub uid: u32,
}

impl Identity {
    /// This process's identity.
    pub fn current() -> io::Result<Identity> {
        let pid = std::process::id();
        Ok(Identity {
            pid,
            start: start_time(pid)?,
            boot_id: boot_id()?,
            pid_ns: pid_ns()?,
            // SAFETY: getuid has no preconditions and cannot fail.
            uid: unsafe { libc::getuid() },
        })
    }

    /// The endpoint of this process's `cma` descriptors.
    pub fn endpoint(&self) -> String {
        Descriptor::process_endpoint(self.pid, self.start)
    }

    /// Why a peer with identity `other` cannot use CMA with this process,
    /// or `None` when it may try (the kernel still has the last word).
    pub fn mismatch(&self, other: &Identity) -> Option<&'static str> {
        if self.boot_id != other.boot_id {
            Some("another host")
        } else if self.pid_ns != other.pid_ns {
            Some("another pid namespace (a container?)")
        } else if self.uid != other.uid {
            Some("another user")
        } else {
            None
        }
    }
}

/// Start time of `pid` in clock ticks after boot.
pub fn start_time(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces or
    // parentheses itself: fields are counted after the last ')'.
    let after = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| io::Error::other("unparsable /proc/<pid>/stat"))?;
    // Field 3 is the first after ')'; field 22 is the 20th.
    after
        .split_whitespace()
        .nth(19)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| io::Error::other("unparsable /proc/<pid>/stat"))
}

/// Real uid of `pid`.
pub fn uid_of(pid: u32) -> io::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| io::Error::other("no Uid in /proc/<pid>/status"))
}

/// Whether `pid` runs as this process's real user.
pub fn same_user(pid: u32) -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    uid_of(pid).is_ok_and(|u| u == unsafe { libc::getuid() })
}

fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

fn pid_ns() -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self/ns/pid")?.ino())
}

/// An owner process held open for reads.
struct Peer {
    pid: u32,
    pidfd: OwnedFd,
}

impl Peer {
    fn open(pid: u32, start: u64) -> Result<Peer, TransferError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; no memory of ours is involved.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(os_error(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by
        // nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // Checked after the pidfd is open: the process it names had `pid`
        // then, and (alive now with the expected start time) it is the one
        // the descriptor names.
        match start_time(pid) {
            Ok(s) if s == start => Ok(Peer { pid, pidfd }),
            Ok(_) => Err(TransferError::BadDescriptor(
                "cma: that pid now belongs to another process",
            )),
            Err(e) => Err(os_error(e)),
        }
    }

    /// Whether the process has exited (its pidfd polls readable).
    fn exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
        rc != 0
    }

    /// Copies `[remote, remote + len)` of the process into `local`.
    ///
    /// # Safety
    /// `local` must be valid for writes of `len` bytes, and nothing else
    /// may access that range during the call.
    unsafe fn read(&self, remote: u64, local: *mut u8, len: usize) -> Result<(), TransferError> {
        let mut done = 0usize;
        while done < len {
            // SAFETY: done < len, so the pointer stays within `local`.
            let at = unsafe { local.add(done) };
            let liov = libc::iovec {
                iov_base: at.cast(),
                iov_len: len - done,
            };
            let riov = libc::iovec {
                iov_base: (remote + done as u64) as *mut libc::c_void,
                iov_len: len - done,
            };
            // SAFETY: `liov` covers memory the caller vouches for; the
            // remote range is only read by the kernel, checked against the
            // other process's mappings (EFAULT when not mapped).
            let n =
                unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &liov, 1, &riov, 1, 0) };
            match n {
                n if n > 0 => done += n as usize,
                0 => {
                    return Err(TransferError::BadDescriptor(
                        "cma: the range is not mapped in the owner process",
                    ))
                }
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(os_error(e));
                }
            }
        }
        if self.exited() {
            return Err(TransferError::PeerClosed);
        }
        Ok(())
    }
}

fn os_error(e: io::Error) -> TransferError {
    match e.raw_os_error() {
        Some(libc::EFAULT) => {
            TransferError::BadDescriptor("cma: the range is not mapped in the owner process")
        }
        Some(libc::ESRCH) => TransferError::PeerClosed,
        _ => TransferError::Io(e),
    }
}

/// Counters of a [`CmaReader`].
#[derive(Debug, Default)]
pub struct CmaStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    /// Reads that failed (permission, exited owner, unmapped range).
    pub errors: AtomicU64,
    /// Pieces of long reads that helper lanes copied (the callers copied
    /// the rest themselves).
    pub lane_pieces: Arc<AtomicU64>,
    /// Reads of at least [`MISALIGNED_MIN_BYTES`] whose source and
    /// destination differ in alignment modulo [`ALIGN_BYTES`]: the kernel
    /// copies those far slower (OPERATIONS.md,
    /// "Same-host data plane"), so a count here points at a buffer to
    /// align.
    pub misaligned: AtomicU64,
}

/// Alignment (bytes) the kernel's copy needs source and destination to
/// share to run at full speed: a destination 8 or 16 bytes off ran far
/// slower than one page-aligned, and one 64 bytes off ran at full speed
/// again (docs/bench-notes/cross-memory-attach.md).
pub const ALIGN_BYTES: u64 = 64;

/// Reads shorter than this are not counted as misaligned: their cost is
/// the system call, not the copy.
pub const MISALIGNED_MIN_BYTES: u64 = 64 * 1024;

/// Whether a read of `len` bytes from `src` to `dst` pays for misalignment.
pub fn misaligned(src: u64, dst: u64, len: u64) -> bool {
    len >= MISALIGNED_MIN_BYTES && !src.wrapping_sub(dst).is_multiple_of(ALIGN_BYTES)
}

/// Reads `cma` descriptors, keeping each owner's pidfd open between reads;
/// long reads are copied by several threads (see `lanes`).
pub struct CmaReader {
    peers: Mutex<HashMap<(u32, u64), Arc<Peer>>>,
    stats: CmaStats,
    lanes: lanes::Lanes,
}

impl Default for CmaReader {
    fn default() -> CmaReader {
        CmaReader::with_lanes(DEFAULT_LANES)
    }
}

impl CmaReader {
    /// A reader with [`DEFAULT_LANES`] lanes.
    pub fn new() -> CmaReader {
        CmaReader::default()
    }

    /// A reader whose reads of at least [`SPLIT_MIN_BYTES`] are copied by
    /// up to `lanes` threads (clamped to 1..=[`LANES_MAX`]; 1: the calling
    /// thread alone).
    pub fn with_lanes(lanes: usize) -> CmaReader {
        let stats = CmaStats::default();
        CmaReader {
            peers: Mutex::default(),
            lanes: lanes::Lanes::new(lanes, stats.lane_pieces.clone()),
            stats,
        }
    }

    /// Threads a long read is copied by.
    pub fn lanes(&self) -> usize {
        self.lanes.count()
    }

    pub fn stats(&self) -> &CmaStats {
        &self.stats
    }

    /// Copies the bytes `src` names into `dst`. Blocks the calling thread
    /// for the copy (memory speed: about 0.1 ms per MiB, less for long
    /// reads over several lanes).
    ///
    /// On error `dst` holds unspecified bytes.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `src.len` bytes, and nothing else
    /// may access that range during the call.
    pub unsafe fn read(&self, src: &Descriptor, dst: *mut u8) -> Result<(), TransferError> {
        let (pid, start) = match (src.transport, src.process()) {
            (TransportKind::Cma, Some(p)) => p,
            _ => return Err(TransferError::BadDescriptor("not a cma descriptor")),
        };
        if src.len == 0 {
            return Ok(());
        }
        let len = usize::try_from(src.len)
            .map_err(|_| TransferError::BadDescriptor("cma: length does not fit this machine"))?;
        let peer = self.peer(pid, start);
        // SAFETY: forwarded from this function's contract.
        let res = peer.and_then(|p| unsafe { self.lanes.read(&p, src.addr, dst, len) });
        match &res {
            Ok(()) => {
                self.stats.reads.fetch_add(1, Relaxed);
                self.stats.bytes.fetch_add(src.len, Relaxed);
                if misaligned(src.addr, dst as u64, src.len)
                    && self.stats.misaligned.fetch_add(1, Relaxed) == 0
                {
                    tracing::warn!(
                        src = format_args!("{:#x}", src.addr),
                        dst = format_args!("{:#x}", dst as usize),
                        len = src.len,
                        "a cross-memory read copies between addresses of different alignment modulo 64 bytes, at about half speed; align the client's buffers to 64 bytes (logged once; counted in cma misaligned)"
                    );
                }
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Relaxed);
                // Opened again (and checked again) next time.
                self.peers.lock().remove(&(pid, start));
            }
        }
        res
    }

    fn peer(&self, pid: u32, start: u64) -> Result<Arc<Peer>, TransferError> {
        if let Some(p) = self.peers.lock().get(&(pid, start)) {
            return Ok(p.clone());
        }
        let peer = Arc::new(Peer::open(pid, start)?);
        let mut peers = self.peers.lock();
        if peers.len() >= PEERS_MAX {
            // Owners come and go; forget them all rather than grow.
            peers.clear();
        }
        peers.insert((pid, start), peer.clone());
        Ok(peer)
    }
}

/// Bytes of the nonce a client proves itself with on a connection.
pub const NONCE_BYTES: usize = 16;

/// A fresh random nonce, from the kernel's generator; `None` if it fails
/// (a predictable nonce would make proofs forgeable).
pub fn nonce() -> Option<[u8; NONCE_BYTES]> {
    let mut out = [0u8; NONCE_BYTES];
    let mut filled = 0;
    while filled < out.len() {
        // SAFETY: getrandom writes at most `out.len() - filled` bytes at
        // `out[filled..]`.
        let n =
            unsafe { libc::getrandom(out[filled..].as_mut_ptr().cast(), out.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
    Some(out)
}

/// A `cma` descriptor for `[addr, addr + len)` of this process.
pub fn describe(me: &Identity, addr: u64, len: u64, rkey: u32, epoch: Option<u64>) -> Descriptor {
    Descriptor {
        transport: TransportKind::Cma,
        endpoint: me.endpoint(),
        addr,
        len,
        rkey,
        epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misalignment_is_relative_and_only_for_long_reads() {
        let k = MISALIGNED_MIN_BYTES;
        assert!(!misaligned(0x1000, 0x2000, k));
        assert!(!misaligned(0x1010, 0x2010, k), "same offset in both");
        assert!(!misaligned(0x1000, 0x2040, k), "64 bytes apart");
        assert!(misaligned(0x1000, 0x2010, k));
        assert!(misaligned(0x2010, 0x1000, k));
        assert!(misaligned(0x1000, 0x2008, k));
        assert!(
            !misaligned(0x1000, 0x2010, k - 1),
            "short reads are not counted"
        );
    }

    #[test]
    fn counts_misaligned_reads() {
        let me = Identity::current().unwrap();
        let src = vec![7u8; 2 * MISALIGNED_MIN_BYTES as usize];
        let mut dst = vec![0u8; src.len() + 128];
        let reader = CmaReader::new();
        let len = MISALIGNED_MIN_BYTES;
        let desc = describe(&me, src.as_ptr() as u64, len, 1, None);
        let base = dst.as_mut_ptr();
        // Where `dst[at..]` has `src`'s alignment modulo 64, and 16 past it.
        let aligned = (src.as_ptr() as usize).wrapping_sub(base as usize) % 64;
        for (at, counted) in [(aligned, 0), (aligned + 16, 1), (aligned + 64, 1)] {
            assert!(at + len as usize <= dst.len());
            // SAFETY: `dst[at..at + len]` is ours (asserted in bounds just
            // above), and nothing else touches it during the read.
            unsafe { reader.read(&desc, base.add(at)) }.unwrap();
            assert_eq!(reader.stats().misaligned.load(Relaxed), counted, "at {at}");
            assert!(dst[at..at + len as usize].iter().all(|&b| b == 7));
        }
    }

    #[test]
    fn reads_this_process_and_refuses_a_wrong_start_time() {
        let me = Identity::current().unwrap();
        assert!(me.mismatch(&me).is_none());
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let reader = CmaReader::new();
        let desc = describe(&me, src.as_ptr() as u64, src.len() as u64, 1, None);
        // SAFETY: `dst` is ours, src.len bytes long, untouched meanwhile.
        unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap();
        assert_eq!(src, dst);

        let mut other = desc.clone();
        other.endpoint = Descriptor::process_endpoint(me.pid, me.start + 1);
        // SAFETY: as above.
        let err = unsafe { reader.read(&other, dst.as_mut_ptr()) }.unwrap_err();
        assert!(matches!(err, TransferError::BadDescriptor(_)), "{err}");

        let mut unmapped = desc.clone();
        unmapped.addr = 8;
        // SAFETY: as above.
        let err = unsafe { reader.read(&unmapped, dst.as_mut_ptr()) }.unwrap_err();
        assert!(matches!(err, TransferError::BadDescriptor(_)), "{err}");
        assert_eq!(reader.stats().errors.load(Relaxed), 2);
    }

    /// `len` bytes of this process's memory in a fresh mapping, patterned.
    struct Mapped {
        ptr: *mut u8,
        len: usize,
    }

    impl Mapped {
        fn new(len: usize) -> Mapped {
            // SAFETY: a fresh private anonymous mapping; checked below.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED);
            let m = Mapped {
                ptr: ptr.cast(),
                len,
            };
            for (i, b) in m.bytes().iter_mut().enumerate() {
                *b = (i * 131 + i / 4099) as u8;
            }
            m
        }

        #[allow(clippy::mut_from_ref)]
        fn bytes(&self) -> &mut [u8] {
            // SAFETY: the mapping is ours and `len` long; tests use one
            // slice at a time.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }

        /// Makes `[at, at + len)` of it unreadable (page-aligned). Not
        /// unmapped: another mapping could land in the hole.
        fn punch(&self, at: usize, len: usize) {
            // SAFETY: a page-aligned range inside the mapping.
            let rc = unsafe { libc::mprotect(self.ptr.add(at).cast(), len, libc::PROT_NONE) };
            assert_eq!(rc, 0);
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: the whole mapping, made by `new`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn long_reads_over_several_lanes_are_byte_exact() {
        let me = Identity::current().unwrap();
        let src = Mapped::new(9 * MIB);
        for lanes in [1, 2, 3, 4, LANES_MAX + 5] {
            let reader = CmaReader::with_lanes(lanes);
            assert_eq!(reader.lanes(), lanes.min(LANES_MAX));
            // Around the split threshold, odd lengths and offsets.
            for (at, len) in [
                (0, SPLIT_MIN_BYTES - 1),
                (1, SPLIT_MIN_BYTES),
                (4097, 5 * MIB + 333),
                (0, 9 * MIB),
            ] {
                let mut dst = vec![0u8; len + 3];
                let desc = describe(&me, src.ptr as u64 + at as u64, len as u64, 1, None);
                // SAFETY: `dst[3..]` is ours and `len` long, untouched meanwhile.
                unsafe { reader.read(&desc, dst[3..].as_mut_ptr()) }.unwrap();
                assert!(
                    dst[3..] == src.bytes()[at..at + len],
                    "{lanes} lanes, {len} bytes at {at}"
                );
                assert_eq!(dst[..3], [0, 0, 0]);
            }
        }
    }

    #[test]
    fn a_long_read_that_fails_in_any_piece_fails_whole() {
        let me = Identity::current().unwrap();
        let reader = CmaReader::with_lanes(3);
        // A hole in the first piece (a helper's) and in the last (the caller's).
        for hole in [0, 5 * MIB] {
            let src = Mapped::new(6 * MIB);
            src.punch(hole, MIB);
            let mut dst = vec![0u8; 6 * MIB];
            let desc = describe(&me, src.ptr as u64, 6 * MIB as u64, 1, None);
            // SAFETY: as above.
            let err = unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap_err();
            assert!(
                matches!(err, TransferError::BadDescriptor(_)),
                "hole at {hole}: {err}"
            );
        }
        // And the reader goes on serving whole reads.
        let src = Mapped::new(4 * MIB);
        let mut dst = vec![0u8; 4 * MIB];
        let desc = describe(&me, src.ptr as u64, 4 * MIB as u64, 1, None);
        // SAFETY: as above.
        unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap();
        assert!(dst == src.bytes());
    }

    /// More long reads at once than there are helpers: the callers take
    /// their unclaimed pieces back, and every read completes, exact.
    #[test]
    fn concurrent_long_reads_share_the_helpers() {
        let me = Identity::current().unwrap();
        let reader = CmaReader::with_lanes(2);
        let src = Mapped::new(8 * MIB);
        let addr = src.ptr as u64;
        let want = src.bytes().to_vec();
        std::thread::scope(|s| {
            for t in 0..6 {
                let (reader, me, want) = (&reader, &me, &want);
                s.spawn(move || {
                    let mut dst = vec![0u8; 8 * MIB];
                    for round in 0..10 {
                        let desc = describe(me, addr, 8 * MIB as u64, 1, None);
                        // SAFETY: as above.
                        unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap();
                        assert!(dst == *want, "thread {t} round {round}");
                        dst.fill(0);
                    }
                });
            }
        });
        assert_eq!(reader.stats().reads.load(Relaxed), 60);
    }

    #[test]
    fn start_time_parses_names_with_parentheses() {
        let me = std::process::id();
        assert!(start_time(me).unwrap() > 0);
        assert!(same_user(me));
    }
}
