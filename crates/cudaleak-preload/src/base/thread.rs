//! Everything a hook keeps per thread. The thread-local itself is small,
//! `const`-initialized and without `Drop` (such a thread-local needs no
//! registration and stays usable while the thread is being torn down).
//! Hooks look it up once per call (a `__tls_get_addr` call in a shared
//! library) and pass the reference down.
//!
//! The cells here are plain values; each is owned by the module that uses
//! it (named on the field), and this file imports none of them. The large
//! per-thread buffers (replay logs, captured stacks) are `capture/mod.rs`'s,
//! reached through the one pointer [`ThreadState::buffers`]: glibc carves
//! static TLS out of each thread's stack, and 6.4 KB of it, plus a 2.5 KB
//! stack buffer in every hook frame, made threads with 16-24 KB stacks
//! crash in their first cudaMalloc (issue 15).

use std::cell::Cell;
use std::ffi::c_void;

pub struct ThreadState {
    /// A driver hook is running on this thread (a nested one passes through;
    /// `events.rs`).
    pub in_driver_hook: Cell<bool>,
    /// The runtime hook running on this thread (`events::HookCx`), if any.
    pub runtime_call: Cell<*const ()>,
    /// (context, slot) last seen on this thread (`state/tracker.rs`).
    pub last_context: Cell<(u64, u8)>,
    /// This thread's stack, [low, high); (0, 0) until first needed
    /// (`unwind.rs`).
    pub stack_bounds: Cell<(usize, usize)>,
    /// (trace id, api, kind) of the last trace interned here; id 0: none
    /// (`capture/mod.rs`).
    pub last_trace: Cell<(u32, u8, u8)>,
    /// and its Python frames' count (u32::MAX when more than fit)
    pub last_python_len: Cell<u32>,
    /// This thread's delta slot in the call sites' counters, plus one; 0
    /// until its first counted block (`state/tracker.rs`).
    pub site_delta: Cell<u16>,
    /// `capture/mod.rs`'s per-thread buffers: null until the thread's first
    /// capture, a sentinel once the thread's exit freed them.
    pub buffers: Cell<*mut c_void>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            in_driver_hook: Cell::new(false),
            runtime_call: Cell::new(std::ptr::null()),
            last_context: Cell::new((0, 0)),
            stack_bounds: Cell::new((0, 0)),
            last_trace: Cell::new((0, 0, 0)),
            last_python_len: Cell::new(u32::MAX),
            site_delta: Cell::new(0),
            buffers: Cell::new(std::ptr::null_mut()),
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
