//! What a hook records about the call stack: raw return addresses (our own
//! frames dropped) and raw Python frames. Names and lines come at dump time.

use crate::thread::{StackBuffer, ThreadBuffers, ThreadState, LAST_PYTHON};
use crate::{python, tracker, unwind};
use cudaleak_core::config::MAX_STACK_DEPTH;
use cudaleak_core::depot::TraceKey;
use cudaleak_core::python::{frames_bytes, PyRawFrame};
use cudaleak_core::record::{Api, MemoryKind, TraceId};
use std::mem::MaybeUninit;

/// Stack a capture may need below the hook (unwinder, Python walk, a new
/// trace's interning); with less left, the capture is skipped and the block
/// recorded without a stack, rather than overflow a small thread stack
/// (issue 15: 16 KiB thread stacks crashed).
const CAPTURE_STACK_NEEDED: usize = 16 << 10;

/// A captured stack. It lives in the hook's frame, so it is small: the
/// frames are in one of the thread's stack buffers (`thread.rs`), taken in
/// turn, so that a runtime hook's stack is still there when the driver
/// hook it calls captures its own.
pub struct Stack {
    /// null when nothing was captured
    buffer: *mut StackBuffer,
    n_native: usize,
    n_python: usize,
    /// the native frames are the previous capture's on this thread
    replayed: bool,
}

impl Stack {
    /// Captures the calling thread's native and Python stacks into `slot`.
    #[inline(never)]
    pub fn capture_into<'a>(slot: &'a mut MaybeUninit<Stack>, thread: &ThreadState) -> &'a Stack {
        let stack = match room_to_capture(slot as *const _ as usize, thread)
            .then(|| thread.buffers())
            .flatten()
        {
            // SAFETY: this thread's buffers, just had.
            Some(buffers) => Self::capture(unsafe { ThreadBuffers::next_stack(buffers) }, thread),
            None => Stack {
                buffer: std::ptr::null_mut(),
                n_native: 0,
                n_python: 0,
                replayed: false,
            },
        };
        slot.write(stack)
    }

    fn capture(buffer: *mut StackBuffer, thread: &ThreadState) -> Stack {
        let depth = crate::settings::config().stack_depth.min(MAX_STACK_DEPTH);
        // SAFETY: the thread's own buffer, not in use by a live capture
        // (see `Stack`); its arrays are MaybeUninit. One field at a time:
        // the unwinder and the Python walk reach their replay logs in the
        // same allocation meanwhile.
        let (n_native, replayed) = if depth > 0 {
            unwind::capture(unsafe { &mut (&mut (*buffer).native)[..depth] }, thread)
        } else {
            (0, true)
        };
        // SAFETY: as above.
        let n_python = python::capture(unsafe { &mut (*buffer).python }, thread);
        Stack {
            buffer,
            n_native,
            n_python,
            replayed,
        }
    }

    pub fn native(&self) -> &[u64] {
        if self.buffer.is_null() {
            return &[];
        }
        // SAFETY: the first n_native entries were written by the unwinder.
        unsafe { std::slice::from_raw_parts((*self.buffer).native.as_ptr().cast::<u64>(), self.n_native) }
    }

    pub fn python(&self) -> &[PyRawFrame] {
        if self.buffer.is_null() {
            return &[];
        }
        // SAFETY: the first n_python entries were written by the reader.
        unsafe {
            std::slice::from_raw_parts((*self.buffer).python.as_ptr().cast::<PyRawFrame>(), self.n_python)
        }
    }

    /// The trace id of this stack for a block of `api` and `kind`. When the
    /// native frames were replayed (unchanged since the previous capture on
    /// this thread) and API, kind and Python frames are the previous
    /// trace's too, that trace's id is reused without hashing.
    pub fn intern(&self, api: Api, kind: MemoryKind, thread: &ThreadState) -> TraceId {
        let python = self.python();
        let (last_id, last_api, last_kind) = thread.last_trace.get();
        let Some(buffers) = thread.buffers() else {
            return self.intern_new(api, kind);
        };
        // SAFETY: this thread's buffers; `last_python` only, disjoint from
        // the stack buffer `python` points into.
        let last_python = unsafe { &mut *std::ptr::addr_of_mut!((*buffers).last_python) };
        if self.replayed
            && last_id != 0
            && (last_api, last_kind) == (api as u8, kind as u8)
            && thread.last_python_len.get() as usize == python.len()
            && frames_bytes(&last_python[..python.len()]) == frames_bytes(python)
        {
            return TraceId(last_id);
        }
        let id = self.intern_new(api, kind);
        if python.len() <= LAST_PYTHON {
            last_python[..python.len()].copy_from_slice(python);
            thread.last_python_len.set(python.len() as u32);
            thread.last_trace.set((id.0, api as u8, kind as u8));
        } else {
            thread.last_trace.set((0, 0, 0));
        }
        id
    }

    fn intern_new(&self, api: Api, kind: MemoryKind) -> TraceId {
        let key = TraceKey {
            api,
            kind,
            native: self.native(),
            python: self.python(),
        };
        tracker::DEPOT.intern(&key, |k| python::remember_code_objects(k.python))
    }
}

fn room_to_capture(sp: usize, thread: &ThreadState) -> bool {
    match unwind::stack_bounds(sp, thread) {
        Some((low, _)) => sp - low >= CAPTURE_STACK_NEEDED,
        // Not on the thread's own stack (a coroutine, sigaltstack): no
        // bounds to check against, as before.
        None => true,
    }
}
