//! The slot map: for each of the 16384 hash slots, the node that owns it
//! and the nodes that hold its replicas, parsed from `CLUSTER SLOTS` (which
//! lists the replicas failover needs) or `CLUSTER SHARDS` (owners only).
//! Pure: no sockets, no clocks.

use redis_protocol::resp2::types::BytesFrame;
use strata_ring::SLOTS;

use crate::conn::unexpected;
use crate::{Error, Result};

/// `slot_set` value of a slot no range covers.
const UNASSIGNED: u32 = u32::MAX;

/// Who serves each slot, as one node described it.
#[derive(Debug)]
pub(crate) struct SlotMap {
    /// Index into `sets` per slot, or `UNASSIGNED`.
    slot_set: Vec<u32>,
    /// RESP addresses, owner first, then replicas in ring order.
    sets: Vec<Vec<String>>,
    /// False when the node has no cluster commands (plain Redis) and stands
    /// for every slot: nothing to refresh then.
    pub(crate) cluster: bool,
}

impl SlotMap {
    /// `addr` owns every slot.
    pub(crate) fn single(addr: &str, cluster: bool) -> Self {
        Self {
            slot_set: vec![0; usize::from(SLOTS)],
            sets: vec![vec![addr.to_owned()]],
            cluster,
        }
    }

    /// Owner then replicas of `slot`; empty if no node serves it.
    pub(crate) fn nodes(&self, slot: u16) -> &[String] {
        match self.slot_set.get(usize::from(slot)) {
            Some(&i) if i != UNASSIGNED => &self.sets[i as usize],
            _ => &[],
        }
    }

    /// Every node named, owners before replicas, each once.
    pub(crate) fn addrs(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let width = self.sets.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..width {
            for addr in self.sets.iter().filter_map(|s| s.get(rank)) {
                if !out.contains(addr) {
                    out.push(addr.clone());
                }
            }
        }
        out
    }

    /// `CLUSTER SLOTS`: `[[start, end, [ip, port, id...], [replica...]...]...]`.
    /// `asked` is the node that answered (for empty ips, and for a node
    /// alone, which is reached as the client reached it).
    pub(crate) fn from_slots(frame: &BytesFrame, asked: &str) -> Result<Self> {
        let mut ranges = Vec::new();
        for range in array(frame, "CLUSTER SLOTS ranges")? {
            let items = array(range, "[start, end, node...]")?;
            if items.len() < 3 {
                return Err(unexpected("[start, end, node...]", range));
            }
            let nodes = items[2..]
                .iter()
                .map(|n| {
                    let n = array(n, "[ip, port, id]")?;
                    match n {
                        [ip, port, ..] => node_addr(&text(ip)?, int(port)?, asked),
                        _ => Err(Error::Protocol("slot node without ip and port".into())),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            ranges.push((slot(&items[0])?, slot(&items[1])?, nodes));
        }
        Self::build(ranges, asked)
    }

    /// `CLUSTER SHARDS`: per shard a flat map with `slots` (flat start/end
    /// list) and `nodes` (flat maps with `ip` and `port`).
    pub(crate) fn from_shards(frame: &BytesFrame, asked: &str) -> Result<Self> {
        let mut ranges = Vec::new();
        for shard in array(frame, "CLUSTER SHARDS")? {
            let (mut slots, mut nodes) = (Vec::new(), Vec::new());
            for (k, v) in pairs(shard)? {
                match &k[..] {
                    b"slots" => {
                        slots = array(v, "slots")?.iter().map(slot).collect::<Result<_>>()?
                    }
                    b"nodes" => {
                        for node in array(v, "nodes")? {
                            let (mut ip, mut port) = (None, None);
                            for (k, v) in pairs(node)? {
                                match &k[..] {
                                    b"ip" => ip = Some(text(v)?),
                                    b"port" => port = Some(int(v)?),
                                    _ => {}
                                }
                            }
                            if let (Some(ip), Some(port)) = (ip, port) {
                                nodes.push(node_addr(&ip, port, asked)?);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if slots.len() % 2 != 0 || nodes.is_empty() {
                return Err(unexpected("slots in pairs and a node", shard));
            }
            for pair in slots.chunks(2) {
                ranges.push((pair[0], pair[1], nodes.clone()));
            }
        }
        Self::build(ranges, asked)
    }

    fn build(ranges: Vec<(u16, u16, Vec<String>)>, asked: &str) -> Result<Self> {
        if ranges.is_empty() {
            return Err(Error::Protocol("the node serves no slots yet".into()));
        }
        let mut map = Self {
            slot_set: vec![UNASSIGNED; usize::from(SLOTS)],
            sets: Vec::new(),
            cluster: true,
        };
        for (start, end, nodes) in ranges {
            if start > end || end >= SLOTS || nodes.is_empty() {
                return Err(Error::Protocol(format!("bad slot range {start}-{end}")));
            }
            let i = match map.sets.iter().position(|s| *s == nodes) {
                Some(i) => i,
                None => {
                    map.sets.push(nodes);
                    map.sets.len() - 1
                }
            };
            map.slot_set[usize::from(start)..=usize::from(end)].fill(i as u32);
        }
        // A node alone (standalone, or behind NAT/port mapping) may
        // advertise an address this client cannot use; the one it was
        // reached at works.
        if map.addrs().len() == 1 {
            for set in &mut map.sets {
                set[0] = asked.to_owned();
            }
        }
        Ok(map)
    }
}

fn array<'a>(frame: &'a BytesFrame, what: &str) -> Result<&'a [BytesFrame]> {
    match frame {
        BytesFrame::Array(items) => Ok(items),
        other => Err(unexpected(what, other)),
    }
}

/// A RESP2 map: an array of alternating keys and values.
fn pairs(frame: &BytesFrame) -> Result<Vec<(Vec<u8>, &BytesFrame)>> {
    let items = array(frame, "a flat map")?;
    if items.len() % 2 != 0 {
        return Err(unexpected("a flat map", frame));
    }
    items
        .chunks(2)
        .map(|kv| Ok((text(&kv[0])?.to_ascii_lowercase(), &kv[1])))
        .collect()
}

fn text(frame: &BytesFrame) -> Result<Vec<u8>> {
    match frame {
        BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Ok(b.to_vec()),
        other => Err(unexpected("a string", other)),
    }
}

fn int(frame: &BytesFrame) -> Result<i64> {
    match frame {
        BytesFrame::Integer(n) => Ok(*n),
        BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected("an integer", frame)),
        other => Err(unexpected("an integer", other)),
    }
}

fn slot(frame: &BytesFrame) -> Result<u16> {
    u16::try_from(int(frame)?)
        .ok()
        .filter(|&s| s < SLOTS)
        .ok_or_else(|| unexpected("a slot number", frame))
}

/// `host:port` of a listed node; an empty or `?` ip means the node asked.
fn node_addr(ip: &[u8], port: i64, asked: &str) -> Result<String> {
    let port = u16::try_from(port)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| Error::Protocol(format!("bad port {port}")))?;
    let ip = String::from_utf8_lossy(ip);
    let host = match &*ip {
        "" | "?" => asked.rsplit_once(':').map_or(asked, |(h, _)| h).to_owned(),
        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        h => h.to_owned(),
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn bulk(s: &str) -> BytesFrame {
        BytesFrame::BulkString(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn node(ip: &str, port: i64) -> BytesFrame {
        BytesFrame::Array(vec![bulk(ip), BytesFrame::Integer(port), bulk("id")])
    }

    fn range(start: i64, end: i64, nodes: Vec<BytesFrame>) -> BytesFrame {
        let mut items = vec![BytesFrame::Integer(start), BytesFrame::Integer(end)];
        items.extend(nodes);
        BytesFrame::Array(items)
    }

    #[test]
    fn slots_reply_gives_owner_and_replicas() {
        let reply = BytesFrame::Array(vec![
            range(0, 99, vec![node("10.0.0.1", 7379), node("10.0.0.2", 7379)]),
            range(
                100,
                16383,
                vec![node("10.0.0.2", 7379), node("10.0.0.3", 7379)],
            ),
        ]);
        let map = SlotMap::from_slots(&reply, "seed:1").expect("parse");
        assert_eq!(map.nodes(0), ["10.0.0.1:7379", "10.0.0.2:7379"]);
        assert_eq!(map.nodes(99)[0], "10.0.0.1:7379");
        assert_eq!(map.nodes(100), ["10.0.0.2:7379", "10.0.0.3:7379"]);
        assert_eq!(
            map.addrs(),
            ["10.0.0.1:7379", "10.0.0.2:7379", "10.0.0.3:7379"]
        );
    }

    #[test]
    fn a_node_alone_is_reached_at_the_asked_address() {
        let reply = BytesFrame::Array(vec![range(0, 16383, vec![node("0.0.0.0", 7379)])]);
        let map = SlotMap::from_slots(&reply, "localhost:17379").expect("parse");
        assert_eq!(map.nodes(5), ["localhost:17379"]);
    }

    #[test]
    fn gaps_are_unassigned_and_bad_ranges_refused() {
        let reply = BytesFrame::Array(vec![
            range(0, 9, vec![node("a", 1)]),
            range(20, 16383, vec![node("b", 2)]),
        ]);
        let map = SlotMap::from_slots(&reply, "a:1").expect("parse");
        assert!(map.nodes(15).is_empty());
        let bad = BytesFrame::Array(vec![range(9, 3, vec![node("a", 1)])]);
        assert!(SlotMap::from_slots(&bad, "a:1").is_err());
        let bad = BytesFrame::Array(vec![range(0, 16384, vec![node("a", 1)])]);
        assert!(SlotMap::from_slots(&bad, "a:1").is_err());
        assert!(SlotMap::from_slots(&BytesFrame::Array(vec![]), "a:1").is_err());
    }

    #[test]
    fn shards_reply_gives_owners() {
        let shard = |slots: &[i64], ip: &str, port: i64| {
            BytesFrame::Array(vec![
                bulk("slots"),
                BytesFrame::Array(slots.iter().map(|&s| BytesFrame::Integer(s)).collect()),
                bulk("nodes"),
                BytesFrame::Array(vec![BytesFrame::Array(vec![
                    bulk("id"),
                    bulk("x"),
                    bulk("port"),
                    BytesFrame::Integer(port),
                    bulk("ip"),
                    bulk(ip),
                ])]),
            ])
        };
        let reply = BytesFrame::Array(vec![
            shard(&[0, 10, 20, 30], "h1", 1),
            shard(&[11, 19, 31, 16383], "h2", 2),
        ]);
        let map = SlotMap::from_shards(&reply, "h1:1").expect("parse");
        assert_eq!(map.nodes(25), ["h1:1"]);
        assert_eq!(map.nodes(15), ["h2:2"]);
        assert_eq!(map.nodes(16383), ["h2:2"]);
    }
}
