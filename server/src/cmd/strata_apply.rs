//! `STRATA.APPLY command args...` (internal): applies a delete or TTL
//! change forwarded by the node that accepted it, without routing it or
//! forwarding it again. Only `DEL`, `UNLINK`, `EXPIRE` and `PEXPIRE`.

use bytes::Bytes;
use strata_proto::CommandError;

use super::{spec_of, Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let inner = &args[1..];
    let Some(spec) =
        spec_of(&inner[0]).filter(|s| matches!(s.name, "DEL" | "UNLINK" | "EXPIRE" | "PEXPIRE"))
    else {
        return CommandError::err("STRATA.APPLY accepts DEL, UNLINK, EXPIRE, PEXPIRE").into();
    };
    let mut inner_ctx = Ctx {
        node: ctx.node,
        session: ctx.session,
        now_ms: ctx.now_ms,
        internal: true,
    };
    (spec.run)(&mut inner_ctx, inner)
}
