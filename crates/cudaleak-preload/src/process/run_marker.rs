//! The run marker: how `cudaleak run --fail-on-leak` learns that a process
//! used CUDA and then wrote no final report.
//!
//! Why: the gate said "no process made a CUDA allocation" and passed when
//! the exit report could not be written (a full disk) or was never written
//! (SIGKILL): docs/decisions.md, "The gate fails closed". Under `cudaleak run` (`CUDALEAK_RUN_ID` set), the
//! first allocation call of each process creates
//! `.cudaleak-active.<pid>.<instance>` in the report directory
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`), holding the run id; it is removed once a
//! final report (exit, fatal signal, or any report that is not a live dump)
//! has been written. A marker left behind is a report missing, and the gate
//! fails closed on it. Outside `cudaleak run` no marker is made.
//!
//! The marker needs the disk; a process whose directory cannot take files
//! could make none (a read-only or full directory passed a
//! leaking job with "no process made a CUDA allocation"). So the process
//! also tells `cudaleak run` through the run channel
//! (`cudaleak_core::run_channel`, a socket found by the name in
//! `CUDALEAK_RUN_CHANNEL`, whatever descriptors the process's parents
//! closed): `start` at its first allocation call, then `final` with its
//! report's file name, or `failed` when that report could not be written.
//! The marker is the witness where the socket cannot be reached (another
//! network namespace). Markers are created mode 0600: the run id in them
//! is what a forged report would need.

use cudaleak_core::report::{Trigger, RUN_ID_ENV, RUN_MARKER_PREFIX};
use cudaleak_core::run_channel::{self, Message, RUN_CHANNEL_ENV};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, Ordering};

/// pid of the process whose marker exists (0: none). A fork child sees its
/// parent's pid here and makes its own marker; it never removes the
/// parent's.
static MARKER_PID: AtomicI32 = AtomicI32::new(0);
static MARKER_PATH: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
/// `CUDALEAK_RUN_ID`, read once by the library constructor (null: not
/// read, or not set).
static RUN_ID: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());
/// The run channel's name and secret (null: none).
static CHANNEL: AtomicPtr<(String, String)> = AtomicPtr::new(std::ptr::null_mut());
/// pid that told the channel `start` (0: none): only it tells `final`.
static STARTED_PID: AtomicI32 = AtomicI32::new(0);
/// This image's final reports so far (the channel's GENERATION); a fork
/// child, a new image, starts at 0.
static GENERATION: AtomicU32 = AtomicU32::new(0);
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
    if let Some((name, secret)) = std::env::var(RUN_CHANNEL_ENV)
        .ok()
        .as_deref()
        .and_then(run_channel::parse_value)
    {
        let channel = (name.to_string(), secret.to_string());
        CHANNEL.store(Box::into_raw(Box::new(channel)), Ordering::Release);
    }
}

/// A fork child: a new process image, whose first final report is
/// generation 0.
pub fn reset_in_child() {
    GENERATION.store(0, Ordering::Release);
}

/// Sends one message to `cudaleak run`: a connection to the channel's
/// socket per message, made, written and closed with the system calls
/// themselves (libc's wrappers are cancellation points, and this runs on
/// the program's threads). Never raises SIGPIPE, never blocks for long: a
/// full backlog or socket is retried for at most about a second.
fn tell_run(message: &Message) -> bool {
    let p = CHANNEL.load(Ordering::Acquire);
    if p.is_null() {
        return false;
    }
    // SAFETY: leaked at load, never freed.
    let (name, secret) = unsafe { &*p };
    let text = run_channel::seal(secret, message);
    let (addr, len) = run_channel::address(name);
    // SAFETY: raw system calls on a descriptor of our own and local
    // buffers: the address and the message outlive the calls.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_socket,
            libc::AF_UNIX as libc::c_long,
            (libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as libc::c_long,
            0 as libc::c_long,
        );
        if fd < 0 {
            return false;
        }
        let mut told = false;
        for _ in 0..1000 {
            let rc = libc::syscall(
                libc::SYS_connect,
                fd,
                &addr as *const libc::sockaddr_un as libc::c_long,
                len as libc::c_long,
            );
            let e = *libc::__errno_location();
            if rc == 0 || e == libc::EISCONN {
                let n = libc::syscall(
                    libc::SYS_sendto,
                    fd,
                    text.as_ptr() as libc::c_long,
                    text.len() as libc::c_long,
                    (libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) as libc::c_long,
                    0 as libc::c_long,
                    0 as libc::c_long,
                );
                if n == text.len() as libc::c_long {
                    told = true;
                    break;
                }
                let e = *libc::__errno_location();
                if n >= 0 || (e != libc::EAGAIN && e != libc::EINTR) {
                    break;
                }
            } else if e != libc::EAGAIN && e != libc::EINTR && e != libc::EINPROGRESS && e != libc::EALREADY {
                break;
            }
            let ms = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            libc::syscall(libc::SYS_nanosleep, &ms as *const libc::timespec, 0usize);
        }
        libc::syscall(libc::SYS_close, fd);
        told
    }
}

/// The run id this process runs under, if any: it goes into every report.
pub fn run_id() -> Option<String> {
    let p = RUN_ID.load(Ordering::Acquire);
    // SAFETY: leaked, never freed.
    (!p.is_null()).then(|| unsafe { (*p).clone() })
}

fn this_pid() -> i32 {
    // SAFETY: getpid takes no arguments, touches no memory of ours and
    // cannot fail; not cached by glibc.
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
        && tell_run(&Message::Start {
            pid,
            instance: instance(),
            generation: GENERATION.load(Ordering::Acquire),
        })
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
        let generation = GENERATION.load(Ordering::Acquire);
        let told = match written.and_then(Path::file_name) {
            Some(name) => Message::Final {
                pid,
                instance: instance(),
                generation,
                file_name: name.to_string_lossy().into_owned(),
            },
            None => Message::Failed {
                pid,
                instance: instance(),
                generation,
            },
        };
        tell_run(&told);
        // Told once per generation: an exec that fails starts the next.
        STARTED_PID.store(0, Ordering::Release);
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
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
