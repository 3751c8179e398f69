//! Out-of-memory moments: when an allocation call fails for
//! lack of memory, what was live at that moment, before the program
//! reacts.
//!
//! PyTorch frees its cache and retries right after a failed `cudaMalloc`;
//! by the time another thread looked, the evidence would be gone. So the
//! failing call takes the snapshot itself, in its hook, after the real
//! call returned (no lock of ours is held across it): a copy of the live
//! map and of the call sites' counts at the peak, the failing call's
//! stack (interned), and the device's free and total memory from the real
//! driver. The dumper thread assembles and writes the report later
//! (`dump::write_oom_reports`), once the episode's second is over, or at
//! exit.
//!
//! Numbered cases:
//! 1. An episode is a failure and every failure within [`EPISODE_MS`]
//!    after it: a retry loop writes one report, whose `failed_calls`
//!    counts them all. Only the first failure of an episode pays for a
//!    snapshot; the others take one lock and add one.
//! 2. At most `CUDALEAK_OOM_REPORTS` episodes of a process get a report
//!    (default 3; 0: none). Later episodes are still listed in every
//!    report's `oom_events`, without one.
//! 3. Recorded at one level: a runtime call (`cudaMalloc`) whose driver
//!    call (`cuMemAlloc_v2`) ran out is one failure, of the driver call
//!    (`hooks/events/mod.rs`, case 1). Every episode keeps its first
//!    call's stack, so that its `oom_events` entry is named by the runtime
//!    function on it, as a block is, when a report is written.
//! 4. The caller's errno is kept: the snapshot allocates and may wait on
//!    a futex, and the driver query is a driver call.
//!
//! Lock order: `dump::DUMP_STATE` → [`LOG`] → (released) →
//! `tracker::SNAPSHOT_LOCK`...; [`PENDING`] is taken alone. A hook holds
//! `LOG` only for its bookkeeping, never across the snapshot or the driver
//! query.

use crate::base::settings;
use crate::base::thread::ThreadState;
use crate::cuda::driver_lookup::CU_MEM_GET_INFO_V2;
use crate::cuda::ffi::*;
use crate::state::tracker;
use cudaleak_core::assemble::Snapshot;
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::record::{Api, TraceId};
use cudaleak_core::report::{OomEvent, OOM_EVENTS_KEPT};

/// Failures this long after an episode's first belong to it (case 1).
pub const EPISODE_MS: u64 = 1000;

/// One failed allocation call, as the hook knows it.
pub struct Failure {
    pub api: Api,
    /// bytes the call asked for (0 when it cannot say)
    pub requested: u64,
    /// the device the call names (cuMemCreate); else the current context's
    pub device: Option<u8>,
}

#[derive(Clone, PartialEq, Eq)]
enum ReportState {
    /// no report: past the cap, reports off, or the snapshot failed
    None,
    /// snapshot taken, report not written yet
    Pending,
    Written(String),
}

struct Episode {
    serial: u64,
    /// monotonic ms of the first failure (the window)
    start_mono_ms: u64,
    /// Unix ms of the first failure
    timestamp_ms: i64,
    api: Api,
    /// the first failure's stack, interned (0: none)
    trace: TraceId,
    requested: u64,
    failed_calls: u64,
    device: Option<u32>,
    /// the driver's free memory right after the first failure, when a
    /// report was taken (only then is the driver asked)
    device_free: Option<u64>,
    report: ReportState,
}

struct Log {
    /// the first `OOM_EVENTS_KEPT / 2` episodes and the latest ones
    episodes: Vec<Episode>,
    next_serial: u64,
    reports_taken: u32,
}

impl Log {
    /// Adds an episode, keeping the first `OOM_EVENTS_KEPT / 2` (their
    /// reports) and the latest ones.
    fn push(&mut self, e: Episode) {
        if self.episodes.len() >= OOM_EVENTS_KEPT {
            self.episodes.remove(OOM_EVENTS_KEPT / 2);
        }
        self.episodes.push(e);
    }
}

static LOG: FutexMutex<Log> = FutexMutex::new(Log {
    episodes: Vec::new(),
    next_serial: 0,
    reports_taken: 0,
});

/// A snapshot waiting for the dumper thread.
pub struct Pending {
    pub serial: u64,
    /// monotonic ms from which it may be written (its episode is over)
    due_mono_ms: u64,
    pub snapshot: Snapshot,
    /// the failing call's stack, interned (0: none)
    pub trace: TraceId,
    pub api: Api,
    pub requested: u64,
    pub device: Option<u32>,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    pub timestamp_ms: i64,
}

static PENDING: FutexMutex<Vec<Pending>> = FutexMutex::new(Vec::new());

fn clock_ms(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local that clock_gettime only writes; an
    // unknown clock fails with EINVAL, handled below.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

fn mono_ms() -> u64 {
    clock_ms(libc::CLOCK_MONOTONIC) as u64
}

/// An allocation call failed for lack of memory; `trace` interns its
/// stack.
#[cold]
#[inline(never)]
pub fn on_out_of_memory(failure: Failure, thread: &ThreadState, trace: &mut dyn FnMut() -> TraceId) {
    // SAFETY: errno is thread-local (case 4).
    let errno = unsafe { *libc::__errno_location() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if crate::state::event_ring::is_on() {
            // Every failed call is an event of the trace, with its stack.
            let device = failure
                .device
                .map(u32::from)
                .or_else(|| tracker::current_device(thread).map(u32::from));
            let site = trace();
            crate::state::event_ring::record(
                crate::state::event_ring::Action::Oom,
                0,
                failure.requested,
                site,
                device,
            );
        }
        record(failure, thread, trace)
    }));
    // SAFETY: __errno_location returns this thread's errno, always a
    // valid, aligned int; the caller's value is put back (case 4).
    unsafe { *libc::__errno_location() = errno };
}

fn record(failure: Failure, thread: &ThreadState, trace: &mut dyn FnMut() -> TraceId) {
    let now = mono_ms();
    let timestamp_ms = clock_ms(libc::CLOCK_REALTIME);
    let device = failure
        .device
        .map(u32::from)
        .or_else(|| tracker::current_device(thread).map(u32::from));
    // Interned before the lock, whose holder may be another hook: a call
    // that joins an episode pays for it too, which only a failing call does.
    let site = trace();
    let serial = {
        let mut log = LOG.lock();
        if let Some(last) = log.episodes.last_mut() {
            // `now` was read before the lock: another thread may have
            // begun this episode a moment after it.
            if now.saturating_sub(last.start_mono_ms) < EPISODE_MS {
                last.failed_calls += 1;
                return;
            }
        }
        let serial = log.next_serial;
        log.next_serial += 1;
        let take = log.reports_taken < settings::config().oom_reports;
        if take {
            log.reports_taken += 1;
        }
        log.push(Episode {
            serial,
            start_mono_ms: now,
            timestamp_ms,
            api: failure.api,
            trace: site,
            requested: failure.requested,
            failed_calls: 1,
            device,
            device_free: None,
            report: if take {
                ReportState::Pending
            } else {
                ReportState::None
            },
        });
        if !take {
            return;
        }
        serial
    };
    let (device_free, device_total) = device_memory(thread, device);
    with_episode(serial, |e| e.device_free = device_free);
    let Some(mut snapshot) = tracker::snapshot(&tracker::Read::plain()) else {
        set_state(serial, ReportState::None);
        return;
    };
    // The holders are what the device holds: blocks of a context destroyed
    // earlier (a device reset) are leaks, but no longer on the device.
    snapshot.torn_down = Vec::new();
    PENDING.lock().push(Pending {
        serial,
        due_mono_ms: now + EPISODE_MS,
        snapshot,
        trace: site,
        api: failure.api,
        requested: failure.requested,
        device,
        device_free,
        device_total,
        timestamp_ms,
    });
}

/// Free and total memory of `device` from the real driver (never a hook
/// of ours: `cuMemGetInfo_v2` is not hooked, and is found like the other
/// helpers). It asks about the current context's device: for a call on
/// another device (cuMemCreate with a location) there is no answer.
fn device_memory(thread: &ThreadState, device: Option<u32>) -> (Option<u64>, Option<u64>) {
    let Some(get) = CU_MEM_GET_INFO_V2.get::<MemGetInfoFn>() else {
        return (None, None);
    };
    let current = tracker::current_device(thread).map(u32::from);
    if device.is_some() && current.is_some() && device != current {
        return (None, None);
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the real driver function with valid out pointers.
    if unsafe { get(&mut free, &mut total) } != CUDA_SUCCESS {
        return (None, None);
    }
    (Some(free as u64), Some(total as u64))
}

/// How long the dumper thread waits for a lock a hook holds for a few
/// instructions: one held longer is held by a thread stopped for good (a
/// signal that ended the process landed in it), and the dumper goes on
/// without what it guards rather than wait for the report's end.
const READER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn with_episode<R>(serial: u64, f: impl FnOnce(&mut Episode) -> R) -> Option<R> {
    LOG.lock_for(READER_WAIT)?
        .episodes
        .iter_mut()
        .find(|e| e.serial == serial)
        .map(f)
}

fn set_state(serial: u64, state: ReportState) {
    with_episode(serial, |e| e.report = state);
}

/// The snapshots to write now: those whose episode is over, or all.
pub fn take_due(all: bool) -> Vec<Pending> {
    let Some(mut pending) = PENDING.lock_for(READER_WAIT) else {
        return Vec::new();
    };
    if pending.is_empty() {
        return Vec::new();
    }
    let now = mono_ms();
    let (due, later): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut *pending)
        .into_iter()
        .partition(|p| all || now >= p.due_mono_ms);
    *pending = later;
    due
}

/// The failed calls an episode counts so far.
pub fn failed_calls(serial: u64) -> u64 {
    with_episode(serial, |e| e.failed_calls).unwrap_or(1)
}

/// The file name of an episode's report (None: it has none, e.g. writing
/// it failed).
pub fn set_report(serial: u64, name: Option<String>) {
    set_state(serial, name.map_or(ReportState::None, ReportState::Written));
}

/// The episodes so far, for a report's `oom_events`. `api_of` names the
/// API of an episode's call from its stack (the runtime function on it),
/// None keeping the driver call's name; it runs once the log's lock is
/// released, as it symbolizes.
pub fn events(api_of: &mut dyn FnMut(TraceId) -> Option<String>) -> Vec<OomEvent> {
    let Some(log) = LOG.lock_for(READER_WAIT) else {
        return Vec::new();
    };
    let events: Vec<(TraceId, OomEvent)> = log
        .episodes
        .iter()
        .map(|e| {
            let event = OomEvent {
                timestamp_ms: e.timestamp_ms,
                api: e.api.name().to_string(),
                requested_bytes: e.requested,
                failed_calls: e.failed_calls,
                device: e.device,
                device_free_bytes: e.device_free,
                report: match &e.report {
                    ReportState::Written(name) => Some(name.clone()),
                    _ => None,
                },
            };
            (e.trace, event)
        })
        .collect();
    drop(log);
    events
        .into_iter()
        .map(|(trace, mut event)| {
            if trace.0 != 0 {
                if let Some(api) = api_of(trace) {
                    event.api = api;
                }
            }
            event
        })
        .collect()
}

/// How many episodes there were so far (the first and latest kept).
pub fn event_count() -> usize {
    LOG.lock_for(READER_WAIT).map_or(0, |log| log.episodes.len())
}

/// pthread_atfork prepare (after `dump::DUMP_STATE`, before the tracker's).
pub fn lock_for_fork() {
    LOG.raw_lock();
    PENDING.raw_lock();
}

/// pthread_atfork parent.
///
/// # Safety
/// After [`lock_for_fork`] on this thread.
pub unsafe fn unlock_after_fork() {
    // SAFETY: the caller ran `lock_for_fork` on this thread, which took
    // both; each is released once, in reverse order.
    unsafe {
        PENDING.raw_unlock();
        LOG.raw_unlock();
    }
}

/// pthread_atfork child: the child's episodes are its own.
///
/// # Safety
/// After [`lock_for_fork`], in the single-threaded child.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller ran `lock_for_fork` before `fork` on the thread
    // that is now the child's only one: it holds both locks and no other
    // thread exists, so their values may be reached without a guard; each
    // is released once, after its last use.
    unsafe {
        *PENDING.get_unchecked() = Vec::new();
        let log = LOG.get_unchecked();
        log.episodes = Vec::new();
        log.reports_taken = 0;
        PENDING.raw_unlock();
        LOG.raw_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_first_episodes_and_the_latest() {
        let mut log = Log {
            episodes: Vec::new(),
            next_serial: 0,
            reports_taken: 0,
        };
        for serial in 0..100 {
            log.push(Episode {
                serial,
                start_mono_ms: serial * 1000,
                timestamp_ms: 0,
                api: Api::cudaMalloc,
                trace: TraceId(0),
                requested: 1,
                failed_calls: 1,
                device: None,
                device_free: None,
                report: ReportState::None,
            });
        }
        let kept: Vec<u64> = log.episodes.iter().map(|e| e.serial).collect();
        let want: Vec<u64> = (0..32).chain(68..100).collect();
        assert_eq!(kept, want);
    }
}
