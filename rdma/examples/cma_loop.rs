//! The limit of the same-host data plane: a bare `process_vm_readv` loop
//! between two processes (this one and a child holding the bytes), next to
//! a plain `memcpy` of the same sizes. No strata code is on the timed path
//! except `CmaReader::read` (pidfd check included) for comparison.
//!
//! `cargo run --release -p strata-rdma --example cma_loop -- [seconds per case, default 2]`

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use strata_rdma::cma::{describe, CmaReader, Identity};

const CHILD_ENV: &str = "STRATA_CMA_LOOP_CHILD";
const HELD: usize = 64 << 20;

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // The owner: 64 MiB of bytes at an address it prints, until stdin closes.
        let held: Vec<u8> = (0..HELD).map(|i| (i * 31) as u8).collect();
        println!("{}", held.as_ptr() as u64);
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(2.0);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let remote: u64 = line.trim().parse().unwrap();
    let pid = child.id();
    let owner = Identity {
        pid,
        start: strata_rdma::cma::start_time(pid).unwrap(),
        ..Identity::current().unwrap()
    };
    let reader = CmaReader::new();
    let local_src: Vec<u8> = vec![7u8; HELD];
    println!("size | process_vm_readv | CmaReader::read | memcpy (GB/s)");
    for size in [64 << 10, 1 << 20, 4 << 20, 16 << 20] {
        let mut dst = vec![0u8; size];
        let run = |f: &mut dyn FnMut()| -> f64 {
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            let start = Instant::now();
            let mut n = 0u64;
            while Instant::now() < deadline {
                f();
                n += 1;
            }
            (n * size as u64) as f64 / start.elapsed().as_secs_f64() / 1e9
        };
        let bare = run(&mut || {
            let liov = libc::iovec {
                iov_base: dst.as_mut_ptr().cast(),
                iov_len: size,
            };
            let riov = libc::iovec {
                iov_base: remote as *mut libc::c_void,
                iov_len: size,
            };
            // SAFETY: `dst` is ours and `size` long; the remote range lies
            // in the child's 64 MiB buffer.
            let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &liov, 1, &riov, 1, 0) };
            assert_eq!(got, size as isize);
        });
        let desc = describe(&owner, remote, size as u64, 0, None);
        let ours = run(&mut || {
            // SAFETY: as above.
            unsafe { reader.read(&desc, dst.as_mut_ptr()) }.unwrap();
        });
        let copy = run(&mut || {
            dst.copy_from_slice(&local_src[..size]);
            std::hint::black_box(&dst);
        });
        println!("{} KiB | {bare:.2} | {ours:.2} | {copy:.2}", size >> 10);
    }
    drop(child.stdin.take());
    let _ = child.wait();
}
