//! The keys a node holds below DRAM (queued for NVMe or on it), kept by
//! [`Spill`](crate::spill::Spill) so that `EXISTS`, `PREFIX`, `SCAN`,
//! `KEYS`, `DBSIZE` and cluster repair know them without reading NVMe.
//!
//! Two views of one set: a hash map for lookups, and the same keys in SCAN
//! order (the store's scan hash, then the key), so one SCAN cursor walks
//! DRAM and NVMe together. A key whose value is also in DRAM (promoted and
//! unchanged since) is marked `resident`: DRAM lists and counts it, so
//! `DBSIZE` adds only the others.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use xxhash_rust::xxh3::Xxh3Builder;

use crate::store::scan_hash;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BelowEntry {
    pub expire_at_ms: Option<u64>,
    /// The same version is in DRAM too.
    pub resident: bool,
}

#[derive(Default)]
pub(crate) struct Below {
    map: HashMap<Bytes, BelowEntry, Xxh3Builder>,
    order: BTreeSet<(u64, Bytes)>,
    resident: usize,
}

impl Below {
    pub fn insert(&mut self, key: Bytes, expire_at_ms: Option<u64>, resident: bool) {
        let entry = BelowEntry {
            expire_at_ms,
            resident,
        };
        match self.map.insert(key.clone(), entry) {
            Some(old) => self.resident -= usize::from(old.resident),
            None => {
                self.order.insert((scan_hash(&key), key));
            }
        }
        self.resident += usize::from(resident);
    }

    pub fn remove(&mut self, key: &[u8]) -> bool {
        let Some((key, old)) = self.map.remove_entry(key) else {
            return false;
        };
        self.resident -= usize::from(old.resident);
        self.order.remove(&(scan_hash(&key), key));
        true
    }

    pub fn get(&self, key: &[u8]) -> Option<BelowEntry> {
        self.map.get(key).copied()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Keys whose only copy is below DRAM.
    pub fn only_below(&self) -> usize {
        self.map.len() - self.resident
    }

    pub fn clear(&mut self) {
        *self = Below::default();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &BelowEntry)> {
        self.map.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Bytes> {
        self.map.keys()
    }

    /// Keys in SCAN order from `cursor` (a scan hash) on.
    pub fn scan_from(&self, cursor: u64) -> impl Iterator<Item = (u64, &Bytes)> {
        self.order
            .range((cursor, Bytes::new())..)
            .map(|(h, k)| (*h, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_views_and_the_resident_count_stay_in_step() {
        let mut b = Below::default();
        b.insert(Bytes::from_static(b"a"), None, false);
        b.insert(Bytes::from_static(b"b"), Some(5), true);
        b.insert(Bytes::from_static(b"c"), None, false);
        assert_eq!((b.len(), b.only_below()), (3, 2));
        // Re-inserting changes the flag, never the count of keys.
        b.insert(Bytes::from_static(b"b"), Some(5), false);
        b.insert(Bytes::from_static(b"a"), None, true);
        assert_eq!((b.len(), b.only_below()), (3, 2));
        assert!(b.remove(b"a"));
        assert!(!b.remove(b"a"));
        assert_eq!((b.len(), b.only_below()), (2, 2));
        let mut walked: Vec<_> = b.scan_from(0).map(|(_, k)| k.clone()).collect();
        walked.sort();
        assert_eq!(
            walked,
            vec![Bytes::from_static(b"b"), Bytes::from_static(b"c")]
        );
        let hashes: Vec<u64> = b.scan_from(0).map(|(h, _)| h).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]), "scan order");
        b.clear();
        assert_eq!((b.len(), b.only_below(), b.scan_from(0).count()), (0, 0, 0));
    }
}
