//! What each hooked call means for the live map: the events of the hook
//! table (`hook_table.rs`).
//!
//! Every hook runs `intercept(layer, make_event, call_real)`:
//! 1. the event looks at the arguments (`before`), then
//! 2. the real function runs with no lock of ours held, then
//! 3. the event records the outcome (`after`); the real result is returned
//!    unchanged, whatever happens here.
//!
//! Numbered cases worth knowing:
//! 1. Record at one level: the driver's. A runtime allocation (cudaMalloc)
//!    is the driver call it makes (cuMemAlloc_v2), recorded by the driver
//!    hook with the driver's API and the stack below it; the report names
//!    the runtime function found on that stack (`assemble/merge.rs`), for
//!    a runtime loaded as a library as for one linked into the program.
//!    No runtime allocation or release is hooked, so one program call is
//!    one allocation, and a call pays for one hook. Only cudaDeviceReset
//!    is: it publishes a [`RuntimeCall`] in a thread-local, and tears the
//!    device's blocks down itself if no driver hook under it did.
//! 2. A driver hook entered while another driver hook runs on the same
//!    thread (a driver entry point calling another exported one) passes
//!    straight through, unless a signal handler that interrupted the other
//!    hook made the call: that is the program's call, recorded
//!    (`base/signal_frames.rs`).
//! 3. Releases remove the block *before* the real call and put it back if
//!    the call fails. Removing after would race with another thread that
//!    gets the same address from the driver between the two.
//! 4. Panics are caught on both sides of the real call, never around it;
//!    a failed `before` still calls the real function. A thread cancelled
//!    inside the real call unwinds through the hook untouched (`mod.rs`);
//!    the library's own work on either side runs with cancellation
//!    disabled wherever it reaches a cancellation point (a write, a sleep):
//!    a pending `pthread_cancel` acts in the program's code, not ours.
//! 5. A call that fails for lack of memory is one out-of-memory failure
//!    (`oom.rs`) of the driver call, named like a block by the runtime
//!    function on its stack when the report is written.
//!
//! Bottom up:
//!
//! 1. the sizes calls do not state: `sizes`
//! 2. the events of each kind of call: `allocations`, `releases`, `vmm`, `contexts`, `graph_nodes`, `modules`, `lookups`, `runtime`
//!
//! This file: the hook call's context, the framework every event runs in,
//! the runtime call a driver hook serves (case 1), and what each release
//! call accepts.

use crate::base::thread::{self, ThreadState};
use crate::capture::Stack;
use crate::cuda::ffi::*;
use crate::cuda::hook_table::{HookId, Layer};
use crate::hooks::resolve::entry_points;
use crate::hooks::resolve::global::Handouts;
use crate::state::graphs;
use crate::state::oom;
use crate::state::tracker::{self, Releases};
use cudaleak_core::record::{Api, MemoryKind, TraceId};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

mod allocations;
mod contexts;
mod graph_nodes;
mod lookups;
mod modules;
mod releases;
mod runtime;
mod sizes;
mod vmm;

pub use allocations::*;
pub use contexts::*;
pub use graph_nodes::*;
pub use lookups::*;
pub use modules::*;
pub use releases::*;
pub use runtime::*;
pub use sizes::*;
pub use vmm::*;

/// One hook call's scratch space, on the hook's own stack frame: the stack
/// buffer is captured into in place, and the runtime's reset hook
/// publishes a pointer to its `HookCx` for the driver hook it calls
/// (case 1).
///
/// The stack buffer is a separate local of `intercept`, referenced from
/// here: were it a field initialized with `MaybeUninit::uninit()`, LLVM
/// would merge the struct's initialization into a 2.5 KiB memset.
pub struct HookCx<'a> {
    pub thread: &'static ThreadState,
    stack: &'a mut MaybeUninit<Stack>,
    runtime: Option<RuntimeCall>,
}

impl<'a> HookCx<'a> {
    #[inline(always)]
    fn new(thread: &'static ThreadState, stack: &'a mut MaybeUninit<Stack>) -> HookCx<'a> {
        HookCx {
            thread,
            stack,
            runtime: None,
        }
    }

    /// The trace of the caller's stack for a block of `api` and `kind`:
    /// the stack captured and interned in one go, under the thread's
    /// capture flag. A replay leaves the stack's Python frames in the
    /// thread's log until the interning needs them (`Stack::intern`), so
    /// the flag is held until then: a signal handler's hook that
    /// interrupts either (allocating in a handler is not
    /// async-signal-safe, but programs do it) takes no stack, and is
    /// counted instead (`Stack::skipped`).
    #[inline(always)]
    pub fn trace(&mut self, api: Api, kind: MemoryKind) -> TraceId {
        let thread = self.thread;
        if thread.capturing.get() {
            return Stack::skipped(self.stack).intern(&tracker::DEPOT, api, kind, thread);
        }
        thread.capturing.set(true);
        /// Lets the flag go however the capture ends (a panic is caught at
        /// the hook's boundary, and the thread goes on capturing).
        struct Release<'t>(&'t ThreadState);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.capturing.set(false);
            }
        }
        let _release = Release(thread);
        Stack::capture_into(self.stack, thread).intern(&tracker::DEPOT, api, kind, thread)
    }

    /// Makes this (runtime) call visible to driver hooks on this thread.
    fn publish(&mut self, call: RuntimeCall) {
        self.runtime = Some(call);
        self.thread
            .runtime_call
            .set(self as *const HookCx<'a> as *const ());
    }

    fn unpublish(&self) {
        self.thread.runtime_call.set(std::ptr::null());
    }
}

pub trait Event {
    type State;
    /// Looks at the call before it happens; `None` skips `after`.
    fn before(&self, cx: &mut HookCx) -> Option<Self::State>;
    fn after(&self, cx: &mut HookCx, state: Self::State, result: c_int);
}

#[inline(always)]
pub fn intercept<E: Event>(layer: Layer, make: impl FnOnce() -> E, call: impl FnOnce() -> c_int) -> c_int {
    if !tracker::is_tracking() {
        return call();
    }
    let thread = thread::current();
    let mut stack = MaybeUninit::<Stack>::uninit();
    // Case 2, for driver hooks only: the frame this hook's stack buffer is
    // in marks where it runs; the running driver hook's, if any, is saved.
    let (mut outer_frame, mut was_in_driver_hook) = (0, false);
    if layer == Layer::Driver {
        let here = stack.as_ptr() as usize;
        outer_frame = thread.driver_hook_frame.get();
        was_in_driver_hook = thread.in_driver_hook.replace(true);
        // (no frame yet: a handler that came between the two stores)
        if was_in_driver_hook
            && outer_frame != 0
            && !crate::base::signal_frames::called_from_signal_handler(here, outer_frame)
        {
            return call();
        }
        thread.driver_hook_frame.set(here);
        // A signal handler on this thread must see both stores as made
        // here, not moved past the work below: a handler's hook reads them.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    let mut cx = HookCx::new(thread, &mut stack);
    let prepared = catch_unwind(AssertUnwindSafe(|| {
        let ev = make();
        ev.before(&mut cx).map(|st| (ev, st))
    }))
    .ok()
    .flatten();
    let result = call();
    if layer == Layer::Driver {
        // A handler's hook hands the driver hook it interrupted back its own.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        thread.in_driver_hook.set(was_in_driver_hook);
        thread.driver_hook_frame.set(outer_frame);
    }
    if let Some((ev, st)) = prepared {
        if catch_unwind(AssertUnwindSafe(|| ev.after(&mut cx, st, result))).is_err() {
            tracker::note_internal_error();
        }
    }
    cx.unpublish_if_runtime();
    result
}

impl HookCx<'_> {
    #[inline(always)]
    fn unpublish_if_runtime(&self) {
        if self.runtime.is_some() {
            self.unpublish();
        }
    }
}

/// The blocks each release call accepts (`tracker::Releases`).
pub type KindSet = &'static Releases;
const fn frees(kinds: &'static [MemoryKind], imported_by: &'static [Api]) -> Releases {
    Releases::new(kinds, imported_by)
}
/// cuMemFree(Async): also memory imported from another process's pool and
/// buffers mapped from external memory, which NVIDIA documents are freed so.
pub const FREES_DEVICE: KindSet = &frees(
    &[MemoryKind::Device, MemoryKind::Managed, MemoryKind::Graph],
    &[Api::cuMemPoolImportPointer, Api::cuExternalMemoryGetMappedBuffer],
);
pub const FREES_HOST: KindSet = &frees(&[MemoryKind::Host], &[]);
pub const FREES_REGISTERED: KindSet = &frees(&[MemoryKind::Registered], &[]);
pub const FREES_RESERVATION: KindSet = &frees(&[MemoryKind::Reservation], &[]);
pub const FREES_ARRAY: KindSet = &frees(&[MemoryKind::Array], &[]);
/// cuMipmappedArrayDestroy: also arrays mapped from external memory.
pub const FREES_MIPMAPPED: KindSet = &frees(
    &[MemoryKind::Array],
    &[Api::cuExternalMemoryGetMappedMipmappedArray],
);
pub const FREES_IPC: KindSet = &frees(&[], &[Api::cuIpcOpenMemHandle, Api::cuIpcOpenMemHandle_v2]);
pub const FREES_EXTERNAL: KindSet = &frees(&[], &[Api::cuImportExternalMemory]);
pub const FREES_POOL: KindSet = &frees(&[MemoryKind::Pool], &[]);

// ---- runtime calls (case 1) ----

pub struct RuntimeCall {
    /// driver hooks this runtime entry point makes
    expects: &'static [HookId],
    /// a driver context hook handled a teardown
    torn_down: Cell<bool>,
}

impl RuntimeCall {
    fn new(expects: &'static [HookId]) -> RuntimeCall {
        RuntimeCall {
            expects,
            torn_down: Cell::new(false),
        }
    }
}

/// The runtime call (and its hook context) this driver hook serves, if any.
fn calling_runtime(
    thread: &ThreadState,
    id: HookId,
) -> Option<(&'static HookCx<'static>, &'static RuntimeCall)> {
    let p = thread.runtime_call.get() as *const HookCx<'static>;
    if p.is_null() {
        return None;
    }
    // SAFETY: published by a runtime hook further up this thread's stack,
    // cleared before that frame ends; only its Cells are touched here.
    let outer = unsafe { &*p };
    let rc = outer.runtime.as_ref()?;
    rc.expects.contains(&id).then_some((outer, rc))
}
