//! The thread's stack bounds, and reads of the stack checked against
//! them: a wrong rule ends a walk instead of faulting.

use crate::base::thread::ThreadState;

#[inline]
pub(crate) fn stack_bounds(sp: usize, thread: &ThreadState) -> Option<(usize, usize)> {
    let (lo, hi) = thread.stack_bounds.get();
    if lo <= sp && sp < hi {
        return Some((lo, hi));
    }
    new_stack_bounds(sp, thread)
}

#[cold]
fn new_stack_bounds(sp: usize, thread: &ThreadState) -> Option<(usize, usize)> {
    // SAFETY: querying this thread's attributes.
    let bounds = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if ok != 0 {
            return None;
        }
        (addr as usize, addr as usize + size)
    };
    // A stack the thread switched to (coroutines, sigaltstack) is not
    // ours to walk with these bounds.
    if !(bounds.0 <= sp && sp < bounds.1) {
        return None;
    }
    thread.stack_bounds.set(bounds);
    Some(bounds)
}

/// Reads a word of the stack between the capture's own stack pointer
/// (everything above it is mapped and in use) and the stack's top.
#[inline(always)]
pub(super) fn read_stack(addr: usize, bounds: (usize, usize)) -> Option<usize> {
    if addr < bounds.0 || addr >= bounds.1 || addr & 7 != 0 {
        return None;
    }
    // SAFETY: inside this thread's live stack, aligned.
    Some(unsafe { (addr as *const usize).read() })
}
