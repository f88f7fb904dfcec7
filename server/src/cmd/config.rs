//! `CONFIG GET pattern [pattern ...]`: configuration values as a map.
//! `CONFIG SET` is refused: strata reads its configuration once at start
//! (see `--print-config`), so a running node never drifts from its file.

use bytes::Bytes;
use strata_proto::{glob, CommandError, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let sub = args[1].to_ascii_uppercase();
    match sub.as_slice() {
        b"GET" if args.len() >= 3 => {
            let entries = ctx.node.cfg.entries();
            let mut out = Vec::new();
            for (k, v) in &entries {
                if args[2..].iter().any(|p| glob::matches(&p.to_ascii_lowercase(), k.as_bytes())) {
                    out.push((Reply::text(k), Reply::text(v)));
                }
            }
            Reply::Map(out).into()
        }
        b"GET" => CommandError::wrong_arity("config|get").into(),
        b"SET" => CommandError::err(
            "CONFIG SET is not supported: strata reads its configuration at start; change strata.json or STRATA_* and restart",
        )
        .into(),
        _ => CommandError::unknown_subcommand("CONFIG", &args[1]).into(),
    }
}
