//! Redis Cluster hash slots: key → slot, bit for bit what Redis computes.
//!
//! Cluster-aware Redis clients compute the slot themselves and route on it,
//! so any divergence from Redis here would send them to the wrong node.
//! This module is pure arithmetic: no I/O, no allocation.

/// Number of hash slots, fixed by Redis Cluster: clients assume 16384.
pub const SLOTS: u16 = 16384;

/// CRC16-XMODEM (poly 0x1021, init 0, no reflection, no final xor), the
/// variant Redis uses (`crc16.c`), as a 256-entry table built at compile time
/// so there is nothing to initialise at run time and no dependency.
const CRC16_TABLE: [u16; 256] = crc16_table();

const fn crc16_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC16-XMODEM of `bytes`; `crc16(b"123456789") == 0x31C3`.
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The part of `key` that is hashed, following Redis' `keyHashSlot`: if the
/// key has a `{` and a later `}` with at least one byte between them, only the
/// bytes between the *first* `{` and the first `}` after it are hashed;
/// otherwise (no `{`, no closing `}`, or `{}`) the whole key is.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => &rest[..close],
        _ => key,
    }
}

/// The Redis Cluster hash slot of `key`, in `0..SLOTS`.
pub fn key_slot(key: &[u8]) -> u16 {
    // SLOTS is a power of two, so Redis' `& 16383` and `% 16384` agree.
    crc16(hash_tag(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_xmodem_check_value() {
        // The standard CRC catalogue check value for CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn known_redis_slots() {
        // Values from `CLUSTER KEYSLOT` on a real Redis.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags_follow_redis() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // Empty tag: the whole key is hashed.
        assert_eq!(hash_tag(b"{}foo"), b"{}foo");
        assert_eq!(key_slot(b"{}foo"), crc16(b"{}foo") % SLOTS);
        assert_eq!(hash_tag(b"{a}b"), b"a");
        assert_eq!(key_slot(b"{a}b"), key_slot(b"a"));
        // Only the first `{` counts, and the first `}` after it.
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"{}{a}"), b"{}{a}");
        // No closing brace: whole key.
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"}{"), b"}{");
    }

    #[test]
    fn slots_are_in_range() {
        for i in 0u32..10_000 {
            assert!(key_slot(&i.to_le_bytes()) < SLOTS);
        }
    }
}
