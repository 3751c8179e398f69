//! Process-wide tracking state, and what the events do to it.
//!
//! Lock order (never taken the other way round): SNAPSHOT_LOCK → VMM →
//! a map shard → TORN_DOWN. No lock here is held while a real CUDA function
//! runs.

use crate::capture::Stack;
use crate::driver_lookup::{CU_CTX_GET_CURRENT, CU_CTX_GET_DEVICE};
use crate::ffi::*;
use crate::thread::ThreadState;
use cudaleak_core::assemble::{PeakSites, Snapshot};
use cudaleak_core::config::Config;
use cudaleak_core::depot::Depot;
use cudaleak_core::live_map::{AddrHash, LiveMap, MapCounts};
use cudaleak_core::lock::FutexMutex;
use cudaleak_core::record::{Api, Block, MemoryKind, TraceId};
use cudaleak_core::site_counters::SiteCounters;
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
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
/// When PEAK_BYTES was last raised (Unix ms, to the coarse clock's tick).
static PEAK_TIME_MS: AtomicI64 = AtomicI64::new(0);
static INTERNAL_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Checkpoint epoch; stored in each block (`cudaleak_checkpoint`).
pub static EPOCH: AtomicU32 = AtomicU32::new(0);
static SAW_ALLOCATION_CALL: AtomicBool = AtomicBool::new(false);
static TRACKING: AtomicBool = AtomicBool::new(false);

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
pub fn sampler_sources() -> crate::sampler::Sources<'static> {
    crate::sampler::Sources {
        period: crate::settings::config().timeline,
        sites: &SITES,
        depot: &DEPOT,
        peak_bytes: PEAK_BYTES.load(Ordering::Relaxed),
        active: saw_allocation_call(),
    }
}

pub fn note_internal_error() {
    INTERNAL_ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// Live and peak bytes count memory, not reserved address space. The call
/// site is told the peak before the block counts (`site_counters.rs`).
fn add_bytes(b: &Block) {
    if !b.kind().counts_in_live_bytes() {
        return;
    }
    let n = b.size();
    let peak = PEAK_BYTES.load(Ordering::Relaxed);
    SITES.add(b.trace, n, peak);
    let now = LIVE_BYTES.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
    if now > peak {
        new_peak(now);
    }
}

/// Live bytes went past the peak: only while memory grows, never in a
/// steady alloc/free loop.
#[cold]
#[inline(never)]
fn new_peak(now: u64) {
    if PEAK_BYTES.fetch_max(now, Ordering::Relaxed) < now {
        PEAK_TIME_MS.store(coarse_now_ms(), Ordering::Relaxed);
    }
}

/// Unix time in ms from the coarse clock (a vDSO read, no system call;
/// its tick is 1-4 ms).
fn coarse_now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

fn sub_bytes(b: &Block) {
    if b.kind().counts_in_live_bytes() {
        SITES.sub(b.trace, b.size(), PEAK_BYTES.load(Ordering::Relaxed));
        LIVE_BYTES.fetch_sub(b.size(), Ordering::Relaxed);
    }
}

/// Kinds whose memory belongs to a context and dies with it.
fn context_bound(kind: MemoryKind) -> bool {
    matches!(
        kind,
        MemoryKind::Device | MemoryKind::Host | MemoryKind::Managed | MemoryKind::Array
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
        VMM.lock().handles.insert(key, HandleState::default());
        &HANDLES
    } else {
        &LIVE
    };
    if let Some(old) = map.insert(key, block) {
        sub_bytes(&old);
    }
    add_bytes(&block);
}

/// Takes a block out of the live map before its release call (case 3 in
/// events.rs); `None` when `addr` is not a live block of an accepted kind.
pub fn remove_block(addr: u64, accepts: &[MemoryKind]) -> Option<Block> {
    LIVE.remove_if(addr, |b| accepts.contains(&b.kind()))
}

pub fn finish_release(addr: u64, removed: Option<Block>, succeeded: bool) {
    match removed {
        Some(b) if succeeded => sub_bytes(&b),
        Some(b) => LIVE.restore(addr, b),
        None => {
            INVALID_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---- virtual memory management ----

#[derive(Clone, Copy, Default)]
struct HandleState {
    maps: u32,
    released: bool,
}

struct Vmm {
    /// mapped VA → (handle, size); ordered for range lookups in cuMemUnmap
    mappings: BTreeMap<u64, (u64, u64)>,
    handles: HashMap<u64, HandleState, AddrHash>,
}

static VMM: FutexMutex<Vmm> = FutexMutex::new(Vmm {
    mappings: BTreeMap::new(),
    handles: HashMap::with_hasher(AddrHash),
});

pub enum HandleRelease {
    NotLive,
    Removed(Block),
    /// still mapped: physical memory lives until the last unmap
    Deferred,
}

pub fn release_handle_begin(handle: u64) -> HandleRelease {
    let mut vmm = VMM.lock();
    let state = vmm.handles.get(&handle).copied();
    match state {
        Some(s) if s.released => HandleRelease::NotLive,
        Some(s) if s.maps > 0 => {
            if let Some(st) = vmm.handles.get_mut(&handle) {
                st.released = true;
            }
            HandleRelease::Deferred
        }
        _ => match HANDLES.remove(handle) {
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
        (HandleRelease::Removed(b), true) => sub_bytes(&b),
        (HandleRelease::Removed(b), false) => {
            VMM.lock().handles.insert(handle, HandleState::default());
            HANDLES.restore(handle, b);
        }
        (HandleRelease::Deferred, true) => {}
        (HandleRelease::Deferred, false) => {
            if let Some(s) = VMM.lock().handles.get_mut(&handle) {
                s.released = false;
            }
        }
    }
}

pub fn mapped(va: u64, size: u64, handle: u64) {
    let mut vmm = VMM.lock();
    vmm.mappings.insert(va, (handle, size));
    vmm.handles.entry(handle).or_default().maps += 1;
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
        let mut drop_handle = false;
        if let Some(st) = vmm.handles.get_mut(&h) {
            st.maps = st.maps.saturating_sub(1);
            drop_handle = st.maps == 0 && st.released;
        }
        if drop_handle {
            vmm.handles.remove(&h);
            if let Some(b) = HANDLES.remove(h) {
                handles.push((h, b));
            }
        }
    }
    UnmapUndo {
        mappings: gone,
        handles,
    }
}

pub fn unmap_finish(undo: UnmapUndo, succeeded: bool) {
    if succeeded {
        for (_, b) in &undo.handles {
            sub_bytes(b);
        }
        return;
    }
    let mut vmm = VMM.lock();
    for (h, b) in undo.handles {
        vmm.handles.insert(
            h,
            HandleState {
                maps: 0,
                released: true,
            },
        );
        HANDLES.restore(h, b);
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
        let s = slot_of(ctx).unwrap_or_else(|| add_context(ctx));
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
    let Some(slot) = slot_of(ctx) else { return };
    teardown_slots(|s| s == slot);
}

fn teardown_slots(matches: impl Fn(u8) -> bool) {
    let _g = SNAPSHOT_LOCK.lock();
    let moved = LIVE.drain_where(|b| b.context_slot() != 0 && matches(b.context_slot()));
    if !moved.is_empty() {
        TORN_DOWN.lock().extend(moved);
    }
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

/// Reads every live block and the counters, exactly (see live_map.rs).
/// With a timeout, gives up on locks that stay taken (dumps at exit).
pub fn snapshot(timeout: Option<Duration>) -> Option<Snapshot> {
    let _g = match timeout {
        Some(t) => SNAPSHOT_LOCK.lock_for(t)?,
        None => SNAPSHOT_LOCK.lock(),
    };
    let mut snap = Snapshot::default();
    // Sized first (one short lock per shard): growing the copy by doubling
    // moved it several times (issue 21: the out-of-memory snapshot is taken
    // on the failing thread).
    if timeout.is_none() {
        let live = LIVE.counts().live + HANDLES.counts().live;
        snap.blocks.reserve(live as usize + live as usize / 16 + 64);
    }
    let mut counts = MapCounts::default();
    let mut skipped = 0;
    for map in [&LIVE, &HANDLES] {
        skipped += map.for_each_shard(timeout, |it, c| {
            snap.blocks.extend(it);
            counts.add(c);
        });
    }
    snap.blocks.extend(TORN_DOWN.lock().iter().copied());
    snap.allocations = counts.inserted;
    snap.frees = counts.removed;
    snap.failed_allocations = FAILED_ALLOCATIONS.load(Ordering::Relaxed);
    snap.invalid_frees = INVALID_FREES.load(Ordering::Relaxed);
    let peak = PEAK_BYTES.load(Ordering::Relaxed);
    snap.peak_bytes = peak;
    snap.peak = Some(peak_sites(peak));
    snap.incomplete_shards = skipped as u64;
    Some(snap)
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
        timestamp_ms: PEAK_TIME_MS.load(Ordering::Relaxed),
        sites,
    }
}

/// Live blocks allocated at or after checkpoint epoch `epoch`.
pub fn blocks_since(epoch: u32) -> Vec<(u64, Block)> {
    let mut out = Vec::new();
    let _g = SNAPSHOT_LOCK.lock();
    for map in [&LIVE, &HANDLES] {
        map.for_each_shard(None, |it, _| out.extend(it.filter(|(_, b)| b.epoch() >= epoch)));
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
    crate::python::CODES.lock_for_fork();
    LIVE.lock_all();
    HANDLES.lock_all();
    TORN_DOWN.raw_lock();
}

/// pthread_atfork parent.
///
/// # Safety
/// After [`lock_all_for_fork`] on this thread.
pub unsafe fn unlock_all_after_fork() {
    TORN_DOWN.raw_unlock();
    HANDLES.unlock_all();
    LIVE.unlock_all();
    crate::python::CODES.unlock_after_fork();
    DEPOT.unlock_after_fork();
    CONTEXT_INSERT.raw_unlock();
    VMM.raw_unlock();
    SNAPSHOT_LOCK.raw_unlock();
}

/// pthread_atfork child: the child tracks only its own blocks, from zero.
/// Interned traces and code objects stay valid (same address space).
///
/// # Safety
/// After [`lock_all_for_fork`], in the single-threaded child.
pub unsafe fn reset_in_child_and_unlock() {
    let torn = TORN_DOWN.get_unchecked();
    *torn = Vec::new();
    TORN_DOWN.raw_unlock();
    HANDLES.reset_locked_and_unlock();
    LIVE.reset_locked_and_unlock();
    crate::python::CODES.unlock_after_fork();
    DEPOT.unlock_after_fork();
    CONTEXT_INSERT.raw_unlock();
    let vmm = VMM.get_unchecked();
    vmm.mappings = BTreeMap::new();
    vmm.handles = HashMap::with_hasher(AddrHash);
    VMM.raw_unlock();
    SNAPSHOT_LOCK.raw_unlock();
    SITES.reset();
    for c in [&FAILED_ALLOCATIONS, &INVALID_FREES, &LIVE_BYTES, &PEAK_BYTES] {
        c.store(0, Ordering::Relaxed);
    }
    PEAK_TIME_MS.store(0, Ordering::Relaxed);
    for r in &PRIMARY_REFS {
        r.store(0, Ordering::Relaxed);
    }
    SAW_ALLOCATION_CALL.store(false, Ordering::Release);
}
