//! The state across `fork`: every lock taken before, released in the
//! parent, reset in the child.

use super::contexts::{ATTACHES, CONTEXT_INSERT, GREEN_INSERT, PRIMARY_REFS};
use super::vmm::VMM;
use super::*;

/// pthread_atfork prepare: every lock a hook can hold, in lock order.
pub fn lock_all_for_fork() {
    SNAPSHOT_LOCK.raw_lock();
    VMM.raw_lock();
    CONTEXT_INSERT.raw_lock();
    DEPOT.lock_for_fork();
    crate::capture::python::CODES.lock_for_fork();
    LIVE.lock_all(me().tid);
    HANDLES.lock_all(me().tid);
    TORN_DOWN.raw_lock();
    ATTACHES.raw_lock();
    GREEN_INSERT.raw_lock();
}

/// pthread_atfork parent.
///
/// # Safety
/// After [`lock_all_for_fork`] on this thread.
pub unsafe fn unlock_all_after_fork() {
    // SAFETY: the caller ran `lock_all_for_fork` on this thread, which took
    // each of these locks once; they are released once each, in reverse
    // order.
    unsafe {
        GREEN_INSERT.raw_unlock();
        ATTACHES.raw_unlock();
        TORN_DOWN.raw_unlock();
        HANDLES.unlock_all(me().tid);
        LIVE.unlock_all(me().tid);
        crate::capture::python::CODES.unlock_after_fork();
        DEPOT.unlock_after_fork();
        CONTEXT_INSERT.raw_unlock();
        VMM.raw_unlock();
        SNAPSHOT_LOCK.raw_unlock();
    }
}

/// pthread_atfork child: the child tracks only its own blocks, from zero.
/// Interned traces and code objects stay valid (same address space).
///
/// # Safety
/// After [`lock_all_for_fork`], in the single-threaded child.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller ran `lock_all_for_fork` before `fork` on the thread
    // that is now the child's only one, so this thread holds every lock
    // below and no other thread can use them: each lock's value may be
    // reached without a guard while held (`get_unchecked`), and each lock
    // is released once, in reverse order, its reference unused after.
    unsafe {
        GREEN_INSERT.raw_unlock();
        ATTACHES.raw_unlock();
        let torn = TORN_DOWN.get_unchecked();
        *torn = Vec::new();
        TORN_DOWN.raw_unlock();
        HANDLES.reset_locked_and_unlock();
        LIVE.reset_locked_and_unlock();
        crate::capture::python::CODES.unlock_after_fork();
        DEPOT.unlock_after_fork();
        CONTEXT_INSERT.raw_unlock();
        VMM.get_unchecked().clear();
        VMM.raw_unlock();
        SNAPSHOT_LOCK.raw_unlock();
    }
    SITES.reset();
    for c in [
        &FAILED_ALLOCATIONS,
        &INVALID_FREES,
        &crate::capture::NESTED_CAPTURES,
    ] {
        c.store(0, Ordering::Relaxed);
    }
    live_bytes::reset_in_child();
    crate::base::thread::current().reset_in_child();
    for r in &PRIMARY_REFS {
        r.store(0, Ordering::Relaxed);
    }
    crate::state::event_ring::reset_in_child();
    SAW_ALLOCATION_CALL.store(false, Ordering::Release);
}
