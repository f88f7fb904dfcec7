//! `MPUT key desc [key desc ...]`: several PUTs in one round trip. Each
//! pair succeeds or fails on its own (one `+OK` or error per pair, in
//! order); their transfers run concurrently.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};
use strata_tiering::{Condition, Expiry};

use super::put::{prepare, pull};
use super::{own_key, Ctx, Out};
use crate::cluster::replicate;
use crate::node::now_ms;

/// A batch is one request's worth of blocks; larger ones are split by the
/// client.
const MAX_PAIRS: usize = 1024;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let pairs = &args[1..];
    if !pairs.len().is_multiple_of(2) {
        return CommandError::wrong_arity("mput").into();
    }
    if pairs.len() / 2 > MAX_PAIRS {
        return CommandError::err(format!("at most {MAX_PAIRS} pairs per MPUT")).into();
    }
    if let Some(out) = ctx.wait_for_room() {
        return out;
    }
    let mut tasks = Vec::with_capacity(pairs.len() / 2);
    for kv in pairs.chunks_exact(2) {
        let prepared = prepare(ctx.node, &kv[1]);
        let node = ctx.node.clone();
        let key = own_key(&kv[0]);
        let internal = ctx.internal;
        let copies = node.cfg.replica_num as usize;
        let targets = if internal {
            Vec::new()
        } else {
            replicate::targets(&node, &key, copies)
        };
        tasks.push(tokio::spawn(async move {
            let (desc, res) = prepared?;
            pull(&node, &desc, &res).await?;
            node.store.commit(
                key.clone(),
                res,
                Condition::Always,
                Expiry::Persist,
                now_ms(),
            );
            if let Some(value) = node
                .store
                .peek(&key, now_ms())
                .map_err(super::store_error)?
            {
                if !internal {
                    replicate::push_write(&node, key, value, None, targets, copies).await;
                }
            }
            Ok::<(), CommandError>(())
        }));
    }
    Out::Later(Box::pin(async move {
        let mut replies = Vec::with_capacity(tasks.len());
        for t in tasks {
            replies.push(match t.await {
                Ok(Ok(())) => Reply::Ok,
                Ok(Err(e)) => e.into(),
                Err(e) => CommandError::err(format!("io: transfer task failed: {e}")).into(),
            });
        }
        Reply::Array(replies)
    }))
}
