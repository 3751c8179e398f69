//! The thread that allocates and frees alone, if any: while it is alone,
//! the live maps take no shard lock and the live-byte count no locked add
//! for it (`cudaleak_core::base::sole` has the protocol and its cases).
//! Most programs allocate GPU memory from one thread; the first other
//! thread that records or releases a block ends this for good. A live dump
//! on the library's dump thread only reads: it holds the owner off while
//! it copies the maps, and leaves sole mode as it was (case 8).

use crate::base::thread::ThreadState;
use cudaleak_core::base::sole::{SoleOwner, ThreadKey};

pub static SOLE_THREAD: SoleOwner = SoleOwner::new();

/// `thread`'s key: the address of its state, which no other live thread
/// has.
#[inline(always)]
pub fn key(thread: &ThreadState) -> ThreadKey {
    thread as *const ThreadState as usize
}

/// The calling thread's key, for paths with no thread state at hand.
#[inline]
pub fn current_key() -> ThreadKey {
    key(crate::base::thread::current())
}

/// At start-up: sole mode may begin where membarrier can be registered,
/// on x86-64 (the live-byte count's unlocked add is x86-64 assembly).
pub fn init() {
    if cfg!(target_arch = "x86_64") {
        SOLE_THREAD.allow();
    }
}

/// A fork's child: one thread, no owner yet.
pub fn reset_in_child() {
    SOLE_THREAD.reset_in_child();
}
