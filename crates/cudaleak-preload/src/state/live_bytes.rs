//! The process's live bytes, kept only to find its peak (the out-of-memory
//! and peak issue): every allocation adds, every release subtracts, and an
//! addition that passes the peak raises it.
//!
//! Nothing else reads the count: reports take their live bytes from the
//! live map. So it is exact where the peak is compared with it, and
//! nowhere else matters.
//!
//! Numbered cases worth knowing:
//! 1. While one thread alone allocates and frees (`sole_thread.rs`), it
//!    updates the count with one `add` to memory that has no `lock`
//!    prefix: a locked add costs about 4 ns, twice a pair (issue 24). One
//!    instruction, so that a signal handler on the same thread that
//!    allocates (never async-signal-safe, but programs do it) cannot land
//!    between a load and a store of the count: a nested section adds too.
//!    The peak is exact.
//! 2. With more threads, each keeps what it counted in its own state
//!    (`ThreadState::pending_bytes`) and adds it to the shared count only
//!    when it could hide a new peak: when the count plus its share passes
//!    the peak, or when its share passes a quota of the peak. The shared
//!    word, which every thread's add took from the others' caches (two
//!    threads: 2x the library's cost per pair), is then written only that
//!    often. The share is a plain cell: a signal handler that allocates
//!    between its read and its write loses the handler's change (one
//!    block, for good), as allocating in a handler is not async-signal-
//!    safe anyway.
//! 3. The quota is the peak / 2^(8 + 2 * ceil(log2 n)), n the live threads
//!    that count so: at most peak / (256 n^2). Of those, the k-th to start
//!    saw n >= k at each of its changes (the k - 1 before it were counted
//!    and are still alive), so it holds at most peak / (256 k^2), and all
//!    of them together at most 0.64 % of the peak (the sum of 1 / k^2 is
//!    under 1.65): a peak seen by one thread misses at most that much of
//!    the others' shares, within the 1 % the out-of-memory and peak issue
//!    allows. An exiting thread leaves n after its share is added (case
//!    4). Before, n never went down, and a program that had started many
//!    short-lived threads (a data loader's workers) kept quotas of 0.
//! 4. A thread's share is added at its exit (a pthread key's destructor):
//!    an exited thread's share would otherwise be lost for good. Where no
//!    key can be had, the quota is 0: every change is added at once.

use crate::base::thread::ThreadState;
use crate::state::sole_thread::{self, SOLE_THREAD};
use cudaleak_core::base::own_line::OwnLine;
use cudaleak_core::base::sole::Entry;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

static LIVE_BYTES: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));
static PEAK_BYTES: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));
/// When PEAK_BYTES was last raised (Unix ms, to the coarse clock's tick).
static PEAK_TIME_MS: AtomicI64 = AtomicI64::new(0);
/// Case 3: the live threads that count with a share of their own.
static SHARING_THREADS: AtomicU32 = AtomicU32::new(0);
/// Case 4: the pthread key whose destructor adds an exiting thread's
/// share, plus one; 0 before it is made, `u32::MAX` when it cannot be.
static EXIT_KEY: AtomicU32 = AtomicU32::new(0);

/// The peak so far, in bytes.
#[inline]
pub fn peak() -> u64 {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// When the peak was last raised (Unix ms).
pub fn peak_time_ms() -> i64 {
    PEAK_TIME_MS.load(Ordering::Relaxed)
}

/// `n` bytes more, counted by `thread`; `peak` is [`peak`] as the caller
/// read it before.
#[inline]
pub fn add(n: u64, thread: &ThreadState, peak: u64) {
    if sole_update(n, thread) {
        // The owner's own add is visible to it.
        let now = LIVE_BYTES.load(Ordering::Relaxed);
        if now > peak {
            new_peak(now);
        }
    } else {
        shared_change(n as i64, thread, peak);
    }
}

/// `n` bytes less, released by `thread`.
#[inline]
pub fn sub(n: u64, thread: &ThreadState) {
    if !sole_update(n.wrapping_neg(), thread) {
        shared_change((n as i64).wrapping_neg(), thread, peak());
    }
}

/// Case 2: `delta` into `thread`'s share, which goes to the shared count
/// when it could hide a new peak or passes the quota.
#[inline]
fn shared_change(delta: i64, thread: &ThreadState, peak: u64) {
    if !thread.counts_pending.get() {
        start_sharing(thread);
    }
    let share = thread.pending_bytes.get().wrapping_add(delta);
    // The quota first: past it, the shared word is written anyway, and a
    // load of it first would take its line twice (shared, then owned).
    if share.unsigned_abs() > quota(peak)
        || (delta > 0 && LIVE_BYTES.load(Ordering::Relaxed).wrapping_add(share as u64) > peak)
    {
        thread.pending_bytes.set(0);
        let now = LIVE_BYTES
            .fetch_add(share as u64, Ordering::Relaxed)
            .wrapping_add(share as u64);
        if now > peak {
            new_peak(now);
        }
    } else {
        thread.pending_bytes.set(share);
    }
}

/// Case 3: how far a thread's share may grow, in bytes.
#[inline]
fn quota(peak: u64) -> u64 {
    if EXIT_KEY.load(Ordering::Relaxed) == u32::MAX {
        return 0; // case 4
    }
    let n = SHARING_THREADS.load(Ordering::Relaxed).max(1);
    let log2_ceil = u32::BITS - (n - 1).leading_zeros();
    peak.checked_shr(8 + 2 * log2_ceil).unwrap_or(0)
}

/// A thread's first share: counted in the quota's n, and added at its
/// exit (case 4).
#[cold]
#[inline(never)]
fn start_sharing(thread: &ThreadState) {
    thread.counts_pending.set(true);
    SHARING_THREADS.fetch_add(1, Ordering::Relaxed);
    if let Some(key) = exit_key() {
        // The value only needs to be non-null for the destructor to run.
        let value = &EXIT_KEY as *const AtomicU32 as *const c_void;
        // SAFETY: a key of ours (TSD slots below 32 need no allocation).
        if unsafe { libc::pthread_setspecific(key, value) } != 0 {
            let _ = EXIT_KEY.swap(u32::MAX, Ordering::Relaxed);
        }
    }
}

/// Case 4: adds the exiting thread's share. A destructor that runs after
/// this one and frees memory starts the thread's sharing again, which
/// sets the key again: glibc runs destructors up to four rounds.
extern "C" fn add_share_at_exit(_: *mut c_void) {
    let thread = crate::base::thread::current();
    let share = thread.pending_bytes.replace(0);
    if share != 0 {
        LIVE_BYTES.fetch_add(share as u64, Ordering::Relaxed);
    }
    if thread.counts_pending.replace(false) {
        SHARING_THREADS.fetch_sub(1, Ordering::Relaxed);
    }
}

fn exit_key() -> Option<libc::pthread_key_t> {
    crate::base::thread::exit_key(&EXIT_KEY, add_share_at_exit)
}

/// Case 1: the sole thread's update; false when the caller must share.
#[inline(always)]
fn sole_update(delta: u64, thread: &ThreadState) -> bool {
    match SOLE_THREAD.enter(sole_thread::key(thread)) {
        Entry::Sole(_section) | Entry::Nested(_section) => {
            unlocked_add(delta);
            true
        }
        Entry::Shared => false,
    }
}

/// One `add` to memory, without `lock`.
#[inline(always)]
fn unlocked_add(delta: u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an add to a live, aligned u64 (the atomic's storage). Other
    // threads only read it meanwhile (the sole section keeps them from
    // writing), and an aligned 8-byte store is single-copy atomic on
    // x86-64, so a reader sees the old or the new value.
    unsafe {
        std::arch::asm!(
            "add qword ptr [{count}], {delta}",
            count = in(reg) LIVE_BYTES.as_ptr(),
            delta = in(reg) delta,
            options(nostack),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // Not reached: sole mode begins on x86-64 only (`sole_thread::init`).
    LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
}

/// Live bytes went past the peak: only while memory grows, never in a
/// steady alloc/free loop.
#[cold]
#[inline(never)]
fn new_peak(now: u64) {
    if PEAK_BYTES.fetch_max(now, Ordering::Relaxed) < now {
        PEAK_TIME_MS.store(coarse_now_ms(), Ordering::Relaxed);
    }
}

/// Unix time in ms from the coarse clock (a vDSO read, no system call;
/// its tick is 1-4 ms).
fn coarse_now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local that clock_gettime only writes; an
    // unknown clock fails with EINVAL, handled below.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// A fork's child starts from zero, its one thread sharing nothing.
pub fn reset_in_child() {
    LIVE_BYTES.store(0, Ordering::Relaxed);
    PEAK_BYTES.store(0, Ordering::Relaxed);
    PEAK_TIME_MS.store(0, Ordering::Relaxed);
    SHARING_THREADS.store(0, Ordering::Relaxed);
    let thread = crate::base::thread::current();
    thread.pending_bytes.set(0);
    thread.counts_pending.set(false);
}
