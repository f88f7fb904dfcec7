//! `STRATA.META key`: facts about a stored value — size, tier, creation
//! time (Unix ms), CRC32C checksum (hex) of the bytes as stored now,
//! epoch, TTL — as a map, or nil.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};
use crate::errors::store_error;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..2]) {
        return out;
    }
    // The checksum is summed now, over the stored bytes (see
    // `Store::meta_summed`): a pass over the value, on this thread.
    let (m, checksum) = match ctx.node.store.meta_summed(&args[1], ctx.now_ms) {
        Ok(Some(found)) => found,
        Ok(None) => return Reply::Nil.into(),
        Err(e) => return store_error(e).into(),
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
            Reply::text(&format!("crc32c:{checksum:08x}")),
        ),
        (Reply::text("epoch"), Reply::Int(m.epoch as i64)),
        (Reply::text("version"), Reply::Int(m.version as i64)),
        (Reply::text("ttl_ms"), Reply::Int(ttl_ms)),
    ])
    .into()
}
