//! `cpu_memory_prefault`: faulting the DRAM arena in on a thread of its
//! own while the node already serves.
//!
//! The arena is mapped lazily (so that an idle node costs only what it
//! holds), which charges the kernel's page fault and zeroing to the first
//! write into each page, and on a VM the host's backing of memory the
//! guest has never touched: a fresh node's first writes ran far slower than
//! once warm (docs/bench-notes/prefault.md). Prefaulting moves that cost
//! to start-up, where nobody waits on it, and makes a pool larger than the
//! machine's free memory show at start (the prefault stops, with a
//! warning) instead of in the OOM killer's log mid-run.

use std::io;
use std::time::{Duration, Instant};

use strata_tiering::ArenaHandle;

/// Bytes faulted in per step: small enough that a node stopping mid-way
/// waits for at most one step, and that free memory is checked often.
const STEP_BYTES: u64 = 64 << 20;

/// Free memory (`MemAvailable`) a step must leave, so that prefaulting never
/// pushes the machine into reclaim or the OOM killer.
const HEADROOM_BYTES: u64 = 256 << 20;

/// How often a long prefault logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Nice value of the prefault thread: it yields the cores to serving.
const NICE: libc::c_int = 10;

/// How a prefault ended.
#[derive(Debug)]
pub struct Prefaulted {
    /// Bytes of arena walked (all of it unless `stopped`).
    pub bytes: u64,
    pub elapsed: Duration,
    /// Why it stopped early, if it did.
    pub stopped: Option<String>,
}

/// Starts faulting `arena` in, front to back, on a thread named
/// `strata-prefault`; it logs progress and its end, and stops by itself
/// when the store is dropped.
pub fn spawn(arena: ArenaHandle) -> io::Result<std::thread::JoinHandle<Prefaulted>> {
    std::thread::Builder::new()
        .name("strata-prefault".into())
        .spawn(move || {
            lower_priority();
            let done = run(&arena, mem_available);
            match &done.stopped {
                None => tracing::info!(
                    bytes = done.bytes,
                    secs = format_args!("{:.2}", done.elapsed.as_secs_f64()),
                    "DRAM arena prefaulted (cpu_memory_prefault)"
                ),
                Some(why) => tracing::warn!(
                    bytes = done.bytes,
                    reason = %why,
                    "stopped prefaulting the DRAM arena; the rest faults in as values are written"
                ),
            }
            done
        })
}

/// `available`: the machine's free memory now (`mem_available`; tests
/// pass their own).
fn run(arena: &ArenaHandle, available: impl Fn() -> Option<u64>) -> Prefaulted {
    let start = Instant::now();
    let mut logged = start;
    let mut offset = 0;
    let stopped = |offset, why: String| Prefaulted {
        bytes: offset,
        elapsed: start.elapsed(),
        stopped: Some(why),
    };
    loop {
        let Some(total) = arena.capacity() else {
            return stopped(offset, "the node stopped".into());
        };
        if offset >= total {
            break;
        }
        let len = STEP_BYTES.min(total - offset);
        // Pages already resident (values written meanwhile) cost nothing.
        let resident = match arena.resident_bytes(offset, len) {
            Some(Ok(n)) => n,
            Some(Err(e)) => return stopped(offset, e.to_string()),
            None => return stopped(offset, "the node stopped".into()),
        };
        let need = len.saturating_sub(resident);
        if let Some(available) = available() {
            if need > 0 && available < need + HEADROOM_BYTES {
                return stopped(
                    offset,
                    format!(
                        "the machine has {available} bytes of memory available; the pool (cpu_memory_pool_size {total}) does not fit with {HEADROOM_BYTES} to spare"
                    ),
                );
            }
        }
        match arena.populate(offset, len) {
            Some(Ok(())) => {}
            Some(Err(e)) => return stopped(offset, e.to_string()),
            None => return stopped(offset, "the node stopped".into()),
        }
        offset += len;
        if logged.elapsed() >= PROGRESS_EVERY {
            logged = Instant::now();
            tracing::info!(
                done = offset,
                total,
                "prefaulting the DRAM arena ({}%)",
                offset * 100 / total
            );
        }
    }
    Prefaulted {
        bytes: offset,
        elapsed: start.elapsed(),
        stopped: None,
    }
}

/// `MemAvailable` from /proc/meminfo in bytes; `None` where it cannot be
/// read (then only the kernel's own refusal stops a prefault).
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&info)
}

fn parse_mem_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take no pointers; a failure only
    // leaves the thread at the node's priority.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, NICE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use strata_tiering::{Condition, Expiry, Store, StoreConfig};

    fn store(capacity_bytes: u64) -> Store {
        Store::new(StoreConfig {
            capacity_bytes,
            max_value_bytes: capacity_bytes,
            high_watermark: 0.9,
            tombstone_ms: 0,
        })
        .unwrap()
    }

    #[test]
    fn faults_the_whole_arena_in_and_keeps_values() {
        let s = store(STEP_BYTES + (3 << 20));
        let mut r = s.reserve(9).unwrap();
        r.as_mut_slice().copy_from_slice(b"the value");
        assert!(s.commit(
            Bytes::from_static(b"k"),
            r,
            Condition::Always,
            Expiry::Persist,
            0
        ));
        let (_, len) = s.region();
        let arena = s.arena_handle();
        let done = spawn(arena.clone()).unwrap().join().unwrap();
        assert_eq!(done.stopped, None, "{done:?}");
        assert_eq!(done.bytes, len);
        assert_eq!(arena.resident_bytes(0, len).unwrap().unwrap(), len);
        let value = s.get(b"k", 0).unwrap().expect("still stored");
        assert_eq!(value.as_slice(), b"the value");
    }

    #[test]
    fn stops_when_the_store_is_gone() {
        let s = store(8 << 20);
        let arena = s.arena_handle();
        drop(s);
        let done = run(&arena, mem_available);
        assert_eq!(done.bytes, 0);
        assert_eq!(done.stopped.as_deref(), Some("the node stopped"));
    }

    #[test]
    fn stops_before_the_machine_runs_out_of_memory() {
        let s = store(3 * STEP_BYTES);
        let arena = s.arena_handle();
        // A machine with room for the first step and its headroom: what
        // the arena takes comes off what is free.
        let free = STEP_BYTES + HEADROOM_BYTES + (1 << 20);
        let taken = || arena.resident_bytes(0, 3 * STEP_BYTES).unwrap().unwrap();
        let done = run(&arena, || Some(free - taken()));
        assert_eq!(done.bytes, STEP_BYTES, "{done:?}");
        let why = done.stopped.expect("stopped early");
        assert!(why.contains("does not fit"), "{why}");
        assert_eq!(
            arena
                .resident_bytes(STEP_BYTES, 2 * STEP_BYTES)
                .unwrap()
                .unwrap(),
            0,
            "nothing beyond the first step was faulted in"
        );
    }

    #[test]
    fn reads_mem_available() {
        let info =
            "MemTotal:       24683520 kB\nMemFree:        1 kB\nMemAvailable:   23754600 kB\n";
        assert_eq!(parse_mem_available(info), Some(23_754_600 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        assert!(mem_available().is_some_and(|n| n > 0));
    }
}
