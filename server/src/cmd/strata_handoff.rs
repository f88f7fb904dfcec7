//! `STRATA.HANDOFF key node_id` (internal): the node that now holds `key`'s
//! slot asks for it before its repair reached it; this node pushes its copy
//! there (`STRATA.REPLICATE`) and replies `+OK`, or `-NOTFOUND`.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};

use super::{Ctx, Out};
use crate::services::replicate;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    // A copy on NVMe is read back first (not fetched from other nodes:
    // that is what the asking node is doing).
    if let Some(out) = ctx.fetch_from_nvme(&args[1..2]) {
        return out;
    }
    let node = ctx.node.clone();
    let (value, expire) = match node.store.peek_with_expiry(&args[1], ctx.now_ms) {
        Ok(Some(found)) => found,
        Ok(None) => return CommandError::new(ErrorCode::NotFound, "no such key").into(),
        Err(e) => return super::store_error(e).into(),
    };
    let ring = node.cluster.ring();
    let Some(target) = ring
        .nodes()
        .iter()
        .find(|n| n.id.as_bytes() == &args[2][..])
        .cloned()
    else {
        return CommandError::err("unknown node").into();
    };
    let key = args[1].clone();
    Out::Later(Box::pin(async move {
        if replicate::push(&node, key, value, expire, vec![target]).await == 1 {
            Reply::Ok
        } else {
            CommandError::err("io: hand-off push failed").into()
        }
    }))
}
