//! `EXPIRE key seconds [NX|XX|GT|LT]` and `PEXPIRE key ms [...]`: 1 if the
//! timeout was set, 0 if the key is missing or the condition failed. A
//! non-positive timeout deletes the key, as in Redis.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};
use strata_tiering::Ttl;

use super::{int_arg, Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if let Some(out) = ctx.fetch_missing(&args[1..2]) {
        return out;
    }
    let millis = args[0].eq_ignore_ascii_case(b"PEXPIRE");
    let name = if millis { "pexpire" } else { "expire" };
    let n = match int_arg(&args[2]) {
        Ok(n) => n,
        Err(e) => return e.into(),
    };
    let ms = if millis { Some(n) } else { n.checked_mul(1000) };
    let at = ms.and_then(|ms| (ctx.now_ms as i64).checked_add(ms));
    let Some(at) = at else {
        return CommandError::err(format!("invalid expire time in '{name}' command")).into();
    };
    let flag = match &args[3..] {
        [] => None,
        [f] => Some(f.to_ascii_uppercase()),
        _ => return CommandError::syntax().into(),
    };
    let store = &ctx.node.store;
    let current = store.ttl(&args[1], ctx.now_ms);
    if current == Ttl::Missing {
        return Reply::Int(0).into();
    }
    // Redis: a key without TTL counts as infinite for GT/LT.
    let cur_at = match current {
        Ttl::Ms(left) => Some(ctx.now_ms as i64 + left as i64),
        _ => None,
    };
    let applies = match flag.as_deref() {
        None => true,
        Some(b"NX") => cur_at.is_none(),
        Some(b"XX") => cur_at.is_some(),
        Some(b"GT") => cur_at.is_some_and(|c| at > c),
        Some(b"LT") => cur_at.is_none_or(|c| at < c),
        Some(other) => {
            return CommandError::err(format!(
                "Unsupported option {}",
                strata_proto::error::show(other)
            ))
            .into()
        }
    };
    if !applies {
        return Reply::Int(0).into();
    }
    let at = at.max(0) as u64;
    let set = store.set_expiry(&args[1], Some(at), ctx.now_ms);
    if set {
        // Redis: a time already past deletes the key, and says `del`.
        let event = if at <= ctx.now_ms {
            Event::Del
        } else {
            Event::Expire
        };
        ctx.notify(event, &args[1]);
    }
    ctx.forward(args, Reply::Int(i64::from(set)))
}
