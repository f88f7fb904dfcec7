//! `EXISTS key [key ...]`: how many of the given keys exist; a key named
//! twice counts twice, as in Redis.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..]) {
        return out;
    }
    let n = args[1..]
        .iter()
        .filter(|k| ctx.node.store.exists(k, ctx.now_ms))
        .count();
    Reply::Int(n as i64).into()
}
