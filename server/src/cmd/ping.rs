//! `PING [message]`: `+PONG`, or the message as a bulk string.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{Ctx, Out};

pub fn run(_ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    match args {
        [_] => Reply::Status("PONG").into(),
        [_, msg] => Reply::Bulk(msg.clone()).into(),
        _ => CommandError::wrong_arity("ping").into(),
    }
}
