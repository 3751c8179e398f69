//! Reading the state: snapshots for reports, live memory by device,
//! activity and peaks.

use super::contexts::TEARDOWNS_MOVING;
use super::*;

/// How a snapshot reads the maps.
pub struct Read<'a> {
    /// Gives up on locks held longer than this (exit paths).
    pub timeout: Option<Duration>,
    /// The thread that asked for the report and waits for it, which never
    /// runs again (exit paths): shards it holds are taken over
    /// (cudaleak_core's `live_map.rs`, case 1).
    pub stopped: Option<Stopped<'a>>,
    /// Asked while a lock is waited for: true stops the read (a live dump
    /// that an exit report is waiting for).
    pub give_up: &'a dyn Fn() -> bool,
}

impl Read<'_> {
    /// An ordinary read: every lock waited for.
    pub fn plain() -> Read<'static> {
        Read {
            timeout: None,
            stopped: None,
            give_up: &|| false,
        }
    }
}

/// Reads every live block and the counters, exactly (see live_map.rs).
/// None when `read.give_up` stopped it, or (no thread to take over) the
/// snapshot lock stayed held past the timeout.
pub fn snapshot(read: &Read) -> Option<Snapshot> {
    let caller = me();
    // A read by a thread inside a change of its own (a signal handler's
    // call on top of it) reads through its own flight.
    let stopped = read.stopped.or(Some(Stopped {
        tid: caller.tid,
        flight: caller.flight,
    }));
    let mut incomplete = 0u64;
    let _g = match read.timeout {
        Some(t) => match SNAPSHOT_LOCK.lock_for(t) {
            Some(g) => Some(g),
            // The thread that waits for this report may hold it (an
            // out-of-memory snapshot or a teardown it was in): the shards
            // are read anyway, each under its own lock or taken over. A
            // teardown stopped halfway holds blocks that are in neither
            // the shards nor the torn-down list: the report is counted
            // incomplete, rather than short of them.
            None if read.stopped.is_some() => {
                if TEARDOWNS_MOVING.load(Ordering::Acquire) > 0 {
                    incomplete += 1;
                }
                None
            }
            None => return None,
        },
        None => Some(SNAPSHOT_LOCK.lock()),
    };
    let mut snap = Snapshot::default();
    // Sized first (one short lock per shard): growing the copy by doubling
    // moved it several times (the out-of-memory snapshot is taken
    // on the failing thread).
    if read.timeout.is_none() {
        let live = LIVE.counts(caller).live + HANDLES.counts(caller).live;
        snap.blocks.reserve(live as usize + live as usize / 16 + 64);
    }
    let mut counts = MapCounts::default();
    for map in [&LIVE, &HANDLES] {
        incomplete += map.for_each_shard(caller.tid, stopped, read.timeout, read.give_up, |it, c| {
            snap.blocks.extend(it);
            counts.add(c);
        })? as u64;
    }
    let torn_down = match read.timeout {
        Some(t) => TORN_DOWN.lock_for(t),
        None => Some(TORN_DOWN.lock()),
    };
    match torn_down {
        Some(t) => snap.torn_down.extend(t.iter().copied()),
        None => incomplete += 1,
    }
    snap.allocations = counts.inserted;
    snap.frees = counts.removed;
    snap.failed_allocations = FAILED_ALLOCATIONS.load(Ordering::Relaxed);
    snap.invalid_frees = INVALID_FREES.load(Ordering::Relaxed);
    let peak = live_bytes::peak();
    snap.peak_bytes = peak;
    snap.peak = Some(peak_sites(peak));
    snap.incomplete_shards = incomplete;
    snap.stacks_skipped_nested = crate::capture::NESTED_CAPTURES.load(Ordering::Relaxed);
    Some(snap)
}

/// Where live memory is: (device + 1, or 0 when not known; [`HOST`] for
/// pinned host memory), with its bytes and blocks, for the kinds counted
/// in live bytes. One pass over the live blocks, each shard under its own
/// lock for as long as it takes to add its blocks up; nothing is added to
/// an allocation. None when a lock stayed held past `timeout`.
pub fn live_by_device(timeout: Duration) -> Option<Vec<(u16, u64, u64)>> {
    let caller = me();
    let mut by: Vec<(u16, u64, u64)> = Vec::new();
    let mut add = |b: &Block| {
        if !b.kind().counts_in_live_bytes() {
            return;
        }
        let key = match (b.kind(), b.device()) {
            (MemoryKind::Host, _) => HOST,
            (_, Some(d)) => d.min(255) as u16 + 1,
            (_, None) => 0,
        };
        match by.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1 += b.size();
                e.2 += 1;
            }
            None => by.push((key, b.size(), 1)),
        }
    };
    for map in [&LIVE, &HANDLES] {
        let skipped = map.for_each_shard(caller.tid, None, Some(timeout), &|| false, |it, _| {
            for (_, b) in it {
                add(&b);
            }
        })?;
        if skipped > 0 {
            return None;
        }
    }
    // Blocks of a destroyed context are leaks the device no longer holds.
    by.sort_unstable();
    Some(by)
}

/// [`live_by_device`]'s key of pinned host memory.
pub const HOST: u16 = u16::MAX;

/// Every allocation and release call recorded so far, failed ones
/// included: equal counts, nothing happened in between (an `exec` tried
/// again after a failed one writes a new report only if it did).
pub fn activity() -> u64 {
    let me = me();
    let mut c = LIVE.counts(me);
    c.add(HANDLES.counts(me));
    c.inserted
        + c.removed
        + c.moved
        + FAILED_ALLOCATIONS.load(Ordering::Relaxed)
        + INVALID_FREES.load(Ordering::Relaxed)
}

/// What each call site held at the process's peak so far, without reading
/// the live map: for the in-process API's peak report.
pub fn peak_now() -> PeakSites {
    peak_sites(live_bytes::peak())
}

/// What each call site held when the process reached `peak`, the current
/// peak (`site_counters.rs`): one pass over the call sites, no lock.
fn peak_sites(peak: u64) -> PeakSites {
    let mut sites = Vec::new();
    SITES.for_each_at_peak(DEPOT.len(), peak, |trace, bytes, blocks| {
        sites.push((trace, blocks, bytes))
    });
    PeakSites {
        bytes: peak,
        timestamp_ms: live_bytes::peak_time_ms(),
        sites,
    }
}

/// Blocks allocated since a checkpoint and not freed.
pub struct BlocksSince {
    pub live: Vec<(u64, Block)>,
    /// those whose context was destroyed since: leaks too
    pub torn_down: Vec<(u64, Block)>,
}

/// Blocks allocated at or after checkpoint epoch `epoch` and not freed.
pub fn blocks_since(epoch: u32) -> BlocksSince {
    let mut live = Vec::new();
    let _g = SNAPSHOT_LOCK.lock();
    for map in [&LIVE, &HANDLES] {
        let _ = map.for_each_shard(me().tid, None, None, &|| false, |it, _| {
            live.extend(it.filter(|(_, b)| b.epoch() >= epoch))
        });
    }
    let torn_down = TORN_DOWN
        .lock()
        .iter()
        .filter(|(_, b)| b.epoch() >= epoch)
        .copied()
        .collect();
    BlocksSince { live, torn_down }
}
