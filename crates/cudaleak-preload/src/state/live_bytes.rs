//! The process's live bytes, kept only to find its peak (the out-of-memory
//! and peak issue): every allocation adds, every release subtracts, and an
//! addition that passes the peak raises it.
//!
//! Numbered cases worth knowing:
//! 1. Nothing else reads the count: reports take their live bytes from the
//!    live map. So the count is exact where the peak is compared with it,
//!    and nowhere else matters.
//! 2. Sole writer. While one thread alone has counted bytes, it updates
//!    the count with one `add` to memory that has no `lock` prefix. A
//!    locked add costs about 4 ns, twice a pair (issue 24), and most
//!    programs allocate GPU memory from one thread. The owner is that
//!    thread's `ThreadState`, whose address no other live thread has.
//! 3. The first other thread to count ends sole mode for good
//!    ([`leave_sole_mode`]): it marks the count shared, makes every thread
//!    of the process pass a full memory barrier (membarrier(2), private
//!    expedited), then waits until the owner is out of its update. An
//!    update the owner began before that barrier is then visible, finished,
//!    and one it begins after it sees the count shared and locks. Without
//!    the barrier, the owner's "updating" flag could still sit in its store
//!    buffer while the other thread reads it as clear.
//! 4. The owner's update is one instruction so that a signal handler on
//!    the same thread, which may allocate (never async-signal-safe, but
//!    programs do it), cannot land between a load and a store of the
//!    count; the handler restores the "updating" flag it found, so the
//!    interrupted update stays covered.
//! 5. Where membarrier cannot be registered (kernels before 4.14, seccomp
//!    filters) or on other architectures, the count is shared from the
//!    start: locked adds, as before.
//! 6. The wait of case 3 gives up after a second: an owner stopped for
//!    good inside its two-instruction update (a fork's child inherits no
//!    such thread; `reset_in_child` clears the flag) must not hang the
//!    program. What giving up risks is one lost update of the peak count.

use crate::base::thread::ThreadState;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

/// Case 2: 0 before any thread counted, the owner's `ThreadState`
/// address in sole mode, [`SHARED`] after it.
static SOLE_OWNER: OwnLine<AtomicUsize> = OwnLine(AtomicUsize::new(0));
const SHARED: usize = usize::MAX;
/// Case 3: set by the owner around its update, read by a thread leaving
/// sole mode. Written by the owner alone, in its own line.
static OWNER_UPDATING: OwnLine<AtomicBool> = OwnLine(AtomicBool::new(false));
/// Case 5: membarrier is registered, so sole mode may begin.
static SOLE_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Registers for private expedited membarriers (case 3), once at start-up
/// and again in a fork's child.
pub fn init() {
    let allowed = cfg!(target_arch = "x86_64") && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
    SOLE_ALLOWED.store(allowed, Ordering::Relaxed);
}

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

/// Case 2: the owner's update, or `None` when the caller must lock (it is
/// not the owner, and sole mode has ended, case 3).
#[inline(always)]
fn sole_update(delta: u64, thread: &ThreadState) -> Option<u64> {
    let me = thread as *const ThreadState as usize;
    let owner = SOLE_OWNER.load(Ordering::Relaxed);
    if owner != me {
        if owner != SHARED {
            begin_or_leave_sole_mode(me);
        }
        // Sole mode is taken on the next update: this one locks.
        return None;
    }
    let was = OWNER_UPDATING.load(Ordering::Relaxed);
    OWNER_UPDATING.store(true, Ordering::Relaxed);
    // Only the compiler is fenced: the processor's order of the flag's
    // store and the owner's load below is what the membarrier of case 3
    // settles.
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    let result = if SOLE_OWNER.load(Ordering::Relaxed) == me {
        Some(unlocked_add(delta))
    } else {
        None
    };
    OWNER_UPDATING.store(was, Ordering::Release);
    result
}

/// Case 4: one `add` to memory, without `lock`; then the count as this
/// thread now sees it.
#[inline(always)]
fn unlocked_add(delta: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an add to a live, aligned u64 (the atomic's storage). Other
    // threads only read it meanwhile (case 3 keeps them from writing), and
    // an aligned 8-byte store is single-copy atomic on x86-64, so a reader
    // sees the old or the new value.
    unsafe {
        std::arch::asm!(
            "add qword ptr [{count}], {delta}",
            count = in(reg) LIVE_BYTES.as_ptr(),
            delta = in(reg) delta,
            options(nostack),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // Not reached: `init` allows sole mode on x86-64 only (case 5).
    LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The first counting thread becomes the owner; any other ends sole mode.
#[cold]
#[inline(never)]
fn begin_or_leave_sole_mode(me: usize) {
    if SOLE_ALLOWED.load(Ordering::Relaxed)
        && SOLE_OWNER
            .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        return;
    }
    leave_sole_mode();
}

/// Case 3, once per process: from here on every update locks.
#[cold]
#[inline(never)]
fn leave_sole_mode() {
    if SOLE_OWNER.load(Ordering::Relaxed) == SHARED {
        return;
    }
    let owner = SOLE_OWNER.swap(SHARED, Ordering::SeqCst);
    if owner == 0 || owner == SHARED {
        return;
    }
    if !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        // Registered, so this should not fail; if it does, give the
        // owner's store buffer time to drain before trusting the flag.
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = Instant::now();
    while OWNER_UPDATING.load(Ordering::Acquire) {
        if start.elapsed() > Duration::from_secs(1) {
            return; // case 6
        }
        std::thread::yield_now();
    }
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

/// A fork's child starts from zero, with its one thread free to become
/// the owner (its registration is its own: register again).
pub fn reset_in_child() {
    LIVE_BYTES.store(0, Ordering::Relaxed);
    PEAK_BYTES.store(0, Ordering::Relaxed);
    PEAK_TIME_MS.store(0, Ordering::Relaxed);
    OWNER_UPDATING.store(false, Ordering::Relaxed);
    SOLE_OWNER.store(0, Ordering::Relaxed);
    init();
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) == 0 }
}
