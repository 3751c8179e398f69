//! Everything a hook keeps per thread, in one `const`-initialized
//! thread-local without `Drop` (such a thread-local needs no registration
//! and stays usable while the thread is being torn down). Hooks look it up
//! once per call (a `__tls_get_addr` call in a shared library) and pass
//! the reference down.

use crate::python::PyReplayLog;
use crate::unwind::ReplayLog;
use cudaleak_core::python::PyRawFrame;
use std::cell::{Cell, UnsafeCell};

/// Python frames of the last trace interned on this thread, for reuse.
pub const LAST_PYTHON: usize = 32;

pub struct ThreadState {
    /// A driver hook is running on this thread (a nested one passes through).
    pub in_driver_hook: Cell<bool>,
    /// The runtime hook running on this thread (`events::HookCx`), if any.
    pub runtime_call: Cell<*const ()>,
    /// (context, slot) last seen on this thread.
    pub last_context: Cell<(u64, u8)>,
    /// This thread's stack, [low, high); (0, 0) until first needed.
    pub stack_bounds: Cell<(usize, usize)>,
    /// What the last full stack walk read (`unwind.rs`, replay).
    pub replay: UnsafeCell<ReplayLog>,
    /// What the last Python frame walk saw (`python.rs`, replay).
    pub python_replay: UnsafeCell<PyReplayLog>,
    /// (trace id, api, kind) of the last trace interned here; id 0: none.
    pub last_trace: Cell<(u32, u8, u8)>,
    /// and its Python frames (count; u32::MAX when more than fit)
    pub last_python: UnsafeCell<[PyRawFrame; LAST_PYTHON]>,
    pub last_python_len: Cell<u32>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            in_driver_hook: Cell::new(false),
            runtime_call: Cell::new(std::ptr::null()),
            last_context: Cell::new((0, 0)),
            stack_bounds: Cell::new((0, 0)),
            replay: UnsafeCell::new(ReplayLog::EMPTY),
            python_replay: UnsafeCell::new(PyReplayLog::EMPTY),
            last_trace: Cell::new((0, 0, 0)),
            last_python: UnsafeCell::new([PyRawFrame { code: 0, guard: 0, offset: 0, flags: 0 }; LAST_PYTHON]),
            last_python_len: Cell::new(u32::MAX),
        }
    };
}

/// The calling thread's state. The reference must not leave the thread,
/// which is why only hooks (running on it) use it.
#[inline]
pub fn current() -> &'static ThreadState {
    // SAFETY: a thread-local without destructor lives as long as its thread,
    // and the reference is only used on this thread, within a hook.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}
