//! `ECHO message`.

use bytes::Bytes;
use strata_proto::Reply;

use super::{Ctx, Out};

pub fn run(_ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    Reply::Bulk(args[1].clone()).into()
}
