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
//! found by that word and checked by that stack pointer. A nested hook
//! that is not below the running one on the same stack (a handler on an
//! alternate signal stack) is a handler's call too. Only a nested entry
//! looks, and nesting is rare.

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

/// How far below the running driver hook a nested one called from inside
/// the driver can be: more is another stack.
const NESTING_MAX: usize = 1 << 20;

/// Whether the driver hook entered at `low` (a local of its frame), while
/// the one at `high` (a local of that hook's frame) runs on this thread,
/// was called by a signal handler rather than from inside the driver. A
/// call from inside the driver is deeper on the same stack: anything else
/// (a handler on an alternate stack, state a non-local exit left behind)
/// is a call of the program's own. On the same stack it is a handler's
/// when a signal frame lies between the two.
pub fn called_from_signal_handler(low: usize, high: usize) -> bool {
    if high <= low || high - low > NESTING_MAX {
        return true;
    }
    signal_frame_between(low, high)
}

/// Whether a signal frame lies between `low` and `high` on this thread's
/// stack: the restorer's address, followed by a context the kernel saved
/// (no link, the user code segment, a stack pointer above the frame and
/// below `high`). Out of line, so that its own frame is below `low`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn signal_frame_between(low: usize, high: usize) -> bool {
    /// x86-64 Linux's user code segment (`__USER_CS`).
    const USER_CS: i64 = 0x33;
    // The interrupted context up to its segment registers: flags, link
    // and stack (5 words), then 19 of the general registers.
    const CONTEXT: usize = std::mem::offset_of!(libc::ucontext_t, uc_mcontext) + 19 * 8;
    let Some(restorer) = restorer() else {
        return false;
    };
    let mut at = (low + 7) & !7;
    while at + 8 + CONTEXT <= high {
        // SAFETY: an aligned word between two live locals of this thread's
        // own stack (the caller checked that they are on one stack, the
        // higher less than NESTING_MAX above), which is mapped between them.
        let word = unsafe { (at as *const usize).read() };
        if word == restorer {
            let context = (at + 8) as *const libc::ucontext_t;
            // SAFETY: the words after it, below `high` (the loop's bound),
            // read as the context the kernel saves there.
            let (link, regs) = unsafe {
                (
                    std::ptr::addr_of!((*context).uc_link).read(),
                    std::ptr::addr_of!((*context).uc_mcontext.gregs).cast::<i64>(),
                )
            };
            // SAFETY: registers REG_RSP and REG_CSGSFS of that context,
            // inside CONTEXT.
            let (sp, segments) = unsafe {
                (
                    regs.add(libc::REG_RSP as usize).read() as usize,
                    regs.add(libc::REG_CSGSFS as usize).read(),
                )
            };
            if link.is_null() && segments & 0xffff == USER_CS && sp > at && sp <= high {
                return true;
            }
        }
        at += 8;
    }
    false
}

/// Elsewhere the kernel's frame has another layout (aarch64 returns
/// through the vDSO): a handler on the interrupted hook's own stack is not
/// told apart from a call from inside the driver, and passes through.
#[cfg(not(target_arch = "x86_64"))]
fn signal_frame_between(_low: usize, _high: usize) -> bool {
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
        let found = called_from_signal_handler(low, HIGH.load(Ordering::Relaxed));
        SEEN.store(if found { 2 } else { 1 }, Ordering::Relaxed);
    }

    #[inline(never)]
    fn called_directly(high: usize) -> bool {
        let here = [0u64; 64];
        called_from_signal_handler(std::hint::black_box(&here).as_ptr() as usize, high)
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
        // Above the outer hook, or far from it, is another stack.
        assert!(called_from_signal_handler(high + 64, high));
        assert!(called_from_signal_handler(high - 2 * NESTING_MAX, high));
        // SAFETY: puts the default action back.
        unsafe { libc::signal(libc::SIGURG, libc::SIG_DFL) };
    }
}
