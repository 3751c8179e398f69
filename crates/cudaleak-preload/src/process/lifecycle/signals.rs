//! The signals: the dump signal's handler (chained to the program's), and
//! SIGTERM/SIGINT taken over the default disposition to write the
//! fatal-signal report first. A handler only stores to atomics and wakes
//! the dumper thread.

use super::exit::{die_by_default_action, report_fatal_signal};
use super::handoff::{wake_dumper, DUMPER_STARTED, SIGNAL_PENDING};
use crate::base::settings;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The dump signal's previous handler and whether it takes three
/// arguments, published as one word so that the handler never pairs one
/// handler with another's flags (it would call a one-argument handler's
/// address with garbage info/uctx, or the reverse): the address with
/// [`PREV_TAKES_SIGINFO`] set when the handler was installed with
/// SA_SIGINFO. User-space code addresses never have the top bit set.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(0);
const PREV_TAKES_SIGINFO: usize = 1 << (usize::BITS - 1);

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

pub(super) fn install_signal_handlers() {
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
    // SAFETY: `__errno_location` returns this thread's own errno, an
    // aligned `int` valid for the thread's life; restoring it is
    // async-signal-safe.
    unsafe { *libc::__errno_location() = errno };
}

extern "C" fn on_fatal_signal(sig: c_int, _info: *mut libc::siginfo_t, _uctx: *mut c_void) {
    report_fatal_signal(sig);
    die_by_default_action(sig);
}
