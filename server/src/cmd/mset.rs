//! `MSET key value [key value ...]`: all keys are set at once (readers see
//! all or none); if any value cannot get space, none is set and the reply
//! is `-NOSPACE`.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{own_key, store_error, Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let pairs = &args[1..];
    if !pairs.len().is_multiple_of(2) {
        return CommandError::wrong_arity("mset").into();
    }
    if let Some(out) = ctx.wait_for_room() {
        return out;
    }
    let store = &ctx.node.store;
    let mut items = Vec::with_capacity(pairs.len() / 2);
    for kv in pairs.chunks_exact(2) {
        match store.reserve(kv[1].len() as u64) {
            Ok(mut r) => {
                r.as_mut_slice().copy_from_slice(&kv[1]);
                items.push((own_key(&kv[0]), r));
            }
            // Dropping `items` frees what was reserved so far.
            Err(e) => return store_error(e).into(),
        }
    }
    let keys: Vec<Bytes> = items.iter().map(|(k, _)| k.clone()).collect();
    store.commit_all(items, ctx.now_ms);
    for k in &keys {
        ctx.notify(Event::Set, k);
    }
    ctx.replicate(keys, None, Reply::Ok)
}
