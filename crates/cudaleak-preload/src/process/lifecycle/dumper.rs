//! The dumper thread: created with every signal blocked, it does every
//! dump the triggers ask for (signal, interval, `cudaleak dump`, a fatal
//! signal's report, `_exit`'s exit report) and takes the timeline's
//! samples.

use super::exit::{exit_report, exit_report_for};
use super::handoff::requester;
use super::handoff::{
    DUMPER_STARTED, DUMPER_TID, EXIT_REQUEST, EXIT_REQUEST_CODE, EXIT_REQUEST_DONE, EXIT_REQUEST_EXEC,
    FATAL_DONE, FATAL_SIGNAL, NO_EXIT_REQUEST, PID, SIGNAL_PENDING, STATUS_NOT_KNOWN, WAKE,
};
use crate::base::settings::{self, report_dir, warn};
use crate::process::dump::{self, Request};
use crate::state::tracker;
use cudaleak_core::base::lock::wait_while_equal;
use cudaleak_core::report::Trigger;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the dumper looks for a `cudaleak dump` request file.
const REQUEST_POLL: Duration = Duration::from_millis(200);

/// Starts the dumper thread with `pthread_create` rather than
/// `std::thread::spawn`: this runs inside the first allocation hook, on
/// whatever stack the program gave that thread, and std's spawn needs
/// kilobytes of it (a first cudaMalloc on a 16 KiB thread stack
/// crashed in it).
pub(super) fn start_dumper() {
    if DUMPER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    extern "C" fn dumper_main(_: *mut c_void) -> *mut c_void {
        // Named here, on this thread's own 1 MiB stack: naming another
        // thread formats a /proc path with sprintf, about 2.2 KB of the
        // allocating thread's stack; naming oneself is a prctl.
        // SAFETY: a static C string.
        unsafe { libc::pthread_setname_np(libc::pthread_self(), c"cudaleak-dump".as_ptr()) };
        let _ = std::panic::catch_unwind(dumper_loop);
        std::ptr::null_mut()
    }
    // The thread inherits this mask: it must never run a signal handler.
    // SAFETY: sigset and attribute manipulation on local storage.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, 1 << 20);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut thread: libc::pthread_t = std::mem::zeroed();
        let rc = libc::pthread_create(&mut thread, &attr, dumper_main, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if rc != 0 {
            DUMPER_STARTED.store(false, Ordering::Release);
        }
    }
}

fn request_file() -> Option<PathBuf> {
    let dir = settings::configured_report_dir()?;
    Some(dir.join(cudaleak_core::report::dump_request_name(
        PID.load(Ordering::Acquire),
    )))
}

/// Whether `path` is a dump request this process honours: a plain file
/// (never followed) created by the process's own user or by root, as
/// `cudaleak dump` creates it. In a shared report directory any user can
/// create a file of that name; another user's is left alone, so that no
/// one else can make the process write reports (eight files from another
/// user made eight reports before this check).
fn is_our_request(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && (m.uid() == me || m.uid() == 0))
}

/// The dumper thread never dies: a panic in one round is caught, noted
/// once on stderr, and the loop goes on (a dumper thread that
/// died silently left no way to dump, and SIGTERM then waited 10 s for
/// nothing).
fn dumper_loop() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    loop {
        if std::panic::catch_unwind(dumper_rounds).is_err() {
            if !WARNED.swap(true, Ordering::Relaxed) {
                warn("cudaleak: internal error in the dump thread; it goes on (please report this)");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A live dump that an exit report does not wait for: while it waits for
/// a lock, an exit or fatal-signal report asked for meanwhile stops it
/// (the thread that asked may hold that lock, stopped for good), and the
/// next round writes that report first.
fn live_dump(r: Request) {
    let mut r = r;
    r.give_up = || {
        EXIT_REQUEST.load(Ordering::Acquire) != NO_EXIT_REQUEST || FATAL_SIGNAL.load(Ordering::Acquire) != 0
    };
    dump::dump(r);
}

/// `now + every`, or None (no interval dump) when that is past what
/// `Instant` can hold.
fn next_due(every: Option<Duration>) -> Option<Instant> {
    Instant::now().checked_add(every?)
}

fn dumper_rounds() {
    static CLEANED: AtomicBool = AtomicBool::new(false);
    DUMPER_TID.store(cudaleak_core::base::tid_lock::gettid() as i32, Ordering::Release);
    if !CLEANED.swap(true, Ordering::AcqRel) {
        // The suppressions file is read, and a bad one warned about, here,
        // at the process's first allocation call, never at load.
        dump::load_suppressions_now();
        if let Some(dir) = report_dir() {
            cudaleak_core::writer::remove_stale_temporaries(&dir, &dump::hostname());
        }
    }
    let mut next_interval = next_due(settings::config().interval);
    let request = request_file();
    loop {
        let seen = WAKE.load(Ordering::Acquire);
        let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            dump::write_oom_reports(false, None);
            let asked = EXIT_REQUEST.swap(NO_EXIT_REQUEST, Ordering::AcqRel);
            if asked != NO_EXIT_REQUEST {
                // A program thread (exit, _exit, exec) waits for this,
                // bounded, perhaps stopped inside a hook.
                let status = (asked != STATUS_NOT_KNOWN).then_some(asked as i32);
                let reason = EXIT_REQUEST_EXEC.load(Ordering::Relaxed).then_some("exec");
                let code = exit_report_for(status, None, reason, false, requester());
                EXIT_REQUEST_CODE.store(code.map_or(NO_EXIT_REQUEST, i64::from), Ordering::Release);
                EXIT_REQUEST_DONE.store(true, Ordering::Release);
            }
            let fatal = FATAL_SIGNAL.load(Ordering::Acquire);
            if fatal != 0 && !FATAL_DONE.load(Ordering::Acquire) {
                exit_report(None, Some(fatal), requester());
                FATAL_DONE.store(true, Ordering::Release);
            }
            if SIGNAL_PENDING.swap(false, Ordering::AcqRel) {
                let mut r = Request::new(Trigger::Signal);
                r.signal = settings::config().signal;
                live_dump(r);
            }
            if let Some(due) = next_interval {
                if Instant::now() >= due {
                    // The next one is scheduled first: a dump that panics
                    // must not make every later round dump again at once.
                    next_interval = next_due(settings::config().interval);
                    live_dump(Request::new(Trigger::Interval));
                    // And again from its end: a dump that took longer than
                    // the interval must not start the next one at once.
                    next_interval = next_due(settings::config().interval);
                }
            }
            if let Some(req) = request.as_deref().filter(|r| is_our_request(r)) {
                if std::fs::remove_file(req).is_ok() {
                    let mut r = Request::new(Trigger::Api);
                    r.reason = Some("cudaleak dump".into());
                    live_dump(r);
                }
            }
        }));
        if round.is_err() {
            // A fatal-signal handler waits for this flag: never leave it hanging.
            if FATAL_SIGNAL.load(Ordering::Acquire) != 0 {
                FATAL_DONE.store(true, Ordering::Release);
            }
            EXIT_REQUEST_DONE.store(true, Ordering::Release);
            std::panic::resume_unwind(Box::new("dump round"));
        }
        let mut wait = REQUEST_POLL;
        if let Ok(Some(next_sample)) =
            std::panic::catch_unwind(|| crate::state::sampler::tick(&tracker::sampler_sources()))
        {
            wait = wait.min(next_sample);
        }
        if let Ok(Some(next_write)) = std::panic::catch_unwind(crate::process::metrics::tick) {
            wait = wait.min(next_write);
        }
        if let Ok(Some(next_view)) =
            std::panic::catch_unwind(|| crate::process::live_view::tick(is_our_request))
        {
            wait = wait.min(next_view);
        }
        if let Some(due) = next_interval {
            wait = wait.min(due.saturating_duration_since(Instant::now()));
        }
        wait_while_equal(&WAKE, seen, Some(wait));
    }
}
