//! Contexts: the slot of each, its device, teardowns of a context or a
//! device, CUDA 2.0's usage count and green contexts.

use super::*;

const MAX_CONTEXTS: usize = 256;
/// Slot → context handle; slot 0 means "no context".
static CONTEXTS: [AtomicU64; MAX_CONTEXTS] = [const { AtomicU64::new(0) }; MAX_CONTEXTS];
/// Slot → device + 1 (0: unknown).
static CONTEXT_DEVICES: [AtomicU8; MAX_CONTEXTS] = [const { AtomicU8::new(0) }; MAX_CONTEXTS];
static CONTEXT_COUNT: AtomicUsize = AtomicUsize::new(0);
pub(super) static CONTEXT_INSERT: FutexMutex<()> = FutexMutex::new(());

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
pub(super) fn current_context(thread: &ThreadState) -> (u8, Option<u8>) {
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
pub(super) static ATTACHES: FutexMutex<[(u64, u32); 16]> = FutexMutex::new([(0, 0); 16]);

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
pub(super) static GREEN_INSERT: FutexMutex<()> = FutexMutex::new(());

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
pub(super) static TEARDOWNS_MOVING: AtomicU32 = AtomicU32::new(0);

fn teardown_slots(matches: impl Fn(u8) -> bool) {
    let _g = SNAPSHOT_LOCK.lock();
    TEARDOWNS_MOVING.fetch_add(1, Ordering::AcqRel);
    let moved = LIVE.drain_where(me(), |b| b.context_slot() != 0 && matches(b.context_slot()));
    if !moved.is_empty() {
        // The device no longer holds them: out of the live bytes, the call
        // sites' counts (the peak, the timeline, the metrics) and the
        // event trace, as a free takes them out; kept as leaks.
        for (addr, b) in &moved {
            crate::state::event_ring::record(
                crate::state::event_ring::Action::Free,
                *addr,
                b.size(),
                b.trace,
                b.device(),
            );
            sub_bytes(b);
        }
        TORN_DOWN.lock().extend(moved);
    }
    TEARDOWNS_MOVING.fetch_sub(1, Ordering::AcqRel);
}

const MAX_DEVICES: usize = 64;
static PRIMARY_CONTEXT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
pub(super) static PRIMARY_REFS: [AtomicI64; MAX_DEVICES] = [const { AtomicI64::new(0) }; MAX_DEVICES];

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
