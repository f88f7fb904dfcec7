//! The inline commands, whose values cross the command connection: `SET`,
//! `GET` and their pipelined forms, for small values and tools, and `DEL`.

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;
use strata_ring::key_slot;

use crate::conn::{expect_bulk_or_nil, expect_int, expect_ok};
use crate::node::Idempotent;
use crate::router::Access;
use crate::{Client, Error, Result, BATCH_MAX};

impl Client {
    /// Inline `SET key value`: the value crosses the command connection.
    pub async fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let reply = self
            .call_key(key, Access::Write, &[b"SET", key, value], Idempotent::Yes)
            .await?;
        match expect_ok(reply)? {
            true => Ok(()),
            false => Err(Error::Protocol("nil reply to SET without NX".into())),
        }
    }

    /// Inline `GET key`.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        expect_bulk_or_nil(
            self.call_key(key, Access::Read, &[b"GET", key], Idempotent::Yes)
                .await?,
        )
    }

    /// Inline `SET`s of every `(key, value)`, pipelined: one write and one
    /// round trip per node owning some of them (the nodes concurrently).
    /// One result per item, in order; at most [`BATCH_MAX`] at a time.
    pub async fn set_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        items: &[(K, V)],
    ) -> Vec<Result<()>> {
        self.pipelined(
            items.len(),
            Access::Write,
            |i| items[i].0.as_ref(),
            |i| vec![b"SET", items[i].0.as_ref(), items[i].1.as_ref()],
            |r| match expect_ok(r)? {
                true => Ok(()),
                false => Err(Error::Protocol("nil reply to SET without NX".into())),
            },
        )
        .await
    }

    /// Inline `GET`s of every key, pipelined like [`Client::set_many`].
    pub async fn get_many_inline<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Result<Option<Bytes>>> {
        self.pipelined(
            keys.len(),
            Access::Read,
            |i| keys[i].as_ref(),
            |i| vec![b"GET", keys[i].as_ref()],
            expect_bulk_or_nil,
        )
        .await
    }

    /// One inline command per item (`command(i)`, on the node owning
    /// `key(i)`), each node's commands in one write, `BATCH_MAX` items at
    /// a time; every reply through `parse`. One result per item, in order.
    async fn pipelined<'a, T>(
        &self,
        n: usize,
        access: Access,
        key: impl Fn(usize) -> &'a [u8],
        command: impl Fn(usize) -> Vec<&'a [u8]>,
        parse: impl Fn(BytesFrame) -> Result<T> + Copy,
    ) -> Vec<Result<T>> {
        let mut out = Vec::with_capacity(n);
        for start in (0..n).step_by(BATCH_MAX) {
            let end = (start + BATCH_MAX).min(n);
            let slots: Vec<u16> = (start..end).map(|i| key_slot(key(i))).collect();
            let done = self
                .router
                .routed_batch(&slots, access, Idempotent::Yes, |node, idx| {
                    let commands: Vec<Vec<&[u8]>> =
                        idx.iter().map(|&j| command(start + j)).collect();
                    async move {
                        let commands: Vec<&[&[u8]]> = commands.iter().map(Vec::as_slice).collect();
                        let replies = node.exchange(&commands, Idempotent::Yes).await?;
                        Ok(replies.into_iter().map(|r| parse(r?)).collect())
                    }
                })
                .await;
            out.extend(done);
        }
        out
    }

    /// `DEL key`: whether it existed. Not retried after a lost connection
    /// (a retry would report `false` for the client's own delete).
    pub async fn del(&self, key: &[u8]) -> Result<bool> {
        let reply = self
            .call_key(key, Access::Write, &[b"DEL", key], Idempotent::No)
            .await?;
        Ok(expect_int(reply)? > 0)
    }
}
