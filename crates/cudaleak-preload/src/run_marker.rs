//! The run marker: how `cudaleak run --fail-on-leak` learns that a process
//! used CUDA and then wrote no final report.
//!
//! Why: the gate said "no process made a CUDA allocation" and passed when
//! the exit report could not be written (a full disk) or was never written
//! (SIGKILL), issue 15. Under `cudaleak run` (`CUDALEAK_RUN_ID` set), the
//! first allocation call of each process creates
//! `.cudaleak-active.<pid>.<instance>` in the report directory
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`), holding the run id; it is removed once a
//! final report (exit, fatal signal, or any report that is not a live dump)
//! has been written. A marker left behind is a report missing, and the gate
//! fails closed on it. Outside `cudaleak run` no marker is made.

use cudaleak_core::report::{Trigger, RUN_ID_ENV, RUN_MARKER_PREFIX};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// pid of the process whose marker exists (0: none). A fork child sees its
/// parent's pid here and makes its own marker; it never removes the
/// parent's.
static MARKER_PID: AtomicI32 = AtomicI32::new(0);
static MARKER_PATH: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
/// `CUDALEAK_RUN_ID`, read once by the library constructor (null: not
/// read, or not set).
static RUN_ID: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

/// Reads `CUDALEAK_RUN_ID`; called once, from the library constructor.
/// Never later: getenv on a hook or the dumper thread races the program's
/// own setenv (glibc's environment is not thread-safe).
pub fn read_run_id() {
    if let Some(v) = std::env::var(RUN_ID_ENV).ok().filter(|v| !v.is_empty()) {
        RUN_ID.store(Box::into_raw(Box::new(v)), Ordering::Release);
    }
}

/// The run id this process runs under, if any: it goes into every report.
pub fn run_id() -> Option<String> {
    let p = RUN_ID.load(Ordering::Acquire);
    // SAFETY: leaked, never freed.
    (!p.is_null()).then(|| unsafe { (*p).clone() })
}

fn this_pid() -> i32 {
    // SAFETY: plain system call; not cached by glibc.
    unsafe { libc::getpid() }
}

fn create_marker(dir: &Path, name: &str, run_id: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(&path)?;
    if let Err(e) = f.write_all(format!("{run_id}\n").as_bytes()) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// At the first allocation call of a process (or fork child) under
/// `cudaleak run`: leaves the marker. The lifecycle passes in its report
/// directory, instance and warning functions, so that this module stays
/// below it (no import circle); the directory is only asked for under
/// `cudaleak run`.
pub fn on_first_allocation_call(
    report_dir: fn() -> Option<PathBuf>,
    instance: fn() -> String,
    warn: fn(&str),
) {
    let pid = this_pid();
    if MARKER_PID.load(Ordering::Acquire) == pid {
        return;
    }
    let Some(id) = run_id() else {
        return;
    };
    let Some(dir) = report_dir() else {
        return;
    };
    let name = format!("{RUN_MARKER_PREFIX}{pid}.{}", instance());
    match create_marker(&dir, &name, &id) {
        Ok(path) => {
            // A fork child replaces its parent's path; the old box is
            // leaked (a few bytes per fork), never freed under a reader.
            MARKER_PATH.store(Box::into_raw(Box::new(path)), Ordering::Release);
            MARKER_PID.store(pid, Ordering::Release);
        }
        Err(e) => warn(&format!(
            "cudaleak: cannot create the run marker {}: {e}; `cudaleak run` will not know if this process's report goes missing",
            dir.join(&name).display()
        )),
    }
}

/// After a report was written (`written`): a final one removes the marker.
/// Live dumps (signal, `cudaleak dump`, API, interval, context teardown)
/// leave it; every other trigger ends the process image's reporting.
pub fn on_report_written(trigger: Trigger, written: bool) {
    let live = matches!(
        trigger,
        Trigger::Signal | Trigger::Api | Trigger::Interval | Trigger::ContextTeardown | Trigger::Oom
    );
    if live || !written || MARKER_PID.load(Ordering::Acquire) != this_pid() {
        return;
    }
    let p = MARKER_PATH.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        let _ = std::fs::remove_file(unsafe { &*p });
    }
    MARKER_PID.store(0, Ordering::Release);
}
