//! `PING [message]`: `+PONG`, or the message as a bulk string. In RESP2
//! subscribed mode, `["pong", message or ""]`, as Redis answers there.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    if ctx.session.subscribed_resp2() && args.len() <= 2 {
        let msg = args.get(1).cloned().unwrap_or_default();
        return Reply::Array(vec![Reply::text("pong"), Reply::Bulk(msg)]).into();
    }
    match args {
        [_] => Reply::Status("PONG").into(),
        [_, msg] => Reply::Bulk(msg.clone()).into(),
        _ => CommandError::wrong_arity("ping").into(),
    }
}
