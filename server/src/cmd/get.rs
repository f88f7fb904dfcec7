//! `GET key`: the value as a bulk string, written straight from store
//! memory (pinned while it is written), or nil.
//!
//! `GET key desc` (zero-copy): `desc` names the client's destination
//! buffer. The value is pinned under a lease and the reply is
//! `[source descriptor, lease, len]`; the client pulls the bytes itself with
//! a one-sided read and then sends `RELEASE lease`.
//!
//! `GET key desc INLINE n`: the same, except that a value of at most `n`
//! bytes comes back as a bulk string, like a plain `GET`: for a small
//! value a second round trip (the read) and a lease cost more than the
//! bytes themselves. The destination is checked as for any zero-copy GET,
//! so a client gets the same errors whichever way the value travels.
//!
//! `GET key desc INLINE n RANGE off len`: as with `INLINE n`, but an
//! inline value comes back as `[version, value length, bytes off..off+len]`
//! (clipped to the value). A client reads one large value as two ranges
//! over two connections at once, which on loopback under BBR beat one
//! paced stream (docs/bench-notes/ranged-gets.md); equal versions say the
//! ranges are of one write.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};
use strata_rdma::{Transport, TransportKind};
use strata_tiering::Value;

use super::{desc_arg, int_arg, store_error, transfer_error, Ctx, Out};
use crate::metrics::Direction;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    match args {
        [_, key] => match look_up(ctx, key) {
            Ok(v) => Out::Value(v),
            Err(out) => out,
        },
        [_, key, desc] => lease(ctx, key, desc, 0, None).unwrap_or_else(Into::into),
        [_, key, desc, opt, n] if opt.eq_ignore_ascii_case(b"INLINE") => match count(n, "INLINE") {
            Ok(n) => lease(ctx, key, desc, n, None).unwrap_or_else(Into::into),
            Err(e) => e.into(),
        },
        [_, key, desc, opt, n, ropt, off, len]
            if opt.eq_ignore_ascii_case(b"INLINE") && ropt.eq_ignore_ascii_case(b"RANGE") =>
        {
            let parsed = count(n, "INLINE")
                .and_then(|n| Ok((n, count(off, "RANGE")?, count(len, "RANGE")?)));
            match parsed {
                Ok((n, off, len)) => {
                    lease(ctx, key, desc, n, Some((off, len))).unwrap_or_else(Into::into)
                }
                Err(e) => e.into(),
            }
        }
        [_, _, _, _, _] | [_, _, _, _, _, _, _, _] => CommandError::syntax().into(),
        _ => CommandError::wrong_arity("get").into(),
    }
}

/// The value of `key`, or `None` for a miss (counted and notified). `Err`:
/// the key is being brought in from below DRAM or a previous holder, after
/// which the command runs again (see [`Ctx::missed`]), or the store's error.
fn look_up(ctx: &mut Ctx<'_>, key: &Bytes) -> Result<Option<Value>, Out> {
    match ctx.node.store.get_present(key, ctx.now_ms) {
        Ok(Some(v)) => Ok(Some(v)),
        Ok(None) => ctx.missed(std::slice::from_ref(key)).map_or(Ok(None), Err),
        Err(e) => Err(store_error(e).into()),
    }
}

/// A count argument: an integer, 0 or more.
fn count(arg: &[u8], what: &str) -> Result<u64, CommandError> {
    int_arg(arg).and_then(|n| {
        u64::try_from(n).map_err(|_| CommandError::err(format!("{what} must be 0 or more bytes")))
    })
}

/// A zero-copy GET: a lease on the value, or the value itself when it is
/// at most `inline_max` bytes (bytes `range` of it, as `Out::Range`, when
/// asked for).
fn lease(
    ctx: &mut Ctx<'_>,
    key: &Bytes,
    desc: &[u8],
    inline_max: u64,
    range: Option<(u64, u64)>,
) -> Result<Out, CommandError> {
    let dst = desc_arg(desc)?;
    let cma = dst.transport == TransportKind::Cma;
    if cma {
        if ctx.node.cma.is_none() || ctx.session.cma_peer.is_none() {
            return Err(CommandError::new(
                ErrorCode::NoCma,
                "cross-memory attach is not set up on this connection (STRATA.CMA)",
            ));
        }
    } else {
        super::network_desc(ctx.node, dst.transport, false)?;
    }
    let value = match look_up(ctx, key) {
        Ok(v) => v,
        Err(out) => return Ok(out),
    };
    let Some(value) = value else {
        return Err(CommandError::new(ErrorCode::NotFound, "no such key"));
    };
    if value.len() > dst.len {
        return Err(CommandError::new(
            ErrorCode::TooLarge,
            format!(
                "value of {} bytes does not fit the destination of {} bytes",
                value.len(),
                dst.len
            ),
        ));
    }
    if value.len() <= inline_max {
        let Some((off, len)) = range else {
            return Ok(Out::Value(Some(value)));
        };
        // Both at most the value's length, which is in memory.
        let start = off.min(value.len()) as usize;
        let end = off.saturating_add(len).min(value.len()) as usize;
        return Ok(Out::Range { value, start, end });
    }
    let (src, id) = grant(ctx, value, cma)?;
    Ok(Reply::Array(vec![
        Reply::text(&src.0),
        Reply::Int(id as i64),
        Reply::Int(src.1 as i64),
    ])
    .into())
}

/// Leases `value` to this connection; returns (source descriptor, len) and
/// the lease id. With `cma` the source is a `cma` descriptor of this
/// process: the client copies the value out itself and confirms the lease
/// with RELEASE afterwards (the node cannot see the read).
fn grant(ctx: &mut Ctx<'_>, value: Value, cma: bool) -> Result<((String, u64), u64), CommandError> {
    let node = ctx.node;
    if ctx.session.leases.len() >= node.cfg.max_leases as usize {
        return Err(CommandError::new(
            ErrorCode::Busy,
            format!(
                "too many leases on this connection ({}); RELEASE some first",
                node.cfg.max_leases
            ),
        ));
    }
    let len = value.len();
    let offset = node.arena_offset(value.addr());
    let transport = if cma {
        TransportKind::Cma
    } else {
        node.transport.kind()
    };
    let (id, tokens) =
        node.leases
            .grant_transfer(vec![value], ctx.now_ms + node.cfg.lease_ttl_ms, transport);
    let described = match node.cma.as_ref().filter(|_| cma) {
        Some(c) => Ok(strata_rdma::cma::describe(
            &c.me,
            node.arena_region.addr() + offset,
            len,
            node.arena_region.rkey(),
            Some(tokens[0]),
        )),
        None => node
            .transport
            .describe(&node.arena_region, offset, len, Some(tokens[0])),
    };
    let src = match described {
        Ok(src) => src,
        Err(e) => {
            node.leases.release(id);
            return Err(transfer_error(e));
        }
    };
    ctx.session.leases.insert(id);
    ctx.session.handed += len;
    node.metrics
        .transfers
        .add_bytes(Direction::Out, transport, len);
    Ok(((src.to_string(), len), id))
}
