//! Fork: the `pthread_atfork` handlers take every lock a hook can hold,
//! so that the child starts with consistent state and tracks its own
//! blocks from zero.

use super::exit::{ExitReport, EXIT_REPORT, EXIT_STATUS, STATUS_UNKNOWN};
use super::handoff::{
    DUMPER_STARTED, DUMPER_TID, EXIT_REQUEST, EXIT_REQUEST_DONE, FATAL_DONE, FATAL_SIGNAL, NO_EXIT_REQUEST,
    PID, SIGNAL_PENDING,
};
use super::new_instance;
use crate::process::dump;
use crate::state::tracker;
use std::sync::atomic::Ordering;

/// Waits for a dump in progress, fsync of its report included: a fork in
/// the middle of one would give the child a half-built dump state. The
/// fsync could move out of the state the fork waits on only by splitting
/// the write (render under the lock, sync and link after, bookkeeping
/// under the lock again); not done yet: the wait is one report's fsync.
pub(super) extern "C" fn fork_prepare() {
    crate::process::live_view::lock_for_fork();
    crate::process::metrics::lock_for_fork();
    dump::DUMP_STATE.raw_lock();
    dump::lock_suppressions_for_fork();
    crate::state::oom::lock_for_fork();
    crate::state::graphs::lock_for_fork();
    tracker::lock_all_for_fork();
}

pub(super) extern "C" fn fork_parent() {
    // SAFETY: the prepare handler took these locks on this thread.
    unsafe {
        tracker::unlock_all_after_fork();
        crate::state::graphs::unlock_after_fork();
        crate::state::oom::unlock_after_fork();
        dump::unlock_suppressions_after_fork();
        dump::DUMP_STATE.raw_unlock();
        crate::process::metrics::unlock_after_fork();
        crate::process::live_view::unlock_after_fork();
    }
}

pub(super) extern "C" fn fork_child() {
    // SAFETY: single-threaded child; the prepare handler took the locks.
    unsafe {
        tracker::reset_in_child_and_unlock();
        crate::state::graphs::reset_in_child_and_unlock();
        crate::state::oom::reset_in_child_and_unlock();
        if let Some(state) = dump::DUMP_STATE.get_unchecked().as_mut() {
            state.reset_for_child();
        }
        dump::unlock_suppressions_after_fork();
        dump::DUMP_STATE.raw_unlock();
        crate::process::metrics::reset_in_child_and_unlock();
        crate::process::live_view::reset_in_child_and_unlock();
        PID.store(libc::getpid(), Ordering::Release);
    }
    crate::hooks::dlsym_override::reset_after_fork();
    new_instance();
    crate::process::run_marker::reset_in_child();
    DUMPER_STARTED.store(false, Ordering::Release);
    SIGNAL_PENDING.store(false, Ordering::Release);
    FATAL_SIGNAL.store(0, Ordering::Release);
    FATAL_DONE.store(false, Ordering::Release);
    DUMPER_TID.store(0, Ordering::Release);
    super::handoff::REQUESTER_TID.store(0, Ordering::Release);
    EXIT_REQUEST.store(NO_EXIT_REQUEST, Ordering::Release);
    EXIT_REQUEST_DONE.store(false, Ordering::Release);
    EXIT_REPORT.store(ExitReport::NotStarted);
    EXIT_STATUS.store(STATUS_UNKNOWN, Ordering::Release);
}
