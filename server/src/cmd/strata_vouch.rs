//! `STRATA.VOUCH node-id`: internal; whether `node-id` is a member whose
//! record this node has seen and not seen deleted, and that it can reach
//! (1), or not (0). A node that cannot reach etcd serves on a majority of
//! its peers' 1s (see `crate::cluster::fence`); a node that would delete an
//! unreachable member's record first counts the 0s.
//!
//! A member whose record is gone gets 0 even once it is reachable again:
//! it was cut off, the others took its slots over and wrote past its
//! copies, and a 1 would let it serve them again before it learns from
//! etcd that it must drop them.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let id = String::from_utf8_lossy(&args[1]);
    let cl = &ctx.node.cluster;
    let member = cl.member_revisions.lock().contains_key(id.as_ref());
    let suspected = cl.suspects.lock().contains(id.as_ref());
    Reply::Int(i64::from(member && !suspected)).into()
}
