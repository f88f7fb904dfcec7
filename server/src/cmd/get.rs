//! `GET key`: the value as a bulk string, written straight from store
//! memory (pinned while it is written), or nil.

use bytes::Bytes;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    Out::Value(ctx.node.store.get(&args[1], ctx.now_ms))
}
