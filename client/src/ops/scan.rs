//! `SCAN`: the keys matching a pattern, walked on every node of the map.

use std::collections::HashSet;

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;

use crate::conn::{expect_bulk_or_nil, unexpected};
use crate::node::Idempotent;
use crate::{Client, Error, Result};

impl Client {
    /// Keys matching the glob `pattern` on every node of the map (one
    /// `SCAN` walk per node; a key held by several nodes is listed once),
    /// at most `limit` of them.
    ///
    /// A node that cannot be reached is skipped: with replicas its keys are
    /// listed by the nodes that hold the copies, and a listing is a hint in
    /// every engine that asks for one. Only when no node answers is the
    /// failure returned.
    pub async fn scan(&self, pattern: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        let mut addrs = self.router.addrs();
        if addrs.is_empty() {
            addrs.clone_from(&self.cfg.seeds);
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut last_failure = None;
        let mut answered = false;
        for addr in addrs {
            match self
                .scan_node(&addr, pattern, limit, &mut seen, &mut out)
                .await
            {
                Ok(()) => answered = true,
                Err(e) if e.is_node_failure() => last_failure = Some(e),
                Err(e) => return Err(e),
            }
            if out.len() >= limit {
                break;
            }
        }
        match last_failure {
            Some(e) if !answered => Err(e),
            _ => Ok(out),
        }
    }

    /// One node's `SCAN` walk, adding keys not yet `seen` to `out` until it
    /// holds `limit`.
    async fn scan_node(
        &self,
        addr: &str,
        pattern: &[u8],
        limit: usize,
        seen: &mut HashSet<Bytes>,
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        let node = self.router.node(addr);
        let mut cursor = Bytes::from_static(b"0");
        loop {
            let args: [&[u8]; 6] = [b"SCAN", &cursor, b"MATCH", pattern, b"COUNT", SCAN_COUNT];
            let reply = node
                .call(&args, Idempotent::Yes, self.cfg.retry_attempts)
                .await?;
            let (next, keys) = scan_page(reply)?;
            for key in keys {
                if out.len() >= limit {
                    return Ok(());
                }
                if seen.insert(key.clone()) {
                    out.push(key);
                }
            }
            if &next[..] == b"0" {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// Keys a `SCAN` step asks for: enough to keep round trips few, small
/// enough that one reply stays well under the reply size limit.
const SCAN_COUNT: &[u8] = b"1000";

/// `[cursor, [key...]]`.
fn scan_page(reply: BytesFrame) -> Result<(Bytes, Vec<Bytes>)> {
    let BytesFrame::Array(mut parts) = reply else {
        return Err(unexpected("a SCAN reply", &reply));
    };
    if parts.len() != 2 {
        return Err(Error::Protocol(format!(
            "SCAN reply of {} parts",
            parts.len()
        )));
    }
    let keys = match parts.pop() {
        Some(BytesFrame::Array(keys)) => keys,
        Some(other) => return Err(unexpected("a SCAN key list", &other)),
        None => unreachable!("checked two parts"),
    };
    let cursor = expect_bulk_or_nil(parts.pop().expect("checked two parts"))?
        .ok_or_else(|| Error::Protocol("nil SCAN cursor".into()))?;
    let keys = keys
        .into_iter()
        .map(|k| expect_bulk_or_nil(k)?.ok_or_else(|| Error::Protocol("nil key in SCAN".into())))
        .collect::<Result<Vec<_>>>()?;
    Ok((cursor, keys))
}
