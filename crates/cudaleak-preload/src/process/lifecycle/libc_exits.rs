//! The C library's ways out, wrapped: `exit`, `_exit`/`_Exit`, the status
//! `main` returns (`__libc_start_main`), and the ways out that run no
//! destructor of ours: `kill`/`raise` to ourselves, `exec`.

use super::exit::{
    exit_report_handed, real_exit_immediately, report_fatal_signal, ExitFn, ExitReport, EXIT_REPORT,
    EXIT_STATUS,
};
use super::handoff::is_our_process;
use crate::base::settings::{instance, report_dir, warn};
use crate::process::dump;
use crate::state::tracker;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);

/// `_exit` and `_Exit`: no atexit handlers run, so the report is written
/// before the real `_exit` (os._exit in Python, multiprocessing workers,
/// many launchers). `_exit` is async-signal-safe and often called from a
/// signal handler, which may have interrupted malloc: the report (which
/// allocates, symbolizes and writes files) is written by the dumper thread
/// while this thread waits, at most [`FATAL_DUMP_WAIT`](super::handoff::FATAL_DUMP_WAIT), as for `kill` and
/// `raise` (a handler's `_exit` deadlocked on glibc's malloc
/// lock). The dumper thread itself writes inline; without one (it could
/// not be started) nothing is written here but one line, with `write(2)`.
fn immediate_exit(status: c_int) -> ! {
    let code = std::panic::catch_unwind(|| exit_report_handed(Some(status), false, false))
        .ok()
        .flatten();
    real_exit_immediately(code.unwrap_or(status))
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn _exit(status: c_int) -> ! {
    immediate_exit(status)
}

#[allow(non_snake_case)]
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn _Exit(status: c_int) -> ! {
    immediate_exit(status)
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn exit(status: c_int) -> ! {
    if is_our_process() {
        EXIT_STATUS.store(status as i64, Ordering::Release);
    }
    // Found at load: `exit` is often called from signal handlers, where a
    // `dlsym` (the loader's lock, malloc) may wait for the code they
    // interrupted.
    let p = match REAL.exit.load(Ordering::Acquire) {
        0 => crate::base::loader::real_dlsym(libc::RTLD_NEXT, c"exit"),
        p => p as *mut c_void,
    };
    if !p.is_null() {
        // SAFETY: `p` is not null: the C library's `exit`, the definition
        // after ours (RTLD_NEXT), whose C type `void exit(int)`, noreturn,
        // is `ExitFn`. Any status is valid; it runs the atexit handlers as
        // the program's own call would.
        unsafe {
            let f: ExitFn = std::mem::transmute(p);
            f(status)
        }
    }
    real_exit_immediately(status)
}

type MainFn = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMainFn = unsafe extern "C" fn(
    MainFn,
    c_int,
    *mut *mut c_char,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// The `main` that glibc calls in place of the program's: calls the program's
/// `main` and notes the status it returns.
///
/// # Safety
/// Called only by glibc's `__libc_start_main`, handed it by ours below
/// after the program's `main` was stored in `REAL_MAIN`.
unsafe extern "C" fn main_returning_status(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    // SAFETY: our `__libc_start_main` stored the program's `main`, a
    // `MainFn`, in REAL_MAIN (Release) before it handed this function to
    // glibc, which alone calls it: the value is that non-null function
    // pointer as a `usize`, turned back into its own type.
    let main: MainFn = unsafe { std::mem::transmute(REAL_MAIN.load(Ordering::Acquire)) };
    // SAFETY: the program's `main`, called with the arguments glibc gives
    // this function, which are the ones glibc would have given it.
    let status = unsafe { main(argc, argv, envp) };
    if is_our_process() {
        EXIT_STATUS.store(status as i64, Ordering::Release);
    }
    status
}

/// Wraps `main` to learn the status it returns: glibc passes it to an
/// internal `exit` that no preload can see.
///
/// # Safety
/// Called by the program's `_start` with glibc's arguments.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __libc_start_main(
    main: MainFn,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    let real = crate::base::loader::real_dlsym(libc::RTLD_NEXT, c"__libc_start_main");
    if real.is_null() {
        // Nothing to forward to: cannot happen with glibc.
        std::process::abort();
    }
    // SAFETY: `real` is not null: the C library's `__libc_start_main`
    // (RTLD_NEXT: the definition after ours). `StartMainFn` is its C type
    // in csu/libc-start.c: `main`, `argc`, `argv`, then `init`, `fini`,
    // `rtld_fini` and `stack_end`, four pointer-sized arguments passed
    // through untouched as `*mut c_void` (the same registers).
    let real: StartMainFn = unsafe { std::mem::transmute(real) };
    REAL_MAIN.store(main as usize, Ordering::Release);
    // SAFETY: the arguments `_start` gave us, unchanged but for `main`:
    // `main_returning_status` has main's C type and, REAL_MAIN being
    // stored just above, calls the program's `main` with what it gets.
    unsafe {
        real(
            main_returning_status,
            argc,
            argv,
            init,
            fini,
            rtld_fini,
            stack_end,
        )
    }
}

/// Whether `sig`, sent to this process now, ends it by the default action
/// of SIGTERM or SIGINT.
fn dies_of(sig: c_int) -> bool {
    if sig != libc::SIGTERM && sig != libc::SIGINT {
        return false;
    }
    // SAFETY: queries only (a null new action and a null new mask) into
    // locals, plain C structs for which all-zero bytes are a valid value;
    // `sig` is SIGTERM or SIGINT, a valid signal number.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 || cur.sa_sigaction != libc::SIG_DFL {
            return false;
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
        libc::sigismember(&mask, sig) == 0
    }
}

/// CPython ends a program stopped by an uncaught KeyboardInterrupt with
/// `signal(SIGINT, SIG_DFL); kill(getpid(), SIGINT)` after finalization:
/// no destructor of ours runs (Ctrl-C, the usual end of a
/// training run, wrote no report). So a SIGINT or SIGTERM that a process
/// sends itself with the default action writes the fatal-signal report
/// first. The dumper thread writes it, as for a signal we handle: C
/// programs send themselves the signal from their own handlers too, where
/// this thread may have been interrupted inside malloc.
fn before_signal_to_self(sig: c_int) {
    if is_our_process() && tracker::saw_allocation_call() && dies_of(sig) {
        report_fatal_signal(sig);
    }
}

type KillFn = unsafe extern "C" fn(libc::pid_t, c_int) -> c_int;
type RaiseFn = unsafe extern "C" fn(c_int) -> c_int;

/// The C library's definitions of the functions this file wraps besides
/// the allocation hooks, found once at load (0 when absent). Not lazily:
/// CPython's subprocess calls execve in a vfork child, where a first
/// dlsym would take the loader lock and malloc on the parent's heap; and
/// kill/raise can be called from signal handlers.
struct RealFunctions {
    exit: AtomicUsize,
    kill: AtomicUsize,
    raise: AtomicUsize,
    execve: AtomicUsize,
    execv: AtomicUsize,
    execvp: AtomicUsize,
    execvpe: AtomicUsize,
    fexecve: AtomicUsize,
    execveat: AtomicUsize,
}

static REAL: RealFunctions = RealFunctions {
    exit: AtomicUsize::new(0),
    kill: AtomicUsize::new(0),
    raise: AtomicUsize::new(0),
    execve: AtomicUsize::new(0),
    execv: AtomicUsize::new(0),
    execvp: AtomicUsize::new(0),
    execvpe: AtomicUsize::new(0),
    fexecve: AtomicUsize::new(0),
    execveat: AtomicUsize::new(0),
};

pub(super) fn resolve_real_functions() {
    let slots: [(&AtomicUsize, &CStr); 10] = [
        (&REAL.exit, c"exit"),
        (&super::exit::REAL_EXIT_NOW, c"_exit"),
        (&REAL.kill, c"kill"),
        (&REAL.raise, c"raise"),
        (&REAL.execve, c"execve"),
        (&REAL.execv, c"execv"),
        (&REAL.execvp, c"execvp"),
        (&REAL.execvpe, c"execvpe"),
        (&REAL.fexecve, c"fexecve"),
        (&REAL.execveat, c"execveat"),
    ];
    for (slot, name) in slots {
        slot.store(
            crate::base::loader::real_dlsym(libc::RTLD_NEXT, name) as usize,
            Ordering::Release,
        );
    }
}

/// Runs `f` with the caller's errno kept (our reporting must not change
/// what the program reads after a call that succeeded), passing a panic
/// by.
fn errno_kept(f: impl FnOnce()) {
    // Our files and messages must not act on a cancellation of the
    // program's pending on this thread.
    let _no_cancel = cudaleak_core::base::signal_mask::CancelDisabled::begin();
    // SAFETY: `__errno_location` returns the calling thread's own errno,
    // an aligned `int` valid for the thread's life; no other thread
    // touches it.
    let errno = unsafe { *libc::__errno_location() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // SAFETY: `__errno_location` returns the calling thread's own errno,
    // an aligned `int` valid for the thread's life, which no other thread
    // writes.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether `kill(pid, _)` reaches this process: its pid, its process
/// group (`0` or `-pgid`), or every process (`-1`, which spares only
/// init and the sender: not us).
fn kill_reaches_us(pid: libc::pid_t) -> bool {
    // SAFETY: `getpid` and `getpgrp` take nothing, cannot fail and are
    // async-signal-safe (kill may be called from a signal handler).
    unsafe {
        match pid {
            0 => true,
            p if p > 0 => p == libc::getpid(),
            -1 => false,
            p => p.checked_neg() == Some(libc::getpgrp()),
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn kill(pid: libc::pid_t, sig: c_int) -> c_int {
    // A signal to our own process group ends us too (a launcher's
    // `kill(0, SIGTERM)`): the report is written as for one to ourselves.
    errno_kept(|| {
        if kill_reaches_us(pid) {
            before_signal_to_self(sig);
        }
    });
    match REAL.kill.load(Ordering::Acquire) {
        // SAFETY: `p` is not null: the C library's `kill`, found at load
        // by `resolve_real_functions` (RTLD_NEXT); `KillFn` is its C type
        // `int kill(pid_t, int)`. The program's arguments, unchanged: its
        // call meets kill's contract as it would without us.
        p if p != 0 => unsafe { std::mem::transmute::<usize, KillFn>(p)(pid, sig) },
        // SAFETY: no C library `kill` (cannot happen with glibc): the
        // system call it makes, with the same arguments; plain integers.
        _ => unsafe { libc::syscall(libc::SYS_kill, pid as libc::c_long, sig as libc::c_long) as c_int },
    }
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn raise(sig: c_int) -> c_int {
    errno_kept(|| before_signal_to_self(sig));
    match REAL.raise.load(Ordering::Acquire) {
        // SAFETY: `p` is not null: the C library's `raise`, found at load
        // by `resolve_real_functions` (RTLD_NEXT); `RaiseFn` is its C type
        // `int raise(int)`. The program's argument, unchanged.
        p if p != 0 => unsafe { std::mem::transmute::<usize, RaiseFn>(p)(sig) },
        // SAFETY: no C library `raise` (cannot happen with glibc): the
        // system calls it makes (a signal to this thread), plain integers.
        _ => unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid() as libc::c_long,
                libc::syscall(libc::SYS_gettid),
                sig as libc::c_long,
            ) as c_int
        },
    }
}

/// The old image's report, before an exec replaces it: the exit report
/// (`trigger: "exit"`, `reason: "exec"`, no `exit_status`). The new image
/// loads the library afresh and reports its own blocks (leaks of
/// an image that called exec were never reported before this). Only a
/// process that made CUDA allocation calls writes one; a vfork child
/// (another pid) does not touch our state.
///
/// A failed exec goes on: the image is live again, with its marker, its
/// `start` on the run channel and, at its end, a final report of its own
/// (`after_failed_exec`). The next attempt writes a new exec report if the
/// image made allocation or release calls since the failure, and
/// otherwise lets the last one stand (Python's os.execvp tries execv once
/// per PATH entry, with no CUDA call in between: each attempt wrote a
/// full, fsynced report). Returns whether the failure path must run.
fn before_exec() -> bool {
    if !is_our_process() || !tracker::saw_allocation_call() {
        return false;
    }
    errno_kept(|| {
        let unchanged = ACTIVITY_AT_FAILED_EXEC.load(Ordering::Acquire) == tracker::activity();
        if EXIT_REPORT.load() == ExitReport::AfterFailedExec && unchanged {
            // This image's exec report stands: only the marker goes.
            crate::process::run_marker::on_exec_report_stands(instance);
        } else {
            exit_report_handed(None, true, true);
        }
    });
    true
}

/// [`tracker::activity`] when the last exec failed.
static ACTIVITY_AT_FAILED_EXEC: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The exec failed and the process goes on: its exit report is still to
/// come (at its end, with whatever it does until then), and the gate must
/// again notice should it go missing.
fn after_failed_exec(reported: bool) {
    if reported {
        errno_kept(|| {
            ACTIVITY_AT_FAILED_EXEC.store(tracker::activity(), Ordering::Release);
            EXIT_REPORT.move_from(ExitReport::Done, ExitReport::AfterFailedExec);
            dump::reporting_resumes();
            crate::process::metrics::resume();
            crate::process::run_marker::on_first_allocation_call(report_dir, instance, warn);
        });
    }
}

type Argv = *const *const c_char;

macro_rules! exec_hook {
    ($name:ident, ($($arg:ident: $ty:ty),*)) => {
        /// Writes the old image's report, then calls the C library's function.
        ///
        /// # Safety
        /// The C library's contract for this function.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            let reported = before_exec();
            let p = REAL.$name.load(Ordering::Acquire);
            if p == 0 {
                // SAFETY: the calling thread's errno, an aligned `int`
                // valid for the thread's life (and async-signal-safe to
                // write, as exec is called after fork).
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                after_failed_exec(reported);
                return -1;
            }
            // SAFETY: `p` is not null: the C library's function of this
            // name, found at load by `resolve_real_functions` (RTLD_NEXT).
            // The type is the one its invocation below spells, the
            // function's C type in unistd.h (`Argv` for `char *const[]`).
            let f: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(p) };
            // SAFETY: the program's arguments, unchanged: its call meets
            // the C library's contract as it would without us. The
            // address was found at load, so this makes no `dlsym`, which
            // would lock and allocate in a vfork child or a child forked
            // from threads (CPython's subprocess).
            let rc = unsafe { f($($arg),*) };
            after_failed_exec(reported);
            rc
        }
    };
}

exec_hook!(execve, (path: *const c_char, argv: Argv, envp: Argv));
exec_hook!(execv, (path: *const c_char, argv: Argv));
exec_hook!(execvp, (file: *const c_char, argv: Argv));
exec_hook!(execvpe, (file: *const c_char, argv: Argv, envp: Argv));
exec_hook!(fexecve, (fd: c_int, argv: Argv, envp: Argv));
exec_hook!(execveat, (dirfd: c_int, path: *const c_char, argv: Argv, envp: Argv, flags: c_int));
