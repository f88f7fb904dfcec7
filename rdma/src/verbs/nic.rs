//! One opened RDMA device: protection domain, the completion queue every
//! queue pair shares, and the queue-pair state changes of an RC connection.
//!
//! Everything here is a thin, checked layer over `sideway`; it owns no
//! sockets and no tasks.

use std::error::Error as StdError;
use std::net::Ipv6Addr;
use std::sync::Arc;

use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairState};
use sideway::ibverbs::AccessFlags;

use super::{CQ_DEPTH, WINDOW};
use crate::handshake::Hello;
use crate::TransferError;

/// Port of the device used; multi-port NICs expose each port as its own
/// RoCE device in practice.
const PORT: u8 = 1;
/// Local ACK timeout exponent: 4.096 µs × 2^14 ≈ 67 ms per try. Long
/// enough for a software RoCE peer under load, short enough that seven
/// tries detect a dead peer in about half a second.
const ACK_TIMEOUT: u8 = 14;
/// Transport retries before a work request fails with RETRY_EXC.
const RETRY_CNT: u8 = 7;
/// Minimum RNR NAK timer (code 12 ≈ 0.64 ms); READs never hit RNR, but
/// the field must be set on RTR.
const MIN_RNR_TIMER: u8 = 12;
/// GRH hop limit; RoCEv2 routes over IP, so the usual IP TTL.
const HOP_LIMIT: u8 = 64;

/// Why no device could be used; the text names what was found.
#[derive(Debug, thiserror::Error)]
#[error("no RDMA device: {0}")]
pub struct NoDevice(pub String);

/// An opened device with everything the transport shares across queue
/// pairs.
pub(crate) struct Nic {
    pub(crate) name: String,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) channel: Arc<CompletionChannel>,
    pub(crate) cq: Arc<BasicCompletionQueue>,
    gid: Gid,
    gid_index: u8,
    lid: u16,
    mtu: Mtu,
    /// Outstanding RDMA READs per queue pair, both as initiator and as
    /// responder: the device's limit, capped at our window.
    rd_atomic: u8,
    // Declared last: dropped after the objects created from it.
    _ctx: Arc<DeviceContext>,
}

/// The GID this port is reached by.
struct Addressing {
    gid: Gid,
    gid_index: u8,
    lid: u16,
    mtu: Mtu,
}

impl Nic {
    /// Opens `name`, or with `None` the first device with an active port
    /// that has a RoCEv2 GID.
    pub(crate) fn open(name: Option<&str>) -> Result<Nic, NoDevice> {
        let list = DeviceList::new().map_err(|e| {
            let hint = if chain(&e).contains("Operation not supported") {
                " (libibverbs.so.1 could not be loaded: install libibverbs1 and a provider)"
            } else {
                ""
            };
            NoDevice(format!("ibv_get_device_list failed: {}{hint}", chain(&e)))
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        if names.is_empty() {
            return Err(NoDevice(
                "ibv_get_device_list found no devices (is a driver such as rdma_rxe or mlx5_ib loaded?)"
                    .into(),
            ));
        }
        let mut why = Vec::new();
        for device in list.iter() {
            let dev_name = device.name();
            if name.is_some_and(|n| n != dev_name) {
                continue;
            }
            let ctx = match device.open() {
                Ok(ctx) => ctx,
                Err(e) => {
                    why.push(format!("{dev_name}: cannot open: {}", chain(&e)));
                    continue;
                }
            };
            match addressing(&ctx) {
                Ok(a) => return Nic::new(dev_name, ctx, a),
                Err(reason) => why.push(format!("{dev_name}: {reason}")),
            }
        }
        Err(NoDevice(match name {
            Some(n) if why.is_empty() => {
                format!("device {n:?} not found (found: {})", names.join(", "))
            }
            _ => format!("no usable device ({})", why.join("; ")),
        }))
    }

    fn new(name: String, ctx: Arc<DeviceContext>, a: Addressing) -> Result<Nic, NoDevice> {
        let fail = |what: &str, e: &dyn StdError| NoDevice(format!("{name}: {what}: {}", chain(e)));
        let attr = ctx.query_device().map_err(|e| fail("query_device", &e))?;
        let rd_atomic = attr
            .max_qp_rd_atom()
            .min(attr.max_qp_init_rd_atom())
            .clamp(1, WINDOW as i32) as u8;
        let pd = ctx.alloc_pd().map_err(|e| fail("alloc_pd", &e))?;
        let channel = ctx
            .create_comp_channel()
            .map_err(|e| fail("create_comp_channel", &e))?;
        // The poller thread waits on the channel's fd with poll(2) and must
        // never block inside ibv_get_cq_event.
        channel
            .set_nonblocking(true)
            .map_err(|e| fail("completion channel O_NONBLOCK", &e))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(CQ_DEPTH)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| fail("create_cq", &e))?;
        Ok(Nic {
            name,
            pd,
            channel,
            cq,
            gid: a.gid,
            gid_index: a.gid_index,
            lid: a.lid,
            mtu: a.mtu,
            rd_atomic,
            _ctx: ctx,
        })
    }

    /// The GID as text, for logs.
    pub(crate) fn gid_text(&self) -> String {
        format!("{} (index {})", Ipv6Addr::from(self.gid), self.gid_index)
    }

    /// A fresh RC queue pair in INIT, whose peer may READ memory registered
    /// on this device and whose own READs may land in it.
    pub(crate) fn create_qp(&self) -> Result<BasicQueuePair, TransferError> {
        let mut qp = self
            .pd
            .create_qp_builder()
            .setup_send_cq(Arc::clone(&self.cq))
            .setup_recv_cq(Arc::clone(&self.cq))
            .setup_max_send_wr(WINDOW as u32)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .build()
            .map_err(|e| verbs_err("ibv_create_qp", &e))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(PORT)
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteRead);
        qp.modify(&attr)
            .map_err(|e| verbs_err("modify_qp INIT", &e))?;
        Ok(qp)
    }

    /// What this side tells its peer about `qp`.
    pub(crate) fn hello(&self, qp: &BasicQueuePair, psn: u32) -> Hello {
        Hello {
            qpn: qp.qp_number(),
            psn,
            lid: self.lid,
            mtu: self.mtu as u8,
            rd_atomic: self.rd_atomic,
            gid: Ipv6Addr::from(self.gid).octets(),
        }
    }

    /// INIT → RTR → RTS against the peer's hello; `psn` is the one this side
    /// announced.
    pub(crate) fn connect_qp(
        &self,
        qp: &mut BasicQueuePair,
        peer: &Hello,
        psn: u32,
    ) -> Result<(), TransferError> {
        let mtu = Mtu::from(u32::from(peer.mtu.min(self.mtu as u8)));
        let mut av = AddressHandleAttribute::new();
        av.setup_dest_lid(peer.lid)
            .setup_port(PORT)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.gid_index)
            .setup_grh_dest_gid(&Gid::from(Ipv6Addr::from(peer.gid)))
            .setup_grh_hop_limit(HOP_LIMIT);
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(peer.qpn)
            .setup_rq_psn(peer.psn)
            .setup_max_dest_read_atomic(self.rd_atomic)
            .setup_min_rnr_timer(MIN_RNR_TIMER)
            .setup_address_vector(&av);
        qp.modify(&rtr)
            .map_err(|e| verbs_err("modify_qp RTR", &e))?;
        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(psn)
            .setup_timeout(ACK_TIMEOUT)
            .setup_retry_cnt(RETRY_CNT)
            .setup_rnr_retry(RETRY_CNT)
            .setup_max_read_atomic(self.rd_atomic.min(peer.rd_atomic));
        qp.modify(&rts).map_err(|e| verbs_err("modify_qp RTS", &e))
    }
}

/// Moves `qp` to ERROR: the device stops placing data for it and flushes
/// every outstanding work request with a completion.
pub(crate) fn fail_qp(qp: &mut BasicQueuePair) {
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Error);
    if let Err(e) = qp.modify(&attr) {
        tracing::warn!(error = %chain(&e), "cannot move an RDMA queue pair to ERROR");
    }
}

/// Finds an active port's RoCEv2 GID, IPv4-mapped preferred (that is the
/// one a peer reaching us by IPv4 address routes to).
fn addressing(ctx: &DeviceContext) -> Result<Addressing, String> {
    let port = ctx
        .query_port(PORT)
        .map_err(|e| format!("query_port: {}", chain(&e)))?;
    if port.port_state() != PortState::Active {
        return Err(format!(
            "port {PORT} is not active ({:?})",
            port.port_state()
        ));
    }
    let table = ctx
        .query_gid_table()
        .map_err(|e| format!("query_gid_table: {}", chain(&e)))?;
    let roce: Vec<_> = table
        .iter()
        .filter(|g| g.port_num() == u32::from(PORT) && g.gid_type() == GidType::RoceV2)
        .filter(|g| !g.gid().is_zero())
        .collect();
    let best = roce
        .iter()
        .find(|g| Ipv6Addr::from(g.gid()).to_ipv4_mapped().is_some())
        .or_else(|| roce.first())
        .ok_or_else(|| format!("port {PORT} is active but has no RoCEv2 GID"))?;
    Ok(Addressing {
        gid: best.gid(),
        gid_index: u8::try_from(best.gid_index()).map_err(|_| "GID index over 255".to_string())?,
        lid: port.lid(),
        mtu: port.active_mtu(),
    })
}

/// An error and its sources on one line: sideway's outer errors say which
/// call failed, the inner io::Error says why.
pub(crate) fn chain(e: &dyn StdError) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let s = inner.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cur = inner.source();
    }
    text
}

pub(crate) fn verbs_err(call: &str, e: &dyn StdError) -> TransferError {
    TransferError::Io(std::io::Error::other(format!("{call}: {}", chain(e))))
}
