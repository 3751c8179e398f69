//! Live bytes and blocks per interned trace (call site), kept as the
//! program runs, so that a sampler can draw memory over time by call site
//! without reading the live map (issue 13), and so that every report can say
//! what was live at the process's peak (issue 21).
//!
//! A change is one add to a 64-bit word (on the thread's own delta slot
//! in the common case, see below): blocks and bytes share the word, bytes
//! in the low [`BYTES_BITS`] bits and blocks above. Both move together,
//! so one add of `(1 << BYTES_BITS) + size` keeps both. Bytes are exact up to 16 TiB live
//! per call site; the block count is kept modulo 2^20 (a million live
//! blocks of one call site wrap it; the dumps count blocks exactly).
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
//! **Per-thread deltas** (issue 21's budget of 5 ns a pair). The two
//! `lock`ed adds on the site's word cost 10-12 ns a pair, more than the
//! whole budget. So a thread that has a delta slot keeps the changes of its
//! last call site in that slot, with plain stores on its own cache line:
//! an allocation and a release at that site add and take away there, and
//! the site's shared word moves only when the thread goes on to another
//! site (the slot is folded into the site then). Readers add the slots'
//! deltas to the sites' words. The slot keeps the peak the same lazy way a
//! site does: before its first change after a new peak, the thread copies
//! its delta as it was at the peak (`at_peak`), tagged with that peak, so
//! the peak stays exact for one thread, and with threads only the calls in
//! flight at the peak (one per thread) can fall on the wrong side.
//! A thread claims a slot at its first counted block; when the
//! [`DELTA_SLOTS`] are gone, later threads add to the sites directly.
//!
//! Counters live in chunks allocated on a trace's first block, indexed as
//! the depot indexes traces; a chunk is never freed.

use crate::record::TraceId;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

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

/// How many threads keep their own delta (64 bytes each); later threads
/// add to the sites' words directly.
pub const DELTA_SLOTS: usize = 512;
/// A slot number that names no slot: the thread found them all taken.
pub const NO_DELTA_SLOT: u16 = u16::MAX;
/// The site of an empty delta (trace ids stay below `depot::MAX_TRACES`).
const NO_SITE: u32 = u32::MAX;
/// How long a reader waits on a slot whose `seq` stays odd and unmoved (its
/// owner stopped inside a change: preempted, or in a fatal signal's
/// handler that waits for the dumper) before it takes what it loaded; and
/// on slots whose `seq` keeps moving (owners at work).
const STUCK_FOR: std::time::Duration = std::time::Duration::from_millis(20);
const BUSY_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// Counts a reader's failed tries: spins first, then yields, then gives up
/// after [`STUCK_FOR`] on one unmoved count or [`BUSY_FOR`] in all.
struct Tries {
    last: u64,
    since: Option<std::time::Instant>,
    stuck_since: Option<std::time::Instant>,
    spins: u32,
}

impl Tries {
    fn new() -> Tries {
        Tries {
            last: u64::MAX,
            since: None,
            stuck_since: None,
            spins: 0,
        }
    }

    /// Another try after one that saw the slots' sequence counts `seqs`
    /// (a fold of them)? False: take the values as loaded.
    fn again(&mut self, seqs: u64) -> bool {
        self.spins += 1;
        if self.spins < 1000 {
            std::hint::spin_loop();
            return true;
        }
        let now = std::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        if seqs != self.last {
            self.last = seqs;
            self.stuck_since = Some(now);
        }
        let stuck = self.stuck_since.map_or(std::time::Duration::ZERO, |t| now - t);
        std::thread::yield_now();
        stuck < STUCK_FOR && now - since < BUSY_FOR
    }
}

/// One thread's pending change to one call site, alone in its cache line.
/// Only the owning thread writes it; readers on other threads take the
/// pairs (`site`, `word`) and (`peak_site`, `peak_word`) under `seq`,
/// which is odd while the owner changes a site or copies the peak. The
/// steady add and subtract write `word` alone (a reader sees the value
/// before or after it), so they need no `seq` round.
#[repr(align(64))]
struct DeltaSlot {
    seq: AtomicU32,
    site: AtomicU32,
    /// packed bytes and blocks, as a site's word, added with wrapping
    word: AtomicU64,
    /// the process peak the copy below belongs to; 0: none
    peak: AtomicU64,
    peak_site: AtomicU32,
    peak_word: AtomicU64,
}

impl DeltaSlot {
    const fn new() -> DeltaSlot {
        DeltaSlot {
            seq: AtomicU32::new(0),
            site: AtomicU32::new(NO_SITE),
            word: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            peak_site: AtomicU32::new(NO_SITE),
            peak_word: AtomicU64::new(0),
        }
    }

    /// The owner opens a change readers must not see half made.
    #[inline(always)]
    fn begin(&self) -> u32 {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        s
    }

    #[inline(always)]
    fn end(&self, s: u32) {
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Before the owner changes its delta: if the process reached a peak
    /// since it last did, the delta now is its delta at that peak.
    #[inline(always)]
    fn note_peak(&self, peak: u64) {
        if self.peak.load(Ordering::Relaxed) != peak {
            self.note_peak_slow(peak);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_peak_slow(&self, peak: u64) {
        let s = self.begin();
        self.peak_site
            .store(self.site.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_word
            .store(self.word.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak.store(peak, Ordering::Relaxed);
        self.end(s);
    }

    /// (site, delta) now, and (site, delta) at `peak` (the current delta
    /// when the owner has not changed it since), as loaded: consistent
    /// only when `seq` was even before and is unchanged after.
    fn load(&self, peak: u64) -> ((u32, u64), (u32, u64)) {
        let now = (
            self.site.load(Ordering::Relaxed),
            self.word.load(Ordering::Relaxed),
        );
        let at_peak = if self.peak.load(Ordering::Relaxed) == peak {
            (
                self.peak_site.load(Ordering::Relaxed),
                self.peak_word.load(Ordering::Relaxed),
            )
        } else {
            now
        };
        (now, at_peak)
    }

    /// What another thread reads: [`Self::load`] under `seq`. Bounded: a
    /// thread stopped inside a change (a fatal signal's handler waits on
    /// the dumper that reads here) must not make the reader spin for ever;
    /// after [`STUCK_FOR`] of an odd, unmoved `seq` the values as loaded
    /// are taken, at worst one call in flight off (see `switch_site_slow`
    /// for why that is never a delta counted twice).
    fn read(&self, peak: u64) -> ((u32, u64), (u32, u64)) {
        let mut tries = Tries::new();
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let got = self.load(peak);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return got;
                }
            }
            if !tries.again(u64::from(s1)) {
                return self.load(peak);
            }
        }
    }

    /// A forked child's copy: `seq` too, which a parent thread may have
    /// left odd, inside a change, at the fork (a reader would wait on it).
    fn reset(&self) {
        self.seq.store(0, Ordering::Relaxed);
        self.site.store(NO_SITE, Ordering::Relaxed);
        self.word.store(0, Ordering::Relaxed);
        self.peak.store(0, Ordering::Relaxed);
        self.peak_site.store(NO_SITE, Ordering::Relaxed);
        self.peak_word.store(0, Ordering::Relaxed);
    }
}

pub struct SiteCounters {
    chunks: [AtomicPtr<Chunk>; CHUNKS],
    deltas: [DeltaSlot; DELTA_SLOTS],
    claimed: AtomicU32,
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
            deltas: [const { DeltaSlot::new() }; DELTA_SLOTS],
            claimed: AtomicU32::new(0),
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

    /// Claims a delta slot for the calling thread, once per thread: a slot
    /// number for [`Self::add_from`] and [`Self::sub_from`], or
    /// [`NO_DELTA_SLOT`] when they are all taken.
    #[cold]
    pub fn claim_delta_slot(&self) -> u16 {
        let n = self.claimed.fetch_add(1, Ordering::Relaxed) as usize;
        if n < DELTA_SLOTS {
            n as u16
        } else {
            self.claimed.store(DELTA_SLOTS as u32, Ordering::Relaxed);
            NO_DELTA_SLOT
        }
    }

    /// [`Self::add`] by the thread that owns delta slot `slot`: at the
    /// thread's current site, plain stores on the slot's own line.
    #[inline]
    pub fn add_from(&self, slot: u16, trace: TraceId, size: u64, peak: u64) {
        let Some(d) = self.deltas.get(slot as usize) else {
            return self.add(trace, size, peak);
        };
        d.note_peak(peak);
        if d.site.load(Ordering::Relaxed) == trace.0 {
            let w = d.word.load(Ordering::Relaxed).wrapping_add(delta(size));
            d.word.store(w, Ordering::Relaxed);
        } else {
            self.switch_site(d, trace, delta(size), peak);
        }
    }

    /// [`Self::sub`] by the thread that owns delta slot `slot`.
    #[inline]
    pub fn sub_from(&self, slot: u16, trace: TraceId, size: u64, peak: u64) {
        match self.deltas.get(slot as usize) {
            Some(d) if d.site.load(Ordering::Relaxed) == trace.0 => {
                d.note_peak(peak);
                let w = d.word.load(Ordering::Relaxed).wrapping_sub(delta(size));
                d.word.store(w, Ordering::Relaxed);
            }
            _ => self.sub(trace, size, peak),
        }
    }

    /// The owner moves its delta to another site. When it kept nothing for
    /// the old one (an allocation and its release at one site, then the
    /// next site: 1,024 call sites in turn), that is three stores, inline.
    #[inline(always)]
    fn switch_site(&self, d: &DeltaSlot, trace: TraceId, word: u64, peak: u64) {
        let i = trace.0 as usize;
        let counted = self
            .chunks
            .get(i / CHUNK)
            .is_some_and(|c| !c.load(Ordering::Relaxed).is_null());
        if counted && d.word.load(Ordering::Relaxed) == 0 {
            let s = d.begin();
            d.site.store(trace.0, Ordering::Relaxed);
            d.word.store(word, Ordering::Relaxed);
            d.end(s);
        } else {
            self.switch_site_slow(d, trace, word, peak);
        }
    }

    /// The rest: the old site's word takes what the slot kept for it, and
    /// the new site's chunk of counters may need making.
    #[cold]
    #[inline(never)]
    fn switch_site_slow(&self, d: &DeltaSlot, trace: TraceId, word: u64, peak: u64) {
        if self.slot(trace).is_none() {
            // Beyond the counters (the depot gives no such id): as `add`.
            return;
        }
        let s = d.begin();
        let (old, kept) = (d.site.load(Ordering::Relaxed), d.word.load(Ordering::Relaxed));
        // The slot lets go of `kept` before the old site takes it: a reader
        // that gives up waiting on a thread stopped in here (`Tries`) can
        // miss `kept` for that moment, never count it twice.
        d.word.store(0, Ordering::Relaxed);
        d.site.store(trace.0, Ordering::Relaxed);
        if kept != 0 {
            if let Some(c) = self.slot(TraceId(old)) {
                c.note_peak(peak);
                c.live.fetch_add(kept, Ordering::Release);
            }
        }
        d.word.store(word, Ordering::Relaxed);
        d.end(s);
    }

    /// The claimed slots holding a delta (now, or at `peak`), as (site,
    /// slot) sorted by site: where the walk must read a slot with the site.
    fn holders(&self, peak: Option<u64>) -> Vec<(u32, usize)> {
        let claimed = (self.claimed.load(Ordering::Relaxed) as usize).min(DELTA_SLOTS);
        let mut out: Vec<(u32, usize)> = Vec::new();
        for (i, d) in self.deltas[..claimed].iter().enumerate() {
            let (now, then) = d.read(peak.unwrap_or(u64::MAX));
            let (site, word) = if peak.is_some() { then } else { now };
            if site != NO_SITE && word != 0 {
                out.push((site, i));
            }
        }
        out.sort_unstable();
        out
    }

    /// The word of `site` (trace id `id`), live or at `peak`, with the
    /// deltas of the slots `holders` for it, read together: the review of
    /// issue 21's slots found a reader that took a slot's delta first and
    /// the site's word later counted the delta twice when the owner moved
    /// on between the two (it folds its delta into the site then), and
    /// that can be everything a thread allocated at the site. Here the
    /// slots' `seq` brackets the site's word: a fold in between is seen
    /// and the read done again (bounded as `DeltaSlot::read` is).
    fn word_with_deltas(&self, site: &Site, id: u32, holders: &[(u32, usize)], peak: Option<u64>) -> u64 {
        let pick = || match peak {
            Some(p) if site.seen.load(Ordering::Relaxed) == p => site.at_peak.load(Ordering::Relaxed),
            _ => site.live.load(Ordering::Relaxed),
        };
        let sum = || {
            let mut word = pick();
            for &(_, i) in holders {
                let (now, then) = self.deltas[i].load(peak.unwrap_or(u64::MAX));
                let (at, d) = if peak.is_some() { then } else { now };
                if at == id {
                    word = word.wrapping_add(d);
                }
            }
            word
        };
        if holders.is_empty() {
            return pick();
        }
        // The holders' counts, folded into one number, and whether one is
        // odd (a change under way).
        let counts = || {
            holders.iter().fold((0u64, false), |(h, odd), &(_, i)| {
                let s = self.deltas[i].seq.load(Ordering::Acquire);
                (h.wrapping_mul(31).wrapping_add(u64::from(s)), odd || s & 1 == 1)
            })
        };
        let mut tries = Tries::new();
        loop {
            let (before, odd) = counts();
            if !odd {
                let word = sum();
                fence(Ordering::Acquire);
                if counts().0 == before {
                    return word;
                }
            }
            if !tries.again(before) {
                return sum();
            }
        }
    }

    /// Calls `f(trace, bytes, blocks)` for every trace id up to `limit`
    /// whose word, live or at `peak`, with the threads' deltas, holds bytes
    /// or blocks.
    fn walk(&self, limit: u32, peak: Option<u64>, mut f: impl FnMut(TraceId, u64, u64)) {
        let holders = self.holders(peak);
        let limit = (limit as usize).min(CHUNK * CHUNKS);
        let mut first = 0;
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
                while first < holders.len() && (holders[first].0 as usize) < id {
                    first += 1;
                }
                let mut last = first;
                while last < holders.len() && holders[last].0 as usize == id {
                    last += 1;
                }
                let word = self.word_with_deltas(site, id as u32, &holders[first..last], peak);
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
        // The claims stay: the forked child's thread keeps its slot.
        self.deltas.iter().for_each(DeltaSlot::reset);
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
        /// the delta slots of the "threads" that allocate, in turn; none:
        /// every change goes to the sites' words
        threads: Vec<u16>,
        turn: usize,
        live: u64,
        peak: u64,
        /// per trace at the last new peak, kept the slow way to compare
        at_peak: std::collections::BTreeMap<u32, (u64, u64)>,
        now: std::collections::BTreeMap<u32, (u64, u64)>,
    }

    impl Process {
        /// `n` threads, each with its delta slot, taking turns.
        fn with_threads(n: usize) -> Process {
            let sites = SiteCounters::new();
            let threads = (0..n).map(|_| sites.claim_delta_slot()).collect();
            Process {
                sites,
                threads,
                turn: 0,
                live: 0,
                peak: 0,
                at_peak: Default::default(),
                now: Default::default(),
            }
        }

        fn next_thread(&mut self) -> Option<u16> {
            self.turn += 1;
            (!self.threads.is_empty()).then(|| self.threads[self.turn % self.threads.len()])
        }

        fn alloc(&mut self, t: u32, size: u64) {
            match self.next_thread() {
                Some(slot) => self.sites.add_from(slot, TraceId(t), size, self.peak),
                None => self.sites.add(TraceId(t), size, self.peak),
            }
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
            match self.next_thread() {
                Some(slot) => self.sites.sub_from(slot, TraceId(t), size, self.peak),
                None => self.sites.sub(TraceId(t), size, self.peak),
            }
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
        for threads in 0..3 {
            the_peak_keeps_what_was_freed_since(Process::with_threads(threads));
        }
    }

    fn the_peak_keeps_what_was_freed_since(mut p: Process) {
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
    /// few sites: the lazy reading is exact when one thread allocates, with
    /// or without its delta slot, and when threads with slots take turns
    /// (no call in flight at a peak), as is the live count per site.
    #[test]
    fn the_lazy_peak_equals_a_copy_taken_at_the_peak() {
        for threads in [0, 1, 3] {
            lazy_peak_against_copies(threads);
        }
    }

    fn lazy_peak_against_copies(threads: usize) {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..50 {
            let mut p = Process::with_threads(threads);
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
                    assert_eq!(p.read_peak(), p.expected(), "round {round}, {threads} threads");
                    assert_eq!(
                        p.read_live(),
                        p.expected_live(),
                        "round {round}, {threads} threads"
                    );
                }
            }
            let got = p.read_peak();
            assert_eq!(got, p.expected(), "round {round}, {threads} threads");
            assert_eq!(got.values().map(|v| v.0).sum::<u64>(), p.peak);
        }
    }

    /// Threads past the last slot add to the sites' words, and what a
    /// slot keeps is read with them, dropped by a reset (a forked child).
    #[test]
    fn threads_without_a_slot_and_a_reset() {
        let c = SiteCounters::new();
        let slots: Vec<u16> = (0..DELTA_SLOTS + 2).map(|_| c.claim_delta_slot()).collect();
        assert_eq!(slots[DELTA_SLOTS - 1] as usize, DELTA_SLOTS - 1);
        assert_eq!(slots[DELTA_SLOTS..], [NO_DELTA_SLOT, NO_DELTA_SLOT]);
        c.add_from(NO_DELTA_SLOT, TraceId(7), 70, 0);
        c.add_from(slots[0], TraceId(9000), 90, 0);
        c.add_from(slots[1], TraceId(9000), 10, 0);
        c.sub_from(slots[0], TraceId(7), 70, 0);
        let mut seen = Vec::new();
        c.for_each_live(10_000, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(9000, 100, 2)]);
        c.reset();
        seen.clear();
        c.for_each_live(10_000, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert!(seen.is_empty());
    }

    /// Real threads, each with its slot, hammering shared and own sites
    /// while a reader reads: when they are done the counts are exact.
    #[test]
    fn threads_with_slots_sum_exactly_when_done() {
        let c = std::sync::Arc::new(SiteCounters::new());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    c.for_each_live(100, |_, _, _| {});
                    c.for_each_at_peak(100, 1, |_, _, _| {});
                }
            })
        };
        let workers: Vec<_> = (0..4u32)
            .map(|n| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let slot = c.claim_delta_slot();
                    for i in 0..20_000u64 {
                        let t = TraceId(1 + (i % 3) as u32 + (n % 2) * 10);
                        c.add_from(slot, t, 8 + i % 5, 0);
                        c.sub_from(slot, t, 8 + i % 5, 0);
                    }
                    // One block each left live at a shared site.
                    c.add_from(slot, TraceId(50), 100, 0);
                })
            })
            .collect();
        workers.into_iter().for_each(|w| w.join().unwrap());
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        let mut seen = Vec::new();
        c.for_each_live(100, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        assert_eq!(seen, [(50, 400, 4)]);
    }

    /// The review of the slots: a thread that keeps 1 MiB at a site and
    /// goes back and forth to another (folding its delta into the first
    /// each time) while another thread samples, walking 4,000 sites before
    /// it: the site is never read above
    /// what it holds (a reader counted the folded delta twice).
    #[test]
    fn a_reader_never_counts_a_folded_delta_twice() {
        const MIB: u64 = 1 << 20;
        let c = std::sync::Arc::new(SiteCounters::new());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = {
            let (c, stop, started) = (c.clone(), stop.clone(), started.clone());
            std::thread::spawn(move || {
                let slot = c.claim_delta_slot();
                c.add_from(slot, TraceId(4000), MIB, 0);
                started.store(true, Ordering::Release);
                while !stop.load(Ordering::Relaxed) {
                    c.add_from(slot, TraceId(2), 64, 0);
                    c.sub_from(slot, TraceId(2), 64, 0);
                    c.sub_from(slot, TraceId(4000), MIB, 0);
                    c.add_from(slot, TraceId(4000), MIB, 0);
                }
            })
        };
        // Once the owner is at work, read for 300 ms.
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let mut most = 0;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(300) {
            c.for_each_live(4095, |t, bytes, _| {
                if t == TraceId(4000) {
                    most = most.max(bytes);
                }
            });
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        assert!(most <= MIB, "site read as {most} bytes");
    }

    /// A thread stopped inside a change of its slot (a fatal signal's
    /// handler waiting on the dumper) leaves `seq` odd: readers still
    /// finish, and a forked child's reset clears it.
    #[test]
    fn a_slot_left_inside_a_change_stops_no_reader() {
        let c = SiteCounters::new();
        let slot = c.claim_delta_slot();
        c.add_from(slot, TraceId(3), 30, 0);
        c.deltas[slot as usize].begin();
        let mut seen = Vec::new();
        c.for_each_live(10, |t, bytes, blocks| seen.push((t.0, bytes, blocks)));
        c.for_each_at_peak(10, 0, |_, _, _| {});
        assert_eq!(seen, [(3, 30, 1)]);
        c.reset();
        assert_eq!(c.deltas[slot as usize].seq.load(Ordering::Relaxed), 0);
    }
}
