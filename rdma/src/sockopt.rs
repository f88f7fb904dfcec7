//! The congestion control strata's own TCP sockets use, when an operator
//! names one (`tcp_congestion`) instead of the host's default.
//!
//! Why it is a setting: a zero-copy GET or PUT is one request and one
//! burst of up to a few MiB. Under BBR, the default of many cloud images,
//! such a burst is paced at BBR's estimate of the path's bandwidth, which
//! a connection that is idle between bursts keeps low: on loopback here a
//! 1 MiB burst took 1.7x as long as under Reno or CUBIC
//! (`rdma/examples/tcp_loop.rs`, docs/BENCHMARKS.md §2f). Setting it on
//! strata's sockets alone leaves the host's other traffic as it is.

use std::io;
use std::os::fd::AsRawFd;

/// `TCP_CA_NAME_MAX` in the kernel, the terminating NUL included.
const NAME_MAX: usize = 16;

/// Where the kernel lists what a process may choose.
const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// Sets the congestion control of `socket` (a listener passes it on to the
/// connections it accepts).
pub fn set_congestion(socket: &impl AsRawFd, name: &str) -> io::Result<()> {
    // SAFETY: `name` is a live buffer of the length passed; the kernel
    // copies it before returning and needs no NUL within that length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process may give its sockets congestion control `name`;
/// the error says what the kernel offers instead.
pub fn check_congestion(name: &str) -> Result<(), String> {
    let well_formed = !name.is_empty()
        && name.len() < NAME_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !well_formed {
        return Err(format!(
            "{name:?} is not a congestion control name (letters, digits, '_', at most {} characters)",
            NAME_MAX - 1
        ));
    }
    let probe = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot open a socket to check {name:?}: {e}"))?;
    set_congestion(&probe, name).map_err(|e| {
        let list = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "?".into())
        };
        match e.raw_os_error() {
            Some(libc::ENOENT) => format!(
                "{name:?} is not available in this kernel (available: {}; a module such as tcp_{name} may need loading)",
                list(AVAILABLE)
            ),
            Some(libc::EPERM) => format!(
                "{name:?} is not allowed for this user (allowed: {}, from {ALLOWED})",
                list(ALLOWED)
            ),
            _ => format!("cannot set {name:?}: {e}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reno is built into every Linux kernel and always allowed.
    #[test]
    fn reno_is_always_there_and_set() {
        check_congestion("reno").expect("reno");
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        set_congestion(&l, "reno").expect("set");
        let mut buf = [0u8; NAME_MAX];
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: `buf` and `len` are live and sized as passed.
        let rc = unsafe {
            libc::getsockopt(
                l.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert!(buf.starts_with(b"reno"), "{buf:?}");
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        for bad in ["", "cubic!", "a_name_much_too_long", "no space"] {
            let e = check_congestion(bad).unwrap_err();
            assert!(e.contains("not a congestion control name"), "{bad:?}: {e}");
        }
        let e = check_congestion("nosuchalgo").unwrap_err();
        assert!(e.contains("not available") && e.contains("reno"), "{e}");
    }
}
