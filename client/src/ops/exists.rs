//! Questions about keys that move no value: `EXISTS`, `PREFIX` (how many
//! of a list of keys, from the first, are present) and the value's size
//! from `STRATA.META`.

use redis_protocol::resp2::types::BytesFrame;
use strata_ring::key_slot;

use crate::conn::{expect_int, unexpected};
use crate::node::{Idempotent, Node};
use crate::router::Access;
use crate::{Client, Error, Result};

impl Client {
    pub async fn exists(&self, key: &[u8]) -> Result<bool> {
        let reply = self
            .call_key(key, Access::Read, &[b"EXISTS", key], Idempotent::Yes)
            .await?;
        Ok(expect_int(reply)? > 0)
    }

    /// Length of the value of `key` (the `size` of `STRATA.META`), `None`
    /// if absent: one round trip, no payload.
    pub async fn value_size(&self, key: &[u8]) -> Result<Option<u64>> {
        let reply = self
            .call_key(key, Access::Read, &[b"STRATA.META", key], Idempotent::Yes)
            .await?;
        let fields = match reply {
            BytesFrame::Null => return Ok(None),
            BytesFrame::Array(fields) => fields,
            other => return Err(unexpected("a STRATA.META map", &other)),
        };
        for pair in fields.chunks_exact(2) {
            if let [BytesFrame::BulkString(name) | BytesFrame::SimpleString(name), size] = pair {
                if &name[..] == b"size" {
                    let size = expect_int(size.clone())?;
                    return u64::try_from(size)
                        .map(Some)
                        .map_err(|_| Error::Protocol(format!("negative size {size}")));
                }
            }
        }
        Err(Error::Protocol("STRATA.META reply without size".into()))
    }

    /// How many keys, from the first, are all present. The keys of each
    /// node go to it in one `PREFIX` (the nodes concurrently); the answer
    /// is the first key some node reports missing.
    pub async fn prefix<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let slots: Vec<u16> = keys.iter().map(|k| key_slot(k.as_ref())).collect();
        let retries = self.cfg.retry_attempts;
        // Per key: present, absent, or unknown (after a missing one).
        let presence = self
            .router
            .routed_batch(&slots, Access::Read, Idempotent::Yes, |node, idx| {
                let group: Vec<&[u8]> = idx.iter().map(|&i| keys[i].as_ref()).collect();
                async move {
                    let present = prefix_on(&node, &group, retries).await?;
                    Ok((0..group.len())
                        .map(|k| Ok((k <= present).then_some(k < present)))
                        .collect())
                }
            })
            .await;
        // A node's keys are in key order, so the first key not known to be
        // present is one its node reported missing.
        for (i, known) in presence.into_iter().enumerate() {
            if known? != Some(true) {
                return Ok(i);
            }
        }
        Ok(keys.len())
    }
}

/// `PREFIX` of `keys` on one node.
async fn prefix_on(node: &Node, keys: &[&[u8]], retries: u32) -> Result<usize> {
    let n = keys.len();
    if n == 0 {
        return Ok(0);
    }
    // `... PIN <integer>` at the end would be read as the PIN option:
    // ask about all but the last key, then about the last one alone.
    let ambiguous = n >= 2
        && keys[n - 2].eq_ignore_ascii_case(b"PIN")
        && std::str::from_utf8(keys[n - 1]).is_ok_and(|s| s.parse::<i64>().is_ok());
    let asked = if ambiguous { n - 1 } else { n };
    let mut args: Vec<&[u8]> = vec![b"PREFIX"];
    args.extend(&keys[..asked]);
    let present = count(expect_int(
        node.call(&args, Idempotent::Yes, retries).await?,
    )?)?;
    if ambiguous && present == asked {
        let last = node
            .call(&[b"EXISTS", keys[n - 1]], Idempotent::Yes, retries)
            .await?;
        if expect_int(last)? > 0 {
            return Ok(n);
        }
    }
    Ok(present.min(n))
}

fn count(n: i64) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::Protocol(format!("negative count {n}")))
}
