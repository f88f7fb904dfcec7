//! `STRATA.VOUCH node-id`: internal; whether this node can reach the member
//! `node-id` (1) or suspects it (0). A node that cannot reach etcd serves on
//! a majority of its peers' 1s (see `crate::cluster::fence`); a node that
//! would delete an unreachable member's record first counts the 0s.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let id = String::from_utf8_lossy(&args[1]);
    let suspected = ctx.node.cluster.suspects.lock().contains(id.as_ref());
    Reply::Int(i64::from(!suspected)).into()
}
