//! The limit of request/response over loopback TCP, which is what one
//! zero-copy GET or PUT is: a reader sends a 16-byte request on each of
//! `conns` connections and reads back its share of `size` bytes, which an
//! owner thread per connection writes from memory in one `write`. No strata
//! code is on the path; sockets are set up as the data plane's (4 MiB
//! buffers, `TCP_NODELAY`).
//!
//! It prints µs per transfer and GB/s for each size, number of streams and
//! congestion control: the host's default, and each one named on the
//! command line (`TCP_CONGESTION` on both sockets; an unprivileged process
//! may only pick those in `/proc/sys/net/ipv4/tcp_allowed_congestion_control`).
//!
//! `cargo run --release -p strata-rdma --example tcp_loop -- [seconds per case, default 1] [reno cubic ...]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const SIZES: [usize; 4] = [256 << 10, 1 << 20, 2 << 20, 4 << 20];
const STREAMS: [usize; 3] = [1, 2, 4];
const SOCKET_BUFFER_BYTES: libc::c_int = 4 << 20;
const REQUEST: [u8; 16] = [0; 16];

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args
        .next()
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(1.0);
    let mut controls: Vec<Option<String>> = vec![None];
    controls.extend(args.map(Some));
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    println!("size | streams | congestion control | us per transfer | GB/s");
    for cc in &controls {
        let name = cc.clone().unwrap_or_else(|| format!("{default} (default)"));
        for size in SIZES {
            for streams in STREAMS {
                match run(size, streams, cc.as_deref(), Duration::from_secs_f64(secs)) {
                    Ok((us, gbps)) => {
                        println!(
                            "{} KiB | {streams} | {name} | {us:.1} | {gbps:.2}",
                            size >> 10
                        )
                    }
                    Err(e) => {
                        println!("{} KiB | {streams} | {name} | {e}", size >> 10);
                        break;
                    }
                }
            }
        }
    }
}

/// Transfers of `size` bytes split over `streams` connections, for about
/// `time`; returns µs per transfer and GB/s.
fn run(
    size: usize,
    streams: usize,
    cc: Option<&str>,
    time: Duration,
) -> std::io::Result<(f64, f64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let share = size / streams;
    let mut readers = Vec::with_capacity(streams);
    for _ in 0..streams {
        let reader = TcpStream::connect(addr)?;
        let (owner, _) = listener.accept()?;
        for s in [&reader, &owner] {
            tune(s, cc)?;
        }
        std::thread::spawn(move || serve(owner, share));
        readers.push(reader);
    }
    // Every stream's reader does one transfer per round; the rounds are
    // timed from here.
    let start = Arc::new(Barrier::new(streams + 1));
    let end = Arc::new(Barrier::new(streams + 1));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = readers
        .into_iter()
        .map(|mut reader| {
            let (start, end, stop) = (start.clone(), end.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut dst = vec![0u8; share];
                loop {
                    start.wait();
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    reader.write_all(&REQUEST).expect("request");
                    reader.read_exact(&mut dst).expect("payload");
                    end.wait();
                }
            })
        })
        .collect();
    let began = Instant::now();
    let mut rounds = 0u64;
    while began.elapsed() < time || rounds < 10 {
        start.wait();
        end.wait();
        rounds += 1;
    }
    let elapsed = began.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    start.wait();
    for t in threads {
        t.join().expect("reader");
    }
    let us = elapsed / rounds as f64 * 1e6;
    Ok((us, (share * streams) as f64 * rounds as f64 / elapsed / 1e9))
}

/// The owner's side of one connection: a write of `share` bytes per
/// request, until the reader hangs up.
fn serve(mut owner: TcpStream, share: usize) {
    let src = vec![7u8; share];
    let mut request = [0u8; REQUEST.len()];
    while owner.read_exact(&mut request).is_ok() {
        if owner.write_all(&src).is_err() {
            return;
        }
    }
}

/// The data plane's socket settings, and the congestion control if named.
fn tune(s: &TcpStream, cc: Option<&str>) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let fd = s.as_raw_fd();
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            &SOCKET_BUFFER_BYTES.to_ne_bytes(),
        )?;
    }
    if let Some(cc) = cc {
        setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, cc.as_bytes())?;
    }
    Ok(())
}

fn setsockopt(
    fd: libc::c_int,
    level: libc::c_int,
    opt: libc::c_int,
    value: &[u8],
) -> std::io::Result<()> {
    // SAFETY: `value` is a live buffer of the length passed; the kernel
    // copies it before returning.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
