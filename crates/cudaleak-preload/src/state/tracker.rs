//! Process-wide tracking state, and what the events do to it.
//!
//! Lock order (never taken the other way round): SNAPSHOT_LOCK → VMM →
//! a map shard → TORN_DOWN. ATTACHES and GREEN_INSERT are taken alone. No
//! lock here is held while a real CUDA function runs.

use crate::base::thread::ThreadState;
use crate::capture::Stack;
use crate::cuda::driver_lookup::{CU_CTX_GET_CURRENT, CU_CTX_GET_DEVICE};
use crate::cuda::ffi::*;
use crate::state::live_bytes;
use cudaleak_core::assemble::{PeakSites, Snapshot};
use cudaleak_core::base::hash::AddrHash;
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::config::Config;
use cudaleak_core::record::depot::Depot;
use cudaleak_core::record::live_map::{Caller, LiveMap, MapCounts, Stopped};
use cudaleak_core::record::site_counters::SiteCounters;
use cudaleak_core::record::{Api, Block, MemoryKind, TraceId};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

/// Device, host and managed blocks and VA reservations, by address.
pub static LIVE: LiveMap = LiveMap::new();
/// Physical allocations (cuMemCreate), by handle: another key space.
pub static HANDLES: LiveMap = LiveMap::new();
pub static DEPOT: Depot = Depot::new();
/// Live bytes and blocks per trace, now and at the process's peak: every
/// report's `peak`, and the sampled timeline (`sampler.rs`). Always kept
/// (issue 21; docs/performance.md has their cost).
pub static SITES: SiteCounters = SiteCounters::new();
/// Blocks still live when their context was destroyed: leaked by the
/// program, kept for the reports, but out of LIVE so that the driver's
/// reuse of their addresses cannot be mistaken for them.
pub static TORN_DOWN: FutexMutex<Vec<(u64, Block)>> = FutexMutex::new(Vec::new());
/// Held while a dump reads the maps and while a teardown moves blocks, so
/// that a snapshot never sees a block twice or not at all.
pub static SNAPSHOT_LOCK: FutexMutex<()> = FutexMutex::new(());

static FAILED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static INVALID_FREES: AtomicU64 = AtomicU64::new(0);
static INTERNAL_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Checkpoint epoch; stored in each block (`cudaleak_checkpoint`).
pub static EPOCH: AtomicU32 = AtomicU32::new(0);
static SAW_ALLOCATION_CALL: AtomicBool = AtomicBool::new(false);
static TRACKING: AtomicBool = AtomicBool::new(false);

/// The calling thread as the live maps know it.
fn me() -> Caller<'static> {
    crate::base::thread::current().caller()
}

#[inline]
pub fn is_tracking() -> bool {
    TRACKING.load(Ordering::Relaxed)
}

pub fn set_tracking(on: bool) {
    TRACKING.store(on, Ordering::Release);
}

/// Applies the parts of the configuration the tracking state keeps
/// (called once at load with the configuration in force).
pub fn configure(c: &Config) {
    DEPOT.set_max_traces(c.max_stacks);
    crate::state::event_ring::configure(c.trace_events);
}

/// What the lifecycle does at the first allocation call of a process (or
/// of a fork child): installed at load, before tracking starts, so the
/// tracker never names the floor above it.
static ON_FIRST_ALLOCATION_CALL: AtomicUsize = AtomicUsize::new(0);

/// Installs what runs at the first allocation call (a plain function).
pub fn at_first_allocation_call(f: fn()) {
    ON_FIRST_ALLOCATION_CALL.store(f as usize, Ordering::Release);
}

pub fn saw_allocation_call() -> bool {
    SAW_ALLOCATION_CALL.load(Ordering::Acquire)
}

/// Any allocation call, failed or not: the process will write reports.
/// The first one counts only once the lifecycle installed its work
/// (`at_first_allocation_call`, before tracking starts): a call noted
/// without it would leave the process with no dumper and no handlers.
#[inline]
pub fn note_allocation_call() {
    if SAW_ALLOCATION_CALL.load(Ordering::Relaxed) {
        return;
    }
    let f = ON_FIRST_ALLOCATION_CALL.load(Ordering::Acquire);
    if f != 0
        && SAW_ALLOCATION_CALL
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        // SAFETY: stored from a `fn()` by `at_first_allocation_call`.
        unsafe { std::mem::transmute::<usize, fn()>(f)() };
    }
}

pub fn note_failed_allocation() {
    FAILED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

/// What the timeline's sampler reads (`sampler.rs`).
pub fn sampler_sources() -> crate::state::sampler::Sources<'static> {
    crate::state::sampler::Sources {
        period: crate::base::settings::config().timeline,
        sites: &SITES,
        depot: &DEPOT,
        peak_bytes: live_bytes::peak(),
        active: saw_allocation_call(),
    }
}

/// Allocation calls that failed so far.
pub fn failed_allocations() -> u64 {
    FAILED_ALLOCATIONS.load(Ordering::Relaxed)
}

pub fn note_internal_error() {
    INTERNAL_ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// Live and peak bytes count memory, not reserved address space. The call
/// site is told the peak before the block counts (`site_counters.rs`).
#[inline]
fn add_bytes(b: &Block) {
    if !b.kind().counts_in_live_bytes() {
        return;
    }
    let n = b.size();
    let peak = live_bytes::peak();
    SITES.add(b.trace, n, peak);
    live_bytes::add(n, peak);
}

/// A block gone.
#[inline]
fn sub_bytes(b: &Block) {
    if b.kind().counts_in_live_bytes() {
        SITES.sub(b.trace, b.size(), live_bytes::peak());
        live_bytes::sub(b.size());
    }
}

/// Kinds whose memory belongs to a context and dies with it (a
/// registration is undone with its context).
fn context_bound(kind: MemoryKind) -> bool {
    matches!(
        kind,
        MemoryKind::Device
            | MemoryKind::Host
            | MemoryKind::Managed
            | MemoryKind::Array
            | MemoryKind::Registered
    )
}

pub fn record_allocation(
    key: u64,
    size: u64,
    api: Api,
    kind: MemoryKind,
    stack: &Stack,
    device: Option<u8>,
    thread: &ThreadState,
) {
    let trace: TraceId = stack.intern(&DEPOT, api, kind, thread);
    let (slot, ctx_device) = if context_bound(kind) {
        current_context(thread)
    } else {
        (0, None)
    };
    let block = Block::new(
        size,
        trace,
        kind,
        slot,
        ctx_device.or(device),
        EPOCH.load(Ordering::Relaxed),
    );
    let map = if api.returns_handle() {
        VMM.lock().handles.insert(key, HandleState { maps: 0, refs: 1 });
        &HANDLES
    } else {
        // Blocks with an address, whose frees `finish_release` sees.
        crate::state::event_ring::record(
            crate::state::event_ring::Action::Alloc,
            key,
            size,
            trace,
            block.device(),
        );
        &LIVE
    };
    if let Some(old) = map.insert(thread.caller(), key, block) {
        sub_bytes(&old);
    }
    add_bytes(&block);
}

/// Which blocks a release call takes: blocks of its memory kinds, and
/// memory opened from elsewhere (`Imported`) by the calls it undoes: a
/// pointer imported from another process's pool is freed with cuMemFree,
/// one opened by cuIpcOpenMemHandle only with cuIpcCloseMemHandle.
pub struct Releases {
    pub kinds: &'static [MemoryKind],
    pub imported_by: &'static [Api],
}

impl Releases {
    fn accepts(&self, b: &Block) -> bool {
        if self.kinds.contains(&b.kind()) {
            return true;
        }
        if b.kind() != MemoryKind::Imported || self.imported_by.is_empty() {
            return false;
        }
        // The depot reads without a lock. A block without a stack (the
        // depot was full) is let through: the driver says whether the
        // call may release it, and a failed release puts it back.
        DEPOT
            .get(b.trace)
            .is_none_or(|t| self.imported_by.contains(&t.api))
    }
}

/// Takes a block out of the live map before its release call (case 3 in
/// events.rs); `None` when `addr` is not a live block the call releases.
pub fn remove_block(addr: u64, accepts: &Releases, thread: &ThreadState) -> Option<Block> {
    LIVE.remove_if(thread.caller(), addr, |b| accepts.accepts(b))
}

pub fn finish_release(addr: u64, removed: Option<Block>, succeeded: bool, thread: &ThreadState) {
    match removed {
        Some(b) if succeeded => {
            crate::state::event_ring::record(
                crate::state::event_ring::Action::Free,
                addr,
                b.size(),
                b.trace,
                b.device(),
            );
            sub_bytes(&b);
        }
        Some(b) => LIVE.restore(thread.caller(), addr, b),
        None => {
            INVALID_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---- virtual memory management ----

/// What keeps a handle's memory alive: its references (1 from the call
/// that made it, +1 per cuMemRetainAllocationHandle, -1 per cuMemRelease)
/// and its mappings and multicast binds. It dies when both are 0.
#[derive(Clone, Copy, Default)]
struct HandleState {
    maps: u32,
    refs: u32,
}

/// Memory handle `mem` bound to multicast object `mc` at `offset`, for
/// device `dev` (-1: not known).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Bind {
    mc: u64,
    dev: i32,
    offset: u64,
    mem: u64,
}

struct Vmm {
    /// mapped VA → (handle, size); ordered for range lookups in cuMemUnmap
    mappings: BTreeMap<u64, (u64, u64)>,
    handles: HashMap<u64, HandleState, AddrHash>,
    binds: Vec<Bind>,
}

static VMM: FutexMutex<Vmm> = FutexMutex::new(Vmm {
    mappings: BTreeMap::new(),
    handles: HashMap::with_hasher(AddrHash),
    binds: Vec::new(),
});

pub enum HandleRelease {
    NotLive,
    Removed(Block),
    /// one reference less; still referenced or mapped: the memory lives on
    Deferred,
}

pub fn release_handle_begin(handle: u64) -> HandleRelease {
    let mut vmm = VMM.lock();
    let state = vmm.handles.get(&handle).copied();
    match state {
        Some(s) if s.refs == 0 => HandleRelease::NotLive,
        Some(s) if s.refs > 1 || s.maps > 0 => {
            if let Some(st) = vmm.handles.get_mut(&handle) {
                st.refs -= 1;
            }
            HandleRelease::Deferred
        }
        _ => match HANDLES.remove(me(), handle) {
            Some(b) => {
                vmm.handles.remove(&handle);
                HandleRelease::Removed(b)
            }
            None => HandleRelease::NotLive,
        },
    }
}

pub fn release_handle_end(handle: u64, st: HandleRelease, succeeded: bool) {
    match (st, succeeded) {
        (HandleRelease::NotLive, _) => {
            INVALID_FREES.fetch_add(1, Ordering::Relaxed);
        }
        (HandleRelease::Removed(b), true) => {
            sub_bytes(&b);
            if b.kind() == MemoryKind::Multicast {
                let gone = drop_binds_of(&mut VMM.lock(), handle);
                gone.iter().for_each(|(_, b)| sub_bytes(b));
            }
        }
        (HandleRelease::Removed(b), false) => {
            VMM.lock()
                .handles
                .insert(handle, HandleState { maps: 0, refs: 1 });
            HANDLES.restore(me(), handle, b);
        }
        (HandleRelease::Deferred, true) => {}
        (HandleRelease::Deferred, false) => {
            if let Some(s) = VMM.lock().handles.get_mut(&handle) {
                s.refs += 1;
            }
        }
    }
}

/// cuMemRetainAllocationHandle returned `handle`: one more reference,
/// which a cuMemRelease will give back.
pub fn handle_retained(handle: u64) {
    let mut vmm = VMM.lock();
    if HANDLES.get(me(), handle).is_some() {
        vmm.handles.entry(handle).or_default().refs += 1;
    }
}

pub fn mapped(va: u64, size: u64, handle: u64) {
    let mut vmm = VMM.lock();
    vmm.mappings.insert(va, (handle, size));
    vmm.handles.entry(handle).or_default().maps += 1;
}

/// The handle mapped at `addr`, anywhere in its mapping.
fn handle_mapped_at(vmm: &Vmm, addr: u64) -> Option<u64> {
    let (&va, &(handle, size)) = vmm.mappings.range(..=addr).next_back()?;
    (addr < va.saturating_add(size)).then_some(handle)
}

/// A multicast bind succeeded: memory handle `mem` (or the one mapped at
/// `addr`) lives at least until it is unbound or the object goes.
pub fn bound(mc: u64, dev: i32, offset: u64, mem: Option<u64>, addr: u64) {
    let mut vmm = VMM.lock();
    let Some(mem) = mem.or_else(|| handle_mapped_at(&vmm, addr)) else {
        return; // memory of a pool (cudaMallocAsync), not a handle
    };
    let dev = if dev >= 0 {
        dev
    } else {
        HANDLES
            .get(me(), mem)
            .and_then(|b| b.device())
            .map_or(-1, |d| d as i32)
    };
    vmm.binds.push(Bind { mc, dev, offset, mem });
    vmm.handles.entry(mem).or_default().maps += 1;
}

/// Takes one mapping or bind off handle `h`; when that was the last and
/// no reference is left, its block. `vmm` is locked.
fn unreference(vmm: &mut Vmm, h: u64) -> Option<(u64, Block)> {
    let st = vmm.handles.get_mut(&h)?;
    st.maps = st.maps.saturating_sub(1);
    if st.maps > 0 || st.refs > 0 {
        return None;
    }
    vmm.handles.remove(&h);
    HANDLES.remove(me(), h).map(|b| (h, b))
}

/// A multicast object is gone: its binds with it; the blocks that died.
fn drop_binds_of(vmm: &mut Vmm, mc: u64) -> Vec<(u64, Block)> {
    let mut gone = Vec::new();
    let mut i = 0;
    while i < vmm.binds.len() {
        if vmm.binds[i].mc == mc {
            let b = vmm.binds.swap_remove(i);
            gone.extend(unreference(vmm, b.mem));
        } else {
            i += 1;
        }
    }
    gone
}

/// What cuMulticastUnbind took out, to put back if the call fails.
pub struct UnbindUndo {
    binds: Vec<Bind>,
    handles: Vec<(u64, Block)>,
}

pub fn unbind_begin(mc: u64, dev: i32, offset: u64, size: u64) -> UnbindUndo {
    let mut vmm = VMM.lock();
    let end = offset.saturating_add(size);
    let mut undo = UnbindUndo {
        binds: Vec::new(),
        handles: Vec::new(),
    };
    let mut i = 0;
    while i < vmm.binds.len() {
        let b = vmm.binds[i];
        if b.mc == mc && (b.dev == dev || b.dev < 0) && (offset..end).contains(&b.offset) {
            vmm.binds.swap_remove(i);
            undo.handles.extend(unreference(&mut vmm, b.mem));
            undo.binds.push(b);
        } else {
            i += 1;
        }
    }
    undo
}

pub fn unbind_finish(undo: UnbindUndo, succeeded: bool) {
    if succeeded {
        undo.handles.iter().for_each(|(_, b)| sub_bytes(b));
        return;
    }
    let mut vmm = VMM.lock();
    for (h, b) in undo.handles {
        vmm.handles.insert(h, HandleState { maps: 0, refs: 0 });
        HANDLES.restore(me(), h, b);
    }
    for b in undo.binds {
        vmm.handles.entry(b.mem).or_default().maps += 1;
        vmm.binds.push(b);
    }
}

/// What cuMemUnmap took out, to put back if the call fails.
pub struct UnmapUndo {
    mappings: Vec<(u64, u64, u64)>,
    handles: Vec<(u64, Block)>,
}

pub fn unmap_begin(va: u64, size: u64) -> UnmapUndo {
    let mut vmm = VMM.lock();
    let end = va.saturating_add(size);
    let gone: Vec<(u64, u64, u64)> = vmm
        .mappings
        .range(va..end)
        .map(|(&a, &(h, s))| (a, h, s))
        .collect();
    let mut handles = Vec::new();
    for &(a, h, _) in &gone {
        vmm.mappings.remove(&a);
        handles.extend(unreference(&mut vmm, h));
    }
    UnmapUndo {
        mappings: gone,
        handles,
    }
}

pub fn unmap_finish(undo: UnmapUndo, succeeded: bool) {
    if succeeded {
        for (h, b) in &undo.handles {
            sub_bytes(b);
            if b.kind() == MemoryKind::Multicast {
                let gone = drop_binds_of(&mut VMM.lock(), *h);
                gone.iter().for_each(|(_, b)| sub_bytes(b));
            }
        }
        return;
    }
    let mut vmm = VMM.lock();
    for (h, b) in undo.handles {
        vmm.handles.insert(h, HandleState { maps: 0, refs: 0 });
        HANDLES.restore(me(), h, b);
    }
    for (a, h, s) in undo.mappings {
        vmm.mappings.insert(a, (h, s));
        vmm.handles.entry(h).or_default().maps += 1;
    }
}

// ---- contexts ----

const MAX_CONTEXTS: usize = 256;
/// Slot → context handle; slot 0 means "no context".
static CONTEXTS: [AtomicU64; MAX_CONTEXTS] = [const { AtomicU64::new(0) }; MAX_CONTEXTS];
/// Slot → device + 1 (0: unknown).
static CONTEXT_DEVICES: [AtomicU8; MAX_CONTEXTS] = [const { AtomicU8::new(0) }; MAX_CONTEXTS];
static CONTEXT_COUNT: AtomicUsize = AtomicUsize::new(0);
static CONTEXT_INSERT: FutexMutex<()> = FutexMutex::new(());

fn slot_of(ctx: u64) -> Option<u8> {
    let n = CONTEXT_COUNT.load(Ordering::Acquire);
    (1..=n.min(MAX_CONTEXTS - 1))
        .find(|&i| CONTEXTS[i].load(Ordering::Acquire) == ctx)
        .map(|i| i as u8)
}

fn device_of_slot(slot: u8) -> Option<u8> {
    match CONTEXT_DEVICES[slot as usize].load(Ordering::Acquire) {
        0 => None,
        d => Some(d - 1),
    }
}

/// The device of the calling thread's current context, if known.
pub fn current_device(thread: &ThreadState) -> Option<u8> {
    current_context(thread).1
}

/// The calling thread's current context, as (slot, device).
fn current_context(thread: &ThreadState) -> (u8, Option<u8>) {
    let Some(get) = CU_CTX_GET_CURRENT.get::<CtxGetCurrentFn>() else {
        return (0, None);
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: real driver call with a valid out pointer.
    if unsafe { get(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
        return (0, None);
    }
    let ctx = ctx as u64;
    let (last, last_slot) = thread.last_context.get();
    let slot = if last == ctx && last_slot != 0 {
        last_slot
    } else {
        // A green context's CUcontext allocates the primary context's
        // memory: its blocks take the primary context's slot, and die
        // with it.
        let owner = primary_of_green_context(ctx).unwrap_or(ctx);
        let s = slot_of(owner).unwrap_or_else(|| add_context(owner));
        thread.last_context.set((ctx, s));
        s
    };
    (slot, device_of_slot(slot))
}

#[cold]
fn add_context(ctx: u64) -> u8 {
    let _g = CONTEXT_INSERT.lock();
    if let Some(s) = slot_of(ctx) {
        return s;
    }
    let n = CONTEXT_COUNT.load(Ordering::Acquire);
    if n + 1 >= MAX_CONTEXTS {
        return 0;
    }
    let slot = n + 1;
    let mut dev: CUdevice = -1;
    if let Some(get) = CU_CTX_GET_DEVICE.get::<CtxGetDeviceFn>() {
        // SAFETY: ctx is current on this thread; valid out pointer.
        if unsafe { get(&mut dev) } != CUDA_SUCCESS {
            dev = -1;
        }
    }
    CONTEXTS[slot].store(ctx, Ordering::Release);
    if (0..255).contains(&dev) {
        CONTEXT_DEVICES[slot].store(dev as u8 + 1, Ordering::Release);
    }
    CONTEXT_COUNT.store(slot, Ordering::Release);
    slot as u8
}

/// Moves every block of a destroyed context to TORN_DOWN.
pub fn teardown_context(ctx: u64) {
    forget_attaches(ctx);
    let Some(slot) = slot_of(ctx) else { return };
    teardown_slots(|s| s == slot);
}

// ---- CUDA 2.0's context usage count (cuCtxAttach / cuCtxDetach) ----

/// Contexts attached to (cuCtxAttach) more often than detached, with the
/// count of attaches not yet matched; the context's creation is the one
/// reference a last cuCtxDetach takes away. A deprecated API: a few slots.
static ATTACHES: FutexMutex<[(u64, u32); 16]> = FutexMutex::new([(0, 0); 16]);

pub fn context_attached(ctx: u64) {
    let mut a = ATTACHES.lock();
    if let Some(e) = a.iter_mut().find(|e| e.0 == ctx && e.1 > 0) {
        e.1 += 1;
    } else if let Some(e) = a.iter_mut().find(|e| e.1 == 0) {
        *e = (ctx, 1);
    }
}

/// A successful cuCtxDetach: the last one destroyed the context.
pub fn context_detached(ctx: u64) {
    {
        let mut a = ATTACHES.lock();
        if let Some(e) = a.iter_mut().find(|e| e.0 == ctx && e.1 > 0) {
            e.1 -= 1;
            return;
        }
    }
    teardown_context(ctx);
}

fn forget_attaches(ctx: u64) {
    let mut a = ATTACHES.lock();
    a.iter_mut().filter(|e| e.0 == ctx).for_each(|e| *e = (0, 0));
}

// ---- green contexts (CUDA 12.4) ----
//
// cuGreenCtxCreate retains the device's primary context and
// cuGreenCtxDestroy releases it (NVIDIA's documentation of both); the
// green context's CUcontext (cuCtxFromGreenCtx) is "a normal primary
// context" with other SM resources. So a green context owns no memory:
// what is allocated while it is current is the primary context's and dies
// with that one, and a green context that outlives the program's own
// references keeps the primary context, and its blocks, alive.

const MAX_GREEN: usize = 64;
/// green context handle, its device + 1, and its CUcontext (0 until asked)
static GREEN: [(AtomicU64, AtomicI64, AtomicU64); MAX_GREEN] =
    [const { (AtomicU64::new(0), AtomicI64::new(0), AtomicU64::new(0)) }; MAX_GREEN];
static GREEN_INSERT: FutexMutex<()> = FutexMutex::new(());

pub fn green_created(green: u64, dev: CUdevice) {
    let Some(d) = device_index(dev) else { return };
    PRIMARY_REFS[d].fetch_add(1, Ordering::AcqRel);
    let _g = GREEN_INSERT.lock();
    if let Some(e) = GREEN.iter().find(|e| e.0.load(Ordering::Acquire) == 0) {
        e.2.store(0, Ordering::Relaxed);
        e.1.store(d as i64 + 1, Ordering::Relaxed);
        e.0.store(green, Ordering::Release);
    }
}

pub fn green_destroyed(green: u64) {
    let dev = {
        let _g = GREEN_INSERT.lock();
        let Some(e) = GREEN.iter().find(|e| e.0.load(Ordering::Acquire) == green) else {
            return;
        };
        e.0.store(0, Ordering::Release);
        e.1.load(Ordering::Relaxed) - 1
    };
    primary_released(dev as CUdevice);
}

/// cuCtxFromGreenCtx: `ctx` allocates the primary context's memory.
pub fn green_context(green: u64, ctx: u64) {
    if let Some(e) = GREEN.iter().find(|e| e.0.load(Ordering::Acquire) == green) {
        e.2.store(ctx, Ordering::Release);
    }
}

/// The primary context whose memory `ctx`, a green context's CUcontext,
/// allocates (when that primary context is known).
fn primary_of_green_context(ctx: u64) -> Option<u64> {
    let e = GREEN
        .iter()
        .find(|e| e.0.load(Ordering::Acquire) != 0 && e.2.load(Ordering::Acquire) == ctx)?;
    let d = usize::try_from(e.1.load(Ordering::Relaxed) - 1).ok()?;
    match PRIMARY_CONTEXT.get(d)?.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Teardowns moving blocks from the live map to [`TORN_DOWN`] now: a
/// thread stopped for good in one holds blocks that are in neither (the
/// report of its end counts itself incomplete).
static TEARDOWNS_MOVING: AtomicU32 = AtomicU32::new(0);

fn teardown_slots(matches: impl Fn(u8) -> bool) {
    let _g = SNAPSHOT_LOCK.lock();
    TEARDOWNS_MOVING.fetch_add(1, Ordering::AcqRel);
    let moved = LIVE.drain_where(me(), |b| b.context_slot() != 0 && matches(b.context_slot()));
    if !moved.is_empty() {
        TORN_DOWN.lock().extend(moved);
    }
    TEARDOWNS_MOVING.fetch_sub(1, Ordering::AcqRel);
}

const MAX_DEVICES: usize = 64;
static PRIMARY_CONTEXT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static PRIMARY_REFS: [AtomicI64; MAX_DEVICES] = [const { AtomicI64::new(0) }; MAX_DEVICES];

fn device_index(dev: CUdevice) -> Option<usize> {
    usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES)
}

pub fn primary_retained(dev: CUdevice, ctx: u64) {
    if let Some(d) = device_index(dev) {
        PRIMARY_CONTEXT[d].store(ctx, Ordering::Release);
        PRIMARY_REFS[d].fetch_add(1, Ordering::AcqRel);
    }
}

/// The last release destroys the primary context.
pub fn primary_released(dev: CUdevice) {
    let Some(d) = device_index(dev) else { return };
    let before = PRIMARY_REFS[d].fetch_sub(1, Ordering::AcqRel);
    if before == 1 {
        teardown_context(PRIMARY_CONTEXT[d].load(Ordering::Acquire));
    } else if before <= 0 {
        PRIMARY_REFS[d].store(0, Ordering::Release);
    }
}

pub fn primary_reset(dev: CUdevice) {
    let Some(d) = device_index(dev) else { return };
    PRIMARY_REFS[d].store(0, Ordering::Release);
    match PRIMARY_CONTEXT[d].load(Ordering::Acquire) {
        0 => teardown_device(d as u8),
        ctx => teardown_context(ctx),
    }
}

fn teardown_device(dev: u8) {
    teardown_slots(|s| device_of_slot(s) == Some(dev));
}

/// cudaDeviceReset whose driver call we did not see.
pub fn teardown_current_device(thread: &ThreadState) {
    if let (_, Some(dev)) = current_context(thread) {
        primary_reset(dev as CUdevice);
    }
}

// ---- reading ----

/// How a snapshot reads the maps.
pub struct Read<'a> {
    /// Gives up on locks held longer than this (exit paths).
    pub timeout: Option<Duration>,
    /// The thread that asked for the report and waits for it, which never
    /// runs again (exit paths): shards it holds are taken over
    /// (cudaleak_core's `live_map.rs`, case 1).
    pub stopped: Option<Stopped<'a>>,
    /// Asked while a lock is waited for: true stops the read (a live dump
    /// that an exit report is waiting for).
    pub give_up: &'a dyn Fn() -> bool,
}

impl Read<'_> {
    /// An ordinary read: every lock waited for.
    pub fn plain() -> Read<'static> {
        Read {
            timeout: None,
            stopped: None,
            give_up: &|| false,
        }
    }
}

/// Reads every live block and the counters, exactly (see live_map.rs).
/// None when `read.give_up` stopped it, or (no thread to take over) the
/// snapshot lock stayed held past the timeout.
pub fn snapshot(read: &Read) -> Option<Snapshot> {
    let caller = me();
    // A read by a thread inside a change of its own (a signal handler's
    // call on top of it) reads through its own flight.
    let stopped = read.stopped.or(Some(Stopped {
        tid: caller.tid,
        flight: caller.flight,
    }));
    let mut incomplete = 0u64;
    let _g = match read.timeout {
        Some(t) => match SNAPSHOT_LOCK.lock_for(t) {
            Some(g) => Some(g),
            // The thread that waits for this report may hold it (an
            // out-of-memory snapshot or a teardown it was in): the shards
            // are read anyway, each under its own lock or taken over. A
            // teardown stopped halfway holds blocks that are in neither
            // the shards nor the torn-down list: the report is counted
            // incomplete, rather than short of them.
            None if read.stopped.is_some() => {
                if TEARDOWNS_MOVING.load(Ordering::Acquire) > 0 {
                    incomplete += 1;
                }
                None
            }
            None => return None,
        },
        None => Some(SNAPSHOT_LOCK.lock()),
    };
    let mut snap = Snapshot::default();
    // Sized first (one short lock per shard): growing the copy by doubling
    // moved it several times (the out-of-memory snapshot is taken
    // on the failing thread).
    if read.timeout.is_none() {
        let live = LIVE.counts(caller).live + HANDLES.counts(caller).live;
        snap.blocks.reserve(live as usize + live as usize / 16 + 64);
    }
    let mut counts = MapCounts::default();
    for map in [&LIVE, &HANDLES] {
        incomplete += map.for_each_shard(caller.tid, stopped, read.timeout, read.give_up, |it, c| {
            snap.blocks.extend(it);
            counts.add(c);
        })? as u64;
    }
    let torn_down = match read.timeout {
        Some(t) => TORN_DOWN.lock_for(t),
        None => Some(TORN_DOWN.lock()),
    };
    match torn_down {
        Some(t) => snap.blocks.extend(t.iter().copied()),
        None => incomplete += 1,
    }
    snap.allocations = counts.inserted;
    snap.frees = counts.removed;
    snap.failed_allocations = FAILED_ALLOCATIONS.load(Ordering::Relaxed);
    snap.invalid_frees = INVALID_FREES.load(Ordering::Relaxed);
    let peak = live_bytes::peak();
    snap.peak_bytes = peak;
    snap.peak = Some(peak_sites(peak));
    snap.incomplete_shards = incomplete;
    snap.stacks_skipped_nested = crate::capture::NESTED_CAPTURES.load(Ordering::Relaxed);
    Some(snap)
}

/// Where live memory is: (device + 1, or 0 when not known; [`HOST`] for
/// pinned host memory), with its bytes and blocks, for the kinds counted
/// in live bytes. One pass over the live blocks, each shard under its own
/// lock for as long as it takes to add its blocks up; nothing is added to
/// an allocation. None when a lock stayed held past `timeout`.
pub fn live_by_device(timeout: Duration) -> Option<Vec<(u16, u64, u64)>> {
    let caller = me();
    let mut by: Vec<(u16, u64, u64)> = Vec::new();
    let mut add = |b: &Block| {
        if !b.kind().counts_in_live_bytes() {
            return;
        }
        let key = match (b.kind(), b.device()) {
            (MemoryKind::Host, _) => HOST,
            (_, Some(d)) => d.min(255) as u16 + 1,
            (_, None) => 0,
        };
        match by.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1 += b.size();
                e.2 += 1;
            }
            None => by.push((key, b.size(), 1)),
        }
    };
    for map in [&LIVE, &HANDLES] {
        let skipped = map.for_each_shard(caller.tid, None, Some(timeout), &|| false, |it, _| {
            for (_, b) in it {
                add(&b);
            }
        })?;
        if skipped > 0 {
            return None;
        }
    }
    for (_, b) in TORN_DOWN.lock_for(timeout)?.iter() {
        add(b);
    }
    by.sort_unstable();
    Some(by)
}

/// [`live_by_device`]'s key of pinned host memory.
pub const HOST: u16 = u16::MAX;

/// Every allocation and release call recorded so far, failed ones
/// included: equal counts, nothing happened in between (an `exec` tried
/// again after a failed one writes a new report only if it did).
pub fn activity() -> u64 {
    let me = me();
    let mut c = LIVE.counts(me);
    c.add(HANDLES.counts(me));
    c.inserted
        + c.removed
        + c.moved
        + FAILED_ALLOCATIONS.load(Ordering::Relaxed)
        + INVALID_FREES.load(Ordering::Relaxed)
}

/// What each call site held at the process's peak so far, without reading
/// the live map: for the in-process API's peak report.
pub fn peak_now() -> PeakSites {
    peak_sites(live_bytes::peak())
}

/// What each call site held when the process reached `peak`, the current
/// peak (`site_counters.rs`): one pass over the call sites, no lock.
fn peak_sites(peak: u64) -> PeakSites {
    let mut sites = Vec::new();
    SITES.for_each_at_peak(DEPOT.len(), peak, |trace, bytes, blocks| {
        sites.push((trace, blocks, bytes))
    });
    PeakSites {
        bytes: peak,
        timestamp_ms: live_bytes::peak_time_ms(),
        sites,
    }
}

/// Live blocks allocated at or after checkpoint epoch `epoch`.
pub fn blocks_since(epoch: u32) -> Vec<(u64, Block)> {
    let mut out = Vec::new();
    let _g = SNAPSHOT_LOCK.lock();
    for map in [&LIVE, &HANDLES] {
        let _ = map.for_each_shard(me().tid, None, None, &|| false, |it, _| {
            out.extend(it.filter(|(_, b)| b.epoch() >= epoch))
        });
    }
    out.extend(
        TORN_DOWN
            .lock()
            .iter()
            .filter(|(_, b)| b.epoch() >= epoch)
            .copied(),
    );
    out
}

// ---- fork ----

/// pthread_atfork prepare: every lock a hook can hold, in lock order.
pub fn lock_all_for_fork() {
    SNAPSHOT_LOCK.raw_lock();
    VMM.raw_lock();
    CONTEXT_INSERT.raw_lock();
    DEPOT.lock_for_fork();
    crate::capture::python::CODES.lock_for_fork();
    LIVE.lock_all(me().tid);
    HANDLES.lock_all(me().tid);
    TORN_DOWN.raw_lock();
    ATTACHES.raw_lock();
    GREEN_INSERT.raw_lock();
}

/// pthread_atfork parent.
///
/// # Safety
/// After [`lock_all_for_fork`] on this thread.
pub unsafe fn unlock_all_after_fork() {
    // SAFETY: the caller ran `lock_all_for_fork` on this thread, which took
    // each of these locks once; they are released once each, in reverse
    // order.
    unsafe {
        GREEN_INSERT.raw_unlock();
        ATTACHES.raw_unlock();
        TORN_DOWN.raw_unlock();
        HANDLES.unlock_all(me().tid);
        LIVE.unlock_all(me().tid);
        crate::capture::python::CODES.unlock_after_fork();
        DEPOT.unlock_after_fork();
        CONTEXT_INSERT.raw_unlock();
        VMM.raw_unlock();
        SNAPSHOT_LOCK.raw_unlock();
    }
}

/// pthread_atfork child: the child tracks only its own blocks, from zero.
/// Interned traces and code objects stay valid (same address space).
///
/// # Safety
/// After [`lock_all_for_fork`], in the single-threaded child.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller ran `lock_all_for_fork` before `fork` on the thread
    // that is now the child's only one, so this thread holds every lock
    // below and no other thread can use them: each lock's value may be
    // reached without a guard while held (`get_unchecked`), and each lock
    // is released once, in reverse order, its reference unused after.
    unsafe {
        GREEN_INSERT.raw_unlock();
        ATTACHES.raw_unlock();
        let torn = TORN_DOWN.get_unchecked();
        *torn = Vec::new();
        TORN_DOWN.raw_unlock();
        HANDLES.reset_locked_and_unlock();
        LIVE.reset_locked_and_unlock();
        crate::capture::python::CODES.unlock_after_fork();
        DEPOT.unlock_after_fork();
        CONTEXT_INSERT.raw_unlock();
        let vmm = VMM.get_unchecked();
        vmm.mappings = BTreeMap::new();
        vmm.handles = HashMap::with_hasher(AddrHash);
        vmm.binds = Vec::new();
        VMM.raw_unlock();
        SNAPSHOT_LOCK.raw_unlock();
    }
    SITES.reset();
    for c in [
        &FAILED_ALLOCATIONS,
        &INVALID_FREES,
        &crate::capture::NESTED_CAPTURES,
    ] {
        c.store(0, Ordering::Relaxed);
    }
    live_bytes::reset_in_child();
    crate::base::thread::current().reset_in_child();
    for r in &PRIMARY_REFS {
        r.store(0, Ordering::Relaxed);
    }
    crate::state::event_ring::reset_in_child();
    SAW_ALLOCATION_CALL.store(false, Ordering::Release);
}
