//! `CONFIG GET pattern [pattern ...]`: configuration values as a map.
//! `CONFIG SET` changes only `notify-keyspace-events` (Redis tools turn
//! keyspace notifications on that way); every other key is refused:
//! strata reads its configuration once at start (see `--print-config`), so
//! a running node never drifts from its file.

use bytes::Bytes;
use strata_proto::{glob, CommandError, Reply};

use super::{Ctx, Out};
use crate::pubsub::keyspace::Flags;

/// The live key's names: Redis' spelling and strata's.
const NOTIFY_KEYS: [&str; 2] = ["notify-keyspace-events", "notify_keyspace_events"];

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let sub = args[1].to_ascii_uppercase();
    match sub.as_slice() {
        b"GET" if args.len() >= 3 => {
            let mut entries = ctx.node.cfg.entries();
            let live = ctx.node.pubsub.keyspace.flags().to_string();
            for (k, v) in &mut entries {
                if *k == NOTIFY_KEYS[1] {
                    v.clone_from(&live);
                }
            }
            entries.push((NOTIFY_KEYS[0], live));
            let mut out = Vec::new();
            for (k, v) in &entries {
                if args[2..]
                    .iter()
                    .any(|p| glob::matches(&p.to_ascii_lowercase(), k.as_bytes()))
                {
                    out.push((Reply::text(k), Reply::text(v)));
                }
            }
            Reply::Map(out).into()
        }
        b"GET" => CommandError::wrong_arity("config|get").into(),
        b"SET" if args.len() == 4 && is_notify_key(&args[2]) => {
            let flags = match std::str::from_utf8(&args[3])
                .map_err(|_| "not UTF-8".to_string())
                .and_then(Flags::parse)
            {
                Ok(f) => f,
                Err(e) => {
                    return CommandError::err(format!(
                        "CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - {e}"
                    ))
                    .into()
                }
            };
            ctx.node.pubsub.keyspace.set_flags(flags);
            tracing::info!(flags = %flags, "notify-keyspace-events changed by CONFIG SET");
            Reply::Ok.into()
        }
        b"SET" => CommandError::err(
            "CONFIG SET is not supported except for notify-keyspace-events: strata reads its configuration at start; change strata.json or STRATA_* and restart",
        )
        .into(),
        _ => CommandError::unknown_subcommand("CONFIG", &args[1]).into(),
    }
}

fn is_notify_key(k: &[u8]) -> bool {
    NOTIFY_KEYS
        .iter()
        .any(|n| k.eq_ignore_ascii_case(n.as_bytes()))
}
