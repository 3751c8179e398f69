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
//!
//! The marker needs the disk; a process whose directory cannot take files
//! could make none (issue 23: a read-only or full directory passed a
//! leaking job with "no process made a CUDA allocation"). So the process
//! also tells `cudaleak run` through the socket it inherited
//! (`CUDALEAK_RUN_CHANNEL`): `start` at its first allocation call, then
//! `final` with its report's file name, or `failed` when that report could
//! not be written. The marker is the witness where the socket was closed
//! (a program that closes every descriptor before exec). Markers are
//! created mode 0600: the run id in them is what a forged report would need.

use cudaleak_core::report::{
    Trigger, RUN_CHANNEL_ENV, RUN_CHANNEL_FAILED, RUN_CHANNEL_FINAL, RUN_CHANNEL_START, RUN_ID_ENV,
    RUN_MARKER_PREFIX,
};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

/// pid of the process whose marker exists (0: none). A fork child sees its
/// parent's pid here and makes its own marker; it never removes the
/// parent's.
static MARKER_PID: AtomicI32 = AtomicI32::new(0);
static MARKER_PATH: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
/// `CUDALEAK_RUN_ID`, read once by the library constructor (null: not
/// read, or not set).
static RUN_ID: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());
/// The run channel's descriptor (-1: none), device and inode.
static CHANNEL_FD: AtomicI32 = AtomicI32::new(-1);
static CHANNEL_DEV: AtomicU64 = AtomicU64::new(0);
static CHANNEL_INO: AtomicU64 = AtomicU64::new(0);
/// pid that told the channel `start` (0: none): only it tells `final`.
static STARTED_PID: AtomicI32 = AtomicI32::new(0);
/// The file name of this image's last final report (null: none yet).
static LAST_FINAL: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());

/// Reads `CUDALEAK_RUN_ID` and `CUDALEAK_RUN_CHANNEL`; called once, from
/// the library constructor. Never later: getenv on a hook or the dumper
/// thread races the program's own setenv (glibc's environment is not
/// thread-safe).
pub fn read_run_id() {
    if let Some(v) = std::env::var(RUN_ID_ENV).ok().filter(|v| !v.is_empty()) {
        RUN_ID.store(Box::into_raw(Box::new(v)), Ordering::Release);
    }
    if let Some((fd, dev, ino)) = std::env::var(RUN_CHANNEL_ENV)
        .ok()
        .as_deref()
        .and_then(parse_channel)
    {
        CHANNEL_DEV.store(dev, Ordering::Relaxed);
        CHANNEL_INO.store(ino, Ordering::Relaxed);
        CHANNEL_FD.store(fd, Ordering::Release);
    }
}

/// `FD:DEVICE:INODE`.
fn parse_channel(v: &str) -> Option<(i32, u64, u64)> {
    let mut it = v.trim().split(':');
    let fd = it.next()?.parse::<i32>().ok().filter(|f| *f >= 0)?;
    let dev = it.next()?.parse().ok()?;
    let ino = it.next()?.parse().ok()?;
    it.next().is_none().then_some((fd, dev, ino))
}

/// Sends one message to `cudaleak run`, only while the descriptor is still
/// the socket it passed (a program may have closed it and opened its own
/// file under that number). Never raises SIGPIPE, never blocks for long:
/// a full socket is retried for at most about a second.
fn tell_run(message: &str) -> bool {
    let fd = CHANNEL_FD.load(Ordering::Acquire);
    if fd < 0 {
        return false;
    }
    // SAFETY: fstat into local storage; send of a local buffer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFSOCK
            || st.st_dev != CHANNEL_DEV.load(Ordering::Relaxed)
            || st.st_ino != CHANNEL_INO.load(Ordering::Relaxed)
        {
            return false;
        }
        for _ in 0..1000 {
            let n = libc::send(
                fd,
                message.as_ptr().cast(),
                message.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            );
            if n == message.len() as isize {
                return true;
            }
            let e = *libc::__errno_location();
            if n >= 0 || (e != libc::EAGAIN && e != libc::EINTR) {
                return false;
            }
            let ms = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            libc::nanosleep(&ms, std::ptr::null_mut());
        }
    }
    false
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
        .mode(0o600)
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
    if STARTED_PID.load(Ordering::Acquire) != pid
        && tell_run(&format!("{RUN_CHANNEL_START} {pid} {}", instance()))
    {
        STARTED_PID.store(pid, Ordering::Release);
    }
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

/// After a report was written (`written`: its path) or not (None): a
/// final one removes the marker and tells `cudaleak run` its file name, or
/// that it failed. Live dumps (signal, `cudaleak dump`, API, interval,
/// context teardown) leave it; every other trigger ends the process
/// image's reporting.
pub fn on_report_written(trigger: Trigger, written: Option<&Path>, instance: fn() -> String) {
    let live = matches!(
        trigger,
        Trigger::Signal | Trigger::Api | Trigger::Interval | Trigger::ContextTeardown | Trigger::Oom
    );
    if live {
        return;
    }
    let pid = this_pid();
    if let Some(p) = written {
        // Leaked (a few bytes per final report), never freed under a reader.
        LAST_FINAL.store(Box::into_raw(Box::new(p.to_path_buf())), Ordering::Release);
    }
    end_reporting(pid, written, instance);
}

/// An exec after a failed one: the image's exec report stands (none is
/// written again), and the marker goes, as before the first attempt.
pub fn on_exec_report_stands(instance: fn() -> String) {
    let p = LAST_FINAL.load(Ordering::Acquire);
    // SAFETY: leaked, never freed.
    let last = (!p.is_null()).then(|| unsafe { (*p).clone() });
    end_reporting(this_pid(), last.as_deref(), instance);
}

fn end_reporting(pid: i32, written: Option<&Path>, instance: fn() -> String) {
    if STARTED_PID.load(Ordering::Acquire) == pid {
        let told = match written.and_then(Path::file_name) {
            Some(name) => format!(
                "{RUN_CHANNEL_FINAL} {pid} {} {}",
                instance(),
                name.to_string_lossy()
            ),
            None => format!("{RUN_CHANNEL_FAILED} {pid} {}", instance()),
        };
        tell_run(&told);
        // Told once per image: an exec that fails starts it again.
        STARTED_PID.store(0, Ordering::Release);
    }
    if written.is_none() || MARKER_PID.load(Ordering::Acquire) != pid {
        return;
    }
    let p = MARKER_PATH.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        let _ = std::fs::remove_file(unsafe { &*p });
    }
    MARKER_PID.store(0, Ordering::Release);
}
