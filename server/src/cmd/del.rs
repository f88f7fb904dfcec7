//! `DEL key [key ...]` and `UNLINK key [key ...]`: number of keys removed.
//! Both free memory lazily in effect: a value being read by someone stays
//! valid for them and is freed when they finish.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    // A key being moved here is fetched first, so the delete applies to it
    // (and is forwarded) instead of answering 0 while a copy survives. A
    // key on NVMe is not brought up: the store deletes it there.
    if let Some(out) = ctx.fetch_from_peers(&args[1..]) {
        return out;
    }
    let n = args[1..]
        .iter()
        .filter(|k| ctx.node.store.delete(k, ctx.now_ms))
        .count();
    ctx.forward(args, Reply::Int(n as i64))
}
