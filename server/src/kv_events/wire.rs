//! vLLM's KV-event wire format, as `vllm/distributed/kv_events.py` (vLLM
//! 0.33.0) encodes it with msgspec: a batch is a msgpack array
//! `[ts, events, data_parallel_rank]` (`EventBatch` is `array_like`), and
//! each event a map tagged by its class name in `"type"`, fields in
//! declaration order, the fields that have defaults left out when they
//! hold them (`omit_defaults`). Pure: no sockets, no clocks.
//!
//! This module also turns the node's queue of per-key changes into events
//! ([`Coalescer`]): a block stored as many keys (one per layer, or per K
//! and V) becomes one event per batch, not one per key.

use std::collections::HashMap;

use serde::Serialize;

/// Where a copy lives, named as vLLM names its media
/// (`MEDIUM_GPU`, `MEDIUM_CPU`, `MEDIUM_STORAGE`), so a router that
/// weighs vLLM's offloading tiers weighs strata's the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// The GPU tier (`gpu_memory_pool_size`).
    Gpu,
    /// The DRAM arena (`cpu_memory_pool_size`).
    Cpu,
    /// The NVMe tier (`ssd_path`).
    Storage,
}

impl Medium {
    pub fn name(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Storage => "STORAGE",
        }
    }
}

/// One change the node queues for the publisher: 16 bytes, no heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A copy of block `hash` is now in the medium.
    Stored(Medium, u64),
    /// The copy of block `hash` in the medium is gone (others may remain).
    Removed(Medium, u64),
    /// Block `hash` left the node: every medium's copy is gone.
    Gone(u64),
    /// Every block left the node (`FLUSHALL`).
    Cleared,
}

/// An event of vLLM's `KVEventBatch.events`; the variant name is the tag.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Event {
    BlockStored {
        block_hashes: Vec<u64>,
        /// The parent's hash is not in a strata key: always nil. strata's
        /// block hashes are chained (each commits to the whole prefix), so
        /// a router needs no parent to place a block.
        parent_block_hash: Option<u64>,
        /// Not in a strata key either: always empty.
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<u32>,
        medium: &'static str,
        lora_name: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: &'static str,
    },
    AllBlocksCleared,
}

/// One encoded batch: what goes in the message's third frame.
pub fn encode_batch(ts: f64, events: &[Event], data_parallel_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 112);
    let mut ser = rmp_serde::Serializer::new(&mut out).with_struct_map();
    // A tuple is a msgpack array; each event's struct is a map (above).
    (ts, events, data_parallel_rank)
        .serialize(&mut ser)
        .expect("events of plain numbers and strings always encode");
    out
}

/// Turns a run of [`Change`]s into events, in order, without repeats: a
/// change that leaves a (block, medium) as the batch already said it is
/// is dropped, so the 32 layer keys of one block stored together make one
/// `BlockStored`. Consecutive removals from one medium share one
/// `BlockRemoved` (vLLM's field is a list for that).
#[derive(Debug)]
pub struct Coalescer {
    /// The media this node has, for [`Change::Gone`].
    media: Vec<Medium>,
    block_size: u32,
    /// What this batch last said of each (block, medium): stored or not.
    said: HashMap<(u64, Medium), bool>,
    events: Vec<Event>,
}

impl Coalescer {
    pub fn new(media: Vec<Medium>, block_size: u32) -> Coalescer {
        Coalescer {
            media,
            block_size,
            said: HashMap::new(),
            events: Vec::new(),
        }
    }

    pub fn push(&mut self, change: Change) {
        match change {
            Change::Stored(m, h) => self.stored(m, h),
            Change::Removed(m, h) => self.removed(m, h),
            Change::Gone(h) => {
                for i in 0..self.media.len() {
                    self.removed(self.media[i], h);
                }
            }
            Change::Cleared => {
                self.said.clear();
                if self.events.last() != Some(&Event::AllBlocksCleared) {
                    self.events.push(Event::AllBlocksCleared);
                }
            }
        }
    }

    /// The batch's events; the coalescer starts a new batch.
    pub fn take(&mut self) -> Vec<Event> {
        self.said.clear();
        std::mem::take(&mut self.events)
    }

    fn stored(&mut self, medium: Medium, hash: u64) {
        if self.said.insert((hash, medium), true) == Some(true) {
            return;
        }
        self.events.push(Event::BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: self.block_size,
            lora_id: None,
            medium: medium.name(),
            lora_name: None,
        });
    }

    fn removed(&mut self, medium: Medium, hash: u64) {
        if self.said.insert((hash, medium), false) == Some(false) {
            return;
        }
        if let Some(Event::BlockRemoved {
            block_hashes,
            medium: last,
        }) = self.events.last_mut()
        {
            if *last == medium.name() {
                block_hashes.push(hash);
                return;
            }
        }
        self.events.push(Event::BlockRemoved {
            block_hashes: vec![hash],
            medium: medium.name(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], medium: Medium) -> Event {
        Event::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: 16,
            lora_id: None,
            medium: medium.name(),
            lora_name: None,
        }
    }

    /// The bytes msgspec writes for `KVEventBatch(ts=1.5, events=[
    /// BlockStored([2**64-1, 5], None, [], 16, None, "CPU", None),
    /// BlockRemoved([7], "GPU"), AllBlocksCleared()],
    /// data_parallel_rank=0)` in vLLM 0.33.0's venv.
    const MSGSPEC: &str = "93cb3ff800000000000093de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfffffffffffffffff05b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";

    /// Byte for byte what msgspec writes but one header: msgspec opens a
    /// struct that may have more than 15 fields (BlockStored has 15 and
    /// its tag) with a map16 header (`de 0008`) even when fewer are
    /// written; rmp writes the shortest header (`88`). Both are the same
    /// msgpack map to any decoder (vLLM's own decodes ours in
    /// python/tests/vllm/test_vllm_kv_events.py).
    #[test]
    fn batches_encode_as_msgspec_does() {
        let events = [
            stored(&[u64::MAX, 5], Medium::Cpu),
            Event::BlockRemoved {
                block_hashes: vec![7],
                medium: "GPU",
            },
            Event::AllBlocksCleared,
        ];
        let hex: String = encode_batch(1.5, &events, 0)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, MSGSPEC.replacen("de0008", "88", 1));
    }

    #[test]
    fn a_block_of_many_keys_is_one_event_and_order_is_kept() {
        let media = vec![Medium::Cpu, Medium::Storage];
        let mut c = Coalescer::new(media, 16);
        // Layer keys of blocks 1 and 2, layer-major as the vLLM adapter
        // writes them.
        for _layer in 0..4 {
            c.push(Change::Stored(Medium::Cpu, 1));
            c.push(Change::Stored(Medium::Cpu, 2));
        }
        // Block 1 spills, then is deleted; block 2 is deleted twice.
        c.push(Change::Removed(Medium::Cpu, 1));
        c.push(Change::Stored(Medium::Storage, 1));
        c.push(Change::Gone(1));
        c.push(Change::Gone(2));
        c.push(Change::Gone(2));
        let removed = |h: &[u64], m: Medium| Event::BlockRemoved {
            block_hashes: h.to_vec(),
            medium: m.name(),
        };
        assert_eq!(
            c.take(),
            vec![
                stored(&[1], Medium::Cpu),
                stored(&[2], Medium::Cpu),
                removed(&[1], Medium::Cpu),
                stored(&[1], Medium::Storage),
                // Block 1's CPU copy was already said gone.
                removed(&[1], Medium::Storage),
                removed(&[2], Medium::Cpu),
                removed(&[2], Medium::Storage),
            ]
        );
        // A new batch says everything again.
        c.push(Change::Stored(Medium::Cpu, 1));
        c.push(Change::Cleared);
        c.push(Change::Cleared);
        c.push(Change::Stored(Medium::Cpu, 1));
        assert_eq!(
            c.take(),
            vec![
                stored(&[1], Medium::Cpu),
                Event::AllBlocksCleared,
                stored(&[1], Medium::Cpu),
            ]
        );
    }
}
