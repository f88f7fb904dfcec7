//! `AUTH [username] password`. Only the `default` user exists; the
//! password is `requirepass`. Compared in constant time.

use bytes::Bytes;
use strata_proto::{CommandError, ErrorCode, Reply};

use super::{Ctx, Out};

pub fn run(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Out {
    let (user, pass) = match args {
        [_, pass] => (None, pass),
        [_, user, pass] => (Some(user), pass),
        _ => return CommandError::syntax().into(),
    };
    match check(ctx, user.map(|u| &u[..]), pass) {
        Ok(()) => Reply::Ok.into(),
        Err(e) => e.into(),
    }
}

/// Shared with `HELLO ... AUTH`.
pub fn check(ctx: &mut Ctx<'_>, user: Option<&[u8]>, pass: &[u8]) -> Result<(), CommandError> {
    let Some(expected) = &ctx.node.cfg.requirepass else {
        return Err(CommandError::err(
            "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    };
    let user_ok = user.is_none_or(|u| u == b"default");
    if user_ok && constant_time_eq(expected.as_bytes(), pass) {
        ctx.session.authed = true;
        Ok(())
    } else {
        Err(CommandError::new(
            ErrorCode::WrongPass,
            "invalid username-password pair or user is disabled.",
        ))
    }
}

/// Time depends only on the length of `a` (the secret's length is not
/// hidden, as in Redis), never on where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn eq() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret1"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
