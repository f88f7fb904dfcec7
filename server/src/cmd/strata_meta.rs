//! `STRATA.META key`: facts about a stored value — size, tier, creation
//! time (Unix ms), CRC32C checksum (hex), epoch, TTL — as a map, or nil.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..2]) {
        return out;
    }
    let Some(m) = ctx.node.store.meta(&args[1], ctx.now_ms) else {
        return Reply::Nil.into();
    };
    let ttl_ms = m
        .expire_at_ms
        .map_or(-1, |at| at.saturating_sub(ctx.now_ms) as i64);
    Reply::Map(vec![
        (Reply::text("size"), Reply::Int(m.len as i64)),
        (Reply::text("tier"), Reply::text(m.tier.as_str())),
        (Reply::text("created"), Reply::Int(m.created_ms as i64)),
        (
            Reply::text("checksum"),
            Reply::text(&format!("crc32c:{:08x}", m.checksum)),
        ),
        (Reply::text("epoch"), Reply::Int(m.epoch as i64)),
        (Reply::text("version"), Reply::Int(m.version as i64)),
        (Reply::text("ttl_ms"), Reply::Int(ttl_ms)),
    ])
    .into()
}
