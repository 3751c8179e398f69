//! What a hook records about the call stack: raw return addresses (our own
//! frames dropped) and raw Python frames. Names and lines come at dump time.

use crate::thread::ThreadState;
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
    /// Captures the calling thread's native and Python stacks into `slot`,
    /// in place: the 2.5 KiB of buffers are neither zeroed nor copied.
    #[inline(never)]
    pub fn capture_into<'a>(slot: &'a mut MaybeUninit<Stack>, thread: &ThreadState) -> &'a Stack {
        let p = slot.as_mut_ptr();
        let depth = tracker::config().stack_depth.min(MAX_STACK_DEPTH);
        // SAFETY: the arrays are MaybeUninit (no validity requirement), and
        // both counts are written before the slot is read as initialized.
        unsafe {
            let native = &mut *std::ptr::addr_of_mut!((*p).native);
            let n = if depth > 0 {
                unwind::capture(&mut native[..depth], thread)
            } else {
                0
            };
            std::ptr::addr_of_mut!((*p).n_native).write(n);
            let python = &mut *std::ptr::addr_of_mut!((*p).python);
            std::ptr::addr_of_mut!((*p).n_python).write(python::capture(python));
            slot.assume_init_ref()
        }
    }

    pub fn native(&self) -> &[u64] {
        // SAFETY: the first n_native entries were written by the unwinder.
        unsafe { std::slice::from_raw_parts(self.native.as_ptr().cast::<u64>(), self.n_native) }
    }

    pub fn python(&self) -> &[PyRawFrame] {
        // SAFETY: the first n_python entries were written by the reader.
        unsafe { std::slice::from_raw_parts(self.python.as_ptr().cast::<PyRawFrame>(), self.n_python) }
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
