//! Replies, independent of protocol version, and their encoding with
//! `redis-protocol`. A command builds a [`Reply`]; the connection encodes it
//! as RESP2 or RESP3 depending on what the client chose with `HELLO`.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Frame2;
use redis_protocol::resp3::types::{BytesFrame as Frame3, FrameMap, VerbatimStringFormat};

use crate::error::CommandError;

/// Which wire protocol a connection speaks; RESP2 until `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RespVersion {
    #[default]
    Resp2,
    Resp3,
}

impl RespVersion {
    pub fn number(self) -> i64 {
        match self {
            RespVersion::Resp2 => 2,
            RespVersion::Resp3 => 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`; common enough to deserve its own variant.
    Ok,
    Status(&'static str),
    Error(CommandError),
    Int(i64),
    Bulk(Bytes),
    /// Missing value: `$-1` in RESP2, `_` in RESP3.
    Nil,
    Array(Vec<Reply>),
    /// A RESP3 map; a flat key/value array in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A RESP3 set; an array in RESP2.
    Set(Vec<Reply>),
    /// RESP3 verbatim text (INFO); a bulk string in RESP2.
    Verbatim(String),
    /// RESP3 double; a bulk string in RESP2.
    Double(f64),
    /// An out-of-band message (pub/sub): a RESP3 push (`>`), an array in
    /// RESP2.
    Push(Vec<Reply>),
    /// Several replies to one command, written one after another
    /// (`SUBSCRIBE a b` answers once per channel).
    Seq(Vec<Reply>),
}

impl From<CommandError> for Reply {
    fn from(e: CommandError) -> Self {
        Reply::Error(e)
    }
}

impl Reply {
    pub fn bulk(b: impl Into<Bytes>) -> Reply {
        Reply::Bulk(b.into())
    }

    pub fn text(s: &str) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(&self, version: RespVersion, out: &mut BytesMut) {
        if let Reply::Seq(items) = self {
            for r in items {
                r.encode(version, out);
            }
            return;
        }
        // Encoding a well-formed frame into a growable buffer cannot fail;
        // the crate returns Result only for its fixed-size-buffer APIs.
        let res = match version {
            RespVersion::Resp2 => {
                redis_protocol::resp2::encode::extend_encode(out, &self.to_resp2(), false)
            }
            RespVersion::Resp3 => {
                redis_protocol::resp3::encode::complete::extend_encode(out, &self.to_resp3(), false)
            }
        };
        debug_assert!(res.is_ok(), "encoding into BytesMut failed: {res:?}");
    }

    fn to_resp2(&self) -> Frame2 {
        match self {
            Reply::Ok => Frame2::SimpleString(Bytes::from_static(b"OK")),
            Reply::Status(s) => Frame2::SimpleString(Bytes::from_static(s.as_bytes())),
            Reply::Error(e) => Frame2::Error(e.to_string().into()),
            Reply::Int(i) => Frame2::Integer(*i),
            Reply::Bulk(b) => Frame2::BulkString(b.clone()),
            Reply::Nil => Frame2::Null,
            Reply::Array(items) | Reply::Set(items) | Reply::Push(items) | Reply::Seq(items) => {
                Frame2::Array(items.iter().map(Reply::to_resp2).collect())
            }
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [k.to_resp2(), v.to_resp2()])
                    .collect(),
            ),
            Reply::Verbatim(s) => Frame2::BulkString(Bytes::copy_from_slice(s.as_bytes())),
            Reply::Double(d) => Frame2::BulkString(Bytes::from(format_double(*d))),
        }
    }

    fn to_resp3(&self) -> Frame3 {
        match self {
            Reply::Ok => Frame3::SimpleString {
                data: Bytes::from_static(b"OK"),
                attributes: None,
            },
            Reply::Status(s) => Frame3::SimpleString {
                data: Bytes::from_static(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: e.to_string().into(),
                attributes: None,
            },
            Reply::Int(i) => Frame3::Number {
                data: *i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b.clone(),
                attributes: None,
            },
            Reply::Nil => Frame3::Null,
            // A nested Seq has no frame of its own; only a top-level one
            // (handled in `encode`) is written as separate replies.
            Reply::Array(items) | Reply::Seq(items) => Frame3::Array {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Push(items) => Frame3::Push {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Set(items) => Frame3::Set {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => {
                let mut map = FrameMap::with_capacity(pairs.len());
                for (k, v) in pairs {
                    map.insert(k.to_resp3(), v.to_resp3());
                }
                Frame3::Map {
                    data: map,
                    attributes: None,
                }
            }
            Reply::Verbatim(s) => Frame3::VerbatimString {
                data: Bytes::copy_from_slice(s.as_bytes()),
                format: VerbatimStringFormat::Text,
                attributes: None,
            },
            Reply::Double(d) => Frame3::Double {
                data: *d,
                attributes: None,
            },
        }
    }
}

/// The header of a bulk string, identical in RESP2 and RESP3. Used when the
/// payload is written straight from store memory instead of being copied
/// into a frame.
pub fn bulk_header(len: usize, out: &mut BytesMut) {
    out.extend_from_slice(b"$");
    out.extend_from_slice(itoa_buf(len as u64).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn itoa_buf(v: u64) -> String {
    v.to_string()
}

fn format_double(d: f64) -> String {
    if d.is_infinite() {
        if d > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{d}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CommandError;

    fn enc(r: &Reply, v: RespVersion) -> String {
        let mut out = BytesMut::new();
        r.encode(v, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn resp2_forms() {
        use RespVersion::Resp2 as V;
        assert_eq!(enc(&Reply::Ok, V), "+OK\r\n");
        assert_eq!(enc(&Reply::Int(-3), V), ":-3\r\n");
        assert_eq!(enc(&Reply::Nil, V), "$-1\r\n");
        assert_eq!(enc(&Reply::bulk(&b"a\r\nb"[..]), V), "$4\r\na\r\nb\r\n");
        assert_eq!(
            enc(&Reply::Error(CommandError::syntax()), V),
            "-ERR syntax error\r\n"
        );
        assert_eq!(
            enc(&Reply::Map(vec![(Reply::text("a"), Reply::Int(1))]), V),
            "*2\r\n$1\r\na\r\n:1\r\n"
        );
        assert_eq!(enc(&Reply::Verbatim("x".into()), V), "$1\r\nx\r\n");
    }

    #[test]
    fn resp3_forms() {
        use RespVersion::Resp3 as V;
        assert_eq!(enc(&Reply::Nil, V), "_\r\n");
        assert_eq!(
            enc(&Reply::Map(vec![(Reply::text("a"), Reply::Int(1))]), V),
            "%1\r\n$1\r\na\r\n:1\r\n"
        );
        assert_eq!(enc(&Reply::Verbatim("x".into()), V), "=5\r\ntxt:x\r\n");
        assert_eq!(enc(&Reply::Set(vec![Reply::Int(1)]), V), "~1\r\n:1\r\n");
    }

    #[test]
    fn bulk_header_matches_crate_encoding() {
        let mut a = BytesMut::new();
        bulk_header(3, &mut a);
        a.extend_from_slice(b"abc\r\n");
        assert_eq!(
            a,
            enc(&Reply::bulk(&b"abc"[..]), RespVersion::Resp3).as_bytes()
        );
    }
}
