//! What a node says about itself to the cluster.
//!
//! A `NodeRecord` is registered by each node as JSON under
//! `/strata/<cluster>/nodes/<id>` in etcd and read back by every other node
//! and client to build the same ring. The JSON field names are therefore a
//! wire format shared by processes of different releases: never rename or
//! retype a field; add new ones with `#[serde(default)]` so older records
//! still parse. Unknown fields are ignored so older readers accept newer
//! records. This module only describes the record; it never talks to etcd.

use serde::{Deserialize, Serialize};

/// One cluster member as registered in etcd.
///
/// Placement reads only `id` and `capacity_bytes`; replica placement also
/// reads `host`. The addresses are carried so that whoever holds a ring can
/// redirect (`-MOVED`) and print `CLUSTER SLOTS` without another lookup.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeRecord {
    /// `id`: stable, unique node name. It names the node's virtual points on
    /// the ring, so a node that restarts with the same id gets the same slots
    /// back; changing it moves the node's slots.
    pub id: String,
    /// `resp_addr`: `host:port` where the node speaks RESP; the target of
    /// `-MOVED` redirects and of `CLUSTER SLOTS` entries.
    pub resp_addr: String,
    /// `data_addr`: data-plane endpoint that peers do one-sided reads from
    /// (the TCP emulation's listener, or the verbs side channel).
    pub data_addr: String,
    /// `host`: failure domain, normally the machine's hostname. Replicas of a
    /// slot go to distinct hosts, so two nodes on one machine never hold both
    /// copies.
    pub host: String,
    /// `capacity_bytes`: total bytes the node can store across its tiers. It
    /// is the node's weight on the ring: twice the capacity, about twice the
    /// slots.
    pub capacity_bytes: u64,
    /// `tiers`: capacity and usage per tier (`dram`, `nvme`, `gpu`), for
    /// operators and capacity-aware clients. Not read by placement, so a
    /// change of usage never moves slots. Added after the first release:
    /// older records without it parse with an empty list.
    #[serde(default)]
    pub tiers: Vec<TierUsage>,
    /// `incarnation`: when this process started (Unix ms). A node that
    /// restarts under the same id comes back with a new one: it may have
    /// lost what it held in memory, so repair treats its slots as changed
    /// and the other holders push their copies to it. Not read by
    /// placement. Added after the first release: older records parse as 0.
    #[serde(default)]
    pub incarnation: u64,
    /// `process`: the node process, for peers on the same host that copy
    /// replicas by cross-memory attach (`cma: auto`): they read only a
    /// process the ring names. Absent with `cma: off` and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessRecord>,
}

/// Who a node process is, as [`NodeRecord::process`] publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub pid: u32,
    /// Start time in clock ticks after boot (a recycled pid has another).
    pub start: u64,
    /// The kernel's boot id: equal only on the same running host.
    pub boot_id: String,
    /// Inode of the pid namespace.
    pub pid_ns: u64,
    pub uid: u32,
}

/// One tier's figures in a [`NodeRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierUsage {
    /// `tier`: `dram`, `nvme` or `gpu`.
    pub tier: String,
    /// `capacity_bytes`: the tier's size.
    pub capacity_bytes: u64,
    /// `used_bytes`: bytes of the tier in use.
    pub used_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_field_names_are_stable() {
        let node = NodeRecord {
            id: "n1".into(),
            resp_addr: "10.0.0.1:6379".into(),
            data_addr: "10.0.0.1:7000".into(),
            host: "h1".into(),
            capacity_bytes: 1 << 30,
            tiers: vec![TierUsage {
                tier: "dram".into(),
                capacity_bytes: 1 << 30,
                used_bytes: 5,
            }],
            incarnation: 7,
            process: None,
        };
        let json = serde_json::to_string(&node).expect("serialise");
        assert_eq!(
            json,
            r#"{"id":"n1","resp_addr":"10.0.0.1:6379","data_addr":"10.0.0.1:7000","host":"h1","capacity_bytes":1073741824,"tiers":[{"tier":"dram","capacity_bytes":1073741824,"used_bytes":5}],"incarnation":7}"#
        );
        // Records of the first release (no `tiers`) still parse.
        let old =
            r#"{"id":"n1","resp_addr":"a:1","data_addr":"a:2","host":"h","capacity_bytes":5}"#;
        let parsed = serde_json::from_str::<NodeRecord>(old).expect("parse");
        assert!(parsed.tiers.is_empty());
        assert_eq!(parsed.incarnation, 0);
        assert_eq!(serde_json::from_str::<NodeRecord>(&json).ok(), Some(node));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let json = r#"{"id":"n1","resp_addr":"a:1","data_addr":"a:2","host":"h","capacity_bytes":5,"zone":"z"}"#;
        let node: NodeRecord = serde_json::from_str(json).expect("parse");
        assert_eq!(node.capacity_bytes, 5);
    }
}
