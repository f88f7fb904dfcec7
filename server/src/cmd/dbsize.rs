//! `DBSIZE`: number of keys (including expired ones not yet collected, as
//! in Redis).

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, _args: &[Bytes]) -> Out {
    Reply::Int(ctx.node.store.len() as i64).into()
}
