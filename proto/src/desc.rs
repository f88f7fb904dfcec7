//! Memory descriptors: the name of a memory range a peer may read.
//!
//! A descriptor travels inside RESP commands as ONE bulk string:
//!
//! ```text
//! <transport>://<endpoint>/<addr hex>+<len decimal>#<rkey 8 hex>[@<epoch decimal>]
//! tcp://127.0.0.1:7400/7f0012340000+1048576#9a3c01ee@17
//! ```
//!
//! * `transport` is `tcp`, `tls` (the same TCP data plane, every connection
//!   to the endpoint TLS: a reader must handshake first), `rdma` or `cma`;
//! * `endpoint` is `host:port` of the data-plane listener; `host` is a name or
//!   IPv4 address (`[A-Za-z0-9._-]+`) or a bracketed IPv6 address. For `cma`
//!   (cross-memory attach: the reader copies straight out of the owner
//!   process with `process_vm_readv`) it is `<pid>:<start>` instead, both
//!   decimal: the owner's process id (not 0) and its start time in clock
//!   ticks after boot (`/proc/<pid>/stat` field 22), so that a recycled pid
//!   is never read: `cma://4242:918273/7f0012340000+4096#00000001@3`;
//! * `addr` is lowercase hex without `0x` (at most 16 significant digits);
//! * `len` is decimal, and `addr + len` must not overflow `u64`;
//! * `rkey` is exactly 8 lowercase hex digits;
//! * `epoch` is decimal and present only on source descriptors.
//!
//! The parser is strict and total: any input is either a valid descriptor or
//! a specific [`DescError`]; it never panics and never allocates more than the
//! endpoint string. It must never grow I/O, clocks or lenient guessing: a
//! descriptor that does not parse is refused, not repaired.

use std::fmt;
use std::str::FromStr;

/// Longest encoded descriptor accepted, in bytes. Bounds parser work and the
/// size of the bulk string a client may send in its place; a full descriptor
/// with a 64-char hostname is under 140 bytes.
pub const DESC_LEN_MAX: usize = 256;

/// Which data plane serves the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// One-sided reads emulated over TCP.
    Tcp,
    /// The TCP data plane with every connection TLS.
    Tls,
    /// RDMA READ over verbs.
    Rdma,
    /// Cross-memory attach between processes on one host.
    Cma,
}

impl TransportKind {
    /// The scheme word used in the encoded form.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Tls => "tls",
            Self::Rdma => "rdma",
            Self::Cma => "cma",
        }
    }
}

impl TransportKind {
    /// Whether this is the TCP data plane, plaintext or TLS: the same
    /// frames, reads checked by the owner as they are served.
    pub const fn over_tcp(self) -> bool {
        matches!(self, Self::Tcp | Self::Tls)
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A memory range `[addr, addr + len)` registered under `rkey` at the
/// data-plane listener `endpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// Data plane that serves the range.
    pub transport: TransportKind,
    /// `host:port` of the data-plane listener (not the RESP port).
    pub endpoint: String,
    /// Start of the range in the owner's address space.
    pub addr: u64,
    /// Length of the range in bytes.
    pub len: u64,
    /// Key the owner issued when it registered the region.
    pub rkey: u32,
    /// Version of the value behind the range; set on source descriptors so
    /// the owner can refuse a read of memory that has since been reused.
    pub epoch: Option<u64>,
}

/// Which part of a descriptor an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Transport,
    Endpoint,
    Port,
    Addr,
    Len,
    Rkey,
    Epoch,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transport => "transport",
            Self::Endpoint => "endpoint",
            Self::Port => "port",
            Self::Addr => "addr",
            Self::Len => "len",
            Self::Rkey => "rkey",
            Self::Epoch => "epoch",
        })
    }
}

/// Why a descriptor was refused. The server maps every variant to `-BADDESC`;
/// the variant is for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescError {
    #[error("descriptor is {0} bytes, longer than {DESC_LEN_MAX}")]
    TooLong(usize),
    #[error("descriptor has no {0}")]
    Missing(Field),
    #[error("descriptor has an invalid {0}")]
    Invalid(Field),
    #[error("descriptor {0} does not fit in its type")]
    Overflow(Field),
    #[error("unknown transport (expected tcp, tls, rdma or cma)")]
    UnknownTransport,
    #[error("descriptor addr + len overflows u64")]
    RangeOverflow,
    #[error("trailing bytes after descriptor")]
    TrailingGarbage,
}

impl Descriptor {
    /// Parses the encoded form; see the module docs for the grammar.
    pub fn parse(input: &[u8]) -> Result<Self, DescError> {
        if input.len() > DESC_LEN_MAX {
            return Err(DescError::TooLong(input.len()));
        }
        let mut cur = Cursor { rest: input };
        let transport = parse_transport(&mut cur)?;
        let endpoint = if transport == TransportKind::Cma {
            parse_process(&mut cur)?
        } else {
            parse_endpoint(&mut cur)?
        };
        let addr = cur.number(Field::Addr, 16, Some(b'+'))?;
        let len = cur.number(Field::Len, 10, Some(b'#'))?;
        addr.checked_add(len).ok_or(DescError::RangeOverflow)?;
        let rkey = parse_rkey(&mut cur)?;
        let epoch = if cur.eat(b'@') {
            Some(cur.number(Field::Epoch, 10, None)?)
        } else {
            None
        };
        if !cur.rest.is_empty() {
            return Err(DescError::TrailingGarbage);
        }
        Ok(Self {
            transport,
            endpoint,
            addr,
            len,
            rkey,
            epoch,
        })
    }

    /// A `cma` descriptor's owner: (pid, start time in clock ticks).
    pub fn process(&self) -> Option<(u32, u64)> {
        if self.transport != TransportKind::Cma {
            return None;
        }
        let (pid, start) = self.endpoint.split_once(':')?;
        Some((pid.parse().ok()?, start.parse().ok()?))
    }

    /// The endpoint of a `cma` descriptor for process `pid` started at
    /// `start` (clock ticks after boot).
    pub fn process_endpoint(pid: u32, start: u64) -> String {
        format!("{pid}:{start}")
    }

    /// Exclusive end of the range. Never overflows for a parsed descriptor.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.len)
    }
}

impl FromStr for Descriptor {
    type Err = DescError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s.as_bytes())
    }
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}/{:x}+{}#{:08x}",
            self.transport, self.endpoint, self.addr, self.len, self.rkey
        )?;
        if let Some(epoch) = self.epoch {
            write!(f, "@{epoch}")?;
        }
        Ok(())
    }
}

/// A forward-only view of the unparsed input.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn eat(&mut self, byte: u8) -> bool {
        match self.rest.split_first() {
            Some((&b, tail)) if b == byte => {
                self.rest = tail;
                true
            }
            _ => false,
        }
    }

    /// Splits off everything before the first `sep` and consumes `sep`.
    fn until(&mut self, sep: &[u8]) -> Option<&'a [u8]> {
        let at = self.rest.windows(sep.len()).position(|w| w == sep)?;
        let head = &self.rest[..at];
        self.rest = &self.rest[at + sep.len()..];
        Some(head)
    }

    /// Takes the longest run of bytes matching `pred`.
    fn run(&mut self, pred: impl Fn(u8) -> bool) -> &'a [u8] {
        let n = self.rest.iter().take_while(|&&b| pred(b)).count();
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        head
    }

    /// Parses an unsigned number in `radix` (10 or lowercase 16), then the
    /// separator `sep` (or nothing, for the last field).
    fn number(&mut self, field: Field, radix: u32, sep: Option<u8>) -> Result<u64, DescError> {
        let digits = self.run(|b| digit_value(b, radix).is_some());
        let at_boundary = match (sep, self.rest.first()) {
            (Some(s), Some(&b)) => b == s,
            (Some(_), None) => false,
            (None, next) => next.is_none(),
        };
        if digits.is_empty() {
            return Err(match self.rest.first() {
                None => DescError::Missing(field),
                Some(&b) if Some(b) == sep => DescError::Missing(field),
                Some(_) => DescError::Invalid(field),
            });
        }
        if !at_boundary {
            return Err(match (sep, self.rest.is_empty()) {
                (None, _) => DescError::TrailingGarbage,
                (Some(_), true) => DescError::Missing(next_field(field)),
                (Some(_), false) => DescError::Invalid(field),
            });
        }
        if sep.is_some() {
            self.rest = &self.rest[1..];
        }
        digits.iter().try_fold(0u64, |acc, &b| {
            let d = u64::from(digit_value(b, radix).unwrap_or(0));
            acc.checked_mul(u64::from(radix))
                .and_then(|v| v.checked_add(d))
                .ok_or(DescError::Overflow(field))
        })
    }
}

/// The field that follows `field` in the grammar; used to name what is
/// missing when the input stops after a complete field.
fn next_field(field: Field) -> Field {
    match field {
        Field::Transport => Field::Endpoint,
        Field::Endpoint | Field::Port => Field::Addr,
        Field::Addr => Field::Len,
        Field::Len => Field::Rkey,
        Field::Rkey | Field::Epoch => Field::Epoch,
    }
}

/// Value of a digit in radix 10 or 16; uppercase hex is refused because the
/// encoded form is lowercase and the parser accepts one spelling.
fn digit_value(b: u8, radix: u32) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some(u32::from(b - b'0')),
        b'a'..=b'f' if radix == 16 => Some(u32::from(b - b'a') + 10),
        _ => None,
    }
}

fn parse_transport(cur: &mut Cursor<'_>) -> Result<TransportKind, DescError> {
    match cur.until(b"://") {
        None | Some(b"") => Err(DescError::Missing(Field::Transport)),
        Some(b"tcp") => Ok(TransportKind::Tcp),
        Some(b"tls") => Ok(TransportKind::Tls),
        Some(b"rdma") => Ok(TransportKind::Rdma),
        Some(b"cma") => Ok(TransportKind::Cma),
        Some(_) => Err(DescError::UnknownTransport),
    }
}

fn parse_endpoint(cur: &mut Cursor<'_>) -> Result<String, DescError> {
    let Some(endpoint) = cur.until(b"/") else {
        // No '/' at all: either nothing follows the scheme, or the range is.
        return Err(if cur.rest.is_empty() {
            DescError::Missing(Field::Endpoint)
        } else {
            DescError::Missing(Field::Addr)
        });
    };
    if endpoint.is_empty() {
        return Err(DescError::Missing(Field::Endpoint));
    }
    let colon = endpoint.iter().rposition(|&b| b == b':');
    let (host, port) = match colon {
        // An IPv6 literal's own colons are inside the brackets.
        Some(at) if !endpoint[at..].contains(&b']') => (&endpoint[..at], &endpoint[at + 1..]),
        _ => return Err(DescError::Missing(Field::Port)),
    };
    if !valid_host(host) {
        return Err(DescError::Invalid(Field::Endpoint));
    }
    parse_port(port)?;
    // Every byte was checked to be ASCII above.
    String::from_utf8(endpoint.to_vec()).map_err(|_| DescError::Invalid(Field::Endpoint))
}

/// `<pid>:<start>` of a `cma` descriptor, both decimal, pid in 1..=u32::MAX.
fn parse_process(cur: &mut Cursor<'_>) -> Result<String, DescError> {
    let pid = cur.number(Field::Endpoint, 10, Some(b':'))?;
    if pid == 0 || pid > u64::from(u32::MAX) {
        return Err(DescError::Invalid(Field::Endpoint));
    }
    let start = cur.number(Field::Port, 10, Some(b'/'))?;
    Ok(Descriptor::process_endpoint(pid as u32, start))
}

fn valid_host(host: &[u8]) -> bool {
    match host {
        [b'[', inner @ .., b']'] => {
            !inner.is_empty()
                && inner.contains(&b':')
                && inner
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
        }
        _ => {
            !host.is_empty()
                && host
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        }
    }
}

fn parse_port(port: &[u8]) -> Result<u16, DescError> {
    if port.is_empty() {
        return Err(DescError::Missing(Field::Port));
    }
    if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
        return Err(DescError::Invalid(Field::Port));
    }
    let value = port
        .iter()
        .fold(0u32, |acc, &b| acc * 10 + u32::from(b - b'0'));
    match u16::try_from(value) {
        Ok(0) | Err(_) => Err(DescError::Invalid(Field::Port)),
        Ok(p) => Ok(p),
    }
}

fn parse_rkey(cur: &mut Cursor<'_>) -> Result<u32, DescError> {
    let digits = cur.run(|b| digit_value(b, 16).is_some());
    if digits.is_empty() {
        return Err(if cur.rest.is_empty() {
            DescError::Missing(Field::Rkey)
        } else {
            DescError::Invalid(Field::Rkey)
        });
    }
    if digits.len() != 8 {
        return Err(DescError::Invalid(Field::Rkey));
    }
    Ok(digits
        .iter()
        .fold(0u32, |acc, &b| (acc << 4) | digit_value(b, 16).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic, dependency-free; good enough to spread
    /// test inputs, not for anything else.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn example() -> Descriptor {
        Descriptor {
            transport: TransportKind::Tcp,
            endpoint: "127.0.0.1:7400".into(),
            addr: 0x7f00_1234_0000,
            len: 1_048_576,
            rkey: 0x9a3c_01ee,
            epoch: Some(17),
        }
    }

    #[test]
    fn encodes_the_documented_example() {
        let s = "tcp://127.0.0.1:7400/7f0012340000+1048576#9a3c01ee@17";
        assert_eq!(example().to_string(), s);
        assert_eq!(Descriptor::parse(s.as_bytes()), Ok(example()));
    }

    #[test]
    fn accepts_edge_forms() {
        let ok = [
            "rdma://node-1.example:1/0+0#00000000",
            "tcp://[::1]:65535/ffffffffffffffff+0#ffffffff@0",
            "tcp://h:7/0+18446744073709551615#0000000a@18446744073709551615",
            "tcp://[fe80::1:2]:80/10+1#deadbeef",
            "tls://10.0.0.11:7380/7f0012340000+1048576#9a3c01ee@17",
            "cma://4242:918273/7f0012340000+4096#00000001@3",
            "cma://4294967295:18446744073709551615/0+0#00000000",
        ];
        for s in ok {
            let d = Descriptor::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(d.to_string(), s);
        }
        let d = Descriptor::parse(b"cma://4242:918273/10+1#00000000").unwrap();
        assert_eq!(d.process(), Some((4242, 918273)));
        assert_eq!(
            example().process(),
            None,
            "a tcp descriptor names no process"
        );
    }

    #[test]
    fn refuses_bad_cma_processes() {
        let bad: &[(&[u8], DescError)] = &[
            (
                b"cma://0:5/10+1#00000000",
                DescError::Invalid(Field::Endpoint),
            ),
            (
                b"cma://4294967296:5/10+1#00000000",
                DescError::Invalid(Field::Endpoint),
            ),
            (
                b"cma://12/10+1#00000000",
                DescError::Invalid(Field::Endpoint),
            ),
            (b"cma://12:/10+1#00000000", DescError::Missing(Field::Port)),
            (
                b"cma://h:7/10+1#00000000",
                DescError::Invalid(Field::Endpoint),
            ),
            (b"cma://12:x/10+1#00000000", DescError::Invalid(Field::Port)),
        ];
        for (input, want) in bad {
            assert_eq!(
                Descriptor::parse(input).as_ref(),
                Err(want),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    fn random_endpoint(rng: &mut Rng) -> String {
        let port = 1 + rng.below(65535);
        match rng.below(3) {
            0 => format!(
                "{}.{}.{}.{}:{port}",
                rng.below(256),
                rng.below(256),
                rng.below(256),
                rng.below(256)
            ),
            1 => {
                const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789.-_";
                let n = 1 + rng.below(40) as usize;
                let host: String = (0..n)
                    .map(|_| char::from(CHARS[rng.below(CHARS.len() as u64) as usize]))
                    .collect();
                format!("{host}:{port}")
            }
            _ => format!("[fd00::{:x}]:{port}", rng.below(0x1_0000)),
        }
    }

    fn random_descriptor(rng: &mut Rng) -> Descriptor {
        // Mix full-range values with small ones so short encodings appear too.
        let addr = if rng.below(2) == 0 {
            rng.next()
        } else {
            rng.below(1 << 20)
        };
        let len = rng
            .below((u64::MAX - addr).max(1))
            .min(if rng.below(2) == 0 { u64::MAX } else { 1 << 24 });
        Descriptor {
            transport: [TransportKind::Tcp, TransportKind::Tls, TransportKind::Rdma]
                [rng.below(3) as usize],
            endpoint: random_endpoint(rng),
            addr,
            len,
            rkey: rng.next() as u32,
            epoch: (rng.below(2) == 0).then(|| rng.next() >> rng.below(64)),
        }
    }

    #[test]
    fn round_trips_random_descriptors() {
        let mut rng = Rng(0x5eed_1234_abcd_ef01);
        for _ in 0..20_000 {
            let d = random_descriptor(&mut rng);
            let s = d.to_string();
            assert!(s.len() <= DESC_LEN_MAX, "{s}");
            assert_eq!(Descriptor::parse(s.as_bytes()).as_ref(), Ok(&d), "{s}");
        }
    }

    #[test]
    fn mutated_inputs_never_panic() {
        let mut rng = Rng(0xdead_beef_0bad_cafe);
        for _ in 0..20_000 {
            let mut bytes = random_descriptor(&mut rng).to_string().into_bytes();
            for _ in 0..=rng.below(3) {
                let at = rng.below(bytes.len() as u64) as usize;
                match rng.below(3) {
                    0 => bytes[at] = rng.next() as u8,
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, b"/:+#@-0fx"[rng.below(9) as usize]),
                }
            }
            if let Ok(d) = Descriptor::parse(&bytes) {
                // Whatever parses re-encodes to something that parses the same.
                assert_eq!(Descriptor::parse(d.to_string().as_bytes()), Ok(d));
            }
        }
    }

    #[test]
    fn refuses_bad_inputs_with_specific_errors() {
        use DescError::*;
        let long = format!("tcp://{}:1/0+0#00000000", "h".repeat(DESC_LEN_MAX));
        let cases: &[(&[u8], DescError)] = &[
            (long.as_bytes(), TooLong(long.len())),
            (b"", Missing(Field::Transport)),
            (b"127.0.0.1:7400/0+1#00000000", Missing(Field::Transport)),
            (b"://h:1/0+1#00000000", Missing(Field::Transport)),
            (b"udp://h:1/0+1#00000000", UnknownTransport),
            (b"TCP://h:1/0+1#00000000", UnknownTransport),
            (b"tcp://", Missing(Field::Endpoint)),
            (b"tcp:///0+1#00000000", Missing(Field::Endpoint)),
            (b"tcp://h/0+1#00000000", Missing(Field::Port)),
            (b"tcp://h:/0+1#00000000", Missing(Field::Port)),
            (b"tcp://[::1]/0+1#00000000", Missing(Field::Port)),
            (b"tcp://h:0/0+1#00000000", Invalid(Field::Port)),
            (b"tcp://h:65536/0+1#00000000", Invalid(Field::Port)),
            (b"tcp://h:+80/0+1#00000000", Invalid(Field::Port)),
            (b"tcp://:80/0+1#00000000", Invalid(Field::Endpoint)),
            (b"tcp://h st:80/0+1#00000000", Invalid(Field::Endpoint)),
            (b"tcp://\xc3\xa9:80/0+1#00000000", Invalid(Field::Endpoint)),
            (b"tcp://h:80", Missing(Field::Addr)),
            (b"tcp://h:80/", Missing(Field::Addr)),
            (b"tcp://h:80/+1#00000000", Missing(Field::Addr)),
            (b"tcp://h:80/0x10+1#00000000", Invalid(Field::Addr)),
            (b"tcp://h:80/-10+1#00000000", Invalid(Field::Addr)),
            (b"tcp://h:80/1A+1#00000000", Invalid(Field::Addr)),
            (b"tcp://h:80/1g+1#00000000", Invalid(Field::Addr)),
            (
                b"tcp://h:80/10000000000000000+1#00000000",
                Overflow(Field::Addr),
            ),
            (b"tcp://h:80/10", Missing(Field::Len)),
            (b"tcp://h:80/10+#00000000", Missing(Field::Len)),
            (b"tcp://h:80/10++1#00000000", Invalid(Field::Len)),
            (b"tcp://h:80/10+-1#00000000", Invalid(Field::Len)),
            (b"tcp://h:80/10+1f#00000000", Invalid(Field::Len)),
            (
                b"tcp://h:80/10+18446744073709551616#00000000",
                Overflow(Field::Len),
            ),
            (b"tcp://h:80/1+18446744073709551615#00000000", RangeOverflow),
            (b"tcp://h:80/10+1", Missing(Field::Rkey)),
            (b"tcp://h:80/10+1#", Missing(Field::Rkey)),
            (b"tcp://h:80/10+1#abc", Invalid(Field::Rkey)),
            (b"tcp://h:80/10+1#123456789", Invalid(Field::Rkey)),
            (b"tcp://h:80/10+1#0000000G", Invalid(Field::Rkey)),
            (b"tcp://h:80/10+1#-0000000", Invalid(Field::Rkey)),
            (b"tcp://h:80/10+1#00000000@", Missing(Field::Epoch)),
            (b"tcp://h:80/10+1#00000000@-1", Invalid(Field::Epoch)),
            (b"tcp://h:80/10+1#00000000@+1", Invalid(Field::Epoch)),
            (
                b"tcp://h:80/10+1#00000000@18446744073709551616",
                Overflow(Field::Epoch),
            ),
            (b"tcp://h:80/10+1#00000000@17x", TrailingGarbage),
            (b"tcp://h:80/10+1#00000000@1@2", TrailingGarbage),
            (b"tcp://h:80/10+1#00000000 ", TrailingGarbage),
            (b"tcp://h:80/10+1#00000000\r\n", TrailingGarbage),
        ];
        for (input, want) in cases {
            assert_eq!(
                Descriptor::parse(input).as_ref(),
                Err(want),
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
