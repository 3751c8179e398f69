//! What a hook records about the call stack: raw return addresses (our own
//! frames dropped) and raw Python frames. Names and lines come at dump time.

use crate::thread::{ThreadState, LAST_PYTHON};
use crate::{python, tracker, unwind};
use cudaleak_core::config::MAX_STACK_DEPTH;
use cudaleak_core::depot::TraceKey;
use cudaleak_core::python::{frames_bytes, PyRawFrame};
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
    /// the native frames are the previous capture's on this thread
    replayed: bool,
}

impl Stack {
    /// Captures the calling thread's native and Python stacks into `slot`,
    /// in place: the 2.5 KiB of buffers are neither zeroed nor copied.
    #[inline(never)]
    pub fn capture_into<'a>(slot: &'a mut MaybeUninit<Stack>, thread: &ThreadState) -> &'a Stack {
        let p = slot.as_mut_ptr();
        let depth = tracker::config().stack_depth.min(MAX_STACK_DEPTH);
        // SAFETY: the arrays are MaybeUninit (no validity requirement), and
        // every scalar field is written before the slot is read as initialized.
        unsafe {
            let native = &mut *std::ptr::addr_of_mut!((*p).native);
            let (n, replayed) = if depth > 0 {
                unwind::capture(&mut native[..depth], thread)
            } else {
                (0, true)
            };
            std::ptr::addr_of_mut!((*p).n_native).write(n);
            std::ptr::addr_of_mut!((*p).replayed).write(replayed);
            let python = &mut *std::ptr::addr_of_mut!((*p).python);
            std::ptr::addr_of_mut!((*p).n_python).write(python::capture(python, thread));
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

    /// The trace id of this stack for a block of `api` and `kind`. When the
    /// native frames were replayed (unchanged since the previous capture on
    /// this thread) and API, kind and Python frames are the previous
    /// trace's too, that trace's id is reused without hashing.
    pub fn intern(&self, api: Api, kind: MemoryKind, thread: &ThreadState) -> TraceId {
        let python = self.python();
        let (last_id, last_api, last_kind) = thread.last_trace.get();
        // SAFETY: this thread's own buffer; interning does not nest.
        let last_python = unsafe { &mut *thread.last_python.get() };
        if self.replayed
            && last_id != 0
            && (last_api, last_kind) == (api as u8, kind as u8)
            && thread.last_python_len.get() as usize == python.len()
            && frames_bytes(&last_python[..python.len()]) == frames_bytes(python)
        {
            return TraceId(last_id);
        }
        let key = TraceKey {
            api,
            kind,
            native: self.native(),
            python,
        };
        let id = tracker::DEPOT.intern(&key, |k| python::remember_code_objects(k.python));
        if python.len() <= LAST_PYTHON {
            last_python[..python.len()].copy_from_slice(python);
            thread.last_python_len.set(python.len() as u32);
            thread.last_trace.set((id.0, api as u8, kind as u8));
        } else {
            thread.last_trace.set((0, 0, 0));
        }
        id
    }
}
