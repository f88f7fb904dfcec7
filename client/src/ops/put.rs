//! The zero-copy `PUT key desc [NX]` of one value from a registered
//! buffer, which the node pulls, or, where `transfer` says so, the value
//! itself in a `SET`.

use std::ops::Range;

use strata_rdma::{Descriptor, Region};
use strata_ring::key_slot;

use crate::conn::expect_ok;
use crate::node::Idempotent;
use crate::router::Access;
use crate::{Buffer, Client, Error, Result};

impl Client {
    /// Stores `buf[range]` under `key`; the node pulls the bytes.
    pub async fn put_from(&self, key: &[u8], buf: &Buffer, range: Range<usize>) -> Result<()> {
        match self.put_region(key, buf.region(), range, false).await? {
            true => Ok(()),
            false => Err(Error::Protocol("nil reply to PUT without NX".into())),
        }
    }

    /// Like [`Client::put_from`] but only if `key` is absent; `false` if it
    /// existed (nothing is transferred then).
    pub async fn put_from_nx(&self, key: &[u8], buf: &Buffer, range: Range<usize>) -> Result<bool> {
        self.put_region(key, buf.region(), range, true).await
    }

    /// `PUT` of `region[range]`, named by a `cma` descriptor where the
    /// owning node can read this process, else by the data plane's.
    async fn put_region(
        &self,
        key: &[u8],
        region: &Region,
        range: Range<usize>,
        nx: bool,
    ) -> Result<bool> {
        let d = self.descs(region, range.clone())?;
        let inline = self.inline_put(region, range);
        let idem = if nx { Idempotent::No } else { Idempotent::Yes };
        let retries = self.cfg.retry_attempts;
        let d = &d;
        self.router
            .routed(key_slot(key), Access::Write, idem, |node| async move {
                if let (Some(value), false) = (inline, node.cma_put()) {
                    let mut args: Vec<&[u8]> = vec![b"SET", key, value];
                    if nx {
                        args.push(b"NX");
                    }
                    return expect_ok(node.call(&args, idem, retries).await?);
                }
                let put = |desc: &str| {
                    let mut args: Vec<&[u8]> = vec![b"PUT", key, desc.as_bytes()];
                    if nx {
                        args.push(b"NX");
                    }
                    args.iter().map(|a| a.to_vec()).collect::<Vec<_>>()
                };
                let cma = node.cma_put();
                let args = put(d.pick(cma));
                let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                match node.call(&args, idem, retries).await {
                    // Refused before anything was stored: again over the
                    // network.
                    Err(Error::Server { code, msg }) if code == "NOCMA" && cma => {
                        node.refuse_cma_put(&msg);
                        let args = put(&d.net);
                        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                        expect_ok(node.call(&args, idem, retries).await?)
                    }
                    other => expect_ok(other?),
                }
            })
            .await
    }

    /// `PUT key desc [NX]` with a descriptor the caller built: the low-level
    /// form of the puts, for memory registered elsewhere.
    pub async fn put_desc(&self, key: &[u8], desc: &Descriptor, nx: bool) -> Result<bool> {
        let desc = desc.to_string();
        let (args, idem): (&[&[u8]], _) = if nx {
            (&[b"PUT", key, desc.as_bytes(), b"NX"], Idempotent::No)
        } else {
            (&[b"PUT", key, desc.as_bytes()], Idempotent::Yes)
        };
        expect_ok(self.call_key(key, Access::Write, args, idem).await?)
    }
}
