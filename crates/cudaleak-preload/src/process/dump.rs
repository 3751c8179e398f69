//! One dump: snapshot the maps, assemble the report (core), write it.
//!
//! Only the snapshot holds tracking locks, one map shard at a time;
//! symbolization and writing run with none, so allocating threads are never
//! held up by more than one shard's copy.

use crate::base::settings::{self, instance, report_dir, warn, write_stderr};
use crate::capture::python;
use crate::state::{oom, tracker};
use cudaleak_core::assemble::{Assembler, DumpMeta, GrowthTracker, Snapshot};
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::record::live_map::Stopped;
use cudaleak_core::report::suppress::Suppressions;
use cudaleak_core::report::{AllocationEvent, AllocationTrace, OomRequest, Report, Trigger};
use cudaleak_core::symbolize::ProcessSymbolizer;
use cudaleak_core::writer::{self, ReportName};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What survives from one dump of a process to the next.
pub struct DumpState {
    symbols: ProcessSymbolizer,
    growth: GrowthTracker,
    sequence: u64,
    pub timeline: cudaleak_core::timeline::Timeline,
    /// interval report files written, oldest first (CUDALEAK_INTERVAL_KEEP)
    pub interval_files: std::collections::VecDeque<PathBuf>,
}

impl DumpState {
    fn new() -> DumpState {
        DumpState {
            symbols: ProcessSymbolizer::new(),
            growth: GrowthTracker::default(),
            sequence: 0,
            timeline: Default::default(),
            interval_files: Default::default(),
        }
    }
}

impl DumpState {
    /// A fork child numbers its own dumps and tracks its own growth; the
    /// symbol cache stays valid (same mappings).
    pub fn next_sequence(&self) -> u64 {
        self.sequence + 1
    }

    pub fn reset_for_child(&mut self) {
        self.growth = GrowthTracker::default();
        self.sequence = 0;
        self.timeline = Default::default();
        self.interval_files.clear();
    }
}

/// Serializes dumps; the fork prepare handler takes it too, so a child is
/// never forked in the middle of symbolization.
pub static DUMP_STATE: FutexMutex<Option<DumpState>> = FutexMutex::new(None);

pub struct Request {
    pub trigger: Trigger,
    pub reason: Option<String>,
    pub signal: Option<i32>,
    pub exit_status: Option<i32>,
    /// give up on locks held longer than this (exit paths)
    pub lock_timeout: Option<Duration>,
    /// the thread that asked for this report and waits for it, never to
    /// run again (exit paths): the shard it holds is taken over
    pub stopped: Option<Stopped<'static>>,
    /// asked while a lock is waited for: true stops a live dump (an exit
    /// report is waiting for it)
    pub give_up: fn() -> bool,
}

impl Request {
    pub fn new(trigger: Trigger) -> Request {
        Request {
            trigger,
            reason: None,
            signal: None,
            exit_status: None,
            lock_timeout: None,
            stopped: None,
            give_up: || false,
        }
    }
}

pub struct Outcome {
    pub report: Report,
    pub path: Option<PathBuf>,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn command_line() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn hostname() -> String {
    cudaleak_core::base::hostname()
}

pub fn meta_for(req: &Request, sequence: u64) -> DumpMeta {
    // SAFETY: getpid and getppid take no argument, cannot fail and touch no memory.
    let (pid, ppid) = unsafe { (libc::getpid(), libc::getppid()) };
    DumpMeta {
        trigger: req.trigger,
        sequence,
        pid: pid as i64,
        ppid: Some(ppid as i64),
        command: command_line(),
        hostname: Some(hostname()),
        rank: settings::rank(),
        instance: Some(instance()),
        timestamp_ms: now_ms(),
        reason: req.reason.clone(),
        exit_status: req.exit_status,
        signal: req.signal,
        python: python::status(),
    }
}

/// Assembles a report from `snap` with the process's dump state.
pub fn assemble(state: &mut DumpState, snap: &Snapshot, meta: DumpMeta, growth: bool) -> Report {
    assemble_at_most(state, snap, meta, growth, usize::MAX, None)
}

/// [`assemble`], with at most `max_groups` groups per list: the rest are
/// counted, never made. With `oom`, the report of that failed
/// request.
fn assemble_at_most(
    state: &mut DumpState,
    snap: &Snapshot,
    meta: DumpMeta,
    growth: bool,
    max_groups: usize,
    oom: Option<&oom::Pending>,
) -> Report {
    let mut scratch = GrowthTracker::default();
    let growth_tracker = if growth { &mut state.growth } else { &mut scratch };
    let mut assembler = Assembler {
        depot: &tracker::DEPOT,
        codes: &python::CODES,
        symbols: &mut state.symbols,
        suppressions: suppressions(),
        growth: growth_tracker,
    };
    let mut report = assembler.assemble_at_most(snap, meta, max_groups);
    report.timeline = crate::state::sampler::for_report(&tracker::sampler_sources(), &mut assembler);
    report.run_id = crate::process::run_marker::run_id();
    if let Some(p) = oom {
        let request = oom_request(&mut assembler, p);
        // The snapshot was taken at the episode's first failure, the
        // report is written when the episode is over: its totals count
        // the episode's later failures too, as `oom.failed_calls` does
        // (they read 1 beside "2 failed calls within 1 s").
        report.totals.failed_allocations += request.failed_calls.saturating_sub(1);
        report.oom = Some(request);
    }
    report.oom_events = oom::events(&mut |trace| assembler.site_group(trace).map(|g| g.api));
    report.allocation_trace = allocation_trace(&mut assembler);
    report
}

/// The ring's events (`CUDALEAK_TRACE`), their call sites symbolized once
/// each, as the timeline's are.
fn allocation_trace(assembler: &mut Assembler) -> Option<AllocationTrace> {
    let (capacity, recorded, events) = crate::state::event_ring::read()?;
    let mut site_index: std::collections::HashMap<u32, Option<u32>> = Default::default();
    let mut sites = Vec::new();
    let events = events
        .into_iter()
        .map(|e| {
            let site = *site_index.entry(e.trace.0).or_insert_with(|| {
                let g = (e.trace.0 != 0)
                    .then(|| assembler.site_group(e.trace))
                    .flatten()?;
                sites.push(g);
                Some(sites.len() as u32 - 1)
            });
            AllocationEvent {
                action: e.action.name().to_string(),
                address: format!("{:#x}", e.address),
                size: e.size,
                site,
                device: e.device,
                timestamp_us: e.time_us,
            }
        })
        .collect();
    Some(AllocationTrace {
        capacity: capacity as u64,
        recorded,
        sites,
        events,
    })
}

/// The failed request of `p`, its stack symbolized as a group's (a driver
/// call in a static runtime named by the runtime entry point, as groups
/// are).
fn oom_request(assembler: &mut Assembler, p: &oom::Pending) -> OomRequest {
    let site = (p.trace.0 != 0).then(|| assembler.site_group(p.trace)).flatten();
    let (api, native_stack, python_stack, merged_stack) = match site {
        Some(g) => (g.api, g.native_stack, g.python_stack, g.merged_stack),
        None => (p.api.name().to_string(), vec![], vec![], vec![]),
    };
    OomRequest {
        api,
        requested_bytes: p.requested,
        native_stack,
        python_stack,
        merged_stack,
        device: p.device,
        device_free_bytes: p.device_free,
        device_total_bytes: p.device_total,
        failed_calls: oom::failed_calls(p.serial),
        timestamp_ms: p.timestamp_ms,
    }
}

impl DumpState {
    /// `f` with an assembler over the process's symbols, whose growth
    /// tracking is thrown away: for naming call sites outside a dump (the
    /// metrics file).
    pub fn with_assembler<R>(&mut self, f: impl FnOnce(&mut Assembler) -> R) -> R {
        let mut scratch = GrowthTracker::default();
        let mut assembler = Assembler {
            depot: &tracker::DEPOT,
            codes: &python::CODES,
            symbols: &mut self.symbols,
            suppressions: suppressions(),
            growth: &mut scratch,
        };
        f(&mut assembler)
    }
}

/// Runs `f` with the dump state, creating it on first use.
pub fn with_state<R>(timeout: Option<Duration>, f: impl FnOnce(&mut DumpState) -> R) -> Option<R> {
    let mut guard = match timeout {
        Some(t) => DUMP_STATE.lock_for(t)?,
        None => DUMP_STATE.lock(),
    };
    Some(f(guard.get_or_insert_with(DumpState::new)))
}

/// The pid whose final report (exit, fatal signal, exec) is written (0:
/// none): no live dump starts after it. The process is about to end, and
/// one still being written when it does leaves its temporary file behind
/// (a SIGUSR1 storm left a half-written `.tmp` at exit). A pid,
/// so that a fork child, whose own image goes on, is not affected.
static FINAL_WRITTEN_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn this_pid() -> i32 {
    // SAFETY: getpid takes no argument, cannot fail and touches no memory.
    unsafe { libc::getpid() }
}

/// A failed exec: the process goes on, and so do its live dumps.
pub fn reporting_resumes() {
    FINAL_WRITTEN_BY.store(0, std::sync::atomic::Ordering::Release);
}

/// Takes one dump and writes its report. `None` when the process made no
/// allocation call (it writes no reports), a lock could not be taken, or
/// (for a live dump) the final report is already written.
pub fn dump(req: Request) -> Option<Outcome> {
    if !tracker::saw_allocation_call() {
        return None;
    }
    // A dump on a program thread (the API, an exit report) writes files:
    // a cancellation of the program's pending on that thread must not act
    // inside it.
    let _no_cancel = cudaleak_core::base::signal_mask::CancelDisabled::begin();
    if matches!(req.trigger, Trigger::Exit | Trigger::FatalSignal) {
        // The process ends: its out-of-memory reports come first, whether
        // or not their second is over.
        write_oom_reports(true, req.lock_timeout);
    }
    let live = !matches!(req.trigger, Trigger::Exit | Trigger::FatalSignal);
    with_state(req.lock_timeout, |state| {
        // Checked under the dump lock: a live dump that waited for the
        // final one never starts after it.
        if live && FINAL_WRITTEN_BY.load(std::sync::atomic::Ordering::Acquire) == this_pid() {
            return None;
        }
        if !live {
            FINAL_WRITTEN_BY.store(this_pid(), std::sync::atomic::Ordering::Release);
        }
        let give_up = req.give_up;
        let snap = tracker::snapshot(&tracker::Read {
            timeout: req.lock_timeout,
            stopped: req.stopped,
            give_up: &give_up,
        })?;
        state.sequence += 1;
        let meta = meta_for(&req, state.sequence);
        let report = assemble_at_most(state, &snap, meta, true, settings::config().max_groups, None);
        if settings::config().interval.is_some() {
            state.timeline.record(&report);
        }
        let path = write(&report);
        crate::process::run_marker::on_report_written(req.trigger, path.as_deref(), settings::instance);
        if req.trigger == Trigger::Interval {
            if let Some(p) = &path {
                state.interval_files.push_back(p.clone());
            }
            let keep = settings::config().interval_keep;
            while keep > 0 && state.interval_files.len() > keep {
                if let Some(old) = state.interval_files.pop_front() {
                    let _ = std::fs::remove_file(old);
                }
            }
        }
        if settings::config().interval.is_some() {
            write_timeline(state);
        }
        Some(Outcome { report, path })
    })
    .flatten()
}

/// Writes the out-of-memory reports whose episode is over (`oom.rs`), or
/// every one waiting with `all` (at exit); each gets one line on stderr,
/// then its three largest groups (CUDALEAK_SUMMARY=0: none).
pub fn write_oom_reports(all: bool, lock_timeout: Option<Duration>) {
    for p in oom::take_due(all) {
        let serial = p.serial;
        let written = with_state(lock_timeout, |state| write_oom_report(state, &p));
        if written.is_none() {
            oom::set_report(serial, None);
        }
    }
}

fn write_oom_report(state: &mut DumpState, p: &oom::Pending) {
    state.sequence += 1;
    let mut meta = meta_for(&Request::new(Trigger::Oom), state.sequence);
    // The report shows the moment of the failure.
    meta.timestamp_ms = p.timestamp_ms;
    let name = ReportName {
        hostname: meta.hostname.clone().unwrap_or_else(|| "unknown".into()),
        rank: meta.rank,
        pid: meta.pid,
        instance: instance(),
        sequence: meta.sequence,
        trigger: Trigger::Oom.name(),
    }
    .file_name();
    // Its own episode names it in `oom_events`.
    oom::set_report(p.serial, Some(name));
    // A dump like the others: its growth is since the previous dump, and
    // the next one's since this one.
    let report = assemble_at_most(
        state,
        &p.snapshot,
        meta,
        true,
        settings::config().max_groups,
        Some(p),
    );
    let path = write(&report);
    oom::set_report(
        p.serial,
        path.as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
    );
    crate::process::run_marker::on_report_written(Trigger::Oom, path.as_deref(), settings::instance);
    if settings::config().summary {
        let shown = path.as_deref().map(|p| p.to_string_lossy());
        write_stderr(cudaleak_core::report::render::oom_lines(&report, shown.as_deref()).as_bytes());
    }
}

fn report_name(r: &Report) -> ReportName {
    ReportName {
        hostname: r.hostname.clone().unwrap_or_else(|| "unknown".into()),
        rank: r.rank,
        pid: r.pid,
        instance: instance(),
        sequence: r.sequence,
        trigger: r.trigger.name(),
    }
}

/// Streams the report into its file: the dump's extra memory does not grow
/// with the size of the JSON (a 1 GB report was built in memory
/// first).
fn write(report: &Report) -> Option<PathBuf> {
    let dir = report_dir()?;
    let mut encode_error = None;
    let written = writer::write_report_file(&dir, &report_name(report).file_name(), &mut |w| {
        serde_json::to_writer_pretty(w, report).map_err(|e| {
            if !e.is_io() {
                encode_error = Some(e.to_string());
            }
            std::io::Error::other(e)
        })
    });
    match written {
        Ok(p) => Some(p),
        Err(_) if encode_error.is_some() => {
            warn(&format!(
                "cudaleak: cannot encode the report: {}",
                encode_error.unwrap_or_default()
            ));
            None
        }
        Err(e) => {
            warn(&format!(
                "cudaleak: cannot write the report into {}: {e} (set CUDALEAK_DIR to a writable directory)",
                dir.display()
            ));
            None
        }
    }
}

fn write_timeline(state: &DumpState) {
    let Some(dir) = report_dir() else {
        return;
    };
    let name = ReportName {
        hostname: hostname(),
        rank: settings::rank(),
        // SAFETY: getpid takes no argument, cannot fail and touches no memory.
        pid: unsafe { libc::getpid() } as i64,
        instance: instance(),
        sequence: 0,
        trigger: "interval",
    };
    if let Ok(bytes) = serde_json::to_vec(&state.timeline) {
        let _ = writer::replace_file(&dir, &name.timeline_name(), &bytes);
    }
}

static SUPPRESSIONS: AtomicPtr<Suppressions> = AtomicPtr::new(std::ptr::null_mut());
/// `CUDALEAK_SUPPRESSIONS` made absolute at load (the program may change
/// its directory before its first allocation call); null: none named.
static SUPPRESSIONS_PATH: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
/// Taken by the one thread that reads the suppressions.
static SUPPRESSIONS_LOAD: FutexMutex<()> = FutexMutex::new(());

/// The suppressions every dump applies, read on first use: the dumper
/// thread asks for them as it starts, at the first allocation call.
fn suppressions() -> &'static Suppressions {
    let p = SUPPRESSIONS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        return unsafe { &*p };
    }
    let _g = SUPPRESSIONS_LOAD.lock();
    let p = SUPPRESSIONS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        return unsafe { &*p };
    }
    let loaded: &'static Suppressions = Box::leak(Box::new(load_suppressions(settings::config())));
    SUPPRESSIONS.store(
        loaded as *const Suppressions as *mut Suppressions,
        Ordering::Release,
    );
    loaded
}

/// At load: only where the suppressions file is, resolved against the
/// directory the program starts in. Nothing is read at load: every
/// process that inherits LD_PRELOAD (each shell, `ls`) would read the
/// file, and warn about a bad one, though most never call CUDA. The file
/// is read, and a bad one warned about once, when the process's dumper
/// thread starts at its first allocation call ([`load_suppressions_now`]).
pub fn install_suppressions(config: &cudaleak_core::config::Config) {
    if let Some(path) = &config.suppressions {
        let absolute = if path.is_absolute() {
            path.clone()
        } else {
            std::env::current_dir()
                .map(|d| d.join(path))
                .unwrap_or_else(|_| path.clone())
        };
        SUPPRESSIONS_PATH.store(Box::into_raw(Box::new(absolute)), Ordering::Release);
    }
}

/// Reads the suppressions now, warning about a bad file (the dumper
/// thread, as it starts).
pub fn load_suppressions_now() {
    let _ = suppressions();
}

/// `pthread_atfork` prepare: a read of the suppressions in progress (the
/// dumper thread's, as it starts at the first allocation call) finishes
/// first. A fork in the middle of it gave the child the lock held by a
/// thread the child does not have, and the child's own dumper waited on
/// it for good: its exit report never came, and its exit never returned.
pub fn lock_suppressions_for_fork() {
    SUPPRESSIONS_LOAD.raw_lock();
}

/// `pthread_atfork` parent and child.
///
/// # Safety
/// This thread took the lock in [`lock_suppressions_for_fork`].
pub unsafe fn unlock_suppressions_after_fork() {
    // SAFETY: this function's contract.
    unsafe { SUPPRESSIONS_LOAD.raw_unlock() };
}

/// The largest suppressions file read (about a million rules).
pub const SUPPRESSIONS_CAP: u64 = 64 << 20;

/// Suppressions from CUDALEAK_SUPPRESSIONS (the path resolved at load)
/// plus the built-in defaults.
fn load_suppressions(config: &cudaleak_core::config::Config) -> Suppressions {
    let mut s = Suppressions::default();
    if config.default_suppressions {
        if let Ok(d) = Suppressions::parse(cudaleak_core::report::suppress::DEFAULT_SUPPRESSIONS, "<default>")
        {
            s.extend(d);
        }
    }
    let p = SUPPRESSIONS_PATH.load(Ordering::Acquire);
    // SAFETY: leaked at load, never freed.
    if let Some(path) = (!p.is_null()).then(|| unsafe { &*p }) {
        // Only a regular file, and a bounded one: a FIFO hung the program
        // before main, /dev/zero read until memory ran out.
        match cudaleak_core::base::safe_read::read_regular_text(path, SUPPRESSIONS_CAP) {
            Ok(text) => match Suppressions::parse(&text, &path.display().to_string()) {
                Ok(user) => s.extend(user),
                // Escaped as every other value is (terminal
                // escapes in the path reached the terminal).
                Err(e) => warn(&cudaleak_core::report::render::escape(&format!(
                    "cudaleak: ignoring CUDALEAK_SUPPRESSIONS: {e}"
                ))),
            },
            Err(e) => warn(&cudaleak_core::report::render::escape(&format!(
                "cudaleak: ignoring CUDALEAK_SUPPRESSIONS={:?}: {e}",
                path.display().to_string()
            ))),
        }
    }
    s
}
