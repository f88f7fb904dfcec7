//! `RELEASE lease [lease ...]`: ends leases this connection holds; replies
//! how many were live. Unknown, expired or foreign ids count 0.

use bytes::Bytes;
use strata_proto::Reply;

use super::{int_arg, Ctx, Out};
use crate::metrics::Direction;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let mut ids = Vec::with_capacity(args.len() - 1);
    for a in &args[1..] {
        match int_arg(a) {
            Ok(id) => ids.push(id as u64),
            Err(e) => return e.into(),
        }
    }
    let mut released = 0;
    for id in ids {
        if !ctx.session.leases.remove(&id) {
            continue;
        }
        let (live, timed) = ctx.node.leases.release_timed(id);
        if live {
            released += 1;
        }
        if let Some((transport, held)) = timed {
            ctx.node
                .metrics
                .transfers
                .add_time(Direction::Out, transport, held);
        }
    }
    Reply::Int(released).into()
}
