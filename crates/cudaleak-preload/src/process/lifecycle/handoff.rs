//! What program threads, signal handlers and the dumper thread share: the
//! atomics a trigger sets and the dumper thread reads, the futex word that
//! wakes it, and the bounded wait of a thread that handed it work. Only
//! atomics and async-signal-safe calls: a signal handler runs all of this.

use cudaleak_core::base::lock::wake_all;
use cudaleak_core::record::live_map::{Flight, Stopped};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

pub(super) static PID: AtomicI32 = AtomicI32::new(0);
pub(super) static DUMPER_STARTED: AtomicBool = AtomicBool::new(false);
/// Bumped (and futex-woken) by every trigger.
pub(super) static WAKE: AtomicU32 = AtomicU32::new(0);
pub(super) static SIGNAL_PENDING: AtomicBool = AtomicBool::new(false);
pub(super) static FATAL_SIGNAL: AtomicI32 = AtomicI32::new(0);
pub(super) static FATAL_DONE: AtomicBool = AtomicBool::new(false);
/// An exit report handed to the dumper thread (`exit`, the return from
/// `main`, `_exit`, an `exec`): its status, [`STATUS_NOT_KNOWN`], or
/// [`NO_EXIT_REQUEST`]. The thread that asks only waits: it may be inside
/// a signal handler that interrupted malloc, or a hook holding a shard of
/// the live map (`_exit` from a handler wrote the report in the
/// handler and deadlocked on malloc's lock; the same with `exit(0)` in a
/// SIGTERM handler).
pub(super) static EXIT_REQUEST: AtomicI64 = AtomicI64::new(NO_EXIT_REQUEST);
pub(super) const NO_EXIT_REQUEST: i64 = i64::MIN;
pub(super) const STATUS_NOT_KNOWN: i64 = i64::MIN + 1;
/// The exit request is an `exec`'s report (`reason: "exec"`).
pub(super) static EXIT_REQUEST_EXEC: AtomicBool = AtomicBool::new(false);
/// The thread waiting for the exit or fatal-signal report, which never
/// runs again before the report is written, so that the dumper takes over
/// what it was doing to the live map (cudaleak_core's `live_map.rs`, case
/// 1): its kernel id (0: none) and the address of its flight.
pub(super) static REQUESTER_TID: AtomicU32 = AtomicU32::new(0);
pub(super) static REQUESTER_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// The status the dumper's exit report asks for (CUDALEAK_EXITCODE), or
/// [`NO_EXIT_REQUEST`]; and whether it is done.
pub(super) static EXIT_REQUEST_CODE: AtomicI64 = AtomicI64::new(NO_EXIT_REQUEST);
pub(super) static EXIT_REQUEST_DONE: AtomicBool = AtomicBool::new(false);
/// The dumper thread's kernel thread id (0: none yet).
pub(super) static DUMPER_TID: AtomicI32 = AtomicI32::new(0);

/// How long a SIGTERM/SIGINT handler (or a second way out, `_exit`,
/// `kill`, `raise`) waits for the exit report while the dumper thread
/// makes no progress (uses no CPU): a dumper stuck on a lock the
/// interrupted thread holds is given up after this.
pub(super) const FATAL_DUMP_WAIT: Duration = Duration::from_secs(10);
/// The longest such a wait lasts while the dumper thread works: a large
/// exit report (a million call sites took 3.6 s) plus a live dump in
/// progress can pass [`FATAL_DUMP_WAIT`], and giving up then lost the
/// report.
pub(super) const FATAL_DUMP_MAX: Duration = Duration::from_secs(600);

pub(super) fn wake_dumper() {
    WAKE.fetch_add(1, Ordering::AcqRel);
    wake_all(&WAKE);
}

/// The calling thread, as the one that waits for the report it asks for
/// (see [`REQUESTER_TID`]). Its kernel id is asked for now, so that the dumper
/// finds it in the thread state.
/// Claims the requester's place for the calling thread, unless another
/// thread holds it (its report comes first; this thread waits for it):
/// whether it did. Before the request itself is published, so that the
/// dumper, woken by it, finds its requester.
pub(super) fn note_requester() -> bool {
    let me = crate::base::thread::current().caller();
    REQUESTER_FLIGHT.store(me.flight as *const Flight as usize, Ordering::Relaxed);
    if REQUESTER_TID
        .compare_exchange(0, me.tid, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        return true;
    }
    false
}

/// Gives the requester's place back once its report is done (or was not
/// asked for after all).
pub(super) fn forget_requester() {
    let me = crate::base::thread::current().caller();
    let _ = REQUESTER_TID.compare_exchange(me.tid, 0, Ordering::AcqRel, Ordering::Acquire);
}

/// The thread waiting for the report being written, if one is.
pub(super) fn requester() -> Option<Stopped<'static>> {
    let tid = REQUESTER_TID.load(Ordering::Acquire);
    let flight = REQUESTER_FLIGHT.load(Ordering::Relaxed);
    (tid != 0 && flight != 0).then(|| Stopped {
        tid,
        // SAFETY: the address of a thread's flight, in its thread state,
        // which lives as long as the thread; and the thread waits, alive,
        // for the report this is asked for.
        flight: unsafe { &*(flight as *const Flight) },
    })
}

/// Polls `done` until it holds, for as long as the dumper thread keeps
/// working: it gives up once the dumper has used no CPU for
/// [`FATAL_DUMP_WAIT`], or after [`FATAL_DUMP_MAX`]. Every 0.2 ms for the
/// first 10 ms (a one-leak exit report takes about 3), every 5 ms after.
/// Async-signal-safe (nanosleep, clock_gettime).
pub(super) fn sleep_until(done: impl Fn() -> bool) {
    let quick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000,
    };
    for _ in 0..50 {
        if done() {
            return;
        }
        // SAFETY: sleeping on a local timespec. The system call, not
        // libc's `nanosleep`, a cancellation point: this thread may have a
        // cancellation of the program's pending.
        unsafe { libc::syscall(libc::SYS_nanosleep, &quick as *const libc::timespec, 0usize) };
    }
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
        // SAFETY: sleeping on `step`, a local timespec that outlives the
        // call, with no remainder pointer. The system call, not libc's
        // `nanosleep` (a cancellation point), as above.
        unsafe { libc::syscall(libc::SYS_nanosleep, &step as *const libc::timespec, 0usize) };
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
    // SAFETY: `ts` is a local timespec that clock_gettime writes; a clock
    // id of a thread that is gone fails with EINVAL, nothing worse.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0)
        .then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

pub(super) fn is_our_process() -> bool {
    // SAFETY: getpid takes no arguments, touches no memory of ours and
    // cannot fail; not cached by glibc.
    unsafe { libc::getpid() == PID.load(Ordering::Acquire) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_s_cpu_clock_is_read_by_its_tid() {
        let tid = cudaleak_core::base::tid_lock::gettid() as i32;
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
