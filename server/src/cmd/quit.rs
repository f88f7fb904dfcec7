//! `QUIT`: replies `+OK`, then the connection closes once that reply (and
//! any before it in the same batch) is written.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, _args: &[Bytes]) -> Out {
    ctx.session.quit = true;
    Reply::Ok.into()
}
