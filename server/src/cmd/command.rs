//! `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name...`, `COMMAND DOCS
//! [name...]`: the command table, in Redis' shapes. Cluster-aware clients
//! read key positions from `COMMAND`; redis-cli reads `COMMAND DOCS` for
//! its hints.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{lookup, Ctx, Out, Spec, COMMANDS};

pub fn run(_ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let Some(sub) = args.get(1) else {
        return Reply::Array(COMMANDS.iter().map(info).collect()).into();
    };
    let named = || args[2..].iter().map(|n| lookup(n).map(|i| &COMMANDS[i]));
    match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" if args.len() == 2 => Reply::Int(COMMANDS.len() as i64).into(),
        b"INFO" => {
            let items: Vec<Reply> = if args.len() == 2 {
                COMMANDS.iter().map(info).collect()
            } else {
                named().map(|s| s.map_or(Reply::Nil, info)).collect()
            };
            Reply::Array(items).into()
        }
        b"DOCS" => {
            let specs: Vec<&Spec> = if args.len() == 2 {
                COMMANDS.iter().collect()
            } else {
                named().flatten().collect()
            };
            Reply::Map(
                specs
                    .into_iter()
                    .map(|s| (Reply::text(&s.name.to_ascii_lowercase()), docs(s)))
                    .collect(),
            )
            .into()
        }
        _ => CommandError::unknown_subcommand("COMMAND", sub).into(),
    }
}

/// Redis' COMMAND INFO shape: name, arity, flags, first key, last key, step.
fn info(s: &Spec) -> Reply {
    let mut flags = vec![Reply::Status(if s.write { "write" } else { "readonly" })];
    if s.no_auth {
        flags.push(Reply::Status("no_auth"));
    }
    Reply::Array(vec![
        Reply::text(&s.name.to_ascii_lowercase()),
        Reply::Int(i64::from(s.arity)),
        Reply::Set(flags),
        Reply::Int(i64::from(s.keys.0)),
        Reply::Int(i64::from(s.keys.1)),
        Reply::Int(i64::from(s.keys.2)),
    ])
}

fn docs(s: &Spec) -> Reply {
    Reply::Map(vec![
        (Reply::text("summary"), Reply::text(s.summary)),
        (Reply::text("since"), Reply::text("0.1.0")),
        (Reply::text("group"), Reply::text(s.group)),
    ])
}
