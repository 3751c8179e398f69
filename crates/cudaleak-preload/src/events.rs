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
//! 4. Panics are caught on both sides of the real call (never across
//!    `extern "C"`); a failed `before` still calls the real function.
//! 5. A call that fails for lack of memory is one out-of-memory failure
//!    (`oom.rs`) at the level of case 1: the driver hook under a runtime
//!    call only marks the runtime call, which reports it with its own API
//!    and stack once its real call has returned.

use crate::capture::Stack;
use crate::ffi::*;
use crate::hook_table::{HookId, Layer};
use crate::oom;
use crate::resolve;
use crate::thread::{self, ThreadState};
use crate::tracker;
use cudaleak_core::record::{Api, MemoryKind};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

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

/// Memory kinds each release call accepts.
pub type KindSet = &'static [MemoryKind];
pub const FREES_DEVICE: KindSet = &[MemoryKind::Device, MemoryKind::Managed];
pub const FREES_HOST: KindSet = &[MemoryKind::Host];
pub const FREES_RESERVATION: KindSet = &[MemoryKind::Reservation];
pub const FREES_ARRAY: KindSet = &[MemoryKind::Array];
pub const FREES_IMPORTED: KindSet = &[MemoryKind::Imported];
pub const FREES_POOL: KindSet = &[MemoryKind::Pool];

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

// ---- allocations ----

enum Out {
    /// pointer-sized out parameter holding the new address or handle
    Address(*mut u64),
}

enum Size {
    Bytes(u64),
    /// cuMemAllocPitch: pitch (written by the call) × height; and the
    /// bytes asked for, width × height
    Pitch(*mut usize, usize, u64),
    /// asked from the driver after the call (cuMemGetAddressRange_v2)
    OfAddress,
}

pub struct Alloc {
    id: HookId,
    api: Api,
    kind: MemoryKind,
    out: Out,
    size: Size,
    device: Option<u8>,
}

impl Alloc {
    pub fn new(id: HookId, api: Api, kind: MemoryKind, out: *mut u64, size: usize) -> Alloc {
        Alloc {
            id,
            api,
            kind,
            out: Out::Address(out),
            size: Size::Bytes(size as u64),
            device: None,
        }
    }

    pub fn pitched(
        id: HookId,
        api: Api,
        out: *mut u64,
        pitch: *mut usize,
        width: usize,
        height: usize,
    ) -> Alloc {
        Alloc {
            size: Size::Pitch(pitch, height, (width as u64).saturating_mul(height as u64)),
            ..Alloc::new(id, api, MemoryKind::Device, out, 0)
        }
    }

    /// cuIpcOpenMemHandle_v2: memory another process allocated; its size
    /// is asked from the driver once opened.
    pub fn imported(id: HookId, out: *mut u64) -> Alloc {
        Alloc {
            size: Size::OfAddress,
            ..Alloc::new(id, Api::cuIpcOpenMemHandle_v2, MemoryKind::Imported, out, 0)
        }
    }

    /// cuMemCreate: the device comes from the allocation properties.
    pub fn physical(id: HookId, handle: *mut u64, size: usize, prop: *const CUmemAllocationProp) -> Alloc {
        // SAFETY: prop is the caller's argument; read only when non-null.
        let device = (!prop.is_null())
            .then(|| unsafe { (*prop).location_id })
            .and_then(|d| u8::try_from(d).ok());
        Alloc {
            device,
            ..Alloc::new(id, Api::cuMemCreate, MemoryKind::Physical, handle, size)
        }
    }
}

/// Bytes of a CUDA array from its descriptor (0 when there is none).
pub fn array_2d_bytes(desc: *const CUDA_ARRAY_DESCRIPTOR) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width, d.height, 0, element, 1) as usize
}

/// Bytes of a 3D or mipmapped CUDA array from its descriptor.
pub fn array_3d_bytes(desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width, d.height, d.depth, element, levels) as usize
}

/// Bytes of a runtime array of a channel description and extent.
pub fn runtime_array_bytes(desc: *const cudaChannelFormatDesc, extent: cudaExtent, levels: u32) -> RtSize {
    if desc.is_null() {
        return RtSize::Bytes(0);
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let bits = [d.x, d.y, d.z, d.w].iter().map(|&b| b.max(0) as u64).sum::<u64>();
    let bytes = array_bytes(extent.width, extent.height, extent.depth, bits / 8, levels);
    RtSize::Bytes(bytes as usize)
}

impl Alloc {
    /// The bytes the call asked for (0 when it cannot say: an IPC handle).
    fn requested(&self) -> u64 {
        match self.size {
            Size::Bytes(b) => b,
            Size::Pitch(_, _, asked) => asked,
            Size::OfAddress => 0,
        }
    }

    /// This driver call, made by no runtime call we saw, ran out of memory.
    /// Out of line: the hot path of a successful call stays as it was.
    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, cx: &mut HookCx) {
        let (thread, api, kind) = (cx.thread, self.api, self.kind);
        let failure = oom::Failure {
            api,
            requested: self.requested(),
            device: self.device,
        };
        oom::on_out_of_memory(failure, thread, &mut || {
            cx.stack().intern(&tracker::DEPOT, api, kind, thread)
        });
    }
}

impl Event for Alloc {
    type State = ();

    fn before(&self, _: &mut HookCx) -> Option<()> {
        tracker::note_allocation_call();
        Some(())
    }

    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        let runtime = calling_runtime(cx.thread, self.id).filter(|(_, rc)| !rc.handled.get());
        if let Some((_, rc)) = runtime {
            rc.handled.set(true);
        }
        if result != CUDA_SUCCESS {
            tracker::note_failed_allocation();
            if result == CUDA_ERROR_OUT_OF_MEMORY {
                match runtime {
                    // Case 5: the runtime call reports it.
                    Some((_, rc)) => rc.out_of_memory.set(true),
                    None => self.out_of_memory(cx),
                }
            }
            return;
        }
        let Out::Address(out) = self.out;
        if out.is_null() {
            return;
        }
        // SAFETY: the call succeeded, so it wrote its out parameter.
        let key = unsafe { out.read_unaligned() };
        let size = match self.size {
            Size::Bytes(b) => b,
            // SAFETY: written by the successful call.
            Size::Pitch(p, h, _) if !p.is_null() => {
                unsafe { p.read_unaligned() as u64 }.saturating_mul(h as u64)
            }
            Size::Pitch(..) => 0,
            Size::OfAddress => size_of_address(key),
        };
        let thread = cx.thread;
        let (api, stack) = match runtime.and_then(|(outer, rc)| Some((rc.api, outer.captured()?))) {
            Some((api, s)) => (api, s),
            None => (self.api, cx.stack()),
        };
        tracker::record_allocation(key, size, api, self.kind, stack, self.device, thread);
    }
}

/// The size of the allocation at `addr`, from the driver (0 if it cannot
/// say). Called from `after()`, once the driver hook guard is down again;
/// the helper is not a hook anyway, so nothing is recorded twice.
fn size_of_address(addr: u64) -> u64 {
    let Some(get) = crate::driver_lookup::CU_MEM_GET_ADDRESS_RANGE_V2.get::<MemGetAddressRangeFn>() else {
        return 0;
    };
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: real driver call with valid out pointers.
    if unsafe { get(&mut base, &mut size, addr) } != CUDA_SUCCESS {
        return 0;
    }
    size as u64
}

// ---- releases (case 3) ----

pub struct Free {
    id: HookId,
    addr: u64,
    accepts: KindSet,
}

impl Free {
    pub fn new(id: HookId, addr: u64, accepts: KindSet) -> Free {
        Free { id, addr, accepts }
    }
}

pub struct Removed(Option<cudaleak_core::record::Block>);

impl Event for Free {
    type State = Removed;

    fn before(&self, cx: &mut HookCx) -> Option<Removed> {
        if let Some((_, rc)) = calling_runtime(cx.thread, self.id) {
            rc.released.set(true);
        }
        if self.addr == 0 {
            // Freeing NULL is not a bad free, and records nothing.
            return None;
        }
        Some(Removed(tracker::remove_block(self.addr, self.accepts)))
    }

    fn after(&self, _: &mut HookCx, removed: Removed, result: c_int) {
        tracker::finish_release(self.addr, removed.0, result == CUDA_SUCCESS);
    }
}

pub struct Release(u64);

impl Release {
    pub fn new(handle: u64) -> Release {
        Release(handle)
    }
}

impl Event for Release {
    type State = tracker::HandleRelease;
    fn before(&self, _: &mut HookCx) -> Option<tracker::HandleRelease> {
        Some(tracker::release_handle_begin(self.0))
    }
    fn after(&self, _: &mut HookCx, st: tracker::HandleRelease, result: c_int) {
        tracker::release_handle_end(self.0, st, result == CUDA_SUCCESS);
    }
}

pub struct Map {
    va: u64,
    size: u64,
    handle: u64,
}

impl Map {
    pub fn new(va: u64, size: usize, handle: u64) -> Map {
        Map {
            va,
            size: size as u64,
            handle,
        }
    }
}

impl Event for Map {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            tracker::mapped(self.va, self.size, self.handle);
        }
    }
}

pub struct Unmap {
    va: u64,
    size: u64,
}

impl Unmap {
    pub fn new(va: u64, size: usize) -> Unmap {
        Unmap {
            va,
            size: size as u64,
        }
    }
}

impl Event for Unmap {
    type State = tracker::UnmapUndo;
    fn before(&self, _: &mut HookCx) -> Option<tracker::UnmapUndo> {
        Some(tracker::unmap_begin(self.va, self.size))
    }
    fn after(&self, _: &mut HookCx, undo: tracker::UnmapUndo, result: c_int) {
        tracker::unmap_finish(undo, result == CUDA_SUCCESS);
    }
}

// ---- contexts ----

pub enum ContextEvent {
    Destroy(u64),
    PrimaryRetain(*mut CUcontext, CUdevice),
    PrimaryRelease(CUdevice),
    PrimaryReset(CUdevice),
}

impl ContextEvent {
    pub fn destroy(ctx: CUcontext) -> ContextEvent {
        ContextEvent::Destroy(ctx as u64)
    }
    pub fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRetain(pctx, dev)
    }
    pub fn primary_release(dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRelease(dev)
    }
    pub fn primary_reset(dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryReset(dev)
    }
}

impl Event for ContextEvent {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS {
            return;
        }
        match *self {
            ContextEvent::Destroy(ctx) => tracker::teardown_context(ctx),
            ContextEvent::PrimaryRetain(pctx, dev) if !pctx.is_null() => {
                // SAFETY: written by the successful call.
                tracker::primary_retained(dev, unsafe { *pctx } as u64)
            }
            ContextEvent::PrimaryRetain(..) => {}
            ContextEvent::PrimaryRelease(dev) => tracker::primary_released(dev),
            ContextEvent::PrimaryReset(dev) => {
                if let Some((_, rc)) = calling_runtime(cx.thread, HookId::cuDevicePrimaryCtxReset_v2) {
                    rc.torn_down.set(true);
                }
                tracker::primary_reset(dev)
            }
        }
    }
}

// ---- entry-point lookups ----

pub struct EntryPoint {
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    /// The hook handed out for a name we wrap (`hooks.rs`, above).
    hook_address: fn(HookId) -> usize,
}

impl EntryPoint {
    pub fn new(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        hook_address: fn(HookId) -> usize,
    ) -> EntryPoint {
        EntryPoint {
            symbol,
            pfn,
            version,
            flags,
            hook_address,
        }
    }
}

impl Event for EntryPoint {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            // SAFETY: the lookup's own arguments.
            unsafe {
                resolve::substitute_entry_point(
                    self.symbol,
                    self.pfn,
                    self.version,
                    self.flags,
                    self.hook_address,
                )
            };
        }
    }
}

// ---- runtime entry points ----

pub enum RtSize {
    Bytes(usize),
    /// pitch out parameter × rows; the bytes asked for (width × rows)
    Pitch(*mut usize, usize, u64),
}

impl RtSize {
    /// A pitched allocation of `rows` rows of `width` bytes each.
    pub fn pitch(pitch: *mut usize, width: usize, rows: usize) -> RtSize {
        RtSize::Pitch(pitch, rows, (width as u64).saturating_mul(rows as u64))
    }

    fn requested(&self) -> u64 {
        match *self {
            RtSize::Bytes(b) => b as u64,
            RtSize::Pitch(_, _, asked) => asked,
        }
    }
}

pub struct RuntimeAlloc {
    api: Api,
    kind: MemoryKind,
    expects: &'static [HookId],
    out: *mut u64,
    size: RtSize,
}

impl RuntimeAlloc {
    pub fn new(
        api: Api,
        kind: MemoryKind,
        expects: &'static [HookId],
        out: *mut u64,
        size: RtSize,
    ) -> RuntimeAlloc {
        RuntimeAlloc {
            api,
            kind,
            expects,
            out,
            size,
        }
    }

    /// cudaMalloc3D: the pointer and pitch are fields of `*pitched`.
    pub fn pitched_3d(pitched: *mut cudaPitchedPtr, extent: cudaExtent) -> RuntimeAlloc {
        let (out, pitch) = if pitched.is_null() {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            // SAFETY: field addresses of a non-null caller struct.
            unsafe {
                (
                    std::ptr::addr_of_mut!((*pitched).ptr).cast(),
                    std::ptr::addr_of_mut!((*pitched).pitch),
                )
            }
        };
        RuntimeAlloc::new(
            Api::cudaMalloc3D,
            MemoryKind::Device,
            crate::hook_table::RUNTIME_MALLOC_PITCH,
            out,
            RtSize::pitch(pitch, extent.width, extent.height.saturating_mul(extent.depth)),
        )
    }
}

impl Event for RuntimeAlloc {
    type State = ();

    fn before(&self, cx: &mut HookCx) -> Option<()> {
        tracker::note_allocation_call();
        cx.stack();
        cx.publish(RuntimeCall::new(self.api, self.expects));
        Some(())
    }

    // Inlined into the hooks (out of line, it cost 20 instructions a call).
    #[inline(always)]
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        cx.unpublish();
        if result != CUDA_SUCCESS {
            // By value: passing `self` made the hook spill the event to
            // memory on every call.
            let failure = oom::Failure {
                api: self.api,
                requested: self.size.requested(),
                device: None,
            };
            Self::failed(cx, result, failure, self.kind);
            return;
        }
        if cx.runtime.as_ref().is_none_or(|rc| rc.handled.get()) {
            return;
        }
        if self.out.is_null() {
            return;
        }
        // SAFETY: the call succeeded and wrote its out parameter.
        let key = unsafe { self.out.read_unaligned() };
        if key == 0 {
            return; // cudaMalloc(&p, 0) returns NULL and allocates nothing
        }
        let size = match self.size {
            RtSize::Bytes(b) => b as u64,
            // SAFETY: written by the successful call.
            RtSize::Pitch(p, rows, _) if !p.is_null() => {
                unsafe { p.read_unaligned() as u64 }.saturating_mul(rows as u64)
            }
            RtSize::Pitch(..) => 0,
        };
        let thread = cx.thread;
        tracker::record_allocation(key, size, self.api, self.kind, cx.stack(), None, thread);
    }
}

impl RuntimeAlloc {
    /// The call failed. Out of line, so that a successful call's path is
    /// what it was before out-of-memory reports.
    #[cold]
    #[inline(never)]
    fn failed(cx: &mut HookCx, result: c_int, failure: oom::Failure, kind: MemoryKind) {
        let Some(rc) = cx.runtime.as_ref() else {
            return;
        };
        let out_of_memory = if rc.handled.get() {
            // Case 5: the driver call it made ran out, and so did this call.
            rc.out_of_memory.get()
        } else {
            // The driver hook counts failures it sees; count those it did not.
            tracker::note_failed_allocation();
            result == CUDA_ERROR_MEMORY_ALLOCATION
        };
        if out_of_memory {
            // One failure, with the runtime call's API and the stack
            // captured when it began.
            let (thread, api) = (cx.thread, failure.api);
            oom::on_out_of_memory(failure, thread, &mut || {
                cx.stack().intern(&tracker::DEPOT, api, kind, thread)
            });
        }
    }
}

pub struct RuntimeFree {
    addr: u64,
    expects: &'static [HookId],
    accepts: KindSet,
}

impl RuntimeFree {
    pub fn new(addr: u64, expects: &'static [HookId], accepts: KindSet) -> RuntimeFree {
        RuntimeFree {
            addr,
            expects,
            accepts,
        }
    }
}

impl Event for RuntimeFree {
    type State = ();

    fn before(&self, cx: &mut HookCx) -> Option<()> {
        cx.publish(RuntimeCall::new(Api::cudaMalloc, self.expects));
        Some(())
    }

    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        cx.unpublish();
        // cudaFree(NULL) initializes the context; it frees nothing.
        if cx.runtime.as_ref().is_none_or(|rc| rc.released.get()) || self.addr == 0 {
            return;
        }
        // The runtime released without a driver call we saw.
        let removed = tracker::remove_block(self.addr, self.accepts);
        tracker::finish_release(self.addr, removed, result == CUDA_SUCCESS);
    }
}

pub struct RuntimeReset;

impl Event for RuntimeReset {
    type State = ();
    fn before(&self, cx: &mut HookCx) -> Option<()> {
        cx.publish(RuntimeCall::new(
            Api::cudaMalloc,
            &[HookId::cuDevicePrimaryCtxReset_v2],
        ));
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        cx.unpublish();
        if result == CUDA_SUCCESS && !cx.runtime.as_ref().is_some_and(|rc| rc.torn_down.get()) {
            tracker::teardown_current_device(cx.thread);
        }
    }
}
