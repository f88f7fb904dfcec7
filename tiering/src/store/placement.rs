//! GPU placement: which values live in the GPU pool, and the copies that
//! move them between it and DRAM. No copy runs under the index lock: the
//! value being copied is pinned by the mover's reference, and the index
//! swaps to the copy only if the key still holds that very value.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use crate::checksum::Crc32cStream;
use crate::dram::Chunk;

use crate::events::TierEvent;

use super::{
    try_alloc_in, LruCursor, SlotRef, Store, StoreError, Tier, Value, MAX_GPU_MOVES_PER_WRITE,
};

impl Store {
    /// Moves `slot`, just committed under `key` in DRAM, up to the GPU,
    /// making room by moving the GPU's least recently used values down. A
    /// value that cannot go up simply stays in DRAM. Copies run without the
    /// index lock; the caller's reference keeps the DRAM bytes alive (and
    /// pinned) meanwhile, and the swap happens only if `key` still holds
    /// this very slot (a write or delete that raced wins).
    pub(super) fn raise(&self, key: &Bytes, slot: &SlotRef) {
        let Some(gpu) = &self.shared.gpu else {
            return;
        };
        if slot.place != Tier::Dram || slot.len == 0 || slot.len > gpu.watermark_bytes {
            return;
        }
        let Some(chunk) = self.gpu_room(slot.len) else {
            self.gpu_full.fetch_add(1, Relaxed);
            return;
        };
        let src = Value { slot: slot.clone() };
        if let Err(e) = gpu.device.upload(chunk.offset, src.as_slice()) {
            gpu.alloc.lock().free(chunk);
            self.gpu_errors.fetch_add(1, Relaxed);
            tracing::warn!(error = %e, "GPU upload failed; the value stays in DRAM");
            return;
        }
        let moved = slot.copy_at(Tier::Gpu, chunk, true);
        gpu.value_bytes.fetch_add(slot.len, Relaxed);
        // Whatever leaves the index is dropped after the lock is released.
        let _old = {
            let mut index = self.index.lock();
            if index.holds(key, slot) {
                self.gpu_uploads.fetch_add(1, Relaxed);
                index.move_slot(key, moved)
            } else {
                // Raced: the GPU copy is freed as `moved` drops.
                Some(moved)
            }
        };
    }

    /// A GPU chunk of `len` bytes, moving the GPU's least recently used
    /// values down to DRAM until one fits; `None` if nothing more can
    /// move.
    fn gpu_room(&self, len: u64) -> Option<Chunk> {
        let gpu = self.shared.gpu.as_ref()?;
        for _ in 0..MAX_GPU_MOVES_PER_WRITE {
            if let Some(chunk) = try_alloc_in(&gpu.alloc, gpu.watermark_bytes, len) {
                return Some(chunk);
            }
            match self.demote_gpu_oldest() {
                Ok(true) => {}
                Ok(false) | Err(_) => return None,
            }
        }
        None
    }

    /// Moves the least recently used unpinned GPU value down to DRAM
    /// (which may evict DRAM values to the lower tier). The copy runs
    /// without the index lock: the value is pinned meanwhile, and the swap
    /// happens only if the key still holds it. A value whose bytes cannot
    /// be copied out is dropped (counted and logged). Returns whether a
    /// value left the GPU (`false`: none could).
    pub(super) fn demote_gpu_oldest(&self) -> Result<bool, StoreError> {
        let gpu = self
            .shared
            .gpu
            .as_ref()
            .expect("GPU value without a GPU pool");
        let (key, slot, mut res) = {
            let mut index = self.index.lock();
            let Some((_, key)) = index.oldest_unpinned(Tier::Gpu, LruCursor::START) else {
                return Ok(false);
            };
            let slot = index.get(&key).expect("just found").slot.clone();
            let chunk = self.alloc_dram_locked(&mut index, slot.len)?;
            let res = self.reservation(chunk, slot.len);
            (key, slot, res)
        };
        let copied = gpu.device.download(slot.offset, res.as_mut_slice());
        let copied_ok = copied.is_ok();
        // Whatever leaves the index is dropped after the lock is released.
        let old = {
            let mut index = self.index.lock();
            let current = index.holds(&key, &slot);
            match copied {
                Err(e) => {
                    self.gpu_errors.fetch_add(1, Relaxed);
                    tracing::error!(error = %e, "GPU download failed while moving a value to DRAM; the value is dropped");
                    current
                        .then(|| index.remove(&key).map(|e| e.slot))
                        .flatten()
                }
                // Rewritten or deleted meanwhile: it left the GPU anyway.
                Ok(()) if !current => None,
                Ok(()) => {
                    let chunk = res.chunk.take().expect("fresh reservation");
                    self.shared.value_bytes.fetch_add(slot.len, Relaxed);
                    self.gpu_demotions.fetch_add(1, Relaxed);
                    index.move_slot(&key, slot.copy_at(Tier::Dram, chunk, true))
                }
            }
        };
        if old.is_some() {
            let event = if copied_ok {
                TierEvent::Demoted
            } else {
                TierEvent::Evicted
            };
            self.note(event, &key);
        }
        Ok(true)
    }

    /// A readable value for `slot`: itself if it is in DRAM, else a private
    /// DRAM copy of its GPU bytes (freed when the reader lets go). Must be
    /// called without the index lock (it may evict).
    pub(super) fn readable(&self, key: &[u8], slot: SlotRef) -> Result<Value, StoreError> {
        if slot.place == Tier::Dram {
            return Ok(Value { slot });
        }
        let gpu = self
            .shared
            .gpu
            .as_ref()
            .expect("GPU value without a GPU pool");
        let mut res = self.reserve(slot.len)?;
        if let Err(e) = gpu.device.download(slot.offset, res.as_mut_slice()) {
            return Err(self.drop_unreadable(key, &slot, e));
        }
        self.gpu_staged.fetch_add(1, Relaxed);
        let chunk = res.chunk.take().expect("fresh reservation");
        Ok(Value {
            slot: slot.copy_at(Tier::Dram, chunk, false),
        })
    }

    /// A GPU value whose bytes could not be copied down: counted, logged,
    /// and dropped rather than answered from memory that may be wrong
    /// (only this very value: a write that raced stays). The error to
    /// return.
    fn drop_unreadable(&self, key: &[u8], slot: &SlotRef, e: impl std::fmt::Display) -> StoreError {
        self.gpu_errors.fetch_add(1, Relaxed);
        tracing::error!(error = %e, "GPU download failed; the value is dropped");
        // Whatever leaves the index is dropped after the lock is released.
        let _gone = {
            let mut index = self.index.lock();
            if index.holds(key, slot) {
                index.remove(key)
            } else {
                None
            }
        };
        StoreError::Device(e.to_string())
    }

    /// CRC32C of a GPU value, copied down through a host buffer of at most
    /// [`SUM_PIECE_BYTES`]. A failed copy drops the value, as
    /// [`Store::readable`] does.
    pub(super) fn sum_gpu(&self, key: &[u8], slot: &SlotRef) -> Result<u32, StoreError> {
        let gpu = self
            .shared
            .gpu
            .as_ref()
            .expect("GPU value without a GPU pool");
        let mut buf = vec![0u8; (slot.len as usize).min(SUM_PIECE_BYTES)];
        let mut crc = Crc32cStream::new();
        let mut at = 0u64;
        while at < slot.len {
            let n = (slot.len - at).min(buf.len() as u64) as usize;
            if let Err(e) = gpu.device.download(slot.offset + at, &mut buf[..n]) {
                return Err(self.drop_unreadable(key, slot, e));
            }
            crc.update(&buf[..n]);
            at += n as u64;
        }
        Ok(crc.finish())
    }
}

/// Largest piece of a GPU value summed at a time.
const SUM_PIECE_BYTES: usize = 1 << 20;
