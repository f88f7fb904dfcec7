//! `UNSUBSCRIBE [channel ...]` and `PUNSUBSCRIBE [pattern ...]`: ends those
//! subscriptions (all of that kind without arguments). One reply per name,
//! `[unsubscribe|punsubscribe, name, subscriptions left]` (name nil when
//! there was none to end); with none left the connection leaves
//! subscribed mode.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};
use crate::pubsub::Kind;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (kind, verb) = if args[0].eq_ignore_ascii_case(b"PUNSUBSCRIBE") {
        (Kind::Pattern, "punsubscribe")
    } else {
        (Kind::Channel, "unsubscribe")
    };
    let hub = &ctx.node.pubsub;
    let Some(sub) = ctx.session.sub.as_mut() else {
        let mut replies: Vec<Reply> = args[1..]
            .iter()
            .map(|n| {
                Reply::Push(vec![
                    Reply::text(verb),
                    Reply::Bulk(n.clone()),
                    Reply::Int(0),
                ])
            })
            .collect();
        if replies.is_empty() {
            replies.push(Reply::Push(vec![
                Reply::text(verb),
                Reply::Nil,
                Reply::Int(0),
            ]));
        }
        return Reply::Seq(replies).into();
    };
    let names: Vec<Bytes> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        match kind {
            Kind::Channel => sub.channels.iter().cloned().collect(),
            Kind::Pattern => sub.patterns.iter().cloned().collect(),
        }
    };
    let mut replies = Vec::with_capacity(names.len().max(1));
    for name in names {
        hub.unsubscribe(sub, kind, &name);
        replies.push(Reply::Push(vec![
            Reply::text(verb),
            Reply::Bulk(name),
            Reply::Int(sub.count() as i64),
        ]));
    }
    if replies.is_empty() {
        replies.push(Reply::Push(vec![
            Reply::text(verb),
            Reply::Nil,
            Reply::Int(sub.count() as i64),
        ]));
    }
    Reply::Seq(replies).into()
}
