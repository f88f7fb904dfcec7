//! `MGET key [key ...]`: values in order, nil for missing keys.

use bytes::Bytes;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let keys = &args[1..];
    let store = &ctx.node.store;
    // Looked up first, as GET does: only the keys that missed are brought
    // in (then the whole command runs again) or counted as misses.
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
    ctx.missed(&missing).unwrap_or(Out::Values(values))
}
