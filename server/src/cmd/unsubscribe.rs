//! `UNSUBSCRIBE [channel ...]` and `PUNSUBSCRIBE [pattern ...]`: ends those
//! subscriptions (all of that kind without arguments). One reply per name,
//! `[unsubscribe|punsubscribe, name, subscriptions left]` (name nil when
//! there was none to end); with none left the connection leaves
//! subscribed mode.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};
use crate::pubsub::{confirmation, Kind};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (kind, verb) = if args[0].eq_ignore_ascii_case(b"PUNSUBSCRIBE") {
        (Kind::Pattern, "punsubscribe")
    } else {
        (Kind::Channel, "unsubscribe")
    };
    let hub = &ctx.node.pubsub;
    let sub = ctx.session.sub.as_mut();
    let names: Vec<Bytes> = match (args.len() > 1, &sub) {
        (true, _) => args[1..].to_vec(),
        (false, None) => Vec::new(),
        (false, Some(sub)) => match kind {
            Kind::Channel => sub.channels.iter().cloned().collect(),
            Kind::Pattern => sub.patterns.iter().cloned().collect(),
        },
    };
    let mut replies = Vec::with_capacity(names.len().max(1));
    let mut left = 0;
    if let Some(sub) = sub {
        for name in names {
            hub.unsubscribe(sub, kind, &name);
            replies.push(confirmation(verb, Some(name), sub.count()));
        }
        left = sub.count();
    } else {
        replies.extend(names.into_iter().map(|n| confirmation(verb, Some(n), 0)));
    }
    if replies.is_empty() {
        replies.push(confirmation(verb, None, left));
    }
    Reply::Seq(replies).into()
}
