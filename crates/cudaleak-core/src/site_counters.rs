//! Live bytes and blocks per interned trace (call site), kept as the
//! program runs so that a sampler can draw memory over time by call site
//! without reading the live map (issue 13).
//!
//! The hook path pays one relaxed atomic add on allocation and one on
//! release: blocks and bytes share one 64-bit word, bytes in the low
//! [`BYTES_BITS`] bits and blocks above. Both move together, so one add of
//! `(1 << BYTES_BITS) + size` keeps both. Bytes are exact up to 16 TiB live
//! per call site; the block count is kept modulo 2^20 (a million live
//! blocks of one call site wrap it; the dumps count blocks exactly).
//!
//! Counters live in chunks allocated on a trace's first block, indexed as
//! the depot indexes traces; a chunk is never freed.

use crate::record::TraceId;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub const BYTES_BITS: u32 = 44;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const CHUNK: usize = 4096;
/// Enough for every trace id the depot can give (`depot::MAX_TRACES`).
const CHUNKS: usize = (crate::depot::MAX_TRACES as usize + 1).div_ceil(CHUNK);

type Chunk = [AtomicU64; CHUNK];

pub struct SiteCounters {
    chunks: [AtomicPtr<Chunk>; CHUNKS],
}

impl Default for SiteCounters {
    fn default() -> Self {
        Self::new()
    }
}

#[inline]
fn delta(size: u64) -> u64 {
    (1u64 << BYTES_BITS).wrapping_add(size.min(BYTES_MASK))
}

/// A packed word as (bytes, blocks). A word read while a release on one
/// thread ran ahead of the allocation's add on another can be "negative"
/// for a moment: it reads as zero.
pub fn unpack(word: u64) -> (u64, u64) {
    let bytes = word & BYTES_MASK;
    if bytes > BYTES_MASK / 2 {
        return (0, 0);
    }
    (bytes, word >> BYTES_BITS)
}

impl SiteCounters {
    pub const fn new() -> SiteCounters {
        SiteCounters {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
        }
    }

    #[inline(always)]
    fn slot(&self, trace: TraceId) -> Option<&AtomicU64> {
        let i = trace.0 as usize;
        let holder = self.chunks.get(i / CHUNK)?;
        let mut chunk = holder.load(Ordering::Acquire);
        if chunk.is_null() {
            chunk = Self::first_in_chunk(holder)?;
        }
        // SAFETY: published chunks are never freed.
        Some(unsafe { &(*chunk)[i % CHUNK] })
    }

    /// The first block of a trace in a chunk without counters yet (the
    /// trace was just interned, which allocated too): out of line, so the
    /// hot path stays a load, a test and an add.
    #[cold]
    #[inline(never)]
    fn first_in_chunk(holder: &AtomicPtr<Chunk>) -> Option<*mut Chunk> {
        // Zeroed atomics are valid.
        let layout = std::alloc::Layout::new::<Chunk>();
        // SAFETY: a non-zero-sized layout.
        let fresh = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Chunk>();
        if fresh.is_null() {
            return None;
        }
        match holder.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(fresh),
            Err(other) => {
                // SAFETY: ours, never published.
                unsafe { std::alloc::dealloc(fresh.cast(), layout) };
                Some(other)
            }
        }
    }

    #[inline]
    pub fn add(&self, trace: TraceId, size: u64) {
        if let Some(c) = self.slot(trace) {
            c.fetch_add(delta(size), Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn sub(&self, trace: TraceId, size: u64) {
        if let Some(c) = self.slot(trace) {
            c.fetch_sub(delta(size), Ordering::Relaxed);
        }
    }

    /// Calls `f(trace, bytes, blocks)` for every trace id below `limit`
    /// with live bytes or blocks.
    pub fn for_each_live(&self, limit: u32, mut f: impl FnMut(TraceId, u64, u64)) {
        let limit = (limit as usize).min(CHUNK * CHUNKS);
        for (ci, holder) in self.chunks.iter().enumerate().take(limit.div_ceil(CHUNK)) {
            let chunk = holder.load(Ordering::Acquire);
            if chunk.is_null() {
                continue;
            }
            // SAFETY: published chunks are never freed.
            let chunk = unsafe { &*chunk };
            for (j, word) in chunk.iter().enumerate() {
                let id = ci * CHUNK + j;
                if id > limit {
                    break;
                }
                let (bytes, blocks) = unpack(word.load(Ordering::Relaxed));
                if bytes > 0 || blocks > 0 {
                    f(TraceId(id as u32), bytes, blocks);
                }
            }
        }
    }

    /// Every counter back to zero (a forked child starts from nothing).
    pub fn reset(&self) {
        for holder in &self.chunks {
            let chunk = holder.load(Ordering::Acquire);
            if !chunk.is_null() {
                // SAFETY: published chunks are never freed.
                for word in unsafe { &*chunk } {
                    word.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_bytes_move_together_per_trace() {
        let c = SiteCounters::new();
        c.add(TraceId(1), 100);
        c.add(TraceId(1), 50);
        c.add(TraceId(5000), 1 << 40);
        c.sub(TraceId(1), 100);
        let mut seen = Vec::new();
        c.for_each_live(6000, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(1, 50, 1), (5000, 1 << 40, 1)]);
        c.sub(TraceId(1), 50);
        c.sub(TraceId(5000), 1 << 40);
        let mut n = 0;
        c.for_each_live(6000, |_, _, _| n += 1);
        assert_eq!(n, 0);
    }

    /// A release counted before its allocation (two threads) reads as
    /// nothing, not as 16 TiB, and the pair still sums to zero.
    #[test]
    fn a_release_ahead_of_its_allocation_reads_as_zero() {
        let c = SiteCounters::new();
        c.add(TraceId(2), 10);
        c.sub(TraceId(3), 64);
        let mut seen = Vec::new();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(2, 10, 1)]);
        c.add(TraceId(3), 64);
        seen.clear();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(2, 10, 1)]);
        c.reset();
        seen.clear();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert!(seen.is_empty());
    }
}
