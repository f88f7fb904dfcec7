//! `SUBSCRIBE channel [channel ...]` and `PSUBSCRIBE pattern [pattern ...]`:
//! from now on this connection receives what is published on those
//! channels (or on channels matching the glob patterns). One reply per
//! name: `[subscribe|psubscribe, name, subscriptions of this connection]`,
//! a push in RESP3. In RESP2 the connection is then in subscribed mode
//! (only the pub/sub commands, PING and QUIT run).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{own_key, Ctx, Out};
use crate::pubsub::{confirmation, Kind, Mailbox, Subscriber, MAX_SUBSCRIPTIONS};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (kind, verb) = if args[0].eq_ignore_ascii_case(b"PSUBSCRIBE") {
        (Kind::Pattern, "psubscribe")
    } else {
        (Kind::Channel, "subscribe")
    };
    let hub = &ctx.node.pubsub;
    let resp = ctx.session.resp;
    let sub = ctx.session.sub.get_or_insert_with(|| Subscriber {
        mailbox: Arc::new(Mailbox::new(resp, hub.limit)),
        channels: HashSet::new(),
        patterns: HashSet::new(),
    });
    let mut replies = Vec::with_capacity(args.len() - 1);
    for name in &args[1..] {
        if sub.count() >= MAX_SUBSCRIPTIONS {
            replies.push(Reply::Error(CommandError::err(format!(
                "too many subscriptions on this connection (at most {MAX_SUBSCRIPTIONS})"
            ))));
            break;
        }
        hub.subscribe(sub, kind, own_key(name));
        replies.push(confirmation(verb, Some(name.clone()), sub.count()));
    }
    Reply::Seq(replies).into()
}
