//! The congestion control strata's own TCP sockets use (`tcp_congestion`):
//! `auto` (the default), `host`, or a name such as `cubic`.
//!
//! Why `auto` steps away from BBR: a zero-copy GET or PUT is one request
//! and one burst of up to a few MiB. Under BBR, the default of many cloud
//! images, such a burst is paced at BBR's estimate of the path's
//! bandwidth, which a connection that is idle between bursts keeps low: on
//! loopback a 1 MiB burst took far longer than under Reno or CUBIC
//! (`rdma/examples/tcp_loop.rs`). Worse, on
//! loopback BBR's pacing timer sends some segments from another CPU than
//! the writer, and loopback delivers each CPU's segments in its own
//! queue: the receiver sees them out of order, the sender retransmits
//! what was never lost (not so under CUBIC) and some connections never
//! recover their rate (docs/bench-notes/congestion-control.md).
//! Any other host default (CUBIC, DCTCP, ...) is left as the operator set
//! it, and setting it on strata's sockets alone leaves the host's other
//! traffic as it is.

use std::io;
use std::os::fd::AsRawFd;

/// `TCP_CA_NAME_MAX` in the kernel, the terminating NUL included.
const NAME_MAX: usize = 16;

/// Where the kernel lists what a process may choose.
const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// The `tcp_congestion` setting that picks for the host (see the module
/// comment); also what an empty setting means.
pub const AUTO: &str = "auto";
/// The `tcp_congestion` setting that keeps the host's default.
pub const HOST: &str = "host";
/// Where the host's default is.
const HOST_DEFAULT: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
/// What `auto` tries in place of BBR, in order: CUBIC is the kernel's own
/// default; Reno is built into every kernel and always allowed, where
/// CUBIC is allowed only if the administrator listed it (a non-root node
/// on a BBR host).
const INSTEAD_OF_BBR: [&str; 2] = ["cubic", "reno"];

/// What a `tcp_congestion` setting means on this host: the name to set on
/// strata's sockets, or `None` to leave them at the host's default.
/// `None` and `""` mean `auto`. A name that cannot be set is an error that
/// says what the kernel offers; `auto` never fails.
pub fn resolve(setting: Option<&str>) -> Result<Option<String>, String> {
    match setting.unwrap_or(AUTO) {
        "" | AUTO => Ok(auto()),
        HOST => Ok(None),
        name => check_congestion(name).map(|()| Some(name.to_owned())),
    }
}

/// `auto`'s choice, worked out once per process.
fn auto() -> Option<String> {
    static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| {
            if !host_default().starts_with("bbr") {
                return None;
            }
            INSTEAD_OF_BBR
                .iter()
                .find(|name| check_congestion(name).is_ok())
                .map(|name| (*name).to_owned())
        })
        .clone()
}

/// The host's default congestion control (`?` where it cannot be read).
pub fn host_default() -> String {
    std::fs::read_to_string(HOST_DEFAULT)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

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

/// Makes `socket`'s close discard whatever it has not delivered and send a
/// reset (`SO_LINGER` 0) instead of retransmitting it. For a connection
/// given up on after a failed or timed-out request: the request must not
/// reach the peer later, when a partition heals and the kernel's
/// retransmits get through, and overwrite what was acknowledged since.
/// Best effort: a failure is logged, and the close is then a normal one.
pub fn reset_on_close(socket: &impl AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid option of the size given, on a socket the caller
    // owns; the kernel copies it before returning.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "SO_LINGER on a connection given up on: {}",
            io::Error::last_os_error()
        );
    }
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

    /// `auto` leaves any host default but BBR alone, and never picks BBR.
    #[test]
    fn auto_steps_away_from_bbr_only() {
        let host = host_default();
        let auto = resolve(None).expect("auto never fails");
        assert_eq!(resolve(Some("")).unwrap(), auto);
        assert_eq!(resolve(Some(AUTO)).unwrap(), auto);
        match auto.as_deref() {
            None => assert!(!host.starts_with("bbr"), "host {host}: auto kept BBR"),
            Some(name) => {
                assert!(host.starts_with("bbr"), "host {host}: auto chose {name}");
                assert!(INSTEAD_OF_BBR.contains(&name), "{name}");
            }
        }
        assert_eq!(resolve(Some(HOST)).unwrap(), None);
        assert_eq!(resolve(Some("reno")).unwrap().as_deref(), Some("reno"));
        assert!(resolve(Some("nosuchalgo")).is_err());
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
