//! `TTL key` (seconds, rounded to the nearest second as Redis does) and `PTTL key` (ms):
//! -2 for a missing key, -1 for a key without expiry.

use bytes::Bytes;
use strata_proto::Reply;
use strata_tiering::Ttl;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..2]) {
        return out;
    }
    let millis = args[0].eq_ignore_ascii_case(b"PTTL");
    let v = match ctx.node.store.ttl(&args[1], ctx.now_ms) {
        Ttl::Missing => -2,
        Ttl::Persistent => -1,
        Ttl::Ms(ms) if millis => ms as i64,
        Ttl::Ms(ms) => (ms.saturating_add(500) / 1000).min(i64::MAX as u64) as i64,
    };
    Reply::Int(v).into()
}
