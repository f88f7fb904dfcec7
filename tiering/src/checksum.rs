//! The one checksum strata uses (CRC-32C, the iSCSI polynomial): over
//! every blob the NVMe tier writes, checked when it is read back; over
//! every key-log record; and over a value when `STRATA.META` asks (never
//! on a write: see `Store::meta_summed`).
//!
//! Two implementations, the faster for the CPU picked once at run time:
//! `crc-fast`, which folds with AVX-512 VPCLMULQDQ, and the `crc32c`
//! crate, three interleaved streams of the SSE4.2 `crc32` instruction,
//! which wins where there is no AVX-512 over `crc-fast`'s PCLMULQDQ
//! kernel (docs/bench-notes/checksums-and-write-path.md). Bytes that can
//! only be had in pieces (a GPU value copied down through a bounded
//! buffer) are summed piece by piece ([`Crc32cStream`]; combining the CRCs
//! of separate pieces instead is slow with `crc-fast`). Both give the
//! bits of every other CRC-32C, so data written by earlier builds still
//! verifies.

use std::sync::OnceLock;

use crc_fast::CrcAlgorithm;

/// Which implementation runs on this CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    /// `crc-fast`: AVX-512 folding, or the best it has off x86.
    Fold,
    /// The `crc32c` crate: the SSE4.2 `crc32` instruction.
    Sse42,
}

fn kernel() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if !std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("sse4.2")
        {
            return Kernel::Sse42;
        }
        Kernel::Fold
    })
}

/// CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    match kernel() {
        Kernel::Fold => fold(bytes),
        Kernel::Sse42 => ::crc32c::crc32c(bytes),
    }
}

fn fold(bytes: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC-32C; a 32-bit CRC comes back widened to u64.
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// A CRC-32C over bytes that come in pieces: the same bits as [`crc32c`]
/// of their concatenation.
pub enum Crc32cStream {
    /// Boxed: the digest is 296 bytes.
    Fold(Box<crc_fast::Digest>),
    Sse42(u32),
}

impl Crc32cStream {
    pub fn new() -> Self {
        match kernel() {
            Kernel::Fold => Self::Fold(Box::new(crc_fast::Digest::new(CrcAlgorithm::Crc32Iscsi))),
            Kernel::Sse42 => Self::Sse42(0),
        }
    }

    pub fn update(&mut self, piece: &[u8]) {
        match self {
            Self::Fold(d) => d.update(piece),
            Self::Sse42(crc) => *crc = ::crc32c::crc32c_append(*crc, piece),
        }
    }

    pub fn finish(&self) -> u32 {
        match self {
            Self::Fold(d) => d.finalize() as u32,
            Self::Sse42(crc) => *crc,
        }
    }
}

impl Default for Crc32cStream {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_check_value_and_an_independent_implementation() {
        // The catalogue's check value for CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        // Every length around the SIMD block boundaries, odd alignments too.
        let data: Vec<u8> = (0..5003u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for len in (0..600).chain([1023, 1024, 1025, 4095, 4096, 4097, 4999]) {
            for start in [0, 1, 3] {
                let s = &data[start..start + len];
                // Both kernels, whichever this CPU picks.
                assert_eq!(fold(s), ::crc32c::crc32c(s), "len {len} at {start}");
                assert_eq!(crc32c(s), ::crc32c::crc32c(s), "len {len} at {start}");
            }
        }
    }

    #[test]
    fn a_stream_of_pieces_sums_to_the_checksum_of_the_whole() {
        let data: Vec<u8> = (0..70_001u32).map(|i| (i * 131 + i / 3) as u8).collect();
        for cut in [0, 1, 63, 64, 4096, 65_536, 70_000, 70_001] {
            let (a, b) = data.split_at(cut);
            let fold =
                Crc32cStream::Fold(Box::new(crc_fast::Digest::new(CrcAlgorithm::Crc32Iscsi)));
            for mut s in [Crc32cStream::new(), fold, Crc32cStream::Sse42(0)] {
                s.update(a);
                s.update(b);
                assert_eq!(s.finish(), crc32c(&data), "cut at {cut}");
            }
        }
        assert_eq!(Crc32cStream::new().finish(), crc32c(b""));
    }
}
