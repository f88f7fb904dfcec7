//! Whether the client of a connection has gone, asked of the kernel
//! without reading from the socket.
//!
//! A zero-copy `PUT` pulls the value out of the client's memory. A client
//! that gives up on the call (a timeout, a dropped future) closes its
//! command connection and may then reuse that memory at once, while the
//! node is still pulling: the pull would finish with a mix of old and new
//! bytes. So `PUT` and `MPUT` ask here, after the pull and before
//! publishing, and store nothing for a client that has gone. On one host
//! (loopback, cross-memory attach) the client's close reaches this socket
//! within its `close`/`shutdown` call, before it can touch the memory
//! again; across a network the close and the last bytes travel on two
//! connections and could in principle pass each other.

use std::os::fd::{AsRawFd, RawFd};

/// The socket of one client connection. Only asked while that
/// connection's task runs, which owns the socket: the descriptor cannot
/// be closed and reused meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct Peer(RawFd);

impl Peer {
    pub fn of(sock: &impl AsRawFd) -> Self {
        Self(sock.as_raw_fd())
    }

    /// The client closed or shut down its side, or the connection broke.
    /// Pending requests in the socket do not hide a close behind them
    /// (`POLLRDHUP` reports the FIN, not the data before it). One syscall,
    /// never blocks.
    pub fn gone(self) -> bool {
        let mut p = libc::pollfd {
            fd: self.0,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}
