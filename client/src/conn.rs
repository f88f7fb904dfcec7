//! One RESP2 command connection: requests out as arrays of bulk strings,
//! replies in through `redis-protocol`'s decoder.
//!
//! The connection counts replies it owes: a caller whose future was
//! dropped after sending leaves its replies behind, and the next caller
//! skips them before reading its own. A write cut half-way leaves the
//! stream unusable, which `poisoned` records.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Error, Result};

/// Arguments at least this long are written straight from the caller's
/// memory instead of being copied into the request buffer.
const DIRECT_ARG_BYTES: usize = 64 * 1024;
/// Read granularity for replies; large bulk replies reserve their full size.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// A read buffer grown by a huge reply is dropped when idle and above this.
const READ_BUF_KEEP_BYTES: usize = 1 << 20;

pub(crate) struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Replies sent for but not yet read.
    owed: usize,
    /// A write was interrupted: the stream holds a partial request.
    poisoned: bool,
    timeout: Duration,
}

impl Conn {
    pub(crate) async fn connect(addr: &str, timeout: Duration) -> Result<Self> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            wbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            owed: 0,
            poisoned: false,
            timeout,
        })
    }

    /// Whether a dropped caller left the stream mid-request.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Sends `commands` in one write and skips replies owed to callers that
    /// went away; afterwards the next `commands.len()` replies are ours.
    pub(crate) async fn send(&mut self, commands: &[&[&[u8]]]) -> Result<()> {
        self.poisoned = true;
        let sent = tokio::time::timeout(self.timeout, self.write(commands)).await;
        sent.map_err(|_| timed_out("request write"))??;
        self.poisoned = false;
        self.owed += commands.len();
        while self.owed > commands.len() {
            match self.recv().await {
                Err(e) if e.breaks_connection() => return Err(e),
                // Someone else's reply: their error is not ours.
                Ok(_) | Err(_) => {}
            }
        }
        Ok(())
    }

    /// Sends commands whose replies nobody will read (they are skipped by
    /// the next `send`). Used for RELEASE, whose reply only says how many
    /// leases were live.
    pub(crate) async fn send_detached(&mut self, commands: &[&[&[u8]]]) -> Result<()> {
        self.poisoned = true;
        let sent = tokio::time::timeout(self.timeout, self.write(commands)).await;
        sent.map_err(|_| timed_out("request write"))??;
        self.poisoned = false;
        self.owed += commands.len();
        Ok(())
    }

    async fn write(&mut self, commands: &[&[&[u8]]]) -> std::io::Result<()> {
        self.wbuf.clear();
        for args in commands {
            self.wbuf.put_u8(b'*');
            put_decimal(&mut self.wbuf, args.len());
            for arg in args.iter() {
                self.wbuf.put_u8(b'$');
                put_decimal(&mut self.wbuf, arg.len());
                if arg.len() >= DIRECT_ARG_BYTES {
                    self.stream.write_all(&self.wbuf).await?;
                    self.wbuf.clear();
                    self.stream.write_all(arg).await?;
                } else {
                    self.wbuf.extend_from_slice(arg);
                }
                self.wbuf.extend_from_slice(b"\r\n");
            }
        }
        self.stream.write_all(&self.wbuf).await
    }

    /// Reads the next reply; error replies come back as `Err`.
    pub(crate) async fn recv(&mut self) -> Result<BytesFrame> {
        let frame = tokio::time::timeout(self.timeout, self.read_frame())
            .await
            .map_err(|_| timed_out("reply"))??;
        self.owed = self.owed.saturating_sub(1);
        if self.rbuf.is_empty() && self.rbuf.capacity() > READ_BUF_KEEP_BYTES {
            self.rbuf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        }
        match frame {
            BytesFrame::Error(text) => Err(Error::from_reply(&text)),
            other => Ok(other),
        }
    }

    async fn read_frame(&mut self) -> Result<BytesFrame> {
        loop {
            match decode_bytes_mut(&mut self.rbuf) {
                Ok(Some((frame, _, _))) => return Ok(frame),
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(format!("bad reply: {e:?}"))),
            }
            self.rbuf.reserve(wanted_bytes(&self.rbuf));
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}

/// How much room to make before the next read: the rest of a bulk string
/// when the buffer starts with its header (so a large GET reply is read
/// with few syscalls and never regrown), else one chunk.
fn wanted_bytes(buf: &[u8]) -> usize {
    let frame_len = buf.strip_prefix(b"$").and_then(|rest| {
        let end = rest.iter().position(|&b| b == b'\r')?;
        let len: usize = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
        // "$" + digits + CRLF + payload + CRLF
        len.checked_add(end + 5)
    });
    match frame_len {
        Some(total) => total.saturating_sub(buf.len()).max(READ_CHUNK_BYTES),
        None => READ_CHUNK_BYTES,
    }
}

fn put_decimal(buf: &mut BytesMut, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[at..]);
    buf.extend_from_slice(b"\r\n");
}

fn timed_out(what: &str) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

/// Reply accessors: the shapes the client expects, anything else is
/// `Error::Protocol`.
pub(crate) fn expect_ok(frame: BytesFrame) -> Result<bool> {
    match frame {
        BytesFrame::SimpleString(s) if &s[..] == b"OK" => Ok(true),
        BytesFrame::Null => Ok(false),
        other => Err(unexpected("+OK or nil", &other)),
    }
}

pub(crate) fn expect_int(frame: BytesFrame) -> Result<i64> {
    match frame {
        BytesFrame::Integer(n) => Ok(n),
        other => Err(unexpected("an integer", &other)),
    }
}

pub(crate) fn expect_bulk_or_nil(frame: BytesFrame) -> Result<Option<Bytes>> {
    match frame {
        BytesFrame::BulkString(b) => Ok(Some(b)),
        BytesFrame::Null => Ok(None),
        other => Err(unexpected("a bulk string or nil", &other)),
    }
}

pub(crate) fn unexpected(want: &str, got: &BytesFrame) -> Error {
    let shown = format!("{got:?}");
    let shown: String = shown.chars().take(120).collect();
    Error::Protocol(format!("expected {want}, got {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_encoding() {
        let mut b = BytesMut::new();
        for n in [0usize, 7, 10, 1024, usize::MAX] {
            b.clear();
            put_decimal(&mut b, n);
            assert_eq!(&b[..], format!("{n}\r\n").as_bytes());
        }
    }

    #[test]
    fn wanted_bytes_follows_bulk_headers() {
        assert_eq!(wanted_bytes(b"$1048576\r\nabc"), 1048576 + 12 - 13);
        assert_eq!(wanted_bytes(b"$5\r\n"), READ_CHUNK_BYTES);
        assert_eq!(wanted_bytes(b"*3\r\n"), READ_CHUNK_BYTES);
        assert_eq!(wanted_bytes(b"$12"), READ_CHUNK_BYTES);
    }
}
