//! The process's live bytes, kept only to find its peak (the out-of-memory
//! and peak issue): every allocation adds, every release subtracts, and an
//! addition that passes the peak raises it.
//!
//! Nothing else reads the count: reports take their live bytes from the
//! live map. So it is exact where the peak is compared with it, and
//! nowhere else matters.
//!
//! One shared word, added to and taken from with one atomic instruction
//! by every thread: the peak is exact. (One thread alone once updated it
//! without a locked instruction, and threads once kept shares of their own
//! under a quota of the peak; measured on the shapes of real jobs neither
//! paid for itself, and both went: docs/performance.md, "Real shapes".)

use cudaleak_core::base::own_line::OwnLine;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

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

/// `n` bytes more; `peak` is [`peak`] as the caller read it before.
#[inline]
pub fn add(n: u64, peak: u64) {
    let now = LIVE_BYTES.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
    if now > peak {
        new_peak(now);
    }
}

/// `n` bytes less.
#[inline]
pub fn sub(n: u64) {
    LIVE_BYTES.fetch_sub(n, Ordering::Relaxed);
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
