//! `KEYS pattern`: every key matching a glob. O(keys), like Redis; use
//! SCAN on a large store.

use bytes::Bytes;
use strata_proto::{glob, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let pattern = &args[1];
    let all = pattern.as_ref() == b"*";
    let (_, keys) = ctx.node.store.scan(0, usize::MAX, ctx.now_ms, |k| {
        all || glob::matches(pattern, k)
    });
    Reply::Array(keys.into_iter().map(Reply::Bulk).collect()).into()
}
