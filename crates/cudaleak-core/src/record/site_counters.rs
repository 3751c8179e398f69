//! Live bytes and blocks per interned trace (call site), kept as the
//! program runs, so that a sampler can draw memory over time by call site
//! without reading the live map, and so that every report can say
//! what was live at the process's peak.
//!
//! A change is one add to a 64-bit word: blocks and bytes share the word,
//! bytes in the low [`BYTES_BITS`] bits and blocks above. Both move
//! together, so one add of `(1 << BYTES_BITS) + size` keeps both. Bytes
//! are exact up to 16 TiB live per call site; the block count is kept
//! modulo 2^20 (a million live blocks of one call site wrap it; the dumps
//! count blocks exactly).
//!
//! **The peak, lazily.** Copying every site's value when the process
//! reaches a new peak would cost O(sites) on the allocating thread. Instead
//! each site remembers the process peak it last saw (`seen`, the peak's
//! byte count, which only grows) and its value at that peak (`at_peak`).
//! Before a site changes, it compares `seen` with the current peak: when
//! they differ, the site has not changed since the current peak was
//! reached, so its value now, before the change, is its value at the peak;
//! it keeps that and notes the peak. Reading the peak then takes, per site,
//! `at_peak` when `seen` is the current peak and the live value otherwise.
//! In the common case (no new peak) this adds one load of a word on the
//! site's own cache line and a compare to the add. Exact when one thread
//! allocates; with threads racing at the peak, the calls in flight at that
//! moment (at most one per thread) may be counted on the wrong side of it.
//!
//! (Per-thread delta slots once kept a thread's changes to its last call
//! site off the shared word; measured on the shapes of real jobs they did
//! not pay for themselves, and went: docs/performance.md, "Real shapes".)
//!
//! Counters live in chunks allocated on a trace's first block, indexed as
//! the depot indexes traces; a chunk is never freed.

use crate::record::TraceId;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub const BYTES_BITS: u32 = 44;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const CHUNK: usize = 4096;
/// Enough for every trace id the depot can give (`depot::MAX_TRACES`).
const CHUNKS: usize = (crate::record::depot::MAX_TRACES as usize + 1).div_ceil(CHUNK);

/// One call site: 24 bytes, its three words on one cache line or two.
struct Site {
    /// live bytes and blocks, packed
    live: AtomicU64,
    /// `live` as it was when the process reached the peak `seen` names
    at_peak: AtomicU64,
    /// the process peak (bytes) `at_peak` belongs to
    seen: AtomicU64,
}

type Chunk = [Site; CHUNK];

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

impl Site {
    /// Before the site changes: if the process reached a peak since the
    /// site last changed, the site's value now is its value at that peak.
    #[inline(always)]
    fn note_peak(&self, peak: u64) {
        if self.seen.load(Ordering::Relaxed) != peak {
            self.note_peak_slow(peak);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_peak_slow(&self, peak: u64) {
        self.at_peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
        self.seen.store(peak, Ordering::Relaxed);
    }
}

impl SiteCounters {
    pub const fn new() -> SiteCounters {
        SiteCounters {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
        }
    }

    #[inline(always)]
    fn slot(&self, trace: TraceId) -> Option<&Site> {
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

    /// A block of `size` bytes more at `trace`; `peak` is the process's
    /// peak (bytes) before this block counts in it.
    #[inline]
    pub fn add(&self, trace: TraceId, size: u64, peak: u64) {
        if let Some(c) = self.slot(trace) {
            c.note_peak(peak);
            c.live.fetch_add(delta(size), Ordering::Relaxed);
        }
    }

    /// A block of `size` bytes less at `trace`; `peak` as for [`Self::add`].
    #[inline]
    pub fn sub(&self, trace: TraceId, size: u64, peak: u64) {
        if let Some(c) = self.slot(trace) {
            c.note_peak(peak);
            c.live.fetch_sub(delta(size), Ordering::Relaxed);
        }
    }

    /// Calls `f(trace, bytes, blocks)` for every trace id up to `limit`
    /// whose word, live or at `peak`, holds bytes or blocks.
    fn walk(&self, limit: u32, peak: Option<u64>, mut f: impl FnMut(TraceId, u64, u64)) {
        let limit = (limit as usize).min(CHUNK * CHUNKS);
        for (ci, holder) in self.chunks.iter().enumerate().take(limit.div_ceil(CHUNK)) {
            let chunk = holder.load(Ordering::Acquire);
            if chunk.is_null() {
                continue;
            }
            // SAFETY: published chunks are never freed.
            let chunk = unsafe { &*chunk };
            for (j, site) in chunk.iter().enumerate() {
                let id = ci * CHUNK + j;
                if id > limit {
                    break;
                }
                let word = match peak {
                    Some(p) if site.seen.load(Ordering::Relaxed) == p => site.at_peak.load(Ordering::Relaxed),
                    _ => site.live.load(Ordering::Relaxed),
                };
                let (bytes, blocks) = unpack(word);
                if bytes > 0 || blocks > 0 {
                    f(TraceId(id as u32), bytes, blocks);
                }
            }
        }
    }

    /// Calls `f(trace, bytes, blocks)` for every trace id below `limit`
    /// with live bytes or blocks.
    pub fn for_each_live(&self, limit: u32, f: impl FnMut(TraceId, u64, u64)) {
        self.walk(limit, None, f);
    }

    /// Calls `f(trace, bytes, blocks)` for every trace id below `limit`
    /// with bytes or blocks live when the process reached `peak` (the
    /// current peak, as the hooks passed it; see the module's doc).
    pub fn for_each_at_peak(&self, limit: u32, peak: u64, f: impl FnMut(TraceId, u64, u64)) {
        self.walk(limit, Some(peak), f);
    }

    /// Every counter back to zero (a forked child starts from nothing).
    pub fn reset(&self) {
        for holder in &self.chunks {
            let chunk = holder.load(Ordering::Acquire);
            if !chunk.is_null() {
                // SAFETY: published chunks are never freed.
                for site in unsafe { &*chunk } {
                    site.live.store(0, Ordering::Relaxed);
                    site.at_peak.store(0, Ordering::Relaxed);
                    site.seen.store(0, Ordering::Relaxed);
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
        c.add(TraceId(1), 100, 0);
        c.add(TraceId(1), 50, 0);
        c.add(TraceId(5000), 1 << 40, 0);
        c.sub(TraceId(1), 100, 0);
        let mut seen = Vec::new();
        c.for_each_live(6000, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(1, 50, 1), (5000, 1 << 40, 1)]);
        c.sub(TraceId(1), 50, 0);
        c.sub(TraceId(5000), 1 << 40, 0);
        let mut n = 0;
        c.for_each_live(6000, |_, _, _| n += 1);
        assert_eq!(n, 0);
    }

    /// A release counted before its allocation (two threads) reads as
    /// nothing, not as 16 TiB, and the pair still sums to zero.
    #[test]
    fn a_release_ahead_of_its_allocation_reads_as_zero() {
        let c = SiteCounters::new();
        c.add(TraceId(2), 10, 0);
        c.sub(TraceId(3), 64, 0);
        let mut seen = Vec::new();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(2, 10, 1)]);
        c.add(TraceId(3), 64, 0);
        seen.clear();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(2, 10, 1)]);
        c.reset();
        seen.clear();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert!(seen.is_empty());
    }

    /// The hooks' order (tracker.rs): the site is told the peak as it was
    /// before the event, then the process's live bytes move and may make a
    /// new peak.
    struct Process {
        sites: SiteCounters,
        live: u64,
        peak: u64,
        /// per trace at the last new peak, kept the slow way to compare
        at_peak: std::collections::BTreeMap<u32, (u64, u64)>,
        now: std::collections::BTreeMap<u32, (u64, u64)>,
    }

    impl Process {
        fn new() -> Process {
            Process {
                sites: SiteCounters::new(),
                live: 0,
                peak: 0,
                at_peak: Default::default(),
                now: Default::default(),
            }
        }

        fn alloc(&mut self, t: u32, size: u64) {
            self.sites.add(TraceId(t), size, self.peak);
            self.live += size;
            let e = self.now.entry(t).or_default();
            e.0 += size;
            e.1 += 1;
            if self.live > self.peak {
                self.peak = self.live;
                self.at_peak = self.now.clone();
            }
        }

        fn free(&mut self, t: u32, size: u64) {
            self.sites.sub(TraceId(t), size, self.peak);
            self.live -= size;
            let e = self.now.get_mut(&t).unwrap();
            e.0 -= size;
            e.1 -= 1;
        }

        fn read_peak(&self) -> std::collections::BTreeMap<u32, (u64, u64)> {
            let mut out = std::collections::BTreeMap::new();
            self.sites
                .for_each_at_peak(10_000, self.peak, |t, bytes, blocks| {
                    out.insert(t.0, (bytes, blocks));
                });
            out
        }

        fn read_live(&self) -> std::collections::BTreeMap<u32, (u64, u64)> {
            let mut out = std::collections::BTreeMap::new();
            self.sites.for_each_live(10_000, |t, bytes, blocks| {
                out.insert(t.0, (bytes, blocks));
            });
            out
        }

        fn expected_live(&self) -> std::collections::BTreeMap<u32, (u64, u64)> {
            Self::nonzero(&self.now)
        }

        fn expected(&self) -> std::collections::BTreeMap<u32, (u64, u64)> {
            Self::nonzero(&self.at_peak)
        }

        fn nonzero(
            m: &std::collections::BTreeMap<u32, (u64, u64)>,
        ) -> std::collections::BTreeMap<u32, (u64, u64)> {
            m.iter()
                .filter(|(_, v)| v.0 > 0 || v.1 > 0)
                .map(|(k, v)| (*k, *v))
                .collect()
        }
    }

    /// Weights kept, activations freed, a later small block: the peak holds
    /// the weights and the activations, not the later block.
    #[test]
    fn the_peak_keeps_what_was_freed_since_and_not_what_came_later() {
        let mut p = Process::new();
        p.alloc(1, 1000); // weights
        for _ in 0..4 {
            p.alloc(2, 100); // activations
        }
        for _ in 0..4 {
            p.free(2, 100);
        }
        p.alloc(3, 10); // later, below the peak
        assert_eq!(
            p.read_peak(),
            [(1, (1000, 1)), (2, (400, 4))].into_iter().collect()
        );
        assert_eq!(p.peak, 1400);
        // A new, higher peak replaces the old one.
        p.alloc(4, 5000);
        assert_eq!(
            p.read_peak(),
            [(1, (1000, 1)), (3, (10, 1)), (4, (5000, 1))]
                .into_iter()
                .collect()
        );
    }

    /// Against a copy taken at every new peak, over random traffic on a
    /// few sites: the lazy reading is exact when one thread allocates (no
    /// call in flight at a peak), as is the live count per site.
    #[test]
    fn the_lazy_peak_equals_a_copy_taken_at_the_peak() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..50 {
            let mut p = Process::new();
            let mut live: Vec<(u32, u64)> = Vec::new();
            for _ in 0..2000 {
                let r = next();
                if live.is_empty() || r % 100 < 52 + (round % 5) {
                    let t = (next() % 7) as u32 + 1;
                    let size = next() % 4096 + 1;
                    p.alloc(t, size);
                    live.push((t, size));
                } else {
                    let i = (next() as usize) % live.len();
                    let (t, size) = live.swap_remove(i);
                    p.free(t, size);
                }
                if next() % 50 == 0 {
                    assert_eq!(p.read_peak(), p.expected(), "round {round}");
                    assert_eq!(p.read_live(), p.expected_live(), "round {round}");
                }
            }
            let got = p.read_peak();
            assert_eq!(got, p.expected(), "round {round}");
            assert_eq!(got.values().map(|v| v.0).sum::<u64>(), p.peak);
        }
    }

    /// Threads that allocate and free at shared call sites leave every
    /// site's count exact once they are done.
    #[test]
    fn threads_at_shared_sites_sum_exactly_when_done() {
        let c = std::sync::Arc::new(SiteCounters::new());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let trace = TraceId((i % 5) as u32 + 1);
                        c.add(trace, 10 + t as u64, 0);
                        if i % 4 != 0 {
                            c.sub(trace, 10 + t as u64, 0);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut total = (0, 0);
        c.for_each_live(10, |_, bytes, blocks| {
            total.0 += bytes;
            total.1 += blocks;
        });
        // Per thread, 5,000 blocks kept of 10 + t bytes each.
        assert_eq!(total, ((10 + 11 + 12 + 13) * 5_000, 20_000));
    }
}
