//! `RELEASE lease [lease ...]`: ends leases this connection holds; replies
//! how many were live. Unknown, expired or foreign ids count 0.

use bytes::Bytes;
use strata_proto::Reply;

use super::{int_arg, Ctx, Out};

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
        if ctx.session.leases.remove(&id) && ctx.node.leases.release(id) {
            released += 1;
        }
    }
    Reply::Int(released).into()
}
