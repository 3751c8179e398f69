//! The process around the hooks: start, fork, the dumper thread and its
//! triggers (signal, interval, `cudaleak dump`), and every way out of the
//! process (return from main, exit, _exit, SIGTERM/SIGINT).
//!
//! Rules this file keeps:
//! 1. A signal handler only stores to atomics and wakes a futex (a raw,
//!    async-signal-safe system call); the dumper thread, created with every
//!    signal blocked, does the work.
//! 2. The dump signal's handler is installed at load, so that a
//!    `kill -USR1` before the first CUDA allocation is harmless (issue 15:
//!    it killed the process, rc 138), and again at the first allocation
//!    call if the program replaced it meanwhile (chaining to the
//!    program's). SIGTERM and SIGINT are taken only at the first
//!    allocation call and only while their disposition is still SIG_DFL:
//!    Python installs its SIGINT handler only over SIG_DFL, so one
//!    installed at load would silently turn off KeyboardInterrupt (and a
//!    dump signal of SIGINT is installed late for the same reason).
//! 3. The exit report is written as late as possible: from a destructor
//!    that runs after the program's atexit handlers and static destructors.
//!    Its status comes from hooks on `__libc_start_main` (the value main
//!    returns) and `exit`.
//! 4. In a child of `vfork` the parent's memory is shared and no fork
//!    handler ran: `_exit` there must not touch our state (pid check).
//! 5. Ways out that run no destructor write the report themselves: `_exit`,
//!    a SIGTERM/SIGINT we handle, `kill`/`raise` of SIGINT or SIGTERM to
//!    ourselves with the default action (CPython's exit after an uncaught
//!    KeyboardInterrupt), and `exec` (the old image's report).
//! 6. The exit report is written once. Whoever comes second (a fatal
//!    signal during the exit report, `_exit` on another thread) waits for
//!    it, bounded, instead of cutting it short (issue 15: SIGTERM during
//!    the exit report lost everything).

use crate::base::settings::{self, instance, report_dir, warn, write_stderr};
use crate::process::dump::{self, Request};
use crate::state::tracker;
use cudaleak_core::base::lock::{wait_while_equal, wake_all};
use cudaleak_core::config::Config;
use cudaleak_core::report::render::{self, TextOptions};
use cudaleak_core::report::Trigger;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static PID: AtomicI32 = AtomicI32::new(0);

const STATUS_UNKNOWN: i64 = i64::MIN;
static EXIT_STATUS: AtomicI64 = AtomicI64::new(STATUS_UNKNOWN);
/// The exit report: not started, being written, written; or the exec
/// report written and the exec failed (the process goes on: its exit
/// report is still to come, but further exec attempts write none).
static EXIT_REPORT: AtomicU32 = AtomicU32::new(EXIT_REPORT_NOT_STARTED);
const EXIT_REPORT_NOT_STARTED: u32 = 0;
const EXIT_REPORT_WRITING: u32 = 1;
const EXIT_REPORT_DONE: u32 = 2;
const EXIT_REPORT_AFTER_FAILED_EXEC: u32 = 3;

/// Whether the exit report is still to be written in `state`.
fn exit_report_pending(state: u32) -> bool {
    state == EXIT_REPORT_NOT_STARTED || state == EXIT_REPORT_AFTER_FAILED_EXEC
}

static DUMPER_STARTED: AtomicBool = AtomicBool::new(false);
static HANDLERS_INSTALLED: AtomicBool = AtomicBool::new(false);
/// Bumped (and futex-woken) by every trigger.
static WAKE: AtomicU32 = AtomicU32::new(0);
static SIGNAL_PENDING: AtomicBool = AtomicBool::new(false);
static FATAL_SIGNAL: AtomicI32 = AtomicI32::new(0);
static FATAL_DONE: AtomicBool = AtomicBool::new(false);
/// `_exit(status)` handed to the dumper thread: the status, or
/// [`NO_EXIT_REQUEST`] (issue 23: `_exit` from a signal handler wrote the
/// report in the handler and deadlocked on malloc's lock).
static EXIT_REQUEST: AtomicI64 = AtomicI64::new(NO_EXIT_REQUEST);
const NO_EXIT_REQUEST: i64 = i64::MIN;
/// The status the dumper's exit report asks for (CUDALEAK_EXITCODE), or
/// [`NO_EXIT_REQUEST`]; and whether it is done.
static EXIT_REQUEST_CODE: AtomicI64 = AtomicI64::new(NO_EXIT_REQUEST);
static EXIT_REQUEST_DONE: AtomicBool = AtomicBool::new(false);
/// The dumper thread's kernel thread id (0: none yet).
static DUMPER_TID: AtomicI32 = AtomicI32::new(0);
/// The dump signal's previous handler and whether it takes three
/// arguments, published as one word so that the handler never pairs one
/// handler with another's flags (it would call a one-argument handler's
/// address with garbage info/uctx, or the reverse): the address with
/// [`PREV_TAKES_SIGINFO`] set when the handler was installed with
/// SA_SIGINFO. User-space code addresses never have the top bit set.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(0);
const PREV_TAKES_SIGINFO: usize = 1 << (usize::BITS - 1);
static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);

/// How often the dumper looks for a `cudaleak dump` request file.
const REQUEST_POLL: Duration = Duration::from_millis(200);
/// How long a SIGTERM/SIGINT handler (or a second way out, `_exit`,
/// `kill`, `raise`) waits for the exit report while the dumper thread
/// makes no progress (uses no CPU): a dumper stuck on a lock the
/// interrupted thread holds is given up after this.
const FATAL_DUMP_WAIT: Duration = Duration::from_secs(10);
/// The longest such a wait lasts while the dumper thread works: a large
/// exit report (a million call sites took 3.6 s) plus a live dump in
/// progress can pass [`FATAL_DUMP_WAIT`], and giving up then lost the
/// report (review of issue 23's `_exit` hand-off).
const FATAL_DUMP_MAX: Duration = Duration::from_secs(600);
/// Lock waits on exit paths: a thread may have died holding one.
const EXIT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

fn new_instance() {
    settings::set_instance(cudaleak_core::writer::instance_token(dump::now_ms()));
}

fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Library constructor.
pub fn init() {
    // SAFETY: plain system call.
    PID.store(unsafe { libc::getpid() }, Ordering::Release);
    resolve_real_functions();
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
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if config.signal != Some(libc::SIGINT) {
        install_dump_handler();
    }
    tracker::at_first_allocation_call(on_first_allocation_call);
    tracker::set_tracking(true);
}

/// First allocation call of this process (or of this fork child).
fn on_first_allocation_call() {
    if !HANDLERS_INSTALLED.swap(true, Ordering::AcqRel) {
        install_signal_handlers();
    }
    crate::base::deferred_warnings::flush();
    // The rank again, on this program thread: a worker that sets RANK
    // itself after start (mp.spawn workers often do) is reported under it
    // (see `settings::read_rank`).
    settings::read_rank();
    start_dumper();
    crate::process::run_marker::on_first_allocation_call(report_dir, instance, warn);
}

// ---- the dumper thread ----

/// Starts the dumper thread with `pthread_create` rather than
/// `std::thread::spawn`: this runs inside the first allocation hook, on
/// whatever stack the program gave that thread, and std's spawn needs
/// kilobytes of it (issue 15: a first cudaMalloc on a 16 KiB thread stack
/// crashed in it).
fn start_dumper() {
    if DUMPER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    extern "C" fn dumper_main(_: *mut c_void) -> *mut c_void {
        // Named here, on this thread's own 1 MiB stack: naming another
        // thread formats a /proc path with sprintf, about 2.2 KB of the
        // allocating thread's stack (issue 23); naming oneself is a prctl.
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

/// The dumper thread never dies: a panic in one round is caught, noted
/// once on stderr, and the loop goes on (issue 15: a dumper thread that
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

/// `now + every`, or None (no interval dump) when that is past what
/// `Instant` can hold.
fn next_due(every: Option<Duration>) -> Option<Instant> {
    Instant::now().checked_add(every?)
}

fn dumper_rounds() {
    static CLEANED: AtomicBool = AtomicBool::new(false);
    // SAFETY: plain system call.
    DUMPER_TID.store(unsafe { libc::gettid() }, Ordering::Release);
    if !CLEANED.swap(true, Ordering::AcqRel) {
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
                // A program thread in `_exit` waits for this, bounded.
                let code = exit_report_for(Some(asked as i32), None, None, false);
                EXIT_REQUEST_CODE.store(code.map_or(NO_EXIT_REQUEST, i64::from), Ordering::Release);
                EXIT_REQUEST_DONE.store(true, Ordering::Release);
            }
            let fatal = FATAL_SIGNAL.load(Ordering::Acquire);
            if fatal != 0 && !FATAL_DONE.load(Ordering::Acquire) {
                exit_report(None, Some(fatal));
                FATAL_DONE.store(true, Ordering::Release);
            }
            if SIGNAL_PENDING.swap(false, Ordering::AcqRel) {
                let mut r = Request::new(Trigger::Signal);
                r.signal = settings::config().signal;
                dump::dump(r);
            }
            if let Some(due) = next_interval {
                if Instant::now() >= due {
                    // The next one is scheduled first: a dump that panics
                    // must not make every later round dump again at once.
                    next_interval = next_due(settings::config().interval);
                    dump::dump(Request::new(Trigger::Interval));
                }
            }
            if let Some(req) = &request {
                if std::fs::remove_file(req).is_ok() {
                    let mut r = Request::new(Trigger::Api);
                    r.reason = Some("cudaleak dump".into());
                    dump::dump(r);
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
        if let Some(due) = next_interval {
            wait = wait.min(due.saturating_duration_since(Instant::now()));
        }
        wait_while_equal(&WAKE, seen, Some(wait));
    }
}

fn wake_dumper() {
    WAKE.fetch_add(1, Ordering::AcqRel);
    wake_all(&WAKE);
}

// ---- signals ----

/// Installs the dump signal's handler unless it is already ours or the
/// signal is ignored; a handler the program installed in between is
/// chained to. Never over SIG_IGN: an ignored signal stays ignored across
/// exec while a handled one goes back to its default action, so a program
/// that ignored SIGUSR1 and exec'd a child would have the child die of it
/// (and would itself stop ignoring it). Such a process gets no signal
/// dumps; `cudaleak dump PID` still works.
fn install_dump_handler() {
    let Some(sig) = settings::config().signal else {
        return;
    };
    // SAFETY: sigaction with a handler that only touches atomics.
    unsafe {
        let ours = on_dump_signal as *const () as usize;
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0
            || cur.sa_sigaction == libc::SIG_IGN
            || cur.sa_sigaction == ours
        {
            return;
        }
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = ours;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &new, &mut old) != 0 || old.sa_sigaction == ours {
            return;
        }
        if old.sa_sigaction == libc::SIG_IGN {
            // Ignored between the query and the install: put it back.
            libc::sigaction(sig, &old, std::ptr::null_mut());
            return;
        }
        let takes_siginfo = if old.sa_flags & libc::SA_SIGINFO != 0 {
            PREV_TAKES_SIGINFO
        } else {
            0
        };
        PREV_HANDLER.store(old.sa_sigaction | takes_siginfo, Ordering::Release);
    }
}

fn install_signal_handlers() {
    let config = settings::config();
    install_dump_handler();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        if Some(sig) == config.signal {
            continue;
        }
        // SAFETY: query then install only over the default disposition.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 || cur.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_fatal_signal as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(sig, &new, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_dump_signal(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: errno is thread-local; restored so the interrupted code never
    // sees it change.
    let errno = unsafe { *libc::__errno_location() };
    // Before the first allocation call there is nothing to dump: the
    // signal is only passed on.
    if DUMPER_STARTED.load(Ordering::Acquire) {
        SIGNAL_PENDING.store(true, Ordering::Release);
        wake_dumper();
    }
    let packed = PREV_HANDLER.load(Ordering::Acquire);
    let prev = packed & !PREV_TAKES_SIGINFO;
    if prev != libc::SIG_DFL && prev != libc::SIG_IGN && prev != on_dump_signal as *const () as usize {
        // SAFETY: the handler the program (or a library) installed before
        // us, called the way it asked to be called.
        unsafe {
            if packed & PREV_TAKES_SIGINFO != 0 {
                let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(prev);
                f(sig, info, uctx);
            } else {
                let f: extern "C" fn(c_int) = std::mem::transmute(prev);
                f(sig);
            }
        }
    }
    // SAFETY: see above.
    unsafe { *libc::__errno_location() = errno };
}

extern "C" fn on_fatal_signal(sig: c_int, _info: *mut libc::siginfo_t, _uctx: *mut c_void) {
    report_fatal_signal(sig);
    die_by_default_action(sig);
}

/// Has the fatal-signal report written (or the exit report being written
/// finished) before `sig` ends the process, waiting at most
/// [`FATAL_DUMP_WAIT`]. Async-signal-safe: the dumper thread does the work,
/// this thread only sleeps.
fn report_fatal_signal(sig: c_int) {
    if EXIT_REPORT.load(Ordering::Acquire) == EXIT_REPORT_WRITING {
        // Another thread is writing the exit report (the writer blocks
        // this signal): let it finish, then die as the signal asks. The
        // writer dies of it too, should it get there first.
        let _ = FATAL_SIGNAL.compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire);
        sleep_until(|| EXIT_REPORT.load(Ordering::Acquire) != EXIT_REPORT_WRITING);
    } else if exit_report_pending(EXIT_REPORT.load(Ordering::Acquire))
        && DUMPER_STARTED.load(Ordering::Acquire)
        && FATAL_SIGNAL
            .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        wake_dumper();
        sleep_until(|| FATAL_DONE.load(Ordering::Acquire));
    }
}

/// Polls `done` every 5 ms until it holds, for as long as the dumper
/// thread keeps working: it gives up once the dumper has used no CPU for
/// [`FATAL_DUMP_WAIT`], or after [`FATAL_DUMP_MAX`]. Async-signal-safe
/// (nanosleep, clock_gettime).
fn sleep_until(done: impl Fn() -> bool) {
    let step = libc::timespec {
        tv_sec: 0,
        tv_nsec: 5_000_000,
    };
    let per_second = 200u128;
    let idle_limit = FATAL_DUMP_WAIT.as_secs() as u128 * per_second;
    let max = FATAL_DUMP_MAX.as_secs() as u128 * per_second;
    let mut last_cpu = thread_cpu_ns(DUMPER_TID.load(Ordering::Acquire));
    let mut idle = 0u128;
    for round in 0..max {
        if done() {
            return;
        }
        // SAFETY: sleeping on a local timespec.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
        idle += 1;
        if round % per_second == per_second - 1 {
            let cpu = thread_cpu_ns(DUMPER_TID.load(Ordering::Acquire));
            // At least 1 ms of CPU in the last second: it is working.
            if matches!((last_cpu, cpu), (Some(a), Some(b)) if b >= a + 1_000_000) {
                idle = 0;
            }
            last_cpu = cpu;
        }
        if idle >= idle_limit {
            return;
        }
    }
}

/// CPU time used by thread `tid` of this process, from its thread CPU
/// clock (the kernel's clock id for a thread, as glibc's
/// `pthread_getcpuclockid` makes it: `~tid << 3 | CPUCLOCK_SCHED |
/// CPUCLOCK_PERTHREAD`). Async-signal-safe.
fn thread_cpu_ns(tid: i32) -> Option<u64> {
    if tid <= 0 {
        return None;
    }
    let clock: libc::clockid_t = ((!tid) << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0)
        .then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Continues with the default action of `sig` on this thread. `tgkill`,
/// not `raise`: our own `raise` export would see the default disposition
/// and try to write a report from inside a signal handler.
fn die_by_default_action(sig: c_int) -> ! {
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

// ---- fork ----

/// Waits for a dump in progress, fsync of its report included: a fork in
/// the middle of one would give the child a half-built dump state. The
/// fsync could move out of the state the fork waits on only by splitting
/// the write (render under the lock, sync and link after, bookkeeping
/// under the lock again); not done yet: the wait is one report's fsync.
extern "C" fn fork_prepare() {
    dump::DUMP_STATE.raw_lock();
    crate::state::oom::lock_for_fork();
    tracker::lock_all_for_fork();
}

extern "C" fn fork_parent() {
    // SAFETY: the prepare handler took these locks on this thread.
    unsafe {
        tracker::unlock_all_after_fork();
        crate::state::oom::unlock_after_fork();
        dump::DUMP_STATE.raw_unlock();
    }
}

extern "C" fn fork_child() {
    // SAFETY: single-threaded child; the prepare handler took the locks.
    unsafe {
        tracker::reset_in_child_and_unlock();
        crate::state::oom::reset_in_child_and_unlock();
        if let Some(state) = dump::DUMP_STATE.get_unchecked().as_mut() {
            state.reset_for_child();
        }
        dump::DUMP_STATE.raw_unlock();
        PID.store(libc::getpid(), Ordering::Release);
    }
    crate::hooks::resolve::reset_after_fork();
    new_instance();
    DUMPER_STARTED.store(false, Ordering::Release);
    SIGNAL_PENDING.store(false, Ordering::Release);
    FATAL_SIGNAL.store(0, Ordering::Release);
    FATAL_DONE.store(false, Ordering::Release);
    DUMPER_TID.store(0, Ordering::Release);
    EXIT_REQUEST.store(NO_EXIT_REQUEST, Ordering::Release);
    EXIT_REQUEST_DONE.store(false, Ordering::Release);
    EXIT_REPORT.store(EXIT_REPORT_NOT_STARTED, Ordering::Release);
    EXIT_STATUS.store(STATUS_UNKNOWN, Ordering::Release);
}

// ---- the ways out ----

fn is_our_process() -> bool {
    // SAFETY: plain system call; not cached by glibc.
    unsafe { libc::getpid() == PID.load(Ordering::Acquire) }
}

/// SIGTERM and SIGINT blocked on this thread while it writes the exit
/// report: they are delivered (and take their default action) when it is
/// written, or go to another thread, whose handler waits for it.
struct FatalSignalsBlocked(libc::sigset_t);

impl FatalSignalsBlocked {
    fn new() -> FatalSignalsBlocked {
        // SAFETY: sigset manipulation on local storage.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            FatalSignalsBlocked(old)
        }
    }
}

impl Drop for FatalSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in new().
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Writes the exit report once, prints the summary, and returns the exit
/// status CUDALEAK_EXITCODE asks for, if it applies. A second caller waits
/// (bounded) for the first one's report.
fn exit_report(status: Option<i32>, fatal_signal: Option<i32>) -> Option<i32> {
    exit_report_for(status, fatal_signal, None, fatal_signal.is_none())
}

/// `on_program_thread`: the report is written on a thread of the program
/// (not the dumper's), which may read the environment.
fn exit_report_for(
    status: Option<i32>,
    fatal_signal: Option<i32>,
    reason: Option<&str>,
    on_program_thread: bool,
) -> Option<i32> {
    if !is_our_process() {
        return None;
    }
    let start = |from| {
        EXIT_REPORT
            .compare_exchange(from, EXIT_REPORT_WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    };
    if !start(EXIT_REPORT_NOT_STARTED) && !start(EXIT_REPORT_AFTER_FAILED_EXEC) {
        let deadline = Instant::now() + FATAL_DUMP_WAIT;
        loop {
            let now = EXIT_REPORT.load(Ordering::Acquire);
            if now != EXIT_REPORT_WRITING || Instant::now() >= deadline {
                return None;
            }
            wait_while_equal(&EXIT_REPORT, now, Some(Duration::from_millis(50)));
        }
    }
    let blocked = FatalSignalsBlocked::new();
    if on_program_thread {
        // Every exit report but the fatal-signal one (the dumper thread's)
        // is written on a program thread, which may read the environment:
        // the rank as it is now (see `settings::read_rank`).
        settings::read_rank();
    }
    let code = write_exit_report(status, fatal_signal, reason);
    EXIT_REPORT.store(EXIT_REPORT_DONE, Ordering::Release);
    wake_all(&EXIT_REPORT);
    drop(blocked);
    // A SIGTERM/SIGINT that came while the report was written, handled on
    // another thread: the process ends by it, not by returning from here.
    let arrived = FATAL_SIGNAL.load(Ordering::Acquire);
    if arrived != 0 && fatal_signal.is_none() {
        die_by_default_action(arrived);
    }
    code
}

fn write_exit_report(status: Option<i32>, fatal_signal: Option<i32>, reason: Option<&str>) -> Option<i32> {
    let mut req = Request::new(if fatal_signal.is_some() {
        Trigger::FatalSignal
    } else {
        Trigger::Exit
    });
    req.exit_status = status;
    req.signal = fatal_signal;
    req.reason = reason.map(str::to_string);
    req.lock_timeout = Some(EXIT_LOCK_TIMEOUT);
    let outcome = std::panic::catch_unwind(|| dump::dump(req)).ok().flatten()?;
    let config = settings::config();
    let leaked = !outcome.report.leaks.is_empty();
    if leaked && config.summary {
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

/// Library destructor: after the program's own exit handlers.
pub fn at_exit() {
    if let Some(code) = exit_report(known_status(), None) {
        // SAFETY: flush the program's stdio before leaving without exit().
        unsafe { libc::fflush(std::ptr::null_mut()) };
        real_exit_immediately(code);
    }
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;

fn real_exit_immediately(status: c_int) -> ! {
    let p = crate::base::loader::real_dlsym(libc::RTLD_NEXT, c"_exit");
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

/// `_exit` and `_Exit`: no atexit handlers run, so the report is written
/// before the real `_exit` (os._exit in Python, multiprocessing workers,
/// many launchers). `_exit` is async-signal-safe and often called from a
/// signal handler, which may have interrupted malloc: the report (which
/// allocates, symbolizes and writes files) is written by the dumper thread
/// while this thread waits, at most [`FATAL_DUMP_WAIT`], as for `kill` and
/// `raise` (issue 23: a handler's `_exit` deadlocked on glibc's malloc
/// lock). The dumper thread itself writes inline; without one (it could
/// not be started) nothing is written here but one line, with `write(2)`.
fn immediate_exit(status: c_int) -> ! {
    let code = std::panic::catch_unwind(|| exit_report_by_dumper(status))
        .ok()
        .flatten();
    real_exit_immediately(code.unwrap_or(status))
}

/// Async-signal-safe on every path but the dumper thread's own.
fn exit_report_by_dumper(status: c_int) -> Option<i32> {
    if !is_our_process() {
        return None;
    }
    EXIT_STATUS.store(status as i64, Ordering::Release);
    // SAFETY: plain system call.
    if DUMPER_TID.load(Ordering::Acquire) == unsafe { libc::gettid() } {
        return exit_report_for(Some(status), None, None, false);
    }
    let state = EXIT_REPORT.load(Ordering::Acquire);
    if state == EXIT_REPORT_WRITING {
        // Another thread writes it: wait for it (bounded).
        sleep_until(|| EXIT_REPORT.load(Ordering::Acquire) != EXIT_REPORT_WRITING);
        return None;
    }
    if !exit_report_pending(state) || !tracker::saw_allocation_call() {
        return None;
    }
    if !DUMPER_STARTED.load(Ordering::Acquire) {
        const LINE: &[u8] = b"cudaleak: no dump thread: the exit report was not written at _exit\n";
        write_stderr(LINE);
        return None;
    }
    EXIT_REQUEST_DONE.store(false, Ordering::Release);
    EXIT_REQUEST.store(status as i64, Ordering::Release);
    wake_dumper();
    sleep_until(|| EXIT_REQUEST_DONE.load(Ordering::Acquire));
    match EXIT_REQUEST_CODE.load(Ordering::Acquire) {
        NO_EXIT_REQUEST => None,
        c => Some(c as i32),
    }
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
    let p = crate::base::loader::real_dlsym(libc::RTLD_NEXT, c"exit");
    if !p.is_null() {
        // SAFETY: glibc's exit.
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

unsafe extern "C" fn main_returning_status(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    let main: MainFn = std::mem::transmute(REAL_MAIN.load(Ordering::Acquire));
    let status = main(argc, argv, envp);
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
    let real: StartMainFn = std::mem::transmute(real);
    REAL_MAIN.store(main as usize, Ordering::Release);
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

// ---- ways out that run no destructor: kill/raise to ourselves, exec ----

/// Whether `sig`, sent to this process now, ends it by the default action
/// of SIGTERM or SIGINT.
fn dies_of(sig: c_int) -> bool {
    if sig != libc::SIGTERM && sig != libc::SIGINT {
        return false;
    }
    // SAFETY: querying the disposition and this thread's mask.
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
/// no destructor of ours runs (issue 15: Ctrl-C, the usual end of a
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
    kill: AtomicUsize::new(0),
    raise: AtomicUsize::new(0),
    execve: AtomicUsize::new(0),
    execv: AtomicUsize::new(0),
    execvp: AtomicUsize::new(0),
    execvpe: AtomicUsize::new(0),
    fexecve: AtomicUsize::new(0),
    execveat: AtomicUsize::new(0),
};

fn resolve_real_functions() {
    let slots: [(&AtomicUsize, &CStr); 8] = [
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
    // SAFETY: errno is thread-local.
    let errno = unsafe { *libc::__errno_location() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether `kill(pid, _)` reaches this process: its pid, its process
/// group (`0` or `-pgid`), or every process (`-1`, which spares only
/// init and the sender: not us).
fn kill_reaches_us(pid: libc::pid_t) -> bool {
    // SAFETY: plain system calls.
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
        // SAFETY: glibc's kill.
        p if p != 0 => unsafe { std::mem::transmute::<usize, KillFn>(p)(pid, sig) },
        // SAFETY: the system call glibc's kill makes.
        _ => unsafe { libc::syscall(libc::SYS_kill, pid as libc::c_long, sig as libc::c_long) as c_int },
    }
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn raise(sig: c_int) -> c_int {
    errno_kept(|| before_signal_to_self(sig));
    match REAL.raise.load(Ordering::Acquire) {
        // SAFETY: glibc's raise.
        p if p != 0 => unsafe { std::mem::transmute::<usize, RaiseFn>(p)(sig) },
        // SAFETY: the system call glibc's raise makes.
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
/// loads the library afresh and reports its own blocks (issue 15: leaks of
/// an image that called exec were never reported; issue 11). Only a
/// process that made CUDA allocation calls writes one; a vfork child
/// (another pid) does not touch our state. Written once per image: a
/// failed exec goes on, and its next attempts write none (Python's
/// os.execvp tries execv once per PATH entry: each wrote a full, fsynced
/// report); the run marker is removed before each attempt and made again
/// after each failure. Returns whether the failure path must run.
fn before_exec() -> bool {
    if !is_our_process() || !tracker::saw_allocation_call() {
        return false;
    }
    errno_kept(|| {
        if EXIT_REPORT.load(Ordering::Acquire) == EXIT_REPORT_AFTER_FAILED_EXEC {
            // This image's exec report stands: only the marker goes.
            crate::process::run_marker::on_exec_report_stands(instance);
        } else {
            exit_report_for(None, None, Some("exec"), true);
        }
    });
    true
}

/// The exec failed and the process goes on: its exit report is still to
/// come (at its end, with whatever it does until then), and the gate must
/// again notice should it go missing.
fn after_failed_exec(reported: bool) {
    if reported {
        errno_kept(|| {
            let _ = EXIT_REPORT.compare_exchange(
                EXIT_REPORT_DONE,
                EXIT_REPORT_AFTER_FAILED_EXEC,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            dump::reporting_resumes();
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
                *libc::__errno_location() = libc::ENOSYS;
                after_failed_exec(reported);
                return -1;
            }
            let f: unsafe extern "C" fn($($ty),*) -> c_int = std::mem::transmute(p);
            let rc = f($($arg),*);
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

/// For the in-process API: C string argument to an owned String.
pub fn c_str_arg(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the API's contract: NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_s_cpu_clock_is_read_by_its_tid() {
        // SAFETY: plain system call.
        let tid = unsafe { libc::gettid() };
        let before = super::thread_cpu_ns(tid).expect("this thread's CPU clock");
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = super::thread_cpu_ns(tid).unwrap();
        assert!(after >= before + 5_000_000, "{before} -> {after} ({x})");
        assert_eq!(super::thread_cpu_ns(0), None);
    }
}
