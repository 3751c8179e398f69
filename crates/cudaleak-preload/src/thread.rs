//! Everything a hook keeps per thread. The thread-local itself is small,
//! `const`-initialized and without `Drop` (such a thread-local needs no
//! registration and stays usable while the thread is being torn down).
//! Hooks look it up once per call (a `__tls_get_addr` call in a shared
//! library) and pass the reference down.
//!
//! The large per-thread buffers (replay logs, captured stacks) live in
//! [`ThreadBuffers`], allocated at a thread's first capture and reached
//! through one pointer: glibc carves static TLS out of each thread's stack,
//! and 6.4 KB of it, plus a 2.5 KB stack buffer in every hook frame, made
//! threads with 16-24 KB stacks crash in their first cudaMalloc (issue 15).
//! A pthread key destructor frees them when the thread exits, so programs
//! that make many threads do not leak.

use crate::python::PyReplayLog;
use crate::unwind::ReplayLog;
use cudaleak_core::config::MAX_STACK_DEPTH;
use cudaleak_core::python::PyRawFrame;
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering};

/// Python frames of the last trace interned on this thread, for reuse.
pub const LAST_PYTHON: usize = 32;
/// Python frames recorded per allocation.
pub const PY_MAX: usize = 64;
/// Captured stacks a thread holds at once: a runtime hook's and the driver
/// hook it calls, with room to spare. Captures take them in turn.
const STACK_SLOTS: usize = 4;

/// One captured stack's frames; only the first `n_*` entries (kept in
/// `capture::Stack`) are ever read, so they are never zeroed.
pub struct StackBuffer {
    pub native: [MaybeUninit<u64>; MAX_STACK_DEPTH],
    pub python: [MaybeUninit<PyRawFrame>; PY_MAX],
}

/// A thread's large buffers, allocated on the heap (zeroed, then the replay
/// logs set to their empty states), never built on the (small) stack.
pub struct ThreadBuffers {
    /// What the last full stack walk read (`unwind.rs`, replay).
    pub replay: ReplayLog,
    /// What the last Python frame walk saw (`python.rs`, replay).
    pub python_replay: PyReplayLog,
    /// Python frames of the last trace interned here (see `last_trace`).
    pub last_python: [PyRawFrame; LAST_PYTHON],
    stacks: [StackBuffer; STACK_SLOTS],
    next_stack: usize,
}

impl ThreadBuffers {
    /// The next stack buffer, in turn.
    pub fn next_stack(&mut self) -> *mut StackBuffer {
        let i = self.next_stack % STACK_SLOTS;
        self.next_stack = i + 1;
        &mut self.stacks[i]
    }
}

pub struct ThreadState {
    /// A driver hook is running on this thread (a nested one passes through).
    pub in_driver_hook: Cell<bool>,
    /// The runtime hook running on this thread (`events::HookCx`), if any.
    pub runtime_call: Cell<*const ()>,
    /// (context, slot) last seen on this thread.
    pub last_context: Cell<(u64, u8)>,
    /// This thread's stack, [low, high); (0, 0) until first needed.
    pub stack_bounds: Cell<(usize, usize)>,
    /// (trace id, api, kind) of the last trace interned here; id 0: none.
    pub last_trace: Cell<(u32, u8, u8)>,
    /// and its Python frames' count (u32::MAX when more than fit)
    pub last_python_len: Cell<u32>,
    /// null until the first capture; [`GONE`] once the thread's key
    /// destructor freed them (a later hook on the exiting thread captures
    /// nothing rather than allocate again).
    buffers: Cell<*mut ThreadBuffers>,
}

const GONE: *mut ThreadBuffers = std::ptr::dangling_mut();

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            in_driver_hook: Cell::new(false),
            runtime_call: Cell::new(std::ptr::null()),
            last_context: Cell::new((0, 0)),
            stack_bounds: Cell::new((0, 0)),
            last_trace: Cell::new((0, 0, 0)),
            last_python_len: Cell::new(u32::MAX),
            buffers: Cell::new(std::ptr::null_mut()),
        }
    };
}

/// The pthread key whose destructor frees a thread's buffers, plus one;
/// 0 until created, u32::MAX when it cannot be.
static KEY: AtomicU32 = AtomicU32::new(0);

extern "C" fn free_buffers(p: *mut libc::c_void) {
    if p.is_null() {
        return;
    }
    current().buffers.set(GONE);
    // SAFETY: allocated in `buffers` with this layout; no capture is
    // running on this exiting thread.
    unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<ThreadBuffers>()) };
}

fn key() -> Option<libc::pthread_key_t> {
    match KEY.load(Ordering::Acquire) {
        0 => {}
        u32::MAX => return None,
        k => return Some(k - 1),
    }
    let mut k: libc::pthread_key_t = 0;
    // SAFETY: creating a key with a plain extern "C" destructor.
    if unsafe { libc::pthread_key_create(&mut k, Some(free_buffers)) } != 0 {
        let _ = KEY.compare_exchange(0, u32::MAX, Ordering::AcqRel, Ordering::Acquire);
        return None;
    }
    match KEY.compare_exchange(0, k + 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(k),
        Err(won) => {
            // Another thread created one first: use that one.
            // SAFETY: our own, unused key.
            unsafe { libc::pthread_key_delete(k) };
            (won != u32::MAX).then(|| won - 1)
        }
    }
}

impl ThreadState {
    /// This thread's buffers, allocated on first use; None when they cannot
    /// be had (out of memory, or the thread is exiting).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub fn buffers(&self) -> Option<&mut ThreadBuffers> {
        let p = self.buffers.get();
        if !p.is_null() && p != GONE {
            // SAFETY: this thread's own buffers; callers do not hold two
            // references at once (captures do not nest on a thread).
            return Some(unsafe { &mut *p });
        }
        if p == GONE {
            return None;
        }
        self.new_buffers()
    }

    #[cold]
    #[allow(clippy::mut_from_ref)]
    fn new_buffers(&self) -> Option<&mut ThreadBuffers> {
        let key = key()?;
        // SAFETY: a plain allocation; the fields that need more than zero
        // bits are written below before any use.
        let p = unsafe { std::alloc::alloc_zeroed(std::alloc::Layout::new::<ThreadBuffers>()) }
            .cast::<ThreadBuffers>();
        if p.is_null() {
            return None;
        }
        // SAFETY: fields of the fresh allocation (copied from constants,
        // not built on this small stack).
        unsafe {
            std::ptr::addr_of_mut!((*p).replay).write(ReplayLog::EMPTY);
            std::ptr::addr_of_mut!((*p).python_replay).write(PyReplayLog::EMPTY);
        }
        // SAFETY: registering the buffers for the key's destructor.
        if unsafe { libc::pthread_setspecific(key, p.cast()) } != 0 {
            // SAFETY: just allocated with this layout.
            unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<ThreadBuffers>()) };
            return None;
        }
        self.buffers.set(p);
        // SAFETY: just allocated, this thread's own.
        Some(unsafe { &mut *p })
    }

    /// The replay log of the native unwinder (`unwind.rs`). Captures reach
    /// it after `buffers()` succeeded (`capture.rs`); elsewhere (unit tests)
    /// it is allocated here.
    #[inline(always)]
    pub fn replay_log(&self) -> *mut ReplayLog {
        match self.buffers() {
            Some(b) => &mut b.replay,
            None => no_buffers(),
        }
    }

    /// The replay log of the Python frame walk (`python.rs`); as above.
    #[inline(always)]
    pub fn python_replay_log(&self) -> *mut PyReplayLog {
        match self.buffers() {
            Some(b) => &mut b.python_replay,
            None => no_buffers(),
        }
    }
}

/// Unreachable from hooks (captures check first); a panic is caught at the
/// hook boundary in any case.
#[cold]
#[inline(never)]
fn no_buffers() -> ! {
    panic!("no per-thread buffers")
}

/// The calling thread's state. The reference must not leave the thread,
/// which is why only hooks (running on it) use it.
#[inline]
pub fn current() -> &'static ThreadState {
    // SAFETY: a thread-local without destructor lives as long as its thread,
    // and the reference is only used on this thread, within a hook.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}
