//! `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`.
//!
//! Keys are visited in a stable order (by a hash of the key), so a full
//! iteration returns every key present from start to end exactly once, and
//! the cursor is the position to resume from. COUNT bounds the work per
//! call (default 10, like Redis).

use bytes::Bytes;
use strata_proto::{glob, CommandError, Reply};

use super::{int_arg, Ctx, Out};

/// Redis' default COUNT.
const DEFAULT_COUNT: usize = 10;
/// A single call never walks more than this many keys, whatever COUNT says,
/// so one client cannot hold the index for long.
const MAX_COUNT: usize = 100_000;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let Some(cursor) = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return CommandError::err("invalid cursor").into();
    };
    let mut pattern: Option<&Bytes> = None;
    let mut count = DEFAULT_COUNT;
    let mut only_strings = true;
    let mut i = 2;
    while i < args.len() {
        let Some(val) = args.get(i + 1) else {
            return CommandError::syntax().into();
        };
        match args[i].to_ascii_uppercase().as_slice() {
            b"MATCH" => pattern = Some(val),
            b"COUNT" => match int_arg(val) {
                Ok(n) if n >= 1 => count = (n as usize).min(MAX_COUNT),
                Ok(_) => return CommandError::syntax().into(),
                Err(e) => return e.into(),
            },
            // Every strata value is a string.
            b"TYPE" => only_strings = val.eq_ignore_ascii_case(b"string"),
            _ => return CommandError::syntax().into(),
        }
        i += 2;
    }
    let (next, keys) = ctx.node.store.scan(cursor, count, ctx.now_ms, |k| {
        only_strings && pattern.is_none_or(|p| glob::matches(p, k))
    });
    Reply::Array(vec![
        Reply::text(&next.to_string()),
        Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
    ])
    .into()
}
