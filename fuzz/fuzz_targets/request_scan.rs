//! Feeds arbitrary bytes to the request scanner the way the connection does
//! (`server/src/connection.rs`), under several `Limits`, and checks what the
//! connection relies on:
//!
//! - every length the scanner returns lies inside the buffer and moves on;
//! - `Incomplete { need }` asks for more than is buffered;
//! - a `Frame` decodes with `redis-protocol` (the oracle here) into an
//!   array of bulk strings that uses exactly the scanned length, and
//!   `args`, which the connection slices its arguments with, gives those
//!   very bulks;
//! - every prefix of a `Frame` is `Incomplete` with `need` inside the frame,
//!   so a client that sent one whole request is never kept waiting;
//! - a refused request is skipped to the same byte whether it arrives at
//!   once or a few bytes at a time.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use redis_protocol::resp2::{decode::decode_bytes, types::BytesFrame};
use strata_proto::request::{args, scan, split_inline, Discard, DiscardStep, Limits, Scan};

/// Limits to run every input under: the server's defaults, the proto tests'
/// small ones, and tiny ones so that refusals happen on short inputs.
const LIMITS: [Limits; 3] = [
    Limits {
        max_bulk_len: 512 << 20,
        max_request_len: 1 << 30,
        max_args: 1024 * 1024,
        max_inline_len: 64 * 1024,
    },
    Limits {
        max_bulk_len: 100,
        max_request_len: 250,
        max_args: 8,
        max_inline_len: 64,
    },
    Limits {
        max_bulk_len: 3,
        max_request_len: 8,
        max_args: 3,
        max_inline_len: 8,
    },
];

/// Checking every prefix of a frame is quadratic; sample long ones.
const PREFIX_CHECKS_MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    assert_eq!(LIMITS[0], Limits::default(), "keep LIMITS[0] the default");
    // The first byte picks the chunk size the discarder is fed with, so
    // the bytes themselves stay realistic RESP.
    let chunk = usize::from(data.first().copied().unwrap_or(1) % 8) + 1;
    for limits in &LIMITS {
        drive(data, limits, chunk);
    }
    let _ = split_inline(data);
});

/// Consumes `buf` request by request, as `Connection::next_step` does.
fn drive(buf: &[u8], limits: &Limits, chunk: usize) {
    let mut pos = 0;
    while pos < buf.len() {
        let rest = &buf[pos..];
        match scan(rest, limits) {
            Scan::Incomplete { need } => {
                assert!(need > rest.len(), "need {need} <= buffered {}", rest.len());
                return;
            }
            Scan::Empty { len } => {
                assert!(len > 0 && len <= rest.len(), "Empty len {len}");
                pos += len;
            }
            Scan::Frame { len } => {
                assert!(len > 0 && len <= rest.len(), "Frame len {len}");
                check_frame(&rest[..len], limits);
                pos += len;
            }
            Scan::Inline { len } => {
                assert!(len > 0 && len <= rest.len(), "Inline len {len}");
                assert!(len <= limits.max_inline_len, "Inline len {len} over limit");
                assert_eq!(rest[len - 1], b'\n');
                if let Ok(args) = split_inline(&rest[..len]) {
                    // Blank lines are `Empty`, so an inline line has words.
                    assert!(!args.is_empty(), "inline line without arguments");
                }
                pos += len;
            }
            Scan::TooLarge {
                consumed,
                discard,
                len,
            } => {
                assert!(
                    consumed > 0 && consumed <= rest.len(),
                    "consumed {consumed}"
                );
                assert!(
                    len > limits.max_bulk_len || len > limits.max_request_len,
                    "refused {len} bytes within the limits"
                );
                match skip(&rest[consumed..], discard, chunk) {
                    Some(used) => pos += consumed + used,
                    None => return,
                }
            }
            Scan::Error(_) => return,
        }
    }
}

fn check_frame(frame: &[u8], limits: &Limits) {
    let bytes = Bytes::copy_from_slice(frame);
    let items = match decode_bytes(&bytes) {
        Ok(Some((BytesFrame::Array(items), used))) => {
            assert_eq!(used, frame.len(), "decoder used {used} of {frame:?}");
            items
        }
        other => panic!("scanned frame {frame:?} decodes to {other:?}"),
    };
    assert!(!items.is_empty(), "empty arrays are Scan::Empty");
    assert!(items.len() as u64 <= limits.max_args);
    let mut total = 0u64;
    for item in &items {
        let BytesFrame::BulkString(b) = item else {
            panic!("frame {frame:?} holds {item:?}, not a bulk string");
        };
        assert!(b.len() as u64 <= limits.max_bulk_len);
        total += b.len() as u64;
    }
    assert!(total <= limits.max_request_len);
    let sliced: Vec<&[u8]> = args(frame).map(|r| &frame[r]).collect();
    let decoded: Vec<&[u8]> = items
        .iter()
        .map(|i| match i {
            BytesFrame::BulkString(b) => &b[..],
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(sliced, decoded, "args of {frame:?}");

    let step = (frame.len() / PREFIX_CHECKS_MAX).max(1);
    for cut in (0..frame.len()).step_by(step) {
        match scan(&frame[..cut], limits) {
            Scan::Incomplete { need } => assert!(
                need > cut && need <= frame.len(),
                "prefix {cut} of a {}-byte frame needs {need}",
                frame.len()
            ),
            other => panic!("prefix {cut} of frame {frame:?}: {other:?}"),
        }
    }
}

/// Skips a refused request from `buf` twice, all at once and `chunk` bytes
/// at a time (keeping what the discarder left, as the read buffer does).
/// Both must agree; returns where the next request starts, if it does.
fn skip(buf: &[u8], discard: Discard, chunk: usize) -> Option<usize> {
    let whole = feed(buf, discard, buf.len());
    let chunked = feed(buf, discard, chunk);
    assert_eq!(whole, chunked, "chunks of {chunk} disagree on {buf:?}");
    whole
}

fn feed(buf: &[u8], mut discard: Discard, chunk: usize) -> Option<usize> {
    let (mut start, mut end) = (0, 0);
    loop {
        end = (end + chunk.max(1)).min(buf.len());
        let window = &buf[start..end];
        match discard.advance(window) {
            Ok(DiscardStep::Done { consumed }) => {
                assert!(consumed <= window.len());
                return Some(start + consumed);
            }
            Ok(DiscardStep::More { consumed }) => {
                assert!(consumed <= window.len());
                start += consumed;
                if end == buf.len() {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}
