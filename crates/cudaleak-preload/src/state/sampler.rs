//! The sampler of the sampled timeline (`CUDALEAK_TIMELINE`):
//! on the dumper thread, once a period, it reads the per-call-site
//! counters that the hooks keep ([`tracker::SITES`](crate::state::tracker::SITES): one relaxed add per
//! allocation and per release) into a bounded history
//! ([`cudaleak_core::timeline::site_timeline`]). Allocating threads never wait for
//! it: it reads atomics only, and its own lock is taken by the dumper
//! thread and by dumps, never by a hook. Every report written carries the
//! history up to its moment ([`for_report`]).
//!
//! It sits below the tracking state: what it reads comes in as
//! [`Sources`] (`tracker::sampler_sources`), so it adds no import circle.

use cudaleak_core::assemble::Assembler;
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::record::depot::Depot;
use cudaleak_core::record::site_counters::SiteCounters;
use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::SampledTimeline;
use cudaleak_core::timeline::site_timeline::SiteHistory;
use std::time::{Duration, Instant};

/// What a sample reads.
pub struct Sources<'a> {
    /// `CUDALEAK_TIMELINE`; None: off
    pub period: Option<Duration>,
    pub sites: &'a SiteCounters,
    pub depot: &'a Depot,
    pub peak_bytes: u64,
    /// false until the process's first allocation call
    pub active: bool,
}

struct Sampler {
    /// the process the history belongs to: a fork child starts its own
    pid: i32,
    history: SiteHistory,
    next: Instant,
    /// memory kind of each trace seen, by trace id (ids are dense), so the
    /// depot is read once per trace (a hashed map of a million
    /// traces made each sample of a large process cost seconds)
    kinds: Vec<Option<MemoryKind>>,
}

/// Taken only with a timeout: after a fork in the middle of a sample the
/// child's copy stays locked, and the child then goes without a timeline
/// rather than hang.
static SAMPLER: FutexMutex<Option<Sampler>> = FutexMutex::new(None);
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

fn with_sampler<R>(period: Duration, f: impl FnOnce(&mut Sampler) -> R) -> Option<R> {
    let mut guard = SAMPLER.lock_for(LOCK_TIMEOUT)?;
    // SAFETY: getpid takes no argument, cannot fail and touches no memory.
    let pid = unsafe { libc::getpid() };
    if guard.as_ref().is_none_or(|s| s.pid != pid) {
        *guard = Some(Sampler {
            pid,
            history: SiteHistory::new(period),
            next: Instant::now(),
            kinds: Vec::new(),
        });
    }
    guard.as_mut().map(f)
}

fn sample(s: &mut Sampler, src: &Sources) {
    let mut live = Vec::new();
    src.sites.for_each_live(src.depot.len(), |trace, bytes, blocks| {
        let i = trace.0 as usize;
        if s.kinds.len() <= i {
            s.kinds.resize(i + 1, None);
        }
        let kind =
            *s.kinds[i].get_or_insert_with(|| src.depot.get(trace).map_or(MemoryKind::Device, |t| t.kind));
        live.push((trace, bytes, blocks, kind));
    });
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    s.history.record(now_ms, src.peak_bytes, &live);
}

/// Takes a sample when one is due; returns how long until the next one
/// (`None` when the timeline is off), for the dumper thread's wait.
pub fn tick(src: &Sources) -> Option<Duration> {
    let period = src.period?;
    if !src.active {
        return Some(period);
    }
    with_sampler(period, |s| {
        let now = Instant::now();
        if now >= s.next {
            sample(s, src);
            s.next = now + period;
        }
        s.next.saturating_duration_since(Instant::now())
    })
    .or(Some(period))
}

/// The timeline up to now for a report being assembled: one more sample,
/// then the history with its call sites named by `asm`.
pub fn for_report(src: &Sources, asm: &mut Assembler) -> Option<SampledTimeline> {
    let period = src.period?;
    with_sampler(period, |s| {
        sample(s, src);
        s.history.to_report(|trace| asm.site_group(trace))
    })
}
