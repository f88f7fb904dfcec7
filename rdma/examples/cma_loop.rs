//! The limit of the same-host data plane: bare `process_vm_readv` loops
//! between two processes (this one and a child holding the bytes), next to
//! a plain `memcpy` of the same sizes. No strata code is on the timed path
//! except `CmaReader::read` (pidfd check included) for comparison.
//!
//! Three access patterns, because which one a loop uses decides its figure
//! several times over on a machine whose caches hold a few MiB:
//! - `hot`: the same source range into the same destination every time,
//!   both in cache after the first pass (the most flattering ceiling);
//! - `get`: the source rotates over [`VALUES`] distinct values (what
//!   `strata-bench --keys 32` reads out of a node's arena), one destination;
//! - `put`: the owner rewrites the source just before each read (the
//!   bench fills its buffer before every PUT) and the destination rotates
//!   over fresh slots (a node writes each PUT into a newly reserved chunk).
//!
//! Only the `process_vm_readv` call itself is timed in every pattern.
//!
//! Last, the `get` pattern through `CmaReader` with one lane and with
//! several (a long read split over helper threads, as strata's reads of
//! 2 MiB and more are; hand-off and join timed).
//!
//! `cargo run --release -p strata-rdma --example cma_loop -- [seconds per case, default 2] [lanes, default 2]`

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use strata_rdma::cma::{describe, CmaReader, Identity, DEFAULT_LANES};

const CHILD_ENV: &str = "STRATA_CMA_LOOP_CHILD";
const SIZES: [usize; 4] = [64 << 10, 1 << 20, 4 << 20, 16 << 20];
/// Distinct source values the `get` pattern rotates over (`--keys 32`).
const VALUES: usize = 32;
/// The owner holds VALUES of the largest size.
const HELD: usize = VALUES * (16 << 20);
/// Destination slots the `put` pattern rotates over, capped in bytes.
const DST_SLOTS: usize = 2 * VALUES;
const DST_MAX_BYTES: usize = 256 << 20;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child();
    }
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(2.0);
    let lanes: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().expect("lanes"))
        .unwrap_or(DEFAULT_LANES);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    let mut to_child = child.stdin.take().unwrap();
    let mut line = String::new();
    from_child.read_line(&mut line).unwrap();
    let remote: u64 = line.trim().parse().unwrap();
    let pid = child.id();
    let owner = Identity {
        pid,
        start: strata_rdma::cma::start_time(pid).unwrap(),
        ..Identity::current().unwrap()
    };
    let reader = CmaReader::new();
    let one_lane = CmaReader::with_lanes(1);
    let laned = CmaReader::with_lanes(lanes);
    let local_src: Vec<u8> = vec![7u8; SIZES[SIZES.len() - 1]];
    let mut dst_slots: Vec<u8> = vec![0u8; DST_MAX_BYTES];
    println!(
        "size | process_vm_readv: hot | get pattern | put pattern | CmaReader::read (hot) | memcpy (hot) | CmaReader get pattern: 1 lane | {lanes} lanes (GB/s)"
    );
    for size in SIZES {
        let mut dst = vec![0u8; size];
        let slots = (DST_MAX_BYTES / size).clamp(2, DST_SLOTS);
        let read = |dst: *mut u8, from: u64| {
            let liov = libc::iovec {
                iov_base: dst.cast(),
                iov_len: size,
            };
            let riov = libc::iovec {
                iov_base: from as *mut libc::c_void,
                iov_len: size,
            };
            // SAFETY: `dst` points at `size` bytes of ours; the remote range
            // lies in the child's HELD bytes.
            let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &liov, 1, &riov, 1, 0) };
            assert_eq!(got, size as isize);
        };
        // Runs `op(i)` for `secs`; `op` returns the time of its timed part.
        let run = |op: &mut dyn FnMut(usize) -> Duration| -> f64 {
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            let (mut n, mut timed) = (0usize, Duration::ZERO);
            while Instant::now() < deadline {
                timed += op(n);
                n += 1;
            }
            (n * size) as f64 / timed.as_secs_f64() / 1e9
        };
        let timed = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed()
        };
        let hot = run(&mut |_| timed(&mut || read(dst.as_mut_ptr(), remote)));
        let get = run(&mut |i| {
            let from = remote + ((i % VALUES) * size) as u64;
            timed(&mut || read(dst.as_mut_ptr(), from))
        });
        let put = run(&mut |i| {
            let offset = (i % VALUES) * size;
            fill_in_child(&mut to_child, &mut from_child, offset, size);
            let to = dst_slots[(i % slots) * size..].as_mut_ptr();
            timed(&mut || read(to, remote + offset as u64))
        });
        let desc = describe(&owner, remote, size as u64, 0, None);
        let ours = run(&mut |_| {
            // SAFETY: as above.
            timed(&mut || unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap())
        });
        let mut get_through = |r: &CmaReader| {
            run(&mut |i| {
                let from = remote + ((i % VALUES) * size) as u64;
                let desc = describe(&owner, from, size as u64, 0, None);
                // SAFETY: as above.
                timed(&mut || unsafe { r.read(&desc, dst.as_mut_ptr()) }.unwrap())
            })
        };
        let (get_one, get_laned) = (get_through(&one_lane), get_through(&laned));
        let copy = run(&mut |_| {
            timed(&mut || {
                dst.copy_from_slice(&local_src[..size]);
                std::hint::black_box(&dst);
            })
        });
        println!(
            "{} KiB | {hot:.2} | {get:.2} | {put:.2} | {ours:.2} | {copy:.2} | {get_one:.2} | {get_laned:.2}",
            size >> 10
        );
    }
    drop(to_child);
    let _ = child.wait();
}

/// Asks the owner to rewrite `len` bytes at `offset` and waits until it has.
fn fill_in_child(
    to: &mut ChildStdin,
    from: &mut BufReader<std::process::ChildStdout>,
    offset: usize,
    len: usize,
) {
    writeln!(to, "{offset} {len}").unwrap();
    to.flush().unwrap();
    let mut ok = String::new();
    from.read_line(&mut ok).unwrap();
    assert_eq!(ok.trim(), "ok");
}

/// The owner: HELD bytes at an address it prints; then, per line
/// `offset len` on stdin, rewrites that range and answers `ok`, until
/// stdin closes.
fn child() {
    let mut held: Vec<u8> = (0..HELD).map(|i| (i * 31) as u8).collect();
    let mut out = std::io::stdout();
    writeln!(out, "{}", held.as_ptr() as u64).unwrap();
    out.flush().unwrap();
    let mut round = 0u8;
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let mut it = line.split(' ').map(|n| n.parse::<usize>().unwrap());
        let (offset, len) = (it.next().unwrap(), it.next().unwrap());
        round = round.wrapping_add(1);
        held[offset..offset + len].fill(round);
        writeln!(out, "ok").unwrap();
        out.flush().unwrap();
    }
}
