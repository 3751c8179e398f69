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

// ---- allocations ----

enum Out {
    /// pointer-sized out parameter holding the new address or handle
    Address(*mut u64),
    /// the 32-bit device pointer of a CUDA < 3.2 entry point
    Address32(*mut u32),
    /// the key is an argument (cuMemHostRegister's host pointer)
    Key(u64),
}

enum Size {
    Bytes(u64),
    /// cuMemAllocPitch: pitch (written by the call) × height; and the
    /// bytes asked for, width × height
    Pitch(*mut usize, usize, u64),
    /// the v1 cuMemAllocPitch: a 32-bit pitch × height; and the bytes
    /// asked for
    Pitch32(*mut u32, usize, u64),
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
    /// a stream-ordered allocation's stream, and whether the entry point
    /// is a per-thread (`_ptsz`) one: on a stream being captured, the
    /// call adds a node to the capture's graph instead (`graphs.rs`)
    stream: Option<(CUstream, bool)>,
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
            stream: None,
        }
    }

    /// cuMemAllocAsync, cuMemAllocFromPoolAsync (and `_ptsz`).
    pub fn stream_ordered(
        id: HookId,
        api: Api,
        out: *mut u64,
        size: usize,
        stream: CUstream,
        per_thread: bool,
    ) -> Alloc {
        Alloc {
            stream: Some((stream, per_thread)),
            ..Alloc::new(id, api, MemoryKind::Device, out, size)
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

    /// The 32-bit cuMemAlloc of CUDA < 3.2.
    pub fn narrow(id: HookId, api: Api, out: *mut u32, size: usize) -> Alloc {
        Alloc {
            out: Out::Address32(out),
            ..Alloc::new(id, api, MemoryKind::Device, std::ptr::null_mut(), size)
        }
    }

    /// The 32-bit cuMemAllocPitch of CUDA < 3.2.
    pub fn pitched_narrow(id: HookId, out: *mut u32, pitch: *mut u32, width: u32, height: u32) -> Alloc {
        Alloc {
            out: Out::Address32(out),
            size: Size::Pitch32(pitch, height as usize, u64::from(width) * u64::from(height)),
            ..Alloc::new(
                id,
                Api::cuMemAllocPitch,
                MemoryKind::Device,
                std::ptr::null_mut(),
                0,
            )
        }
    }

    /// cuIpcOpenMemHandle(_v2), cuMemPoolImportPointer: memory another
    /// process allocated; its size is asked from the driver once opened.
    pub fn imported(id: HookId, api: Api, out: *mut u64) -> Alloc {
        Alloc {
            size: Size::OfAddress,
            ..Alloc::new(id, api, MemoryKind::Imported, out, 0)
        }
    }

    /// cuMemHostRegister(_v2): the program's own host memory, pinned.
    pub fn registered(id: HookId, api: Api, p: *mut c_void, size: usize) -> Alloc {
        Alloc {
            out: Out::Key(p as u64),
            ..Alloc::new(id, api, MemoryKind::Registered, std::ptr::null_mut(), size)
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

/// Bytes of a CUDA array from a v1 (CUDA < 3.2) descriptor.
pub fn array_2d_bytes_v1(desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width as usize, d.height as usize, 0, element, 1) as usize
}

/// Bytes of a 3D CUDA array from a v1 (CUDA < 3.2) descriptor.
pub fn array_3d_bytes_v1(desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width as usize, d.height as usize, d.depth as usize, element, 1) as usize
}

/// The size of a multicast object, from its properties.
pub fn multicast_bytes(prop: *const CUmulticastObjectProp) -> usize {
    if prop.is_null() {
        0
    } else {
        // SAFETY: non-null: the properties the program passed to the
        // call, which the driver requires to be a valid struct; read
        // before the call, while the program's argument is live.
        unsafe { (*prop).size }
    }
}

/// The size of an external memory object, from its handle description.
pub fn external_bytes(desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC) -> usize {
    if desc.is_null() {
        0
    } else {
        // SAFETY: non-null: the description the program passed to the
        // call, a valid struct by the driver's contract; read before the
        // call, while the program's argument is live.
        unsafe { (*desc).size as usize }
    }
}

/// The size of a buffer mapped from external memory.
pub fn external_buffer_bytes(desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) -> usize {
    if desc.is_null() {
        0
    } else {
        // SAFETY: non-null: the description the program passed to the
        // call, a valid struct by the driver's contract; read before the
        // call, while the program's argument is live.
        unsafe { (*desc).size as usize }
    }
}

/// The nominal size of a mipmapped array mapped from external memory.
pub fn external_mipmap_bytes(desc: *const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the program's descriptor argument, checked non-null above,
    // which the call reads too; only read here, while the call runs.
    let d = unsafe { &*desc };
    array_3d_bytes(&d.array_desc, d.num_levels)
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
            Size::Pitch(_, _, asked) | Size::Pitch32(_, _, asked) => asked,
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
        let key = match self.out {
            // SAFETY: the program's non-null out parameter, which the
            // successful call wrote; read unaligned, trusting no alignment.
            Out::Address(out) if !out.is_null() => unsafe { out.read_unaligned() },
            // SAFETY: the program's non-null 32-bit out parameter, which
            // the successful call wrote; read unaligned.
            Out::Address32(out) if !out.is_null() => u64::from(unsafe { out.read_unaligned() }),
            Out::Key(key) if key != 0 => key,
            _ => return,
        };
        let size = match self.size {
            Size::Bytes(b) => b,
            Size::Pitch(p, h, _) if !p.is_null() => {
                // SAFETY: the program's non-null pitch out parameter,
                // written by the successful call.
                unsafe { p.read_unaligned() as u64 }.saturating_mul(h as u64)
            }
            Size::Pitch32(p, h, _) if !p.is_null() => {
                // SAFETY: the program's non-null pitch out parameter,
                // written by the successful call.
                (unsafe { p.read_unaligned() } as u64).saturating_mul(h as u64)
            }
            Size::Pitch(..) | Size::Pitch32(..) => 0,
            Size::OfAddress => size_of_address(key),
        };
        let thread = cx.thread;
        let (api, stack) = match runtime.and_then(|(outer, rc)| Some((rc.api, outer.captured()?))) {
            Some((api, s)) => (api, s),
            None => (self.api, cx.stack()),
        };
        if let Some((stream, per_thread)) = self.stream.filter(|_| graphs::capturing()) {
            if let Some(graph) = graphs::capture_graph(stream, per_thread) {
                // Captured: a node of the capture's graph, allocated when a
                // launch runs it (`graphs.rs`, case 1).
                let trace = stack.intern(&tracker::DEPOT, api, MemoryKind::Graph, thread);
                let node = graphs::AllocNode {
                    addr: key,
                    size,
                    api,
                    trace,
                    device: None,
                };
                graphs::alloc_node_added(graph, node);
                return;
            }
        }
        tracker::record_allocation(key, size, api, self.kind, stack, self.device, thread);
    }
}

/// The size of the allocation at `addr`, from the driver (0 if it cannot
/// say). Called from `after()`, once the driver hook guard is down again;
/// the helper is not a hook anyway, so nothing is recorded twice.
fn size_of_address(addr: u64) -> u64 {
    let Some(get) = crate::cuda::driver_lookup::CU_MEM_GET_ADDRESS_RANGE_V2.get::<MemGetAddressRangeFn>()
    else {
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
    /// cuMemFreeAsync's stream (see [`Alloc`]'s)
    stream: Option<(CUstream, bool)>,
}

impl Free {
    pub fn new(id: HookId, addr: u64, accepts: KindSet) -> Free {
        Free {
            id,
            addr,
            accepts,
            stream: None,
        }
    }

    /// cuMemFreeAsync (and `_ptsz`).
    pub fn stream_ordered(id: HookId, addr: u64, stream: CUstream, per_thread: bool) -> Free {
        Free {
            stream: Some((stream, per_thread)),
            ..Free::new(id, addr, FREES_DEVICE)
        }
    }
}

pub enum Removed {
    Block(Option<cudaleak_core::record::Block>),
    /// a free on a stream being captured: a free node of this graph
    Captured(u64),
}

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
        if let Some((stream, per_thread)) = self.stream.filter(|_| graphs::capturing()) {
            if let Some(graph) = graphs::capture_graph(stream, per_thread) {
                return Some(Removed::Captured(graph));
            }
        }
        Some(Removed::Block(tracker::remove_block(
            self.addr,
            self.accepts,
            cx.thread,
        )))
    }

    fn after(&self, cx: &mut HookCx, removed: Removed, result: c_int) {
        match removed {
            Removed::Block(b) => tracker::finish_release(self.addr, b, result == CUDA_SUCCESS, cx.thread),
            Removed::Captured(graph) if result == CUDA_SUCCESS => graphs::free_node_added(graph, self.addr),
            Removed::Captured(_) => {}
        }
    }
}

// ---- CUDA graphs and stream capture (`state/graphs.rs`) ----

/// cuStreamBeginCapture(_v2, ToGraph) and their `_ptsz`: one more stream
/// being captured.
pub struct CaptureBegin;

impl Event for CaptureBegin {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            graphs::capture_began();
        }
    }
}

/// cuStreamEndCapture(_ptsz): the capture ends whatever the call returns
/// (an invalidated capture ends with an error), if there was one.
pub struct CaptureEnd(pub CUstream, pub bool);

impl Event for CaptureEnd {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        (graphs::capturing() && graphs::capture_graph(self.0, self.1).is_some()).then_some(())
    }
    fn after(&self, _: &mut HookCx, _: (), _: c_int) {
        graphs::capture_ended();
    }
}

/// A memory-alloc or memory-free node added to a graph.
pub enum GraphNode {
    /// cuGraphAddMemAllocNode's parameters
    Alloc(Api, CUgraph, *mut CUDA_MEM_ALLOC_NODE_PARAMS),
    /// cuGraphAddMemFreeNode's address
    Free(CUgraph, u64),
    /// cuGraphAddNode(_v2)'s parameters, of any node type
    Generic(Api, CUgraph, *mut CUgraphNodeParams),
}

impl Event for GraphNode {
    type State = ();
    fn before(&self, cx: &mut HookCx) -> Option<()> {
        if let GraphNode::Alloc(..) | GraphNode::Generic(..) = self {
            // The node's stack is the adding call's (case 1).
            cx.stack();
        }
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS {
            return;
        }
        let (api, graph, params) = match *self {
            GraphNode::Free(graph, addr) => return graphs::free_node_added(graph as u64, addr),
            GraphNode::Alloc(api, graph, params) => (api, graph, params),
            GraphNode::Generic(api, graph, params) if !params.is_null() => {
                // SAFETY: the program's node parameters, which the
                // successful call read (and wrote the address into).
                let (node_type, first) = unsafe { ((*params).node_type, (*params).params[0]) };
                match node_type {
                    CU_GRAPH_NODE_TYPE_MEM_FREE => return graphs::free_node_added(graph as u64, first),
                    CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                        // SAFETY: the union at offset 16 holds the alloc
                        // node's parameters for this node type.
                        let alloc = unsafe { std::ptr::addr_of_mut!((*params).params) };
                        (api, graph, alloc.cast::<CUDA_MEM_ALLOC_NODE_PARAMS>())
                    }
                    _ => return,
                }
            }
            GraphNode::Generic(..) => return,
        };
        if params.is_null() {
            return;
        }
        // SAFETY: the program's node parameters, read and written back
        // by the successful call; read unaligned, trusting no alignment.
        let p = unsafe { params.read_unaligned() };
        let thread = cx.thread;
        let trace = cx.stack().intern(&tracker::DEPOT, api, MemoryKind::Graph, thread);
        let node = graphs::AllocNode {
            addr: p.dptr,
            size: p.bytesize as u64,
            api,
            trace,
            device: u8::try_from(p.location_id).ok(),
        };
        graphs::alloc_node_added(graph as u64, node);
    }
}

/// How an instantiation's flags are given.
pub enum InstantiateFlags {
    None,
    Flags(u64),
    Params(*const CUDA_GRAPH_INSTANTIATE_PARAMS),
}

/// cuGraphInstantiate(_v2, WithFlags, WithParams): the executable graph
/// gets the graph's nodes as they are now.
pub struct GraphInstantiate(pub *mut CUgraphExec, pub CUgraph, pub InstantiateFlags);

impl Event for GraphInstantiate {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS || self.0.is_null() {
            return;
        }
        let flags = match self.2 {
            InstantiateFlags::None => 0,
            InstantiateFlags::Flags(f) => f,
            // SAFETY: the program's parameters, read by the successful call.
            InstantiateFlags::Params(p) if !p.is_null() => unsafe { (*p).flags },
            InstantiateFlags::Params(_) => 0,
        };
        // SAFETY: the program's out parameter, written by the successful call.
        let exec = unsafe { self.0.read_unaligned() };
        graphs::instantiated(exec as u64, self.1 as u64, flags);
    }
}

/// cuGraphLaunch(_ptsz): the graph's memory nodes run (case 3). A launch
/// into a stream being captured runs nothing now.
pub struct GraphLaunch(pub CUgraphExec, pub CUstream, pub bool);

impl Event for GraphLaunch {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        tracker::note_allocation_call();
        (!(graphs::capturing() && graphs::capture_graph(self.1, self.2).is_some())).then_some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            graphs::launched(self.0 as u64, FREES_DEVICE, cx.thread);
        }
    }
}

/// cuGraphExecDestroy, cuGraphDestroy: the nodes are forgotten, not the
/// memory a launch allocated (case 4).
pub enum GraphGone {
    Exec(CUgraphExec),
    Graph(CUgraph),
}

impl Event for GraphGone {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS {
            return;
        }
        match *self {
            GraphGone::Exec(e) => graphs::exec_destroyed(e as u64),
            GraphGone::Graph(g) => graphs::graph_destroyed(g as u64),
        }
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

/// cuMemRetainAllocationHandle: one more reference to the handle it
/// returns (the same handle the memory was mapped with).
pub struct Retain(*mut CUmemGenericAllocationHandle);

impl Retain {
    pub fn new(handle: *mut CUmemGenericAllocationHandle) -> Retain {
        Retain(handle)
    }
}

impl Event for Retain {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        (!self.0.is_null()).then_some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            // SAFETY: written by the successful call.
            tracker::handle_retained(unsafe { self.0.read_unaligned() });
        }
    }
}

/// cuMulticastBindMem/BindAddr(_v2): the bound memory lives as long as
/// the bind.
pub struct Bind {
    mc: u64,
    dev: CUdevice,
    offset: u64,
    mem: Option<u64>,
    addr: u64,
}

impl Bind {
    pub fn handle(mc: u64, dev: CUdevice, offset: usize, mem: u64) -> Bind {
        Bind {
            mc,
            dev,
            offset: offset as u64,
            mem: Some(mem),
            addr: 0,
        }
    }
    pub fn address(mc: u64, dev: CUdevice, offset: usize, addr: u64) -> Bind {
        Bind {
            mc,
            dev,
            offset: offset as u64,
            mem: None,
            addr,
        }
    }
}

impl Event for Bind {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            tracker::bound(self.mc, self.dev, self.offset, self.mem, self.addr);
        }
    }
}

/// cuMulticastUnbind: taken out before the call, put back if it fails
/// (case 3).
pub struct McUnbind {
    mc: u64,
    dev: CUdevice,
    offset: u64,
    size: u64,
}

impl McUnbind {
    pub fn new(mc: u64, dev: CUdevice, offset: usize, size: usize) -> McUnbind {
        McUnbind {
            mc,
            dev,
            offset: offset as u64,
            size: size as u64,
        }
    }
}

impl Event for McUnbind {
    type State = tracker::UnbindUndo;
    fn before(&self, _: &mut HookCx) -> Option<tracker::UnbindUndo> {
        Some(tracker::unbind_begin(self.mc, self.dev, self.offset, self.size))
    }
    fn after(&self, _: &mut HookCx, undo: tracker::UnbindUndo, result: c_int) {
        tracker::unbind_finish(undo, result == CUDA_SUCCESS);
    }
}

// ---- contexts ----

pub enum ContextEvent {
    Destroy(u64),
    Attach(*mut CUcontext),
    Detach(u64),
    PrimaryRetain(*mut CUcontext, CUdevice),
    PrimaryRelease(CUdevice),
    /// the hook (v1 or _v2), for the runtime call it may serve
    PrimaryReset(HookId, CUdevice),
    GreenCreate(*mut CUgreenCtx, CUdevice),
    GreenDestroy(u64),
    GreenContext(*mut CUcontext, u64),
}

impl ContextEvent {
    pub fn destroy(ctx: CUcontext) -> ContextEvent {
        ContextEvent::Destroy(ctx as u64)
    }
    pub fn attach(pctx: *mut CUcontext) -> ContextEvent {
        ContextEvent::Attach(pctx)
    }
    pub fn detach(ctx: CUcontext) -> ContextEvent {
        ContextEvent::Detach(ctx as u64)
    }
    pub fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRetain(pctx, dev)
    }
    pub fn primary_release(dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRelease(dev)
    }
    pub fn primary_reset(id: HookId, dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryReset(id, dev)
    }
    pub fn green_create(pgreen: *mut CUgreenCtx, dev: CUdevice) -> ContextEvent {
        ContextEvent::GreenCreate(pgreen, dev)
    }
    pub fn green_destroy(green: CUgreenCtx) -> ContextEvent {
        ContextEvent::GreenDestroy(green as u64)
    }
    pub fn green_context(pctx: *mut CUcontext, green: CUgreenCtx) -> ContextEvent {
        ContextEvent::GreenContext(pctx, green as u64)
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
        // The reads below: the program's non-null out parameters, written
        // by the successful call.
        match *self {
            ContextEvent::Destroy(ctx) => tracker::teardown_context(ctx),
            ContextEvent::Attach(pctx) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::context_attached(unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::Detach(ctx) => tracker::context_detached(ctx),
            ContextEvent::PrimaryRetain(pctx, dev) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::primary_retained(dev, unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::PrimaryRelease(dev) => tracker::primary_released(dev),
            ContextEvent::PrimaryReset(id, dev) => {
                if let Some((_, rc)) = calling_runtime(cx.thread, id) {
                    rc.torn_down.set(true);
                }
                tracker::primary_reset(dev)
            }
            ContextEvent::GreenCreate(pgreen, dev) if !pgreen.is_null() => {
                // SAFETY: `pgreen` is non-null and the call wrote the handle.
                tracker::green_created(unsafe { pgreen.read_unaligned() } as u64, dev)
            }
            ContextEvent::GreenDestroy(green) => tracker::green_destroyed(green),
            ContextEvent::GreenContext(pctx, green) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::green_context(green, unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::Attach(..)
            | ContextEvent::PrimaryRetain(..)
            | ContextEvent::GreenCreate(..)
            | ContextEvent::GreenContext(..) => {}
        }
    }
}

// ---- entry-point lookups ----

pub struct EntryPoint {
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    /// The hooks handed out for a name we wrap (`hooks/mod.rs`, above).
    handouts: Handouts,
}

impl EntryPoint {
    pub fn new(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        handouts: Handouts,
    ) -> EntryPoint {
        EntryPoint {
            symbol,
            pfn,
            version,
            flags,
            handouts,
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
            // SAFETY: `symbol` and `pfn` are what the program passed to the
            // lookup that just succeeded: its C string and the out
            // parameter the driver wrote, as `substitute_entry_point` asks.
            unsafe {
                entry_points::substitute_entry_point(
                    self.symbol,
                    self.pfn,
                    self.version,
                    self.flags,
                    self.handouts,
                    lookup_caller,
                )
            };
        }
    }
}

/// The return address of the hooked call that made an entry-point lookup:
/// the first frame outside this library (libgcc's unwinder: one frame, a
/// few microseconds, whatever CUDALEAK_STACK_DEPTH says).
fn lookup_caller() -> usize {
    let mut frame = [MaybeUninit::<u64>::uninit(); 1];
    match crate::capture::unwind::capture_dwarf(&mut frame, Default::default()) {
        // SAFETY: the unwinder wrote the first `n` entries.
        1 => unsafe { frame[0].assume_init() as usize },
        _ => 0,
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
    /// the key when it is an argument, not written to `out` (cudaHostRegister)
    key: u64,
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
            key: 0,
            size,
        }
    }

    /// cudaHostRegister: the program's own host memory, pinned.
    pub fn registered(ptr: *mut c_void, size: usize) -> RuntimeAlloc {
        RuntimeAlloc {
            key: ptr as u64,
            ..RuntimeAlloc::new(
                Api::cudaHostRegister,
                MemoryKind::Registered,
                crate::cuda::hook_table::RUNTIME_HOST_REGISTER,
                std::ptr::null_mut(),
                RtSize::Bytes(size),
            )
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
            crate::cuda::hook_table::RUNTIME_MALLOC_PITCH,
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
        let key = if self.key != 0 {
            self.key
        } else if self.out.is_null() {
            return;
        } else {
            // SAFETY: the call succeeded and wrote its out parameter.
            unsafe { self.out.read_unaligned() }
        };
        if key == 0 {
            return; // cudaMalloc(&p, 0) returns NULL and allocates nothing
        }
        let size = match self.size {
            RtSize::Bytes(b) => b as u64,
            RtSize::Pitch(p, rows, _) if !p.is_null() => {
                // SAFETY: the program's non-null pitch out parameter,
                // written by the successful call.
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
        let removed = tracker::remove_block(self.addr, self.accepts, cx.thread);
        tracker::finish_release(self.addr, removed, result == CUDA_SUCCESS, cx.thread);
    }
}

pub struct RuntimeReset;

impl Event for RuntimeReset {
    type State = ();
    fn before(&self, cx: &mut HookCx) -> Option<()> {
        cx.publish(RuntimeCall::new(
            Api::cudaMalloc,
            crate::cuda::hook_table::RUNTIME_DEVICE_RESET,
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
