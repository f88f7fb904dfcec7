//! `HELLO [protover [AUTH username password] [SETNAME name]]`: switches
//! the connection to RESP2 or RESP3 and describes the server.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply, RespVersion};

use super::{auth, client, int_arg, Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    match apply(ctx, args) {
        Ok(()) => describe(ctx).into(),
        Err(e) => e.into(),
    }
}

fn apply(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Result<(), CommandError> {
    let mut version = ctx.session.resp;
    if let Some(v) = args.get(1) {
        version = match int_arg(v) {
            Ok(2) => RespVersion::Resp2,
            Ok(3) => RespVersion::Resp3,
            Ok(_) => {
                return Err(CommandError::new(
                    ErrorCode::NoProto,
                    "unsupported protocol version",
                ))
            }
            Err(_) => {
                return Err(CommandError::err(
                    "Protocol version is not an integer or out of range",
                ))
            }
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        let opt = &args[i];
        if opt.eq_ignore_ascii_case(b"AUTH") && i + 2 < args.len() {
            auth::check(ctx, Some(&args[i + 1]), &args[i + 2])?;
            i += 3;
        } else if opt.eq_ignore_ascii_case(b"SETNAME") && i + 1 < args.len() {
            name = Some(client::valid_name(&args[i + 1])?);
            i += 2;
        } else {
            return Err(CommandError::err(format!(
                "Syntax error in HELLO option '{}'",
                strata_proto::error::show(opt)
            )));
        }
    }
    if !ctx.session.authed {
        return Err(CommandError::new(
            ErrorCode::NoAuth,
            "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    ctx.session.resp = version;
    if let Some(sub) = &ctx.session.sub {
        sub.mailbox.set_resp(version);
    }
    if let Some(n) = name {
        ctx.session.name = Some(n);
    }
    Ok(())
}

fn describe(ctx: &Ctx<'_>) -> Reply {
    Reply::Map(vec![
        (Reply::text("server"), Reply::text("strata")),
        (
            Reply::text("version"),
            Reply::text(env!("CARGO_PKG_VERSION")),
        ),
        (Reply::text("proto"), Reply::Int(ctx.session.resp.number())),
        (Reply::text("id"), Reply::Int(ctx.session.id as i64)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(vec![])),
    ])
}
