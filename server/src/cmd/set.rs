//! `SET key value [NX|XX] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL] [REPLICAS n]`.
//!
//! The value is copied once, from the request buffer into a reserved arena
//! chunk, outside every lock (a large one is read from the socket straight
//! into its chunk by the connection instead: `Session::streamed`); the
//! write becomes visible atomically at commit. NX/XX that cannot apply reply nil, as in Redis. `GET` (return
//! the old value) is not supported.

use bytes::Bytes;
use strata_proto::{CommandError, Reply};
use strata_tiering::{Condition, Expiry};

use super::{int_arg, own_key, store_error, Ctx, Out};
use crate::pubsub::keyspace::Event;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (cond, expiry, copies) = match parse_options(&args[3..], ctx.now_ms, "set") {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    if let Some(out) = bring_in_old(ctx, &args[1..2], cond, expiry) {
        return out;
    }
    if let Some(out) = ctx.wait_for_room() {
        return out;
    }
    let store = &ctx.node.store;
    let (key, value) = (&args[1], &args[2]);
    // Don't evict anything for a write that will not apply.
    let exists = || ctx.exists(key);
    if (cond == Condition::IfAbsent && exists()) || (cond == Condition::IfPresent && !exists()) {
        return Reply::Nil.into();
    }
    let res = match ctx.session.streamed.take() {
        // The connection read the value straight into its chunk.
        Some(res) if value.is_empty() => res,
        _ => {
            let mut res = match store.reserve(value.len() as u64) {
                Ok(r) => r,
                Err(e) => return store_error(e).into(),
            };
            res.as_mut_slice().copy_from_slice(value);
            res
        }
    };
    let key = own_key(key);
    if store.commit(key.clone(), res, cond, expiry, ctx.now_ms) {
        ctx.notify(Event::Set, &key);
        if matches!(expiry, Expiry::At(_)) {
            ctx.notify(Event::Expire, &key);
        }
        ctx.replicate(vec![key], copies, Reply::Ok)
    } else {
        Reply::Nil.into()
    }
}

/// KEEPTTL keeps the old value's expiry and XX replaces a value the
/// store's commit must find in DRAM, so a value below DRAM is brought up
/// first; NX only asks whether the key exists, which the NVMe index
/// answers without promoting a value the write would not replace. A key
/// being moved here by a ring change is fetched either way.
fn bring_in_old(ctx: &Ctx<'_>, key: &[Bytes], cond: Condition, expiry: Expiry) -> Option<Out> {
    match cond {
        _ if expiry == Expiry::Keep => ctx.fetch_missing(key),
        Condition::IfPresent => ctx.fetch_missing(key),
        Condition::IfAbsent => ctx.fetch_for_existence(key),
        Condition::Always => None,
    }
}

/// Parses SET's options; shared with nothing else but kept separate so the
/// rules are readable in one place.
pub fn parse_options(
    opts: &[Bytes],
    now_ms: u64,
    cmd: &str,
) -> Result<(Condition, Expiry, Option<u32>), CommandError> {
    let mut cond = Condition::Always;
    let mut expiry = None;
    let mut copies = None;
    let mut i = 0;
    while i < opts.len() {
        let o = opts[i].to_ascii_uppercase();
        match o.as_slice() {
            b"NX" | b"XX" => {
                if cond != Condition::Always {
                    return Err(CommandError::syntax());
                }
                cond = if o == b"NX" {
                    Condition::IfAbsent
                } else {
                    Condition::IfPresent
                };
            }
            b"REPLICAS" => {
                let n = int_arg(opts.get(i + 1).ok_or_else(CommandError::syntax)?)?;
                if copies.is_some() || !(1..=8).contains(&n) {
                    return Err(CommandError::err("REPLICAS must be between 1 and 8"));
                }
                copies = Some(n as u32);
                i += 1;
            }
            b"KEEPTTL" => {
                if expiry.is_some() {
                    return Err(CommandError::syntax());
                }
                expiry = Some(Expiry::Keep);
            }
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => {
                let Some(arg) = opts.get(i + 1) else {
                    return Err(CommandError::syntax());
                };
                if expiry.is_some() {
                    return Err(CommandError::syntax());
                }
                let n = int_arg(arg)?;
                let invalid =
                    || CommandError::err(format!("invalid expire time in '{cmd}' command"));
                if n <= 0 {
                    return Err(invalid());
                }
                let n = n as u64;
                let at = match o.as_slice() {
                    b"EX" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now_ms)),
                    b"PX" => n.checked_add(now_ms),
                    b"EXAT" => n.checked_mul(1000),
                    _ => Some(n),
                }
                .filter(|&at| at <= i64::MAX as u64)
                .ok_or_else(invalid)?;
                expiry = Some(Expiry::At(at));
                i += 1;
            }
            _ => return Err(CommandError::syntax()),
        }
        i += 1;
    }
    Ok((cond, expiry.unwrap_or(Expiry::Persist), copies))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(opts: &[&str]) -> Result<(Condition, Expiry), CommandError> {
        let v: Vec<Bytes> = opts
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        parse_options(&v, 1000, "set").map(|(c, e, _)| (c, e))
    }

    #[test]
    fn options() {
        assert_eq!(p(&[]).unwrap(), (Condition::Always, Expiry::Persist));
        assert_eq!(
            p(&["nx", "ex", "2"]).unwrap(),
            (Condition::IfAbsent, Expiry::At(3000))
        );
        assert_eq!(
            p(&["PX", "5", "XX"]).unwrap(),
            (Condition::IfPresent, Expiry::At(1005))
        );
        assert_eq!(p(&["KEEPTTL"]).unwrap().1, Expiry::Keep);
        assert_eq!(p(&["EXAT", "7"]).unwrap().1, Expiry::At(7000));
        assert_eq!(p(&["NX", "XX"]).unwrap_err(), CommandError::syntax());
        assert_eq!(p(&["EX"]).unwrap_err(), CommandError::syntax());
        assert_eq!(
            p(&["EX", "1", "PX", "1"]).unwrap_err(),
            CommandError::syntax()
        );
        assert_eq!(p(&["EX", "x"]).unwrap_err(), CommandError::not_integer());
        assert!(p(&["EX", "0"])
            .unwrap_err()
            .message
            .contains("invalid expire time in 'set'"));
        assert!(p(&["EX", "-1"]).is_err());
        assert!(p(&["EX", "9223372036854775807"]).is_err());
        assert_eq!(p(&["GET"]).unwrap_err(), CommandError::syntax());
        let v = |o: &[&str]| {
            o.iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            parse_options(&v(&["REPLICAS", "2"]), 0, "set").unwrap().2,
            Some(2)
        );
        assert!(parse_options(&v(&["REPLICAS", "0"]), 0, "set").is_err());
        assert!(parse_options(&v(&["REPLICAS", "9"]), 0, "set").is_err());
    }
}
