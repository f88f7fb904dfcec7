//! `SELECT index`: strata has one keyspace, database 0. Accepting 0 keeps
//! clients that always send `SELECT 0` working; anything else is refused
//! rather than silently sharing database 0.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{int_arg, Ctx, Out};

pub fn run(_ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    match int_arg(&args[1]) {
        Ok(0) => Reply::Ok.into(),
        Ok(_) => CommandError::err("DB index is out of range").into(),
        Err(e) => e.into(),
    }
}
