//! Cross-memory attach with nodes on this host: set up once per command
//! connection (`STRATA.CMA HELLO`, then `PROVE`), after which PUT payloads
//! and GET values move by `process_vm_readv` instead of the network data
//! plane. Anything that does not work (another host, pid namespace or
//! user, a kernel that refuses the read, a node with `cma: off`, a plain
//! Redis) leaves that node on the network data plane, said once in the log.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_protocol::resp2::types::BytesFrame;
use strata_rdma::cma::{CmaReader, Identity, NONCE_BYTES};
use strata_rdma::{Descriptor, TransferError};

use crate::conn::Conn;
use crate::{Error, Result};

/// This process's side: who it is, and a reader of node memory.
pub(crate) struct Local {
    pub(crate) me: Identity,
    pub(crate) reader: CmaReader,
}

impl Local {
    /// `None` when this process cannot describe itself (no /proc). Long
    /// reads go over `lanes` threads.
    pub(crate) fn new(lanes: usize) -> Option<Local> {
        match Identity::current() {
            Ok(me) => Some(Local {
                me,
                reader: CmaReader::with_lanes(lanes),
            }),
            Err(e) => {
                tracing::info!(error = %e, "cross-memory attach unavailable: no /proc; using the network data plane");
                None
            }
        }
    }

    /// A `cma` descriptor of `[addr, addr + len)` in this process.
    pub(crate) fn describe(&self, addr: u64, len: u64, rkey: u32) -> Descriptor {
        strata_rdma::cma::describe(&self.me, addr, len, rkey, None)
    }

    /// Copies what `src` names (in the node `link` says) into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `src.len` bytes, and nothing else
    /// may access that range during the call.
    pub(crate) unsafe fn read(&self, link: Link, src: &Descriptor, dst: *mut u8) -> Result<()> {
        if src.process() != Some((link.pid, link.start)) {
            return Err(Error::Protocol(
                "the node's cma source names another process than the node".into(),
            ));
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.reader.read(src, dst) }.map_err(|e| match e {
            TransferError::Io(e) => Error::Io(e),
            other => other.into(),
        })
    }
}

/// A node this connection may use CMA with: the node process, and how
/// long its leases last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) pid: u32,
    pub(crate) start: u64,
    pub(crate) lease_ttl: std::time::Duration,
}

impl Link {
    /// Whether a read that ended `elapsed` after its GET was sent is known
    /// to have run under a live lease without asking the node: the lease
    /// was granted after the GET was sent and lasts `lease_ttl` on the
    /// same host's clock, and only its RELEASE, its TTL or the end of the
    /// connection end it. Half the TTL leaves room for scheduling delays.
    pub(crate) fn lease_still_live(&self, elapsed: std::time::Duration) -> bool {
        elapsed < self.lease_ttl / 2
    }
}

/// Sets CMA up on a fresh connection to the node at `addr`. `Ok(None)`:
/// not possible, for the reason logged (once per node, via `logged`).
/// `Err` only for a broken connection.
pub(crate) async fn handshake(
    conn: &mut Conn,
    local: &Local,
    addr: &str,
    logged: &AtomicBool,
) -> Result<Option<Link>> {
    let say = |how: &str, why: &str| {
        if !logged.swap(true, Relaxed) {
            tracing::info!(node = %addr, data_plane = how, reason = why, "data plane to this node chosen");
        }
    };
    let hello = match exchange(conn, &[b"STRATA.CMA", b"HELLO"]).await? {
        Ok(BytesFrame::Array(parts)) => parts,
        Ok(_) => {
            say("network", "the node's STRATA.CMA reply is not understood");
            return Ok(None);
        }
        // cma: off, or not a strata node.
        Err(e) => {
            say("network", &e.to_string());
            return Ok(None);
        }
    };
    let Some(h) = Hello::parse(&hello) else {
        say("network", "the node's STRATA.CMA reply is not understood");
        return Ok(None);
    };
    let node = Identity {
        pid: h.pid,
        start: h.start,
        boot_id: h.boot_id.clone(),
        pid_ns: h.pid_ns,
        uid: h.uid,
    };
    if let Some(why) = local.me.mismatch(&node) {
        say("network", why);
        return Ok(None);
    }
    // May this process read the node? (Same user, but Yama or a missing
    // capability can still refuse.)
    let link = Link {
        pid: h.pid,
        start: h.start,
        lease_ttl: std::time::Duration::from_millis(h.lease_ttl_ms),
    };
    let probe = strata_rdma::cma::describe(&node, h.probe_addr, NONCE_BYTES as u64, 0, None);
    let mut got = [0u8; NONCE_BYTES];
    // SAFETY: `got` is a local buffer of exactly `probe.len` bytes.
    if let Err(e) = unsafe { local.reader.read(&probe, got.as_mut_ptr()) } {
        say(
            "network",
            &format!("the kernel refuses to let this process read the node: {e}"),
        );
        return Ok(None);
    }
    if got != h.probe {
        say(
            "network",
            "the node's probe bytes differ: not the process it claims to be",
        );
        return Ok(None);
    }
    // Prove this process to the node: the nonce, in our memory, read by it.
    let nonce = Box::new(h.nonce);
    let pid = local.me.pid.to_string();
    let start = local.me.start.to_string();
    let at = format!("{:x}", nonce.as_ptr() as u64);
    let proved = exchange(
        conn,
        &[
            b"STRATA.CMA",
            b"PROVE",
            pid.as_bytes(),
            start.as_bytes(),
            at.as_bytes(),
        ],
    )
    .await?;
    drop(nonce);
    match proved {
        Ok(_) => {
            say("cma", "same host, same user, reads permitted both ways");
            Ok(Some(link))
        }
        Err(e) => {
            say("network", &e.to_string());
            Ok(None)
        }
    }
}

/// One command on `conn`: `Err` for a broken connection, `Ok(Err)` for an
/// error reply.
async fn exchange(conn: &mut Conn, args: &[&[u8]]) -> Result<Result<BytesFrame>> {
    conn.send(&[args]).await?;
    match conn.recv().await {
        Err(e) if e.breaks_connection() => Err(e),
        reply => Ok(reply),
    }
}

struct Hello {
    boot_id: String,
    pid_ns: u64,
    uid: u32,
    pid: u32,
    start: u64,
    probe_addr: u64,
    probe: [u8; NONCE_BYTES],
    nonce: [u8; NONCE_BYTES],
    lease_ttl_ms: u64,
}

impl Hello {
    fn parse(parts: &[BytesFrame]) -> Option<Hello> {
        let text = |i: usize| match parts.get(i)? {
            BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => {
                std::str::from_utf8(b).ok().map(str::to_owned)
            }
            _ => None,
        };
        let int = |i: usize| match parts.get(i)? {
            BytesFrame::Integer(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        if parts.len() != 9 {
            return None;
        }
        Some(Hello {
            boot_id: text(0)?,
            pid_ns: int(1)?,
            uid: u32::try_from(int(2)?).ok()?,
            pid: u32::try_from(int(3)?).ok()?,
            start: int(4)?,
            probe_addr: u64::from_str_radix(&text(5)?, 16).ok()?,
            probe: unhex(&text(6)?)?,
            nonce: unhex(&text(7)?)?,
            lease_ttl_ms: int(8)?,
        })
    }
}

fn unhex(s: &str) -> Option<[u8; NONCE_BYTES]> {
    if s.len() != 2 * NONCE_BYTES {
        return None;
    }
    let mut out = [0u8; NONCE_BYTES];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}
