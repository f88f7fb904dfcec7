//! The time for one cache line to go from one CPU to another and back:
//! two threads, pinned to the two CPUs named, hand a flag to each other
//! `ROUND_TRIPS` times. Prints the mean round trip in ns.
//!
//! `bench/compare.sh` runs it between the server's and the client's CPU
//! before each client run (with `PIN`), because on some cloud VMs the
//! host moves vCPUs between L3 domains while they run: this then reads
//! several times higher while the two vCPUs do not share an L3
//! (docs/bench-notes/l3-domains.md), and every loopback
//! transfer runs slower in that state, whichever system moves it.
//!
//! Usage: `pingpong CPU_A CPU_B`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

const ROUND_TRIPS: u32 = 100_000;

fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // within it for any cpu below CPU_SETSIZE (checked by the caller).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let cpus: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().ok().filter(|&c| c < libc::CPU_SETSIZE as usize))
        .collect::<Option<_>>()
        // One CPU for both would have each thread spin out its time slice
        // waiting for the other: minutes, not a measurement.
        .filter(|v: &Vec<usize>| v.len() == 2 && v[0] != v[1])
        .ok_or_else(|| std::io::Error::other("usage: pingpong CPU_A CPU_B (two different CPUs)"))?;
    static FLAG: AtomicU32 = AtomicU32::new(0);
    let (a, b) = (cpus[0], cpus[1]);
    let other = std::thread::spawn(move || -> std::io::Result<()> {
        pin(b)?;
        for _ in 0..ROUND_TRIPS {
            while FLAG.load(Ordering::Acquire) != 1 {
                std::hint::spin_loop();
            }
            FLAG.store(0, Ordering::Release);
        }
        Ok(())
    });
    pin(a)?;
    // The other thread may fail to pin (no such CPU): then it never
    // answers, so check it started before timing.
    std::thread::sleep(std::time::Duration::from_millis(5));
    if other.is_finished() {
        return other.join().expect("pingpong thread panicked");
    }
    let t0 = Instant::now();
    for _ in 0..ROUND_TRIPS {
        FLAG.store(1, Ordering::Release);
        while FLAG.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
    }
    let ns = t0.elapsed().as_nanos() / u128::from(ROUND_TRIPS);
    other.join().expect("pingpong thread panicked")?;
    println!("{ns}");
    Ok(())
}
