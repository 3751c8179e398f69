//! The process's live bytes, kept only to find its peak (the out-of-memory
//! and peak issue): every allocation adds, every release subtracts, and an
//! addition that passes the peak raises it.
//!
//! Nothing else reads the count: reports take their live bytes from the
//! live map. So it is exact where the peak is compared with it, and
//! nowhere else matters.
//!
//! One shared word, added to and taken from with one atomic instruction
//! by every thread: the peak is exact. So is the high-water mark of a
//! peak window (the in-process API's `cudaleak_peak_window_*`, a test's
//! peak): while one is open, an addition that passes the mark raises it;
//! while none is, the mark is a value no count passes. (One thread alone once updated it
//! without a locked instruction, and threads once kept shares of their own
//! under a quota of the peak; measured on the shapes of real jobs neither
//! paid for itself, and both went: docs/performance.md, "Real shapes".)

use cudaleak_core::base::own_line::OwnLine;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

static LIVE_BYTES: OwnLine<AtomicU64> = OwnLine(AtomicU64::new(0));

/// The peak, and the high-water mark of the peak windows open
/// (`cudaleak_peak_window_begin`): one cache line, which every allocation
/// reads for the peak anyway, so that looking at the window costs no miss.
struct Peaks {
    bytes: AtomicU64,
    /// the most live bytes since the oldest open window began; `NO_WINDOW`
    /// while none is open, which no count passes: the allocation path
    /// then never goes further than its compare
    window: AtomicU64,
}

const NO_WINDOW: u64 = u64::MAX;

static PEAK: OwnLine<Peaks> = OwnLine(Peaks {
    bytes: AtomicU64::new(0),
    window: AtomicU64::new(NO_WINDOW),
});
/// Windows open, changed under [`WINDOWS_LOCK`] (begin and end are rare
/// API calls, never in a hook).
static WINDOWS_OPEN: AtomicU64 = AtomicU64::new(0);
static WINDOWS_LOCK: AtomicBool = AtomicBool::new(false);
/// When PEAK_BYTES was last raised (Unix ms, to the coarse clock's tick).
static PEAK_TIME_MS: AtomicI64 = AtomicI64::new(0);

/// The peak so far, in bytes.
#[inline]
pub fn peak() -> u64 {
    PEAK.bytes.load(Ordering::Relaxed)
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
    } else if now > PEAK.window.load(Ordering::Relaxed) {
        window_high(now);
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
    if PEAK.bytes.fetch_max(now, Ordering::Relaxed) < now {
        PEAK_TIME_MS.store(coarse_now_ms(), Ordering::Relaxed);
    }
    if now > PEAK.window.load(Ordering::Relaxed) {
        window_high(now);
    }
}

/// Live bytes went past the open windows' high-water mark: only while a
/// window is open and memory grows past its most so far.
#[cold]
#[inline(never)]
fn window_high(now: u64) {
    // A window that closed meanwhile left NO_WINDOW, which this keeps.
    PEAK.window.fetch_max(now, Ordering::Relaxed);
}

/// Runs `f` with the windows' count held still.
fn with_windows<T>(f: impl FnOnce() -> T) -> T {
    while WINDOWS_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let out = f();
    WINDOWS_LOCK.store(false, Ordering::Release);
    out
}

/// Opens a peak window; returns the live bytes now. The first window open
/// starts the high-water mark at the live bytes; one opened while another
/// is open shares its mark (the most since the oldest began).
pub fn window_begin() -> u64 {
    with_windows(|| {
        if WINDOWS_OPEN.fetch_add(1, Ordering::Relaxed) == 0 {
            // The mark first, then the count it starts from: an allocation
            // between the two raises the mark itself, and is in the count
            // read after it, so none is lost.
            PEAK.window.store(0, Ordering::Relaxed);
            let live = LIVE_BYTES.load(Ordering::Relaxed);
            PEAK.window.fetch_max(live, Ordering::Relaxed);
            live
        } else {
            LIVE_BYTES.load(Ordering::Relaxed)
        }
    })
}

/// The most live bytes since the oldest open window began; 0 when none is
/// open.
pub fn window_high_water() -> u64 {
    match PEAK.window.load(Ordering::Relaxed) {
        NO_WINDOW => 0,
        w => w,
    }
}

/// Closes a window; returns its high-water mark ([`window_high_water`]),
/// 0 when none was open. The last window closed stops the mark.
pub fn window_end() -> u64 {
    with_windows(|| {
        let high = window_high_water();
        let open = WINDOWS_OPEN.load(Ordering::Relaxed);
        if open > 0 {
            WINDOWS_OPEN.store(open - 1, Ordering::Relaxed);
            if open == 1 {
                PEAK.window.store(NO_WINDOW, Ordering::Relaxed);
            }
        }
        high
    })
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
    PEAK.bytes.store(0, Ordering::Relaxed);
    PEAK_TIME_MS.store(0, Ordering::Relaxed);
    // The parent's windows are not the child's; a lock the parent held
    // while forking is no one's in the child.
    PEAK.window.store(NO_WINDOW, Ordering::Relaxed);
    WINDOWS_OPEN.store(0, Ordering::Relaxed);
    WINDOWS_LOCK.store(false, Ordering::Relaxed);
}
