//! The exit report, written once, and the ways out of the process that
//! end with it: the library's destructor, `_exit` handed to the dumper
//! thread, a fatal signal's report, the default action of that signal.

use super::handoff::{
    forget_requester, is_our_process, note_requester, sleep_until, wake_dumper, DUMPER_STARTED, DUMPER_TID,
    EXIT_REQUEST, EXIT_REQUEST_CODE, EXIT_REQUEST_DONE, EXIT_REQUEST_EXEC, FATAL_DONE, FATAL_DUMP_WAIT,
    FATAL_SIGNAL, NO_EXIT_REQUEST, STATUS_NOT_KNOWN,
};
use crate::base::settings::{self, write_stderr};
use crate::process::dump::{self, Request};
use crate::state::tracker;
use cudaleak_core::base::lock::{wait_while_equal, wake_all};
use cudaleak_core::base::signal_mask::SignalsBlocked;
use cudaleak_core::record::live_map::Stopped;
use cudaleak_core::report::render::{self, TextOptions};
use cudaleak_core::report::Trigger;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub(super) const STATUS_UNKNOWN: i64 = i64::MIN;
pub(super) static EXIT_STATUS: AtomicI64 = AtomicI64::new(STATUS_UNKNOWN);
/// Where the exit report stands. Kept in an atomic word ([`ExitReportCell`]),
/// not behind a lock or a `Once`: signal handlers read it, and threads that
/// wait for the report sleep on it (futex). Four `u32` constants before.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExitReport {
    NotStarted = 0,
    /// Being written: a second way out waits for it, bounded.
    Writing = 1,
    Done = 2,
    /// The exec report written and the exec failed: the process goes on,
    /// its exit report is still to come, but further exec attempts write
    /// none.
    AfterFailedExec = 3,
}

impl ExitReport {
    /// Whether the exit report is still to be written.
    fn pending(self) -> bool {
        matches!(self, ExitReport::NotStarted | ExitReport::AfterFailedExec)
    }
}

impl From<ExitReport> for u32 {
    fn from(state: ExitReport) -> u32 {
        state as u32
    }
}

impl From<u32> for ExitReport {
    fn from(word: u32) -> ExitReport {
        match word {
            0 => ExitReport::NotStarted,
            1 => ExitReport::Writing,
            2 => ExitReport::Done,
            // 3: the cell stores nothing but these four.
            _ => ExitReport::AfterFailedExec,
        }
    }
}

/// An [`ExitReport`] in an atomic word: loads acquire, stores release.
pub(super) struct ExitReportCell(AtomicU32);

impl ExitReportCell {
    const fn new(state: ExitReport) -> ExitReportCell {
        ExitReportCell(AtomicU32::new(state as u32))
    }

    pub(super) fn load(&self) -> ExitReport {
        self.0.load(Ordering::Acquire).into()
    }

    pub(super) fn store(&self, state: ExitReport) {
        self.0.store(state.into(), Ordering::Release)
    }

    /// Moves from `from` to `to` if it is at `from`; whether it did.
    pub(super) fn move_from(&self, from: ExitReport, to: ExitReport) -> bool {
        self.0
            .compare_exchange(from.into(), to.into(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Sleeps while the state is `now`, at most `timeout`.
    fn wait_while(&self, now: ExitReport, timeout: Duration) {
        wait_while_equal(&self.0, now.into(), Some(timeout))
    }

    fn wake_all(&self) {
        wake_all(&self.0)
    }
}

pub(super) static EXIT_REPORT: ExitReportCell = ExitReportCell::new(ExitReport::NotStarted);

/// Lock waits on exit paths: a thread may have died holding one.
const EXIT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Has the fatal-signal report written (or the exit report being written
/// finished) before `sig` ends the process, waiting at most
/// [`FATAL_DUMP_WAIT`]. Async-signal-safe: the dumper thread does the work,
/// this thread only sleeps.
pub(super) fn report_fatal_signal(sig: c_int) {
    if EXIT_REPORT.load() == ExitReport::Writing {
        // Another thread is writing the exit report (the writer blocks
        // this signal): let it finish, then die as the signal asks. The
        // writer dies of it too, should it get there first.
        let _ = FATAL_SIGNAL.compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire);
        sleep_until(|| EXIT_REPORT.load() != ExitReport::Writing);
    } else if EXIT_REPORT.load().pending() && DUMPER_STARTED.load(Ordering::Acquire) {
        // No handler of the program's runs on this thread while it waits:
        // one that allocates would change the live map the dumper takes
        // over. This thread may have been stopped inside a hook: the
        // dumper takes over what it was doing to the live map, and finds
        // it before it sees the request.
        let _quiet = SignalsBlocked::all();
        let claimed = note_requester();
        if FATAL_SIGNAL
            .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            wake_dumper();
            sleep_until(|| FATAL_DONE.load(Ordering::Acquire));
            if !FATAL_DONE.load(Ordering::Acquire) {
                cannot_wait();
            }
        }
        if claimed {
            forget_requester();
        }
    }
}

/// Continues with the default action of `sig` on this thread. `tgkill`,
/// not `raise`: our own `raise` export would see the default disposition
/// and try to write a report from inside a signal handler.
pub(super) fn die_by_default_action(sig: c_int) -> ! {
    // SAFETY: async-signal-safe calls only.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid() as libc::c_long,
            libc::syscall(libc::SYS_gettid),
            sig as libc::c_long,
        );
        // Not real_exit_immediately: this runs in a signal handler, where
        // dlsym (loader lock, malloc) may deadlock. Nothing of glibc's
        // _exit is needed here.
        libc::syscall(libc::SYS_exit_group, (128 + sig) as libc::c_long);
    }
    std::process::abort()
}

/// One line on stderr when the thread that waits for the report gives up
/// on the dumper thread (it used no CPU for [`FATAL_DUMP_WAIT`]: stuck on
/// a lock the stopped thread holds, such as malloc's with one arena): the
/// process goes on ending without its report, and says so.
fn cannot_wait() {
    const LINE: &[u8] =
        b"cudaleak: the final report was not written: the dump thread made no progress for 10 s\n";
    write_stderr(LINE);
}

/// Writes the exit report once, prints the summary, and returns the exit
/// status CUDALEAK_EXITCODE asks for, if it applies. A second caller waits
/// (bounded) for the first one's report. On the dumper thread; `stopped`
/// is the thread that asked for it and waits.
pub(super) fn exit_report(
    status: Option<i32>,
    fatal_signal: Option<i32>,
    stopped: Option<Stopped<'static>>,
) -> Option<i32> {
    exit_report_for(status, fatal_signal, None, false, stopped)
}

/// `on_program_thread`: the report is written on a thread of the program
/// (not the dumper's), which may read the environment. `stopped`: the
/// thread waiting for this report, whose state in the live map is taken
/// over.
pub(super) fn exit_report_for(
    status: Option<i32>,
    fatal_signal: Option<i32>,
    reason: Option<&str>,
    on_program_thread: bool,
    stopped: Option<Stopped<'static>>,
) -> Option<i32> {
    if !is_our_process() {
        return None;
    }
    let start = |from| EXIT_REPORT.move_from(from, ExitReport::Writing);
    if !start(ExitReport::NotStarted) && !start(ExitReport::AfterFailedExec) {
        let deadline = Instant::now() + FATAL_DUMP_WAIT;
        loop {
            let now = EXIT_REPORT.load();
            if now != ExitReport::Writing || Instant::now() >= deadline {
                return None;
            }
            EXIT_REPORT.wait_while(now, Duration::from_millis(50));
        }
    }
    // SIGTERM and SIGINT wait while this thread writes the exit report:
    // they are delivered (and take their default action) when it is
    // written, or go to another thread, whose handler waits for it.
    let blocked = SignalsBlocked::of(&[libc::SIGTERM, libc::SIGINT]);
    if on_program_thread {
        // Every exit report but the fatal-signal one (the dumper thread's)
        // is written on a program thread, which may read the environment:
        // the rank as it is now (see `settings::read_rank`).
        settings::read_rank();
    }
    let code = write_exit_report(status, fatal_signal, reason, stopped);
    EXIT_REPORT.store(ExitReport::Done);
    EXIT_REPORT.wake_all();
    drop(blocked);
    // A SIGTERM/SIGINT that came while the report was written, handled on
    // another thread: the process ends by it, not by returning from here.
    let arrived = FATAL_SIGNAL.load(Ordering::Acquire);
    if arrived != 0 && fatal_signal.is_none() {
        die_by_default_action(arrived);
    }
    code
}

fn write_exit_report(
    status: Option<i32>,
    fatal_signal: Option<i32>,
    reason: Option<&str>,
    stopped: Option<Stopped<'static>>,
) -> Option<i32> {
    let mut req = Request::new(if fatal_signal.is_some() {
        Trigger::FatalSignal
    } else {
        Trigger::Exit
    });
    req.exit_status = status;
    req.signal = fatal_signal;
    req.reason = reason.map(str::to_string);
    req.lock_timeout = Some(EXIT_LOCK_TIMEOUT);
    req.stopped = stopped;
    let Some(outcome) = std::panic::catch_unwind(|| dump::dump(req)).ok().flatten() else {
        write_stderr(
            b"cudaleak: the final report could not be taken: a lock of the library stayed held past 5 s\n",
        );
        return None;
    };
    let config = settings::config();
    // Loaded modules are in the report, but no leak (`MemoryKind::is_leak`).
    let leaked = outcome.report.has_leaks();
    let leaked_bytes = outcome.report.leaked_bytes();
    let _ = std::panic::catch_unwind(|| crate::process::metrics::last_write(leaked_bytes));
    let _ = std::panic::catch_unwind(crate::process::live_view::last_publish);
    // An incomplete report says so, leaks or none (its first lines).
    if (leaked || outcome.report.incomplete_shards > 0) && config.summary {
        let path = outcome.path.as_deref().map(Path::to_string_lossy);
        let text = render::exit_summary(&outcome.report, path.as_deref(), &TextOptions::default());
        write_stderr(text.as_bytes());
    }
    (leaked && config.exitcode != 0 && status == Some(0)).then_some(config.exitcode)
}

fn known_status() -> Option<i32> {
    match EXIT_STATUS.load(Ordering::Acquire) {
        STATUS_UNKNOWN => None,
        s => Some(s as i32),
    }
}

/// Library destructor: after the program's own exit handlers. The report
/// is handed to the dumper thread: `exit` may have been called from a
/// signal handler that interrupted malloc or a hook (`exit(0)` in a
/// SIGTERM handler is common), where writing it here would wait for
/// locks this very thread holds.
pub fn at_exit() {
    if let Some(code) = exit_report_handed(known_status(), false, true) {
        // SAFETY: flush the program's stdio before leaving without exit().
        unsafe { libc::fflush(std::ptr::null_mut()) };
        real_exit_immediately(code);
    }
}

pub(super) type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// glibc's `_exit`, found at load by `libc_exits.rs` (0: not found).
pub(super) static REAL_EXIT_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(super) fn real_exit_immediately(status: c_int) -> ! {
    // Found at load (no `dlsym` here, often reached from a signal handler).
    let p = match REAL_EXIT_NOW.load(Ordering::Acquire) {
        0 => crate::base::loader::real_dlsym(libc::RTLD_NEXT, c"_exit"),
        p => p as *mut std::ffi::c_void,
    };
    if !p.is_null() {
        // SAFETY: glibc's _exit.
        unsafe {
            let f: ExitFn = std::mem::transmute(p);
            f(status)
        }
    }
    // SAFETY: the raw system call as the last resort.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    std::process::abort()
}

/// Has the dumper thread write the exit report (`exec`: the old image's,
/// `reason: "exec"`) while this thread waits, and returns the status
/// CUDALEAK_EXITCODE asks for, if it applies. This thread may be stopped
/// inside a hook, a signal handler having interrupted it: the dumper takes
/// over what it was doing to the live map (cudaleak_core's `live_map.rs`,
/// case 1). `program_context`: not called from `_exit`, which signal
/// handlers call; the rank is read from the environment here first, and
/// without a dumper thread the report is written on this thread.
/// Async-signal-safe on every path but the dumper thread's own and, with
/// `program_context`, the rank's read.
pub(super) fn exit_report_handed(status: Option<i32>, exec: bool, program_context: bool) -> Option<i32> {
    if !is_our_process() {
        return None;
    }
    if let Some(s) = status {
        EXIT_STATUS.store(s as i64, Ordering::Release);
    }
    let reason = exec.then_some("exec");
    if DUMPER_TID.load(Ordering::Acquire) == cudaleak_core::base::tid_lock::gettid() as i32 {
        return exit_report_for(status, None, reason, false, None);
    }
    let state = EXIT_REPORT.load();
    if state == ExitReport::Writing {
        // Another thread writes it: wait for it (bounded).
        sleep_until(|| EXIT_REPORT.load() != ExitReport::Writing);
        return None;
    }
    if !state.pending() || !tracker::saw_allocation_call() {
        return None;
    }
    if program_context {
        // The rank as it is now (see `settings::read_rank`).
        settings::read_rank();
    }
    if !DUMPER_STARTED.load(Ordering::Acquire) {
        if program_context {
            return exit_report_for(status, None, reason, true, None);
        }
        const LINE: &[u8] = b"cudaleak: no dump thread: the exit report was not written at _exit\n";
        write_stderr(LINE);
        return None;
    }
    // Signals wait while the report is written. SIGTERM and SIGINT are
    // delivered (and take their default action) when it is written, or go
    // to another thread, whose handler waits for it; no handler of the
    // program's runs on this thread meanwhile, where one that allocates
    // would change the live map the dumper takes over.
    let blocked = SignalsBlocked::all();
    let claimed = note_requester();
    EXIT_REQUEST_EXEC.store(exec, Ordering::Relaxed);
    EXIT_REQUEST_DONE.store(false, Ordering::Release);
    EXIT_REQUEST.store(status.map_or(STATUS_NOT_KNOWN, i64::from), Ordering::Release);
    wake_dumper();
    sleep_until(|| EXIT_REQUEST_DONE.load(Ordering::Acquire));
    if !EXIT_REQUEST_DONE.load(Ordering::Acquire) {
        cannot_wait();
    }
    if claimed {
        forget_requester();
    }
    drop(blocked);
    match EXIT_REQUEST_CODE.load(Ordering::Acquire) {
        NO_EXIT_REQUEST => None,
        c => Some(c as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::{ExitReport, ExitReportCell};

    #[test]
    fn the_exit_report_states_keep_their_words_and_moves() {
        use ExitReport::*;
        for (state, word, pending) in [
            (NotStarted, 0, true),
            (Writing, 1, false),
            (Done, 2, false),
            (AfterFailedExec, 3, true),
        ] {
            assert_eq!(u32::from(state), word);
            assert_eq!(ExitReport::from(word), state);
            assert_eq!(state.pending(), pending, "{state:?}");
        }
        let cell = ExitReportCell::new(NotStarted);
        assert!(!cell.move_from(Done, AfterFailedExec));
        assert!(cell.move_from(NotStarted, Writing));
        assert!(!cell.move_from(NotStarted, Writing));
        cell.store(Done);
        assert!(cell.move_from(Done, AfterFailedExec));
        assert_eq!(cell.load(), AfterFailedExec);
    }
}
