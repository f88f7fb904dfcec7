//! `DEL key [key ...]` and `UNLINK key [key ...]`: number of keys removed.
//! Both free memory lazily in effect: a value being read by someone stays
//! valid for them and is freed when they finish.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    // A key being moved here is fetched first, so the delete applies to it
    // (and is forwarded) instead of answering 0 while a copy survives. A
    // key on NVMe is not brought up: the store deletes it there.
    if let Some(out) = ctx.fetch_from_peers(&args[1..]) {
        return out;
    }
    let mut n = 0;
    for k in &args[1..] {
        if ctx.node.store.delete(k, ctx.now_ms) {
            ctx.notify(Event::Del, k);
            n += 1;
        }
    }
    ctx.forward(args, Reply::Int(n as i64))
}
