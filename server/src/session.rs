//! What one client connection carries between its commands: identity,
//! protocol version, authentication, leases, subscriptions. Commands read
//! and change it; the connection owns it.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use strata_proto::RespVersion;
use strata_tiering::Reservation;

use crate::pubsub::{Mailbox, Subscriber};

/// Per-connection state that commands may read or change.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    pub resp: RespVersion,
    pub authed: bool,
    /// Set by QUIT: close after this batch's replies are written.
    pub quit: bool,
    /// Leases this connection holds; released when it closes.
    pub leases: HashSet<u64>,
    /// The nonce `STRATA.CMA HELLO` gave this connection, until proven.
    pub cma_nonce: Option<[u8; crate::cma::NONCE_BYTES]>,
    /// The process (pid, start time) that proved itself with it: the only
    /// one whose memory `cma` descriptors on this connection may name.
    pub cma_peer: Option<(u32, u64)>,
    /// Channels and patterns this connection receives messages on.
    pub sub: Option<Subscriber>,
    /// The value of the `SET` about to run, already read into its arena
    /// chunk (its argument in the request is empty). Cleared after that
    /// request, whatever it did: an unused chunk goes back to the arena.
    pub streamed: Option<Reservation>,
    /// The client's socket, to ask whether it has gone before a pulled
    /// value is published (see `crate::peer`).
    pub peer: crate::peer::Peer,
    /// Bytes leased since the connection last waited, for the client to
    /// read itself (cross-memory attach, the TCP data plane): its next
    /// request follows once it has (`echo_poll_us`).
    pub handed: u64,
}

impl Session {
    /// In RESP2 subscribed mode (at least one subscription).
    pub fn subscribed_resp2(&self) -> bool {
        self.resp == RespVersion::Resp2 && self.sub.as_ref().is_some_and(|s| s.count() > 0)
    }

    pub fn mailbox(&self) -> Option<Arc<Mailbox>> {
        self.sub.as_ref().map(|s| s.mailbox.clone())
    }
}
