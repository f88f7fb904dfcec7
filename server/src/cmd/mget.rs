//! `MGET key [key ...]`: values in order, nil for missing keys.

use bytes::Bytes;

use super::{Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..]) {
        return out;
    }
    match args[1..]
        .iter()
        .map(|k| ctx.node.store.get(k, ctx.now_ms))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(values) => {
            for (k, v) in args[1..].iter().zip(&values) {
                if v.is_none() {
                    ctx.notify(Event::KeyMiss, k);
                }
            }
            Out::Values(values)
        }
        Err(e) => super::store_error(e).into(),
    }
}
