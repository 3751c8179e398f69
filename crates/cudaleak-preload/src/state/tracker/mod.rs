//! Process-wide tracking state, and what the events do to it.
//!
//! Lock order (never taken the other way round): SNAPSHOT_LOCK → VMM →
//! a map shard → TORN_DOWN. ATTACHES and GREEN_INSERT are taken alone. No
//! lock here is held while a real CUDA function runs.
//!
//! 1. contexts, their devices and teardowns: `contexts`
//! 2. virtual memory management (handles, mappings, multicast binds): `vmm`
//! 3. reading the state (snapshots, live memory by device, peaks): `reading`
//! 4. the state across a fork: `fork`

mod contexts;
mod fork;
mod reading;
mod vmm;

pub use contexts::*;
pub use fork::*;
pub use reading::*;
pub use vmm::*;

use crate::base::thread::ThreadState;
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
/// report's `peak`, the sampled timeline (`sampler.rs`), the metrics file
/// and the live view. Always kept, so that a report's peak section never
/// depends on a setting (docs/performance.md has their cost).
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
            | MemoryKind::Graph
            | MemoryKind::Module
    )
}

/// Records a block: its stack's trace (`HookCx::trace`), the context it
/// belongs to, the live map and the byte counts. A graph's memory-alloc
/// node is recorded so when a launch runs it, with the trace of the call
/// that added the node (`state/graphs.rs`).
pub fn record_traced_allocation(
    key: u64,
    size: u64,
    api: Api,
    kind: MemoryKind,
    trace: TraceId,
    device: Option<u8>,
    thread: &ThreadState,
) {
    // A library (cuLibraryLoad*) is context-independent: a reset leaves it.
    let library = matches!(api, Api::cuLibraryLoadData | Api::cuLibraryLoadFromFile);
    let (slot, ctx_device) = if context_bound(kind) && !library {
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
        VMM.lock().created(key);
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
    /// bit `k` set: blocks of the kind numbered `k` (a bit test, where a
    /// search of a list of kinds cost a loop on every free)
    kinds: u32,
    imported_by: &'static [Api],
}

// Every kind's number fits the mask.
const _: () = {
    let mut i = 0;
    while i < MemoryKind::ALL.len() {
        assert!((MemoryKind::ALL[i] as u32) < u32::BITS);
        i += 1;
    }
};

impl Releases {
    pub const fn new(kinds: &[MemoryKind], imported_by: &'static [Api]) -> Releases {
        let mut mask = 0u32;
        let mut i = 0;
        while i < kinds.len() {
            mask |= 1 << kinds[i] as u32;
            i += 1;
        }
        Releases {
            kinds: mask,
            imported_by,
        }
    }

    fn accepts(&self, b: &Block) -> bool {
        if self.kinds & (1 << b.kind() as u32) != 0 {
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
/// hooks/events/mod.rs); `None` when `addr` is not a live block the call releases.
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
