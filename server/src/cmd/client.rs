//! `CLIENT SETNAME|GETNAME|ID|SETINFO|INFO`: connection bookkeeping that
//! Redis clients send on connect (redis-py sends SETINFO).

use bytes::Bytes;
use strata_proto::{CommandError, Reply};

use super::{Ctx, Out};

/// Client names show up in logs; keep them short and printable.
const MAX_NAME_LEN: usize = 256;

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let sub = args[1].to_ascii_uppercase();
    let s = &mut ctx.session;
    match (sub.as_slice(), &args[2..]) {
        (b"SETNAME", [name]) => match valid_name(name) {
            Ok(n) => {
                s.name = (!n.is_empty()).then_some(n);
                Reply::Ok.into()
            }
            Err(e) => e.into(),
        },
        (b"GETNAME", []) => s.name.clone().map_or(Reply::Nil, Reply::Bulk).into(),
        (b"ID", []) => Reply::Int(s.id as i64).into(),
        (b"SETINFO", [attr, value]) => {
            let attr = attr.to_ascii_uppercase();
            let value = match valid_name(value) {
                Ok(v) => v,
                Err(_) => return CommandError::err(
                    "LIB-NAME and LIB-VER cannot contain spaces, newlines or special characters.",
                )
                .into(),
            };
            match attr.as_slice() {
                b"LIB-NAME" => s.lib_name = Some(value),
                b"LIB-VER" => s.lib_ver = Some(value),
                _ => {
                    return CommandError::err(format!(
                        "Unrecognized option '{}'",
                        strata_proto::error::show(&attr)
                    ))
                    .into()
                }
            }
            Reply::Ok.into()
        }
        (b"INFO", []) => Reply::Verbatim(format!(
            "id={} name={} resp={} lib-name={} lib-ver={}\n",
            s.id,
            show(&s.name),
            s.resp.number(),
            show(&s.lib_name),
            show(&s.lib_ver)
        ))
        .into(),
        (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO" | b"INFO", _) => CommandError::wrong_arity(
            &format!("client|{}", String::from_utf8_lossy(&sub).to_lowercase()),
        )
        .into(),
        _ => CommandError::unknown_subcommand("CLIENT", &args[1]).into(),
    }
}

fn show(b: &Option<Bytes>) -> String {
    b.as_ref()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// Redis' rule: no spaces, newlines or other non-printable characters.
pub fn valid_name(name: &Bytes) -> Result<Bytes, CommandError> {
    if name.len() > MAX_NAME_LEN || name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(CommandError::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(Bytes::copy_from_slice(name))
}
