//! What the load generator asks for: which keys, in which order, holding
//! which bytes. Pure functions, no I/O.
//!
//! Every value is derived from (key, size, version): the first 8 bytes are
//! the version, the next 8 a hash of the key, the rest a sequence of words
//! determined by both. A reader recovers the version from the value itself
//! and checks every byte, so a torn, shifted, truncated or foreign value is
//! always caught, even while other tasks overwrite the key.

/// Smallest value the pattern fits: version and key hash.
pub const HEADER_BYTES: usize = 16;

/// Added per word: odd, so consecutive words always differ.
const STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a, enough to tell bench keys apart.
pub fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// splitmix64's finalizer over key, size and version: every output bit
/// depends on every input bit, so two versions differ in every byte lane.
fn seed(hash: u64, len: usize, version: u64) -> u64 {
    let mut z = hash ^ version.wrapping_mul(STEP) ^ (len as u64).rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes the value of `key_hash` at `version` into `buf` (its whole length).
pub fn fill(buf: &mut [u8], key_hash: u64, version: u64) {
    assert!(buf.len() >= HEADER_BYTES, "value shorter than its header");
    let s = seed(key_hash, buf.len(), version);
    let (head, body) = buf.split_at_mut(HEADER_BYTES);
    head[..8].copy_from_slice(&version.to_le_bytes());
    head[8..].copy_from_slice(&key_hash.to_le_bytes());
    let mut words = body.chunks_exact_mut(8);
    let mut w = s;
    for chunk in &mut words {
        chunk.copy_from_slice(&w.to_le_bytes());
        w = w.wrapping_add(STEP);
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&w.to_le_bytes()[..n]);
}

/// Why a value read back is wrong.
#[derive(Debug, PartialEq, Eq)]
pub enum Mismatch {
    Length { want: usize, got: usize },
    Key,
    Content { version: u64 },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Length { want, got } => write!(f, "length {got}, want {want}"),
            Self::Key => f.write_str("value belongs to another key"),
            Self::Content { version } => write!(f, "content differs from version {version}"),
        }
    }
}

/// Checks `buf` is exactly some version of `key_hash`'s value of `want`
/// bytes; returns that version.
pub fn check(buf: &[u8], key_hash: u64, want: usize) -> Result<u64, Mismatch> {
    if buf.len() != want || want < HEADER_BYTES {
        return Err(Mismatch::Length {
            want,
            got: buf.len(),
        });
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let version = word(&buf[..8]);
    if word(&buf[8..16]) != key_hash {
        return Err(Mismatch::Key);
    }
    let body = &buf[HEADER_BYTES..];
    let whole = body.len() - body.len() % 8;
    let (diff, w) = diff_words(&body[..whole], seed(key_hash, want, version));
    let tail = &body[whole..];
    if diff != 0 || tail != &w.to_le_bytes()[..tail.len()] {
        return Err(Mismatch::Content { version });
    }
    Ok(version)
}

/// OR of the differences between `words` (whole 8-byte words) and the
/// sequence `w, w + STEP, ...`, and the sequence's next word.
///
/// The check runs in series with every timed call (a client checks the
/// value it read before its next request), so its speed shows in every
/// GET's figure, and wider vector units run it much faster
/// (docs/bench-notes/one-call-vs-a-stream.md). The same loop is
/// compiled for the wider units and picked at run time, so the release
/// binary stays portable.
fn diff_words(words: &[u8], w: u64) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { diff_words_avx512(words, w) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { diff_words_avx2(words, w) };
        }
    }
    diff_words_generic(words, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn diff_words_avx512(words: &[u8], w: u64) -> (u64, u64) {
    diff_words_generic(words, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn diff_words_avx2(words: &[u8], w: u64) -> (u64, u64) {
    diff_words_generic(words, w)
}

// Inlined into each caller so that it is compiled for the caller's units.
#[inline(always)]
fn diff_words_generic(words: &[u8], mut w: u64) -> (u64, u64) {
    // OR of differences rather than an early exit: the loop vectorizes.
    let mut diff = 0u64;
    for chunk in words.chunks_exact(8) {
        diff |= u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])) ^ w;
        w = w.wrapping_add(STEP);
    }
    (diff, w)
}

/// How keys are picked.
#[derive(Debug, Clone)]
pub enum Dist {
    Uniform,
    /// Zipf with this exponent: key `k` (0-based) has weight `1/(k+1)^s`.
    Zipf(f64),
}

impl std::str::FromStr for Dist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "uniform" => Ok(Self::Uniform),
            None if s == "zipf" => Ok(Self::Zipf(0.99)),
            Some(("zipf", e)) => match e.parse::<f64>() {
                Ok(e) if e > 0.0 && e.is_finite() => Ok(Self::Zipf(e)),
                _ => Err(format!("bad zipf exponent {e:?}")),
            },
            _ => Err(format!("unknown distribution {s:?} (uniform or zipf[:s])")),
        }
    }
}

/// Samples key indices in `0..n` under a [`Dist`].
pub struct Picker {
    n: usize,
    /// Cumulative weights for zipf (normalized to 1); empty for uniform.
    cdf: Vec<f64>,
}

impl Picker {
    pub fn new(dist: &Dist, n: usize) -> Self {
        let cdf = match *dist {
            Dist::Uniform => Vec::new(),
            Dist::Zipf(s) => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (0..n)
                    .map(|k| {
                        acc += 1.0 / ((k + 1) as f64).powf(s);
                        acc
                    })
                    .collect();
                cdf.iter_mut().for_each(|c| *c /= acc);
                cdf
            }
        };
        Self { n, cdf }
    }

    pub fn pick(&self, rng: &mut Rng) -> usize {
        if self.cdf.is_empty() {
            return (rng.next() % self.n as u64) as usize;
        }
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.n - 1)
    }
}

/// xorshift64*: fast, seedable, good enough to spread load.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Parses "4KiB", "1MiB", "16MiB", "4096".
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_and_mismatches_are_caught() {
        for len in [16, 17, 4096, 65_541] {
            let h = key_hash(b"k");
            let mut v = vec![0u8; len];
            fill(&mut v, h, 7);
            assert_eq!(check(&v, h, len), Ok(7));
            assert_eq!(check(&v, key_hash(b"j"), len), Err(Mismatch::Key));
            assert!(check(&v[..len - 1], h, len).is_err());
            let last = len - 1;
            v[last] ^= 1;
            let want = if len > HEADER_BYTES {
                Mismatch::Content { version: 7 }
            } else {
                Mismatch::Key
            };
            assert_eq!(check(&v, h, len), Err(want));
            v[last] ^= 1;
            if len == HEADER_BYTES {
                continue;
            }
            // A torn value (half of another version) is caught.
            let mut other = vec![0u8; len];
            fill(&mut other, h, 8);
            v[len / 2..].copy_from_slice(&other[len / 2..]);
            assert!(check(&v, h, len).is_err());
        }
    }

    #[test]
    fn every_unit_finds_the_same_differences() {
        let h = key_hash(b"k");
        let mut v = vec![0u8; 4096 + 8 * 7];
        fill(&mut v, h, 3);
        let s = seed(h, v.len(), 3);
        let body = &mut v[HEADER_BYTES..];
        let whole = body.len() - body.len() % 8;
        let want = diff_words_generic(&body[..whole], s);
        assert_eq!(want.0, 0);
        assert_eq!(diff_words(&body[..whole], s), want);
        // One flipped bit in each position of a 512-bit lane is caught.
        for at in [0, 7, 8, 63, 64, 127, 1000, whole - 1] {
            body[at] ^= 0x10;
            let got = diff_words(&body[..whole], s);
            assert_eq!(got, diff_words_generic(&body[..whole], s), "at {at}");
            assert_ne!(got.0, 0, "at {at}");
            body[at] ^= 0x10;
        }
    }

    #[test]
    fn zipf_prefers_low_keys_and_stays_in_range() {
        let p = Picker::new(&Dist::Zipf(1.2), 100);
        let mut rng = Rng::new(1);
        let mut hits = [0usize; 100];
        for _ in 0..20_000 {
            hits[p.pick(&mut rng)] += 1;
        }
        assert!(hits[0] > hits[10] && hits[10] > hits[99]);
        let u = Picker::new(&Dist::Uniform, 3);
        assert!((0..1000).all(|_| u.pick(&mut rng) < 3));
    }

    #[test]
    fn sizes_and_dists_parse() {
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("4XB").is_err());
        assert!(matches!("zipf:1.1".parse::<Dist>(), Ok(Dist::Zipf(s)) if s == 1.1));
        assert!("zipf:-1".parse::<Dist>().is_err());
    }
}
