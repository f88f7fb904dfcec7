//! `PUBLISH channel message`: queues the message for every connection
//! subscribed to the channel or to a matching pattern on this node;
//! replies how many. Never waits for a subscriber (a slow one is cut off at
//! `pubsub_output_buffer_limit`). In a cluster a message reaches this
//! node's subscribers only: keyspace events are published by the node
//! that owns the key, so a router subscribes to every node.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    Reply::Int(ctx.node.pubsub.publish(&args[1], &args[2]) as i64).into()
}
