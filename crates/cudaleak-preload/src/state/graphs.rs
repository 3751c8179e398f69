//! CUDA graph memory: when a graph's memory nodes allocate and free.
//!
//! NVIDIA's programming guide ("Graph Memory Nodes") and the driver API
//! documentation decide what is allocated when:
//! 1. Adding a memory-alloc node (cuGraphAddMemAllocNode, cuGraphAddNode
//!    with a `MEM_ALLOC` node, or a stream-ordered allocation on a stream
//!    being captured) fixes the node's address for the graph's lifetime
//!    but allocates nothing: no block is recorded then. The node keeps the
//!    adding call's stack (interned now), API and size.
//! 2. Instantiating copies the graph's nodes into the executable graph, with
//!    its `AUTO_FREE_ON_LAUNCH` flag; later changes to the graph do not
//!    reach it.
//! 3. A launch runs the nodes: each alloc node's memory becomes live (a
//!    block of kind `graph`, with the node's stack) and each free node
//!    frees its address (a block of this launch, of an earlier one, or
//!    memory allocated outside any graph). The launch's own allocations are
//!    recorded before its frees, so an allocation freed within the graph
//!    still counts in the peak.
//! 4. Memory a launch allocated and nothing freed stays live after the
//!    launch, after cuGraphExecDestroy and after cuGraphDestroy, until
//!    cuMemFree(Async) frees it (those hooks accept the `graph` kind), a
//!    free node of another launch frees it, or its context is destroyed.
//!    Never freed, it is a leak, with the stack that added its node.
//! 5. Relaunching an executable graph whose earlier allocations are still
//!    live fails, unless it was instantiated with `AUTO_FREE_ON_LAUNCH`:
//!    then the launch frees them first, and so does this module.
//! 6. A stream-ordered free on a captured stream frees nothing when called:
//!    it becomes a free node of the capture's graph (case 3).
//! 7. cuDeviceGraphMemTrim gives back memory the graph pool keeps unused:
//!    nothing a program holds, so nothing here changes.
//!
//! Nothing here is on an allocation's hot path: an ordinary stream-ordered
//! allocation reads one counter ([`capturing`]) and asks the driver about
//! its stream only while some stream of the process is being captured.
//!
//! Lock order: [`GRAPHS`] is taken alone, never while a real CUDA function
//! runs and never around a call into the tracker.

use crate::base::thread::ThreadState;
use crate::cuda::driver_lookup::CU_STREAM_GET_CAPTURE_INFO_V2;
use crate::cuda::ffi::*;
use crate::state::tracker::{self, Releases};
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::record::{Api, MemoryKind, TraceId};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

/// One memory-alloc node, as added (case 1).
#[derive(Clone, Copy)]
pub struct AllocNode {
    pub addr: u64,
    pub size: u64,
    pub api: Api,
    pub trace: TraceId,
    pub device: Option<u8>,
}

#[derive(Clone, Default)]
struct Nodes {
    allocs: Vec<AllocNode>,
    frees: Vec<u64>,
}

struct Exec {
    nodes: Nodes,
    auto_free: bool,
    /// addresses the last launch allocated and it did not free itself
    outstanding: Vec<u64>,
}

#[derive(Default)]
struct Graphs {
    graphs: BTreeMap<u64, Nodes>,
    execs: BTreeMap<u64, Exec>,
}

static GRAPHS: FutexMutex<Option<Graphs>> = FutexMutex::new(None);

/// Streams being captured now (stream capture begun and not ended): while
/// 0, no stream-ordered call asks the driver about its stream.
static CAPTURES: AtomicU32 = AtomicU32::new(0);

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`
pub const AUTO_FREE_ON_LAUNCH: u64 = 1;
/// The per-thread default stream's handle, which a `_ptsz` entry point's
/// stream 0 means.
const CU_STREAM_PER_THREAD: CUstream = 2 as CUstream;

fn with<R>(f: impl FnOnce(&mut Graphs) -> R) -> R {
    let mut g = GRAPHS.lock();
    f(g.get_or_insert_with(Graphs::default))
}

/// Whether any stream may be capturing (one relaxed load).
#[inline]
pub fn capturing() -> bool {
    CAPTURES.load(Ordering::Relaxed) != 0
}

pub fn capture_began() {
    CAPTURES.fetch_add(1, Ordering::AcqRel);
}

pub fn capture_ended() {
    let _ = CAPTURES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// The graph `stream` is being captured into, from the real driver; None
/// when it is not capturing (or the driver cannot say).
pub fn capture_graph(stream: CUstream, per_thread: bool) -> Option<u64> {
    capture_state(stream, per_thread)
        .filter(|&(status, _)| status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
        .map(|(_, graph)| graph)
}

/// A capture of `stream`, active or invalidated: its status and graph.
pub fn capture_state(stream: CUstream, per_thread: bool) -> Option<(c_int, u64)> {
    let stream = if per_thread && stream.is_null() {
        CU_STREAM_PER_THREAD
    } else {
        stream
    };
    let get = CU_STREAM_GET_CAPTURE_INFO_V2.get::<StreamGetCaptureInfoFn>()?;
    let mut status: c_int = 0;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: real driver call with valid out pointers; the ones we do not
    // want are null, which the driver accepts.
    let r = unsafe {
        get(
            stream,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE && !graph.is_null())
        .then_some((status, graph as u64))
}

pub fn alloc_node_added(graph: u64, node: AllocNode) {
    with(|g| g.graphs.entry(graph).or_default().allocs.push(node));
}

pub fn free_node_added(graph: u64, addr: u64) {
    with(|g| g.graphs.entry(graph).or_default().frees.push(addr));
}

pub fn graph_destroyed(graph: u64) {
    with(|g| g.graphs.remove(&graph));
}

/// A graph made (cuGraphCreate, a capture): a handle a destroyed graph may
/// have had starts without its nodes.
pub fn graph_created(graph: u64) {
    graph_destroyed(graph);
}

/// Executable graphs with memory nodes: while 0, a launch takes no lock.
static EXECS_WITH_NODES: AtomicU32 = AtomicU32::new(0);

/// Whether any executable graph has memory nodes (one relaxed load).
#[inline]
pub fn has_memory_nodes() -> bool {
    EXECS_WITH_NODES.load(Ordering::Relaxed) != 0
}

/// Before a launch of `exec`: the blocks its free nodes free that it did
/// not allocate itself, taken out of the live map (case 3 of events).
pub fn take_outside_frees(
    exec: u64,
    frees: &Releases,
    thread: &ThreadState,
) -> Vec<(u64, Option<cudaleak_core::record::Block>)> {
    let outside: Vec<u64> = with(|g| {
        g.execs.get(&exec).map_or_else(Vec::new, |e| {
            e.nodes
                .frees
                .iter()
                .copied()
                .filter(|a| !e.nodes.allocs.iter().any(|n| n.addr == *a))
                .collect()
        })
    });
    outside
        .into_iter()
        .map(|a| (a, tracker::remove_block(a, frees, thread)))
        .collect()
}

pub fn instantiated(exec: u64, graph: u64, flags: u64) {
    with(|g| {
        // A handle a destroyed executable graph had starts anew.
        if g.execs.remove(&exec).is_some() {
            EXECS_WITH_NODES.fetch_sub(1, Ordering::Relaxed);
        }
        let Some(nodes) = g
            .graphs
            .get(&graph)
            .filter(|n| !n.allocs.is_empty() || !n.frees.is_empty())
        else {
            return;
        };
        let exec_nodes = Exec {
            nodes: nodes.clone(),
            auto_free: flags & AUTO_FREE_ON_LAUNCH != 0,
            outstanding: Vec::new(),
        };
        g.execs.insert(exec, exec_nodes);
        EXECS_WITH_NODES.fetch_add(1, Ordering::Relaxed);
    });
}

pub fn exec_destroyed(exec: u64) {
    with(|g| {
        if g.execs.remove(&exec).is_some() {
            EXECS_WITH_NODES.fetch_sub(1, Ordering::Relaxed);
        }
    });
}

/// A successful launch of `exec` (cases 3 and 5). `frees` is what a
/// free node takes: what cuMemFreeAsync takes.
pub fn launched(exec: u64, frees: &Releases, thread: &ThreadState) {
    let Some((nodes, auto_freed)) = with(|g| {
        let e = g.execs.get_mut(&exec)?;
        let auto_freed = if e.auto_free {
            std::mem::take(&mut e.outstanding)
        } else {
            Vec::new()
        };
        e.outstanding = e
            .nodes
            .allocs
            .iter()
            .map(|a| a.addr)
            .filter(|a| !e.nodes.frees.contains(a))
            .collect();
        Some((e.nodes.clone(), auto_freed))
    }) else {
        return;
    };
    for addr in auto_freed {
        free(addr, frees, thread);
    }
    for a in &nodes.allocs {
        tracker::note_allocation_call();
        tracker::record_traced_allocation(
            a.addr,
            a.size,
            a.api,
            MemoryKind::Graph,
            a.trace,
            a.device,
            thread,
        );
    }
    // Frees of the graph's own allocations; the others were taken out
    // before the launch (`take_outside_frees`). A graph's allocation keeps
    // its address for the graph's life: no other call gets it meanwhile.
    for &addr in nodes
        .frees
        .iter()
        .filter(|a| nodes.allocs.iter().any(|n| n.addr == **a))
    {
        free(addr, frees, thread);
    }
}

/// A free the driver already did (a launch succeeded): a block that is
/// not live (freed earlier by a call we saw) is not a bad free.
fn free(addr: u64, frees: &Releases, thread: &ThreadState) {
    if let Some(b) = tracker::remove_block(addr, frees, thread) {
        tracker::finish_release(addr, Some(b), true, thread);
    }
}

/// pthread_atfork prepare: the lock a hook can hold.
pub fn lock_for_fork() {
    GRAPHS.raw_lock();
}

/// pthread_atfork parent.
///
/// # Safety
/// After [`lock_for_fork`] on this thread.
pub unsafe fn unlock_after_fork() {
    // SAFETY: the caller ran `lock_for_fork` on this thread, which took it.
    unsafe { GRAPHS.raw_unlock() };
}

/// pthread_atfork child: graphs and captures are the parent's, and CUDA
/// does not carry them into a child.
///
/// # Safety
/// After [`lock_for_fork`] on the thread that is now the child's only one.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller took the lock before `fork` on the thread that is
    // now the child's only one: no other thread can reach the value, and
    // the lock is released once, after its last use.
    unsafe {
        *GRAPHS.get_unchecked() = None;
        GRAPHS.raw_unlock();
    }
    CAPTURES.store(0, Ordering::Relaxed);
    EXECS_WITH_NODES.store(0, Ordering::Relaxed);
}
