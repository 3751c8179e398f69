//! Whether a driver hook entered while another runs on the same thread was
//! called from a signal handler that interrupted it. From inside the
//! driver (an exported driver function calling another) the nested call
//! passes straight through: one program call is one block. From a signal
//! handler it is a call of the program's own, recorded like any other, or
//! it would be lost: the runtime's allocations reach us only at the
//! driver, so a handler that calls `cudaMalloc` while the thread it
//! interrupted is inside a driver hook has no other hook to record it.
//!
//! The kernel enters a handler with a signal frame on the stack: the
//! return address glibc's `sigaction` registered (its `__restore_rt`),
//! then the interrupted context, whose stack pointer is above the frame.
//! A signal frame between the nested hook and the interrupted one is
//! found by that word and checked by that stack pointer. Only a nested
//! entry looks, and nesting is rare.

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicUsize, Ordering};

/// glibc's signal return trampoline: 0 not looked for yet, 1 none found.
#[cfg(target_arch = "x86_64")]
static RESTORER: AtomicUsize = AtomicUsize::new(0);

/// `SA_RESTORER` (asm/signal.h): the handler returns through `sa_restorer`.
#[cfg(target_arch = "x86_64")]
const SA_RESTORER: libc::c_int = 0x0400_0000;

/// The restorer of any handler installed through glibc's `sigaction` (all
/// share it), asked of the kernel's record of each signal in turn.
/// `sigaction` is async-signal-safe; this runs in a handler's hook.
#[cfg(target_arch = "x86_64")]
fn restorer() -> Option<usize> {
    match RESTORER.load(Ordering::Relaxed) {
        0 => {}
        1 => return None,
        r => return Some(r),
    }
    let mut found = 1;
    for sig in 1..=libc::SIGRTMAX() {
        // SAFETY: zeroed is a valid `sigaction` out parameter; a query
        // changes nothing.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (null new action) with a valid out parameter.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
            continue;
        }
        if cur.sa_flags & SA_RESTORER != 0 {
            if let Some(f) = cur.sa_restorer {
                found = f as usize;
                break;
            }
        }
    }
    // "None found" is not kept: a handler installed later has one.
    if found != 1 {
        RESTORER.store(found, Ordering::Relaxed);
    }
    (found != 1).then_some(found)
}

/// Whether a signal frame lies on this thread's stack between `low` (a
/// local of the hook just entered) and `high` (a local of the driver hook
/// running further up the same stack).
#[cfg(target_arch = "x86_64")]
pub fn signal_frame_between(low: usize, high: usize) -> bool {
    // The interrupted context up to its instruction pointer: 8 words of
    // flags, link and stack, then the general registers.
    const CONTEXT: usize = std::mem::offset_of!(libc::ucontext_t, uc_mcontext) + 23 * 8;
    if high <= low || high - low > 1 << 20 {
        return false;
    }
    let Some(restorer) = restorer() else {
        return false;
    };
    let mut at = (low + 7) & !7;
    while at + 8 + CONTEXT <= high {
        // SAFETY: an aligned word between two live locals of this thread's
        // own stack, which is mapped between them.
        let word = unsafe { (at as *const usize).read() };
        if word == restorer {
            // SAFETY: the words after it, below `high` (the loop's bound),
            // read as the context the kernel saved there.
            let sp = unsafe {
                std::ptr::addr_of!((*((at + 8) as *const libc::ucontext_t)).uc_mcontext.gregs)
                    .cast::<i64>()
                    .add(libc::REG_RSP as usize)
                    .read()
            } as usize;
            if sp > at && sp <= high {
                return true;
            }
        }
        at += 8;
    }
    false
}

/// Elsewhere the kernel's frame has another layout (aarch64 returns
/// through the vDSO): a nested driver hook passes through.
#[cfg(not(target_arch = "x86_64"))]
pub fn signal_frame_between(_low: usize, _high: usize) -> bool {
    false
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU8;

    /// An address in the frame that raises the signal (the "outer hook").
    static HIGH: AtomicUsize = AtomicUsize::new(0);
    /// 0: the handler did not run; 1: it found no signal frame; 2: found.
    static SEEN: AtomicU8 = AtomicU8::new(0);

    extern "C" fn handler(_: libc::c_int) {
        let here = 0u64;
        let low = std::ptr::addr_of!(here) as usize;
        let found = signal_frame_between(low, HIGH.load(Ordering::Relaxed));
        SEEN.store(if found { 2 } else { 1 }, Ordering::Relaxed);
    }

    #[inline(never)]
    fn called_directly(high: usize) -> bool {
        let here = [0u64; 64];
        signal_frame_between(std::hint::black_box(&here).as_ptr() as usize, high)
    }

    #[test]
    fn a_handler_finds_the_signal_frame_and_a_plain_call_does_not() {
        // SAFETY: a handler that only touches atomics and reads this
        // thread's stack; SIGURG is not used by the test harness.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = handler as *const () as usize;
            assert_eq!(libc::sigaction(libc::SIGURG, &new, std::ptr::null_mut()), 0);
        }
        let mark = [0u64; 4];
        let high = std::hint::black_box(&mark).as_ptr() as usize;
        HIGH.store(high, Ordering::Relaxed);
        // SAFETY: raising a signal whose handler was installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGURG) }, 0);
        assert_eq!(
            SEEN.load(Ordering::Relaxed),
            2,
            "the handler found no signal frame"
        );
        assert!(!called_directly(high), "a plain call found a signal frame");
        // SAFETY: puts the default action back.
        unsafe { libc::signal(libc::SIGURG, libc::SIG_DFL) };
    }
}
