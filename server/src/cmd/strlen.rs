//! `STRLEN key`: value length, 0 for a missing key.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..2]) {
        return out;
    }
    let len = ctx
        .node
        .store
        .meta(&args[1], ctx.now_ms)
        .map_or(0, |m| m.len);
    Reply::Int(len as i64).into()
}
