//! Error replies with a stable code word first, as Redis does (`-ERR ...`,
//! `-WRONGTYPE ...`). Clients branch on the code word, so a code, once
//! shipped, never changes meaning; the text after it is for humans and may.

use std::borrow::Cow;
use std::fmt;

/// The first word of every error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Generic error, same meaning as in Redis (syntax, arity, unknown command).
    Err,
    /// The connection must authenticate before this command.
    NoAuth,
    /// AUTH/HELLO with a wrong password.
    WrongPass,
    /// HELLO asked for a protocol version we do not speak.
    NoProto,
    /// A value, key or request larger than the configured limit.
    TooLarge,
    /// The value does not fit even after evicting everything evictable.
    NoSpace,
    /// The key does not exist (zero-copy commands; inline GET answers nil).
    NotFound,
    /// A memory descriptor is malformed or names memory we may not touch.
    BadDesc,
    /// A descriptor or lease refers to a value that has since changed.
    Stale,
    /// The node is overloaded or shutting down; retry later.
    Busy,
    /// The key's slot is owned by another node.
    Moved,
    /// The keys of one request live in different slots.
    CrossSlot,
    /// This node serves no slots yet (not joined, or lost the cluster).
    ClusterDown,
    /// Cross-memory attach is not available here: off on the node, not
    /// proven on this connection (`STRATA.CMA`), or the read not permitted.
    /// Use the network data plane.
    NoCma,
    /// The write is stored on this node but on fewer nodes than
    /// `replica_num` asks (a replica unreachable): not acknowledged as safe.
    NoReplicas,
}

impl ErrorCode {
    /// The code word as sent on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Err => "ERR",
            ErrorCode::NoAuth => "NOAUTH",
            ErrorCode::WrongPass => "WRONGPASS",
            ErrorCode::NoProto => "NOPROTO",
            ErrorCode::TooLarge => "TOOLARGE",
            ErrorCode::NoSpace => "NOSPACE",
            ErrorCode::NotFound => "NOTFOUND",
            ErrorCode::BadDesc => "BADDESC",
            ErrorCode::Stale => "STALE",
            ErrorCode::Busy => "BUSY",
            ErrorCode::Moved => "MOVED",
            ErrorCode::CrossSlot => "CROSSSLOT",
            ErrorCode::ClusterDown => "CLUSTERDOWN",
            ErrorCode::NoCma => "NOCMA",
            ErrorCode::NoReplicas => "NOREPLICAS",
        }
    }
}

/// One error reply: a code and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    pub code: ErrorCode,
    pub message: Cow<'static, str>,
}

impl CommandError {
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        CommandError {
            code,
            message: message.into(),
        }
    }

    /// `-ERR <message>`.
    pub fn err(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::Err, message)
    }

    /// Redis' exact wording, which clients and tests match on.
    pub fn wrong_arity(command: &str) -> Self {
        Self::err(format!(
            "wrong number of arguments for '{}' command",
            command.to_ascii_lowercase()
        ))
    }

    pub fn syntax() -> Self {
        Self::err("syntax error")
    }

    pub fn not_integer() -> Self {
        Self::err("value is not an integer or out of range")
    }

    /// Redis' wording: the command name and the first arguments, quoted.
    pub fn unknown_command(name: &[u8], args: &[bytes::Bytes]) -> Self {
        let mut msg = format!(
            "unknown command '{}', with args beginning with: ",
            show(name)
        );
        for arg in args.iter().take(MAX_ARGS_ECHOED) {
            msg.push_str(&format!("'{}' ", show(arg)));
        }
        Self::err(msg)
    }

    pub fn unknown_subcommand(command: &str, sub: &[u8]) -> Self {
        Self::err(format!(
            "unknown subcommand '{}'. Try {} HELP.",
            show(sub),
            command.to_ascii_uppercase()
        ))
    }
}

/// Echoing client bytes back in an error is useful, but bounded so that a
/// hostile command cannot make us build a huge reply.
const MAX_ARGS_ECHOED: usize = 8;
const MAX_ECHO_BYTES: usize = 128;

/// Printable, bounded rendering of client bytes for error messages.
/// Errors are simple strings, so CR/LF must never reach the wire.
pub fn show(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(MAX_ECHO_BYTES)];
    let mut s: String = String::from_utf8_lossy(cut)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if bytes.len() > MAX_ECHO_BYTES {
        s.push_str("...");
    }
    s
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for CommandError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms_match_redis() {
        assert_eq!(
            CommandError::wrong_arity("GET").to_string(),
            "ERR wrong number of arguments for 'get' command"
        );
        let e = CommandError::unknown_command(b"foo", &[bytes::Bytes::from_static(b"a b")]);
        assert_eq!(
            e.to_string(),
            "ERR unknown command 'foo', with args beginning with: 'a b' "
        );
    }

    #[test]
    fn show_never_emits_line_breaks_and_is_bounded() {
        let s = show(b"a\r\nb");
        assert_eq!(s, "a??b");
        let long = vec![b'x'; 10_000];
        assert!(show(&long).len() <= MAX_ECHO_BYTES + 3);
        assert_eq!(show(&[0xff, b'a']), "\u{fffd}a");
    }
}
