//! `EXISTS key [key ...]`: how many of the given keys exist; a key named
//! twice counts twice, as in Redis.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    // A key on NVMe is counted from the NVMe index, without reading it.
    if let Some(out) = ctx.fetch_for_existence(&args[1..]) {
        return out;
    }
    let n = args[1..].iter().filter(|k| ctx.exists(k)).count();
    Reply::Int(n as i64).into()
}
