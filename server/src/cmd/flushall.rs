//! `FLUSHALL [ASYNC|SYNC]` and `FLUSHDB [ASYNC|SYNC]`: delete every key.
//! Values being read stay valid for their readers and are freed after.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    match &args[1..] {
        [] => {}
        [mode] if mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC") => {}
        _ => return CommandError::syntax().into(),
    }
    ctx.node.store.flush(ctx.now_ms);
    ctx.node.kv_events_cleared();
    Reply::Ok.into()
}
