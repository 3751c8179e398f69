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
//! 1. Record at one level. A runtime hook (cudaMalloc) captures the stack
//!    and publishes a [`RuntimeCall`] in a thread-local; the driver hook it
//!    calls (cuMemAlloc_v2) records the block with the runtime's API name
//!    and stack, and marks the call consumed. If the runtime reached the
//!    driver some way we did not see, the runtime hook records the block
//!    itself. Either way, one program call is one allocation.
//! 2. A driver hook entered while another driver hook runs on the same
//!    thread (a driver entry point calling another exported one) passes
//!    straight through.
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
//!    (`oom.rs`) at the level of case 1: the driver hook under a runtime
//!    call only marks the runtime call, which reports it with its own API
//!    and stack once its real call has returned.
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
use cudaleak_core::record::{Api, MemoryKind};
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
/// buffer is captured into in place, and a runtime hook publishes a
/// pointer to its `HookCx` for the driver hook it calls (case 1).
///
/// The stack buffer is a separate local of `intercept`, referenced from
/// here: were it a field initialized with `MaybeUninit::uninit()`, LLVM
/// would merge the struct's initialization into a 2.5 KiB memset.
pub struct HookCx<'a> {
    pub thread: &'static ThreadState,
    stack: &'a mut MaybeUninit<Stack>,
    has_stack: bool,
    runtime: Option<RuntimeCall>,
}

impl<'a> HookCx<'a> {
    #[inline(always)]
    fn new(thread: &'static ThreadState, stack: &'a mut MaybeUninit<Stack>) -> HookCx<'a> {
        HookCx {
            thread,
            stack,
            has_stack: false,
            runtime: None,
        }
    }

    /// The caller's stack, captured on first use.
    pub fn stack(&mut self) -> &Stack {
        if !self.has_stack {
            Stack::capture_into(self.stack, self.thread);
            self.has_stack = true;
        }
        // SAFETY: captured above.
        unsafe { self.stack.assume_init_ref() }
    }

    fn captured(&self) -> Option<&Stack> {
        // SAFETY: has_stack is set only after a capture.
        self.has_stack.then(|| unsafe { self.stack.assume_init_ref() })
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
    if layer == Layer::Driver && thread.in_driver_hook.replace(true) {
        return call();
    }
    let mut stack = MaybeUninit::<Stack>::uninit();
    let mut cx = HookCx::new(thread, &mut stack);
    let prepared = catch_unwind(AssertUnwindSafe(|| {
        let ev = make();
        ev.before(&mut cx).map(|st| (ev, st))
    }))
    .ok()
    .flatten();
    let result = call();
    if layer == Layer::Driver {
        thread.in_driver_hook.set(false);
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
    Releases { kinds, imported_by }
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
    api: Api,
    /// driver hooks this runtime entry point makes
    expects: &'static [HookId],
    /// a driver allocation hook handled the call (recorded the block or
    /// counted the failure)
    handled: Cell<bool>,
    /// a driver release hook handled the release
    released: Cell<bool>,
    /// a driver context hook handled a teardown
    torn_down: Cell<bool>,
    /// the driver allocation it made ran out of memory (case 5)
    out_of_memory: Cell<bool>,
}

impl RuntimeCall {
    fn new(api: Api, expects: &'static [HookId]) -> RuntimeCall {
        RuntimeCall {
            api,
            expects,
            handled: Cell::new(false),
            released: Cell::new(false),
            torn_down: Cell::new(false),
            out_of_memory: Cell::new(false),
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
