//! Request framing: find where the next command ends in a read buffer,
//! before anything is decoded or copied.
//!
//! Clients send commands as RESP arrays of bulk strings (`*N\r\n$L\r\n...`)
//! or, from a terminal, as inline lines (`PING\r\n`). The scanner looks only
//! at the headers, so it can:
//! - tell the connection how many bytes the whole frame needs, so the read
//!   buffer grows once instead of doubling its way up to a 512 MiB value;
//! - refuse a bulk that is over the limit *before* its payload is buffered,
//!   and then discard the rest of that frame as it streams past, so the
//!   connection stays usable (Redis closes it instead);
//! - reject malformed input with Redis' wording.
//!
//! Once the scanner says a frame is complete (every header, payload and
//! CRLF checked), [`args`] walks its headers once more and gives each
//! argument's place in the buffer: the connection slices the arguments out
//! of the read buffer without decoding the frame a second time (a GET's
//! generic decode into frames and back was a visible share of the node's
//! CPU: docs/bench-notes/request-path.md).

use thiserror::Error;

/// Bounds applied while framing; every one comes from config or a named
/// constant in the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest single bulk string (value) accepted.
    pub max_bulk_len: u64,
    /// Largest whole request (sum of its bulks); bounds what one client can
    /// make the server buffer.
    pub max_request_len: u64,
    /// Most elements in one request array.
    pub max_args: u64,
    /// Longest inline command line.
    pub max_inline_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 512 << 20,
            max_request_len: 1 << 30,
            // Redis' own limit on multibulk length.
            max_args: 1024 * 1024,
            // Redis' PROTO_INLINE_MAX_SIZE.
            max_inline_len: 64 * 1024,
        }
    }
}

/// Headers are `*<int>\r\n` or `$<int>\r\n`; an i64 has at most 20 chars, so
/// anything longer without a line end is garbage, not a slow sender.
const MAX_HEADER_LEN: usize = 32;

/// Malformed input. The connection replies `-ERR Protocol error: ...` and
/// closes, because after a framing error the byte stream cannot be resynced.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A bulk string's payload is not followed by `\r\n` (its length
    /// header and its payload disagree).
    #[error("Protocol error: expected '\\r\\n' after a bulk string of the length given")]
    ExpectedCrlf,
}

/// What the buffer holds at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// More bytes are needed. `need` is the buffer length that will be
    /// needed at least (known once the pending bulk's header arrived).
    Incomplete {
        need: usize,
    },
    /// A complete RESP array of `len` bytes; decode it.
    Frame {
        len: usize,
    },
    /// A complete inline line of `len` bytes including its `\n`.
    Inline {
        len: usize,
    },
    /// Nothing to execute: `*0`, `*-1` or an empty line. Skip `len` bytes.
    Empty {
        len: usize,
    },
    /// The request is over a limit. Drop the first `consumed` bytes, reply
    /// `-TOOLARGE`, then feed the stream to `discard` until it is done.
    TooLarge {
        consumed: usize,
        discard: Discard,
        /// The offending size, for the error message.
        len: u64,
    },
    Error(ProtocolError),
}

/// Parses `<int>\r\n` at `buf[1..]` (the length line of an array or bulk
/// string, after its type byte); returns the value and the header length.
/// `None`: not all there yet; `Err`: malformed. Replies use the same lines,
/// so the client reads bulk replies' headers with it too.
pub fn header(buf: &[u8]) -> Option<Result<(i64, usize), ()>> {
    let window = &buf[..buf.len().min(MAX_HEADER_LEN)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return if buf.len() >= MAX_HEADER_LEN {
            Some(Err(()))
        } else {
            None
        };
    };
    if cr + 1 >= buf.len() {
        return None;
    }
    if buf[cr + 1] != b'\n' {
        return Some(Err(()));
    }
    Some(parse_i64(&buf[1..cr]).map(|v| (v, cr + 2)).ok_or(()))
}

/// Strict decimal: optional '-', at least one digit, no '+', no spaces.
pub fn parse_i64(digits: &[u8]) -> Option<i64> {
    let (neg, body) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if body.is_empty() || body.len() > 19 || !body.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in body {
        v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if neg { -v } else { v })
}

/// Looks at the start of `buf` and says what is there. Never reads past the
/// headers; cost is proportional to the number of elements, not their size.
pub fn scan(buf: &[u8], limits: &Limits) -> Scan {
    match buf.first() {
        None => Scan::Incomplete { need: 1 },
        Some(b'*') => scan_array(buf, limits),
        Some(_) => scan_inline(buf, limits),
    }
}

fn scan_array(buf: &[u8], limits: &Limits) -> Scan {
    let (count, mut pos) = match header(buf) {
        None => {
            return Scan::Incomplete {
                need: buf.len() + 1,
            }
        }
        Some(Err(())) => return Scan::Error(ProtocolError::InvalidMultibulkLength),
        Some(Ok(h)) => h,
    };
    if count <= 0 {
        return Scan::Empty { len: pos };
    }
    let count = count as u64;
    if count > limits.max_args {
        return Scan::Error(ProtocolError::InvalidMultibulkLength);
    }
    let mut total: u64 = 0;
    for i in 0..count {
        let rest = &buf[pos..];
        match rest.first() {
            None => return Scan::Incomplete { need: pos + 1 },
            Some(b'$') => {}
            Some(&other) => return Scan::Error(ProtocolError::ExpectedBulk(other as char)),
        }
        let (len, hlen) = match header(rest) {
            None => {
                return Scan::Incomplete {
                    need: buf.len() + 1,
                }
            }
            Some(Err(())) => return Scan::Error(ProtocolError::InvalidBulkLength),
            Some(Ok(h)) => h,
        };
        if len < 0 {
            return Scan::Error(ProtocolError::InvalidBulkLength);
        }
        let len = len as u64;
        total = total.saturating_add(len);
        if len > limits.max_bulk_len || total > limits.max_request_len {
            return Scan::TooLarge {
                consumed: pos + hlen,
                discard: Discard {
                    bulk_left: len + 2,
                    elems_left: count - i - 1,
                },
                len: if len > limits.max_bulk_len {
                    len
                } else {
                    total
                },
            };
        }
        // Lengths are bounded by max_request_len above, so usize is safe.
        let end = pos + hlen + len as usize + 2;
        if end > buf.len() {
            return Scan::Incomplete { need: end };
        }
        if &buf[end - 2..end] != b"\r\n" {
            return Scan::Error(ProtocolError::ExpectedCrlf);
        }
        pos = end;
    }
    Scan::Frame { len: pos }
}

/// The places of the arguments (bulk payloads) of `frame`, a RESP array
/// that [`scan`] called a [`Scan::Frame`] of exactly this length, in order.
/// On anything else it stops early rather than panic.
pub fn args(frame: &[u8]) -> Args<'_> {
    match header(frame) {
        Some(Ok((count, pos))) if frame.first() == Some(&b'*') => Args {
            frame,
            pos,
            left: usize::try_from(count).unwrap_or(0),
        },
        _ => Args {
            frame,
            pos: 0,
            left: 0,
        },
    }
}

/// Iterator returned by [`args`].
#[derive(Debug, Clone)]
pub struct Args<'a> {
    frame: &'a [u8],
    pos: usize,
    left: usize,
}

impl Iterator for Args<'_> {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let rest = &self.frame[self.pos..];
        let parsed = match rest.first() {
            Some(b'$') => header(rest).and_then(Result::ok),
            _ => None,
        };
        let Some((len, hlen)) = parsed.filter(|&(len, _)| len >= 0) else {
            self.left = 0;
            return None;
        };
        let start = self.pos + hlen;
        let end = start.saturating_add(len as usize);
        if end.saturating_add(2) > self.frame.len() {
            self.left = 0;
            return None;
        }
        self.pos = end + 2;
        self.left -= 1;
        Some(start..end)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // A well-formed frame has exactly `left`; the count comes from the
        // client, so never promise (or let `collect` reserve) more than
        // the bytes could hold: every argument takes at least 6 bytes.
        let most = self.left.min((self.frame.len() - self.pos) / 6);
        (0, Some(most))
    }
}

/// The bulk string an array request is still receiving, once that bulk's
/// header has arrived: the connection may then read a large value straight
/// to where it will be kept (a `SET`'s arena chunk) instead of buffering it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingBulk {
    /// Elements in the array.
    pub count: usize,
    /// Payload ranges (in the buffer) of the complete elements before it.
    pub before: Vec<std::ops::Range<usize>>,
    /// Where its `$` header starts.
    pub header_at: usize,
    /// Where its payload starts.
    pub payload_at: usize,
    /// Its payload length.
    pub len: usize,
}

/// For a buffer [`scan`] called `Incomplete`: the first element of the
/// array at its start that has not fully arrived (payload or CRLF), if its
/// header has and at most `max_before` complete elements precede it.
/// `None` for anything else (an inline line, a header still arriving,
/// malformed input: `scan` reports those). Limits were checked by `scan`.
pub fn pending_bulk(buf: &[u8], max_before: usize) -> Option<PendingBulk> {
    if buf.first() != Some(&b'*') {
        return None;
    }
    let (count, mut pos) = header(buf)?.ok()?;
    let count = usize::try_from(count).ok().filter(|&c| c > 0)?;
    let mut before = Vec::new();
    while before.len() < count.min(max_before + 1) {
        let rest = &buf[pos..];
        if rest.first() != Some(&b'$') {
            return None;
        }
        let (len, hlen) = header(rest)?.ok()?;
        let len = usize::try_from(len).ok()?;
        let payload_at = pos + hlen;
        let end = payload_at.checked_add(len)?.checked_add(2)?;
        if end > buf.len() {
            return Some(PendingBulk {
                count,
                before,
                header_at: pos,
                payload_at,
                len,
            });
        }
        before.push(payload_at..payload_at + len);
        pos = end;
    }
    None
}

fn scan_inline(buf: &[u8], limits: &Limits) -> Scan {
    let window = &buf[..buf.len().min(limits.max_inline_len)];
    match window.iter().position(|&b| b == b'\n') {
        Some(nl) if window[..nl].iter().all(|b| b.is_ascii_whitespace()) => {
            Scan::Empty { len: nl + 1 }
        }
        Some(nl) => Scan::Inline { len: nl + 1 },
        None if buf.len() >= limits.max_inline_len => Scan::Error(ProtocolError::InlineTooBig),
        None => Scan::Incomplete {
            need: buf.len() + 1,
        },
    }
}

/// Splits an inline command line into arguments: whitespace separated,
/// with `"..."` (backslash escapes `\n \r \t \" \\ \xHH`) and `'...'`
/// quoting, as redis-cli and Redis' `sdssplitargs` do.
pub fn split_inline(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Ok(args);
        }
        let mut cur = Vec::new();
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    match line.get(i) {
                        None => return Err(ProtocolError::UnbalancedQuotes),
                        Some(b'"') => break,
                        Some(b'\\') => {
                            let (byte, used) = unescape(&line[i..]);
                            cur.push(byte);
                            i += used;
                            continue;
                        }
                        Some(&b) => cur.push(b),
                    }
                    i += 1;
                }
                i += 1;
                if i < n && !line[i].is_ascii_whitespace() {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    match line.get(i) {
                        None => return Err(ProtocolError::UnbalancedQuotes),
                        Some(b'\'') => break,
                        Some(b'\\') if line.get(i + 1) == Some(&b'\'') => {
                            cur.push(b'\'');
                            i += 1;
                        }
                        Some(&b) => cur.push(b),
                    }
                    i += 1;
                }
                i += 1;
                if i < n && !line[i].is_ascii_whitespace() {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
            }
            _ => {
                while i < n && !line[i].is_ascii_whitespace() {
                    cur.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(cur);
    }
}

/// One escape at `s[0] == '\\'`: returns the byte and how many input bytes
/// it used.
fn unescape(s: &[u8]) -> (u8, usize) {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    match s.get(1) {
        Some(b'n') => (b'\n', 2),
        Some(b'r') => (b'\r', 2),
        Some(b't') => (b'\t', 2),
        Some(b'b') => (8, 2),
        Some(b'a') => (7, 2),
        Some(b'x') => match (
            s.get(2).and_then(|&b| hex(b)),
            s.get(3).and_then(|&b| hex(b)),
        ) {
            (Some(h), Some(l)) => (h * 16 + l, 4),
            _ => (b'x', 2),
        },
        Some(&other) => (other, 2),
        None => (b'\\', 1),
    }
}

/// Skips the remainder of a refused request without buffering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discard {
    /// Payload bytes of the current bulk still to skip, its CRLF included.
    bulk_left: u64,
    /// Bulks after the current one.
    elems_left: u64,
}

/// Result of feeding bytes to a [`Discard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardStep {
    /// Drop `consumed` bytes; the request is not over yet.
    More { consumed: usize },
    /// Drop `consumed` bytes; the next byte starts a new request.
    Done { consumed: usize },
}

impl Discard {
    /// Refuses the whole array request at the start of `buf` once its
    /// header has arrived (a request refused while it was still arriving).
    /// Returns the header's length, to drop now, and the discard that
    /// skips the rest. `None` when `buf` does not start with a complete
    /// array header.
    pub fn request(buf: &[u8]) -> Option<(usize, Discard)> {
        if buf.first() != Some(&b'*') {
            return None;
        }
        match header(buf) {
            Some(Ok((count, hlen))) if count > 0 => Some((
                hlen,
                Discard {
                    bulk_left: 0,
                    elems_left: count as u64,
                },
            )),
            _ => None,
        }
    }

    /// Consumes as much of `buf` as belongs to the refused request.
    pub fn advance(&mut self, buf: &[u8]) -> Result<DiscardStep, ProtocolError> {
        let mut pos = 0usize;
        loop {
            if self.bulk_left > 0 {
                let take = (self.bulk_left).min((buf.len() - pos) as u64) as usize;
                pos += take;
                self.bulk_left -= take as u64;
                if self.bulk_left > 0 {
                    return Ok(DiscardStep::More { consumed: pos });
                }
            }
            if self.elems_left == 0 {
                return Ok(DiscardStep::Done { consumed: pos });
            }
            let rest = &buf[pos..];
            match rest.first() {
                None => return Ok(DiscardStep::More { consumed: pos }),
                Some(b'$') => {}
                Some(&other) => return Err(ProtocolError::ExpectedBulk(other as char)),
            }
            match header(rest) {
                None => return Ok(DiscardStep::More { consumed: pos }),
                Some(Ok((len, hlen))) if len >= 0 => {
                    pos += hlen;
                    self.bulk_left = len as u64 + 2;
                    self.elems_left -= 1;
                }
                Some(_) => return Err(ProtocolError::InvalidBulkLength),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l() -> Limits {
        Limits {
            max_bulk_len: 100,
            max_request_len: 250,
            max_args: 8,
            max_inline_len: 64,
        }
    }

    #[test]
    fn a_request_refused_midway_is_skipped_whole() {
        let req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*1\r\n$4\r\nPING\r\n";
        // Only part of it has arrived when it is refused.
        let (hlen, mut d) = Discard::request(&req[..20]).expect("array header");
        assert_eq!(hlen, 4);
        let mut pos = hlen;
        let mut end = 20;
        loop {
            match d.advance(&req[pos..end]).expect("valid") {
                DiscardStep::More { consumed } => {
                    pos += consumed;
                    end = req.len();
                }
                DiscardStep::Done { consumed } => {
                    pos += consumed;
                    break;
                }
            }
        }
        assert_eq!(&req[pos..], b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(Discard::request(b"PING\r\n"), None);
        assert_eq!(Discard::request(b"*2\r"), None);
        assert_eq!(Discard::request(b"*0\r\n"), None);
    }

    #[test]
    fn complete_frames() {
        let f = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n";
        assert_eq!(scan(f, &l()), Scan::Frame { len: 20 });
        assert_eq!(scan(b"*0\r\n", &l()), Scan::Empty { len: 4 });
        assert_eq!(scan(b"*-1\r\n", &l()), Scan::Empty { len: 5 });
        assert_eq!(scan(b"$0\r\n\r\n*2\r\n", &l()), Scan::Inline { len: 4 });
    }

    #[test]
    fn args_are_the_payloads_of_a_scanned_frame() {
        let f = b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$11\r\nbin\r\nary\x00\r\n\r\n";
        assert_eq!(scan(f, &l()), Scan::Frame { len: f.len() });
        let got: Vec<&[u8]> = args(f).map(|r| &f[r]).collect();
        assert_eq!(got, [&b"SET"[..], b"", b"bin\r\nary\x00\r\n"]);
        // Never more than the frame could hold, whatever its header says.
        assert!(args(b"*1000000\r\n$1\r\nk\r\n").size_hint().1 <= Some(1));
        // Malformed input (not what scan accepts) stops the walk.
        for bad in [
            &b"*2\r\n$1\r\nk\r\n"[..],
            b"*1\r\n$9\r\nk\r\n",
            b"PING\r\n",
            b"*1\r\n:1\r\n",
        ] {
            assert!(args(bad).count() < 2, "{bad:?}");
        }
    }

    #[test]
    fn a_payload_longer_or_shorter_than_its_header_is_refused() {
        let e = |b: &[u8]| scan(b, &l());
        assert_eq!(
            e(b"*1\r\n$3\r\nGETX\r\n"),
            Scan::Error(ProtocolError::ExpectedCrlf)
        );
        assert_eq!(
            e(b"*2\r\n$3\r\nGE\r\n$1\r\nk\r\n"),
            Scan::Error(ProtocolError::ExpectedCrlf)
        );
        assert_eq!(
            e(b"*1\r\n$3\r\nGET\n\n"),
            Scan::Error(ProtocolError::ExpectedCrlf)
        );
        // Not there yet is not an error.
        assert_eq!(e(b"*1\r\n$3\r\nGET\r"), Scan::Incomplete { need: 13 });
    }

    #[test]
    fn every_prefix_is_incomplete_with_growing_need() {
        let f = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\n0123456789\r\n";
        for cut in 0..f.len() {
            match scan(&f[..cut], &l()) {
                Scan::Incomplete { need } => assert!(need > cut && need <= f.len(), "{cut}"),
                other => panic!("prefix {cut}: {other:?}"),
            }
        }
        // Once the last header is in, the whole length is known.
        assert_eq!(scan(&f[..26], &l()), Scan::Incomplete { need: f.len() });
    }

    #[test]
    fn malformed_headers() {
        let e = |b: &[u8]| match scan(b, &l()) {
            Scan::Error(e) => e,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(b)),
        };
        assert_eq!(e(b"*x\r\n"), ProtocolError::InvalidMultibulkLength);
        assert_eq!(e(b"*9\r\n"), ProtocolError::InvalidMultibulkLength);
        assert_eq!(e(b"*1\r\n:1\r\n"), ProtocolError::ExpectedBulk(':'));
        assert_eq!(e(b"*1\r\n*1\r\n"), ProtocolError::ExpectedBulk('*'));
        assert_eq!(e(b"*1\r\n$-1\r\n"), ProtocolError::InvalidBulkLength);
        assert_eq!(e(b"*1\r\n$+1\r\n"), ProtocolError::InvalidBulkLength);
        assert_eq!(e(b"*1\r\n$1x\r\n"), ProtocolError::InvalidBulkLength);
        assert_eq!(
            e(b"*1\r\n$99999999999999999999999\r\n"),
            ProtocolError::InvalidBulkLength
        );
        assert_eq!(e(&[b'*'; 40]), ProtocolError::InvalidMultibulkLength);
        assert_eq!(e(&[b'A'; 64]), ProtocolError::InlineTooBig);
    }

    #[test]
    fn oversize_bulk_is_refused_before_its_payload_and_discarded() {
        let mut req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$101\r\n".to_vec();
        let header_len = req.len();
        req.extend(std::iter::repeat_n(b'v', 101));
        req.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n");
        // Refused as soon as the header is in, with no payload buffered.
        let Scan::TooLarge {
            consumed,
            mut discard,
            len,
        } = scan(&req[..header_len], &l())
        else {
            panic!("expected TooLarge")
        };
        assert_eq!((consumed, len), (header_len, 101));
        // Feed the rest in small pieces, as a socket would.
        let mut pos = consumed;
        loop {
            let end = (pos + 7).min(req.len());
            match discard.advance(&req[pos..end]).unwrap() {
                DiscardStep::More { consumed } => pos += consumed,
                DiscardStep::Done { consumed } => {
                    pos += consumed;
                    break;
                }
            }
        }
        assert_eq!(&req[pos..], b"*1\r\n$4\r\nPING\r\n");
    }

    #[test]
    fn oversize_request_total_is_refused() {
        let mut req = b"*4\r\n$4\r\nMSET\r\n".to_vec();
        for _ in 0..3 {
            req.extend_from_slice(b"$100\r\n");
            req.extend(std::iter::repeat_n(b'v', 100));
            req.extend_from_slice(b"\r\n");
        }
        match scan(&req, &l()) {
            Scan::TooLarge {
                len,
                mut discard,
                consumed,
            } => {
                assert_eq!(len, 304, "MSET plus three 100-byte values");
                assert_eq!(
                    discard.advance(&req[consumed..]).unwrap(),
                    DiscardStep::Done {
                        consumed: req.len() - consumed
                    }
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pending_bulk_finds_the_value_still_arriving() {
        let req = b"*5\r\n$3\r\nSET\r\n$2\r\nk1\r\n$10\r\n0123456789\r\n$2\r\nEX\r\n$1\r\n9\r\n";
        let value_hdr = 21; // "*5\r\n$3\r\nSET\r\n$2\r\nk1\r\n"
        assert_eq!(&req[value_hdr..value_hdr + 5], b"$10\r\n");
        // Every prefix from the value's complete header up to its CRLF.
        for cut in value_hdr + 5..value_hdr + 5 + 12 {
            let p = pending_bulk(&req[..cut], 2).expect("pending");
            assert_eq!(p.count, 5);
            assert_eq!(p.before, vec![8..11, 17..19]);
            assert_eq!(&req[p.before[0].clone()], b"SET");
            assert_eq!(&req[p.before[1].clone()], b"k1");
            assert_eq!(p.header_at, value_hdr);
            assert_eq!(p.payload_at, value_hdr + 5);
            assert_eq!(p.len, 10);
        }
        // The value's header not complete yet, the value complete, or more
        // complete elements before than asked about: nothing to stream.
        for cut in 0..value_hdr + 5 {
            let p = pending_bulk(&req[..cut], 2);
            assert!(p.is_none() || p.unwrap().before.len() < 2, "cut {cut}");
        }
        assert_eq!(pending_bulk(&req[..value_hdr + 5 + 12], 2), None);
        assert_eq!(pending_bulk(&req[..value_hdr + 5], 1), None);
        assert_eq!(pending_bulk(b"SET k v", 2), None);
        assert_eq!(pending_bulk(b"*2\r\n:1\r\n", 2), None);
        assert_eq!(pending_bulk(b"*0\r\n", 2), None);
        assert_eq!(pending_bulk(b"*1\r\n$-1\r\n", 2), None);
    }

    #[test]
    fn inline_splitting() {
        let s = |b: &[u8]| split_inline(b).unwrap();
        assert_eq!(
            s(b"SET  k v\r\n"),
            vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]
        );
        assert_eq!(
            s(b"SET k \"a b\\x41\\n\""),
            vec![b"SET".to_vec(), b"k".to_vec(), b"a bA\n".to_vec()]
        );
        assert_eq!(
            s(b"ECHO 'it\\'s'"),
            vec![b"ECHO".to_vec(), b"it's".to_vec()]
        );
        assert_eq!(
            split_inline(b"ECHO \"abc"),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(
            split_inline(b"ECHO \"abc\"x"),
            Err(ProtocolError::UnbalancedQuotes)
        );
        assert!(s(b"   \r\n").is_empty());
    }

    #[test]
    fn parse_i64_is_strict() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"9223372036854775808",
            b"1.0",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    /// Random bytes never panic the scanner or the discarder.
    #[test]
    fn random_input_never_panics() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"*$\r\n-0123456789abc ";
        for _ in 0..20_000 {
            let n = (next() % 40) as usize;
            let buf: Vec<u8> = (0..n)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            if let Scan::TooLarge {
                consumed,
                mut discard,
                ..
            } = scan(&buf, &l())
            {
                let _ = discard.advance(&buf[consumed..]);
            }
            let _ = split_inline(&buf);
        }
    }
}
