//! `MGET key [key ...]`: values in order, nil for missing keys.

use bytes::Bytes;

use super::{Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let keys = &args[1..];
    let store = &ctx.node.store;
    // Looked up first, as GET does: only keys that missed are looked for
    // below DRAM (or on their previous holders), then the whole command
    // runs again.
    let values = match keys
        .iter()
        .map(|k| store.get_present(k, ctx.now_ms))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(values) => values,
        Err(e) => return super::store_error(e).into(),
    };
    let missing: Vec<Bytes> = keys
        .iter()
        .zip(&values)
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    if missing.is_empty() {
        return Out::Values(values);
    }
    if let Some(out) = ctx.fetch_missing(&missing) {
        return out;
    }
    for k in &missing {
        ctx.node.store.note_miss();
        ctx.notify(Event::KeyMiss, k);
    }
    Out::Values(values)
}
