//! The side-channel handshake that connects two RC queue pairs.
//!
//! A reader opens a TCP connection to the endpoint named in a descriptor
//! and sends one [`Hello`]; the owner creates a queue pair for it, answers
//! with its own [`Hello`], and both move their queue pairs to ready. The TCP
//! connection then stays open for as long as the queue pair lives: when
//! either side closes it, the other destroys its queue pair. Wire form:
//! `docs/PROTOCOL.md`, "RDMA handshake". Pure (no sockets, no verbs), so it
//! is built and tested without the `rdma` feature too.

/// Bytes of one encoded [`Hello`].
pub const HELLO_LEN: usize = 36;

/// First bytes of every hello: tells a verbs side channel from anything else
/// that might be listening on the port (a TCP data plane, a RESP port).
const MAGIC: [u8; 4] = *b"SVRB";

/// Bumped on any change of the layout below.
const VERSION: u8 = 1;

/// Largest value of a 24-bit queue pair number or packet sequence number.
const U24_MAX: u32 = 0x00ff_ffff;

/// What one side tells the other about its queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// Local identifier of the port; 0 on RoCE, where the GID routes.
    pub lid: u16,
    /// Active path MTU of the port as the verbs enum (1 = 256 .. 5 = 4096).
    pub mtu: u8,
    /// RDMA READs this side will have outstanding / accept at once.
    pub rd_atomic: u8,
    /// The port's GID (RoCEv2: the IPv4-mapped or IPv6 address).
    pub gid: [u8; 16],
}

/// Why a hello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not a strata verbs hello (bad magic)")]
    Magic,
    #[error("unsupported verbs handshake version {0}")]
    Version(u8),
    #[error("hello field {0} out of range")]
    Range(&'static str),
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.mtu;
        b[6] = self.rd_atomic;
        // b[7] reserved, zero
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        // b[18..20] reserved, zero
        b[20..36].copy_from_slice(&self.gid);
        b
    }

    /// Total: every 36-byte input is a hello or a specific error.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Self, HelloError> {
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        if b[4] != VERSION {
            return Err(HelloError::Version(b[4]));
        }
        let word = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let hello = Self {
            mtu: b[5],
            rd_atomic: b[6],
            qpn: word(8),
            psn: word(12),
            lid: u16::from_be_bytes([b[16], b[17]]),
            gid: b[20..36].try_into().map_err(|_| HelloError::Range("gid"))?,
        };
        if !(1..=5).contains(&hello.mtu) {
            return Err(HelloError::Range("mtu"));
        }
        if hello.rd_atomic == 0 {
            return Err(HelloError::Range("rd_atomic"));
        }
        if hello.qpn > U24_MAX || hello.qpn == 0 {
            return Err(HelloError::Range("qpn"));
        }
        if hello.psn > U24_MAX {
            return Err(HelloError::Range("psn"));
        }
        Ok(hello)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Hello {
        Hello {
            qpn: 0x11,
            psn: 0xab_cdef,
            lid: 0,
            mtu: 3,
            rd_atomic: 16,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 0, 1],
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(Hello::decode(&sample().encode()), Ok(sample()));
    }

    #[test]
    fn refuses_what_is_not_a_hello() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), Err(HelloError::Magic));
        b = good;
        b[4] = 9;
        assert_eq!(Hello::decode(&b), Err(HelloError::Version(9)));
        for (at, field) in [(5, "mtu"), (6, "rd_atomic")] {
            b = good;
            b[at] = 0;
            assert_eq!(Hello::decode(&b), Err(HelloError::Range(field)));
        }
        b = good;
        b[8] = 1; // qpn over 24 bits
        assert_eq!(Hello::decode(&b), Err(HelloError::Range("qpn")));
        b = good;
        b[12] = 1;
        assert_eq!(Hello::decode(&b), Err(HelloError::Range("psn")));
    }
}
