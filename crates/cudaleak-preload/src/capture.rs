//! What a hook records about the call stack: raw return addresses (our own
//! frames dropped) and raw Python frames. Names and lines come at dump time.

use crate::{python, tracker, unwind};
use cudaleak_core::config::MAX_STACK_DEPTH;
use cudaleak_core::depot::TraceKey;
use cudaleak_core::python::PyRawFrame;
use cudaleak_core::record::{Api, MemoryKind, TraceId};
use std::mem::MaybeUninit;

/// Python frames recorded per allocation.
pub const PY_MAX: usize = 64;

/// A captured stack, on the hook's own stack frame: no allocation, and the
/// buffers are not even zeroed (only the first `n_*` entries are read).
pub struct Stack {
    native: [MaybeUninit<u64>; MAX_STACK_DEPTH],
    n_native: usize,
    python: [MaybeUninit<PyRawFrame>; PY_MAX],
    n_python: usize,
}

impl Stack {
    /// Captures the calling thread's native and Python stacks.
    #[inline(never)]
    pub fn capture() -> Stack {
        let mut s = Stack {
            native: [const { MaybeUninit::uninit() }; MAX_STACK_DEPTH],
            n_native: 0,
            python: [const { MaybeUninit::uninit() }; PY_MAX],
            n_python: 0,
        };
        let depth = tracker::config().stack_depth.min(MAX_STACK_DEPTH);
        if depth > 0 {
            s.n_native = unwind::capture(&mut s.native[..depth]);
        }
        s.n_python = python::capture(&mut s.python);
        s
    }

    pub fn native(&self) -> &[u64] {
        // SAFETY: the first n_native entries were written by the unwinder.
        unsafe { std::slice::from_raw_parts(self.native.as_ptr().cast::<u64>(), self.n_native) }
    }

    pub fn python(&self) -> &[PyRawFrame] {
        // SAFETY: the first n_python entries were written by the reader.
        unsafe {
            std::slice::from_raw_parts(self.python.as_ptr().cast::<PyRawFrame>(), self.n_python)
        }
    }

    /// The trace id of this stack for a block of `api` and `kind`.
    pub fn intern(&self, api: Api, kind: MemoryKind) -> TraceId {
        let key = TraceKey {
            api,
            kind,
            native: self.native(),
            python: self.python(),
        };
        tracker::DEPOT.intern(&key, |k| python::remember_code_objects(k.python))
    }
}
