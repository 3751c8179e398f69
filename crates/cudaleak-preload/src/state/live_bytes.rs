//! The process's live bytes, kept only to find its peak (the out-of-memory
//! and peak issue): every allocation adds, every release subtracts, and an
//! addition that passes the peak raises it.
//!
//! Nothing else reads the count: reports take their live bytes from the
//! live map. So it is exact where the peak is compared with it, and
//! nowhere else matters.
//!
//! While one thread alone allocates and frees (`sole_thread.rs`), it
//! updates the count with one `add` to memory that has no `lock` prefix:
//! a locked add costs about 4 ns, twice a pair (issue 24). One
//! instruction, so that a signal handler on the same thread that allocates
//! (never async-signal-safe, but programs do it) cannot land between a
//! load and a store of the count: a nested section adds too.

use crate::base::thread::ThreadState;
use crate::state::sole_thread::{self, SOLE_THREAD};
use cudaleak_core::base::sole::Entry;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A value alone in its 64-byte cache line.
///
/// The bug (issue 24): two threads doubled the library's cost per pair
/// with no lock waited on. The live count, written by every allocation and
/// release, shared its line with the peak, the epoch and the tracking flag,
/// which every event reads: each write took the line from the other core.
#[repr(align(64))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

static LIVE_BYTES: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));
static PEAK_BYTES: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));
/// When PEAK_BYTES was last raised (Unix ms, to the coarse clock's tick).
static PEAK_TIME_MS: AtomicI64 = AtomicI64::new(0);

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
    let now = match sole_update(n, thread) {
        Some(now) => now,
        None => LIVE_BYTES.fetch_add(n, Ordering::Relaxed).wrapping_add(n),
    };
    if now > peak {
        new_peak(now);
    }
}

/// `n` bytes less, released by `thread`.
#[inline]
pub fn sub(n: u64, thread: &ThreadState) {
    let minus = n.wrapping_neg();
    if sole_update(minus, thread).is_none() {
        LIVE_BYTES.fetch_add(minus, Ordering::Relaxed);
    }
}

/// The sole thread's update, or `None` when the caller must lock.
#[inline(always)]
fn sole_update(delta: u64, thread: &ThreadState) -> Option<u64> {
    match SOLE_THREAD.enter(sole_thread::key(thread)) {
        Entry::Sole(_section) | Entry::Nested(_section) => Some(unlocked_add(delta)),
        Entry::Shared => None,
    }
}

/// One `add` to memory, without `lock`; then the count as this thread
/// now sees it.
#[inline(always)]
fn unlocked_add(delta: u64) -> u64 {
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
    LIVE_BYTES.load(Ordering::Relaxed)
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

/// A fork's child starts from zero.
pub fn reset_in_child() {
    LIVE_BYTES.store(0, Ordering::Relaxed);
    PEAK_BYTES.store(0, Ordering::Relaxed);
    PEAK_TIME_MS.store(0, Ordering::Relaxed);
}
