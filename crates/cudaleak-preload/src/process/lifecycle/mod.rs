//! The process around the hooks: start, fork, the dumper thread and its
//! triggers (signal, interval, `cudaleak dump`), and every way out of the
//! process (return from main, exit, _exit, SIGTERM/SIGINT).
//!
//! Rules this file keeps:
//! 1. A signal handler only stores to atomics and wakes a futex (a raw,
//!    async-signal-safe system call); the dumper thread, created with every
//!    signal blocked, does the work.
//! 2. Every handler of ours is installed at the process's first CUDA
//!    allocation call, never at load: a process that never calls CUDA
//!    (every shell, `ls`, a launcher such as torchrun's agent) keeps every
//!    signal's disposition, so a `kill -USR1` ends it as it would without
//!    the library. Installed at load, the dump handler made such
//!    processes survive SIGUSR1 (status 138 became 0). The dump handler
//!    chains to a handler the program installed before. SIGTERM and
//!    SIGINT are taken only while their disposition is still SIG_DFL:
//!    Python installs its SIGINT handler only over SIG_DFL, so one of ours
//!    installed first would silently turn off KeyboardInterrupt.
//! 3. The exit report is written as late as possible: from a destructor
//!    that runs after the program's atexit handlers and static destructors.
//!    Its status comes from hooks on `__libc_start_main` (the value main
//!    returns) and `exit`.
//! 4. In a child of `vfork` the parent's memory is shared and no fork
//!    handler ran: `_exit` there must not touch our state (pid check).
//! 5. Ways out that run no destructor write the report themselves:
//!    `_exit`, a SIGTERM/SIGINT we handle, `kill`/`raise` of SIGINT or SIGTERM to
//!    ourselves with the default action (CPython's exit after an uncaught
//!    KeyboardInterrupt), and `exec` (the old image's report).
//! 6. The exit report is written once. Whoever comes second (a fatal
//!    signal during the exit report, `_exit` on another thread) waits for
//!    it, bounded, instead of cutting it short (SIGTERM during
//!    the exit report lost everything).
//!
//! Bottom up:
//!
//! 1. what program threads, signal handlers and the dumper thread share: `handoff`
//! 2. the exit report, written once, and the ways out: `exit`
//! 3. the dumper thread, the signals, fork, the C library's exits: `dumper`, `signals`, `fork`, `libc_exits`

mod dumper;
mod exit;
mod fork;
mod handoff;
mod libc_exits;
mod signals;

// The library's destructor (lib.rs); the unit-test build has none.
#[cfg_attr(test, allow(unused_imports))]
pub use exit::at_exit;

use crate::base::settings::{self, instance, report_dir, warn};
use crate::process::dump;
use crate::state::tracker;
use cudaleak_core::config::Config;
use handoff::PID;
use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

static HANDLERS_INSTALLED: AtomicBool = AtomicBool::new(false);

pub(super) fn new_instance() {
    settings::set_instance(cudaleak_core::writer::instance_token(dump::now_ms()));
}

fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Library constructor.
pub fn init() {
    // SAFETY: getpid takes no arguments, touches no memory of ours and
    // cannot fail.
    PID.store(unsafe { libc::getpid() }, Ordering::Release);
    libc_exits::resolve_real_functions();
    crate::process::run_marker::read_run_id();
    settings::read_rank();
    new_instance();
    let config = settings::install_config(Config::from_env(env_var, |w| {
        crate::base::deferred_warnings::push(&w)
    }));
    tracker::configure(config);
    if let Some(w) = settings::open_outputs(config.log.as_deref()) {
        crate::base::deferred_warnings::push(&w);
    }
    cudaleak_core::writer::set_file_mode(config.report_mode);
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    crate::process::metrics::configure(config, &cwd, env_var);
    let dir = match &config.dir {
        Some(d) if d.is_absolute() => d.clone(),
        Some(d) => cwd.join(d),
        None => cwd,
    };
    settings::set_report_dir(dir);
    dump::install_suppressions(config);
    crate::capture::python::init(config.python);
    // Internal panics are caught at the hook boundary; keep them off the
    // program's stderr (this std copy is ours alone).
    std::panic::set_hook(Box::new(|_| tracker::note_internal_error()));
    // SAFETY: registering plain extern "C" callbacks.
    unsafe {
        libc::pthread_atfork(
            Some(fork::fork_prepare),
            Some(fork::fork_parent),
            Some(fork::fork_child),
        )
    };
    tracker::at_first_allocation_call(on_first_allocation_call);
    tracker::set_tracking(true);
}

/// First allocation call of this process (or of this fork child). Its
/// files and messages (the run marker, the run channel, warnings) are
/// written with cancellation disabled: the call is the program's, and a
/// `pthread_cancel` pending on its thread must act in the program's code.
fn on_first_allocation_call() {
    let _no_cancel = cudaleak_core::base::signal_mask::CancelDisabled::begin();
    if !HANDLERS_INSTALLED.swap(true, Ordering::AcqRel) {
        signals::install_signal_handlers();
    }
    crate::base::deferred_warnings::flush();
    // The rank again, on this program thread: a worker that sets RANK
    // itself after start (mp.spawn workers often do) is reported under it
    // (see `settings::read_rank`).
    settings::read_rank();
    dumper::start_dumper();
    crate::process::run_marker::on_first_allocation_call(report_dir, instance, warn);
}

/// For the in-process API: C string argument to an owned String.
pub fn c_str_arg(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the API's contract: NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
