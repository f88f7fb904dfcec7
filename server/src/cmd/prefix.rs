//! `PREFIX key [key ...] [PIN ms]`: how many keys, from the first, are all
//! present — the lookup a KV-cache engine makes for a prompt's chain of
//! blocks. With `PIN ms` the present values are leased (not evictable) for
//! `ms` or until `RELEASE`, and the reply is `[n, lease]`.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{int_arg, Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let mut keys = &args[1..];
    let mut pin_ms = None;
    if keys.len() >= 3 && keys[keys.len() - 2].eq_ignore_ascii_case(b"PIN") {
        match int_arg(&keys[keys.len() - 1]) {
            Ok(ms) if ms > 0 && (ms as u64) <= ctx.node.cfg.lease_ttl_ms => {
                pin_ms = Some(ms as u64)
            }
            Ok(_) => {
                return CommandError::err(format!(
                    "PIN must be between 1 and lease_ttl_ms ({}) ms",
                    ctx.node.cfg.lease_ttl_ms
                ))
                .into()
            }
            Err(e) => return e.into(),
        }
        keys = &keys[..keys.len() - 2];
    }
    // Without PIN only existence is asked: keys on NVMe are counted from
    // the NVMe index (a prompt's chain can be far larger than DRAM). With
    // PIN the values are leased, so they are read back into DRAM first.
    let Some(ms) = pin_ms else {
        if let Some(out) = ctx.fetch_for_existence(keys) {
            return out;
        }
        let n = keys.iter().take_while(|k| ctx.exists(k)).count();
        ctx.node.metrics.prefixes.record(keys.len(), n);
        return Reply::Int(n as i64).into();
    };
    if let Some(out) = ctx.fetch_missing(keys) {
        return out;
    }
    let store = &ctx.node.store;
    let mut values = Vec::new();
    for k in keys {
        match store.get(k, ctx.now_ms) {
            Ok(Some(v)) => values.push(v),
            Ok(None) => break,
            Err(e) => return super::store_error(e).into(),
        }
    }
    let n = values.len();
    ctx.node.metrics.prefixes.record(keys.len(), n);
    if n == 0 {
        return Reply::Array(vec![Reply::Int(0), Reply::Int(0)]).into();
    }
    if ctx.session.leases.len() >= ctx.node.cfg.max_leases as usize {
        return CommandError::new(
            strata_proto::ErrorCode::Busy,
            "too many leases on this connection",
        )
        .into();
    }
    let (id, _) = ctx.node.leases.grant(values, ctx.now_ms + ms);
    ctx.session.leases.insert(id);
    Reply::Array(vec![Reply::Int(n as i64), Reply::Int(id as i64)]).into()
}
