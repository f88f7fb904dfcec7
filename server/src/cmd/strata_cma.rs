//! `STRATA.CMA HELLO` and `STRATA.CMA PROVE pid start addr`: a same-host
//! client sets up cross-memory attach on its connection (see `crate::cma`).
//!
//! `HELLO` replies `[boot_id, pid_ns, uid, pid, start, probe_addr, probe,
//! nonce, lease_ttl_ms]` (ids decimal, `probe_addr` hex, `probe` and
//! `nonce` 32 hex digits each): the client compares the first three with its own, reads
//! the 16 bytes at `probe_addr` of process `pid` (started at `start`) and
//! checks them against `probe`, writes `nonce` into its own memory at some
//! `addr` and sends `PROVE` naming itself. `+OK` binds that process to this
//! connection; `-NOCMA <why>` otherwise. `-NOCMA` also answers `HELLO`
//! when `cma: off`.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};

use super::{Ctx, Out};
use crate::cma::{nonce, NONCE_BYTES};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let Some(cma) = ctx.node.cma.clone() else {
        return CommandError::new(
            ErrorCode::NoCma,
            "cross-memory attach is off on this node (cma: off)",
        )
        .into();
    };
    match (args[1].to_ascii_uppercase().as_slice(), &args[2..]) {
        (b"HELLO", []) => {
            let Some(n) = nonce() else {
                return CommandError::new(ErrorCode::NoCma, "no random nonce (getrandom failed)")
                    .into();
            };
            ctx.session.cma_nonce = Some(n);
            ctx.session.cma_peer = None;
            let me = &cma.me;
            Reply::Array(vec![
                Reply::text(&me.boot_id),
                Reply::Int(me.pid_ns as i64),
                Reply::Int(i64::from(me.uid)),
                Reply::Int(i64::from(me.pid)),
                Reply::Int(me.start as i64),
                Reply::text(&format!("{:x}", cma.probe_addr())),
                Reply::text(&hex(cma.probe())),
                Reply::text(&hex(&n)),
                Reply::Int(ctx.node.cfg.lease_ttl_ms as i64),
            ])
            .into()
        }
        (b"PROVE", [pid, start, addr]) => {
            let parsed = (num(pid, 10), num(start, 10), num(addr, 16));
            let (Some(pid), Some(start), Some(addr)) = parsed else {
                return CommandError::err(
                    "STRATA.CMA PROVE pid start addr: decimal pid and start, hex addr",
                )
                .into();
            };
            let Ok(pid) = u32::try_from(pid) else {
                return CommandError::err("pid out of range").into();
            };
            let Some(n) = ctx.session.cma_nonce.take() else {
                return CommandError::new(
                    ErrorCode::NoCma,
                    "no nonce on this connection: send STRATA.CMA HELLO first",
                )
                .into();
            };
            match cma.prove(pid, start, addr, &n) {
                Ok(()) => {
                    ctx.session.cma_peer = Some((pid, start));
                    Reply::Ok.into()
                }
                Err(why) => CommandError::new(ErrorCode::NoCma, why).into(),
            }
        }
        _ => CommandError::syntax().into(),
    }
}

fn num(b: &[u8], radix: u32) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(b).ok()?, radix).ok()
}

fn hex(b: &[u8; NONCE_BYTES]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
