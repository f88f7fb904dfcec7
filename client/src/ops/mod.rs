//! The client's operations, one file per family of commands, as the server
//! has one file per command: each file builds its commands, sends them
//! through the router and parses their replies beside them. How a payload
//! travels (inline in the command or the reply, pulled over the TCP data
//! plane, copied by cross-memory attach, read over RDMA) is chosen in one
//! place, `transfer`. Nothing here opens a connection or learns the slot
//! map: that is the handle's (`client.rs`) and the router's.

mod batch;
mod exists;
mod get;
mod inline;
mod put;
mod scan;
mod transfer;

use redis_protocol::resp2::types::BytesFrame;
use strata_ring::key_slot;

use crate::node::Idempotent;
use crate::router::Access;
use crate::{Client, Result};

impl Client {
    /// One command about `key`, sent to its slot's node (see
    /// [`Router::routed`](crate::router::Router::routed)).
    pub(crate) async fn call_key(
        &self,
        key: &[u8],
        access: Access,
        args: &[&[u8]],
        idem: Idempotent,
    ) -> Result<BytesFrame> {
        let retries = self.cfg.retry_attempts;
        self.router
            .routed(key_slot(key), access, idem, |node| async move {
                node.call(args, idem, retries).await
            })
            .await
    }
}
