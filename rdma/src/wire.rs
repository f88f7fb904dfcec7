//! The TCP data plane's binary frames (see `docs/transport-tcp.md`).
//!
//! Pure encode/decode of fixed-size headers, all integers big-endian. No
//! I/O here, and nothing that reads or writes payload bytes.

use crate::region::Denied;
use crate::TransferError;

pub(crate) const REQUEST_MAGIC: [u8; 4] = *b"STRQ";
pub(crate) const RESPONSE_MAGIC: [u8; 4] = *b"STRP";
pub(crate) const VERSION: u8 = 1;
pub(crate) const REQUEST_LEN: usize = 48;
pub(crate) const RESPONSE_LEN: usize = 24;
const FLAG_EPOCH: u8 = 0x01;

/// Response status byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok = 0,
    UnknownRkey = 1,
    OutOfRange = 2,
    Stale = 3,
    TooLarge = 4,
    Gone = 5,
    BadRequest = 6,
    /// The listener speaks TLS and the reader sent plaintext; sent with
    /// id 0 before the listener closes the connection.
    NeedsTls = 7,
}

impl Status {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => Self::Ok,
            1 => Self::UnknownRkey,
            2 => Self::OutOfRange,
            3 => Self::Stale,
            4 => Self::TooLarge,
            5 => Self::Gone,
            6 => Self::BadRequest,
            7 => Self::NeedsTls,
            _ => return None,
        })
    }

    /// The error a reader reports for a refusal; `None` for `Ok`.
    pub(crate) fn to_error(self, len: u64, len_max: u64) -> Option<TransferError> {
        Some(match self {
            Self::Ok => return None,
            Self::UnknownRkey => Denied::UnknownRkey.into(),
            Self::OutOfRange => Denied::OutOfRange.into(),
            Self::Stale => Denied::Stale.into(),
            Self::Gone => Denied::Gone.into(),
            Self::TooLarge => TransferError::TooLarge { len, max: len_max },
            Self::BadRequest => TransferError::Protocol("peer rejected the request frame"),
            Self::NeedsTls => TransferError::Tls(
                "the data plane at this endpoint speaks TLS, and the descriptor said tcp (plaintext)"
                    .into(),
            ),
        })
    }

    /// The owner could not read the request (it answers with id 0) and
    /// closes the connection after this answer.
    pub(crate) fn closes(self) -> bool {
        matches!(self, Self::BadRequest | Self::NeedsTls)
    }
}

impl From<Denied> for Status {
    fn from(d: Denied) -> Self {
        match d {
            Denied::UnknownRkey => Self::UnknownRkey,
            Denied::OutOfRange => Self::OutOfRange,
            Denied::Stale => Self::Stale,
            Denied::Gone => Self::Gone,
        }
    }
}

/// A read request: "send me `len` bytes at `addr` of region `rkey`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub id: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
    pub epoch: Option<u64>,
}

impl Request {
    pub(crate) fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = VERSION;
        b[5] = if self.epoch.is_some() { FLAG_EPOCH } else { 0 };
        b[8..16].copy_from_slice(&self.id.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..32].copy_from_slice(&self.len.to_be_bytes());
        b[32..36].copy_from_slice(&self.rkey.to_be_bytes());
        b[40..48].copy_from_slice(&self.epoch.unwrap_or(0).to_be_bytes());
        b
    }

    /// Strict: wrong magic or version, unknown flags or non-zero reserved
    /// bytes all mean the peer is not speaking this protocol.
    pub(crate) fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, Status> {
        let flags = b[5];
        let reserved_zero = b[6..8] == [0, 0] && b[36..40] == [0; 4];
        if b[0..4] != REQUEST_MAGIC || b[4] != VERSION || flags & !FLAG_EPOCH != 0 || !reserved_zero
        {
            return Err(Status::BadRequest);
        }
        let epoch = be64(&b[40..48]);
        if flags & FLAG_EPOCH == 0 && epoch != 0 {
            return Err(Status::BadRequest);
        }
        Ok(Self {
            id: be64(&b[8..16]),
            addr: be64(&b[16..24]),
            len: be64(&b[24..32]),
            rkey: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
            epoch: (flags & FLAG_EPOCH != 0).then_some(epoch),
        })
    }
}

/// A response header, followed on the wire by `len` payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: Status,
    pub id: u64,
    pub len: u64,
}

impl Response {
    pub(crate) fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..4].copy_from_slice(&RESPONSE_MAGIC);
        b[4] = VERSION;
        b[5] = self.status as u8;
        b[8..16].copy_from_slice(&self.id.to_be_bytes());
        b[16..24].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Self, TransferError> {
        if b[0..4] != RESPONSE_MAGIC || b[4] != VERSION || b[6..8] != [0, 0] {
            return Err(TransferError::Protocol("bad response header"));
        }
        let status =
            Status::from_byte(b[5]).ok_or(TransferError::Protocol("unknown response status"))?;
        let len = be64(&b[16..24]);
        if status != Status::Ok && len != 0 {
            return Err(TransferError::Protocol("error response with a payload"));
        }
        Ok(Self {
            status,
            id: be64(&b[8..16]),
            len,
        })
    }
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_is_byte_exact() {
        let r = Request {
            id: 7,
            addr: 0x7f00_1234_0000,
            len: 4096,
            rkey: 0x9a3c_01ee,
            epoch: Some(17),
        };
        let b = r.encode();
        assert_eq!(&b[0..8], b"STRQ\x01\x01\x00\x00");
        assert_eq!(&b[32..36], &[0x9a, 0x3c, 0x01, 0xee]);
        assert_eq!(Request::decode(&b), Ok(r));
        let plain = Request { epoch: None, ..r };
        assert_eq!(Request::decode(&plain.encode()), Ok(plain));
    }

    #[test]
    fn request_decode_is_strict() {
        let good = Request {
            id: 1,
            addr: 2,
            len: 3,
            rkey: 4,
            epoch: None,
        }
        .encode();
        for (at, byte) in [(0, b'X'), (4, 2), (5, 0x02), (6, 1), (37, 1), (47, 1)] {
            let mut b = good;
            b[at] = byte;
            assert_eq!(Request::decode(&b), Err(Status::BadRequest), "byte {at}");
        }
    }

    #[test]
    fn response_round_trips_and_rejects_junk() {
        let r = Response {
            status: Status::Ok,
            id: 9,
            len: 1 << 20,
        };
        let b = r.encode();
        assert_eq!(Response::decode(&b).ok(), Some(r));
        let mut bad = b;
        bad[5] = 99;
        assert!(matches!(
            Response::decode(&bad),
            Err(TransferError::Protocol(_))
        ));
        let refused = Response {
            status: Status::Stale,
            id: 9,
            len: 1,
        };
        assert!(Response::decode(&refused.encode()).is_err());
    }
}
