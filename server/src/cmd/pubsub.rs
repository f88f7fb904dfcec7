//! `PUBSUB CHANNELS [pattern]`, `PUBSUB NUMSUB [channel ...]`,
//! `PUBSUB NUMPAT`: what this node's connections are subscribed to.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let hub = &ctx.node.pubsub;
    match args[1].to_ascii_uppercase().as_slice() {
        b"CHANNELS" if args.len() <= 3 => {
            let pattern = args.get(2).map(|p| &p[..]);
            Reply::Array(hub.channels(pattern).into_iter().map(Reply::Bulk).collect()).into()
        }
        b"NUMSUB" => {
            let mut out = Vec::with_capacity(args.len() - 2);
            for c in &args[2..] {
                out.push((Reply::Bulk(c.clone()), Reply::Int(hub.numsub(c) as i64)));
            }
            Reply::Map(out).into()
        }
        b"NUMPAT" if args.len() == 2 => Reply::Int(hub.numpat() as i64).into(),
        b"CHANNELS" => CommandError::wrong_arity("pubsub|channels").into(),
        b"NUMPAT" => CommandError::wrong_arity("pubsub|numpat").into(),
        _ => CommandError::unknown_subcommand("PUBSUB", &args[1]).into(),
    }
}
