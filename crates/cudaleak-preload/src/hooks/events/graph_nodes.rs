//! CUDA graphs and stream capture: the calls that add memory nodes,
//! instantiate, launch and destroy graphs (`state/graphs.rs` says when
//! graph memory is allocated and freed).

use super::*;

/// cuStreamBeginCapture(_v2, ToGraph) and their `_ptsz`: one more stream
/// being captured. Counted before the real call: an allocation another
/// thread makes on the stream as soon as the capture begins must find the
/// count up. Fields: the stream; whether the entry point is a `_ptsz`
/// one; whether the capture makes a graph of its own (not ToGraph), whose
/// handle may be one an earlier graph had.
pub struct CaptureBegin(pub CUstream, pub bool, pub bool);

impl Event for CaptureBegin {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        graphs::capture_began();
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS {
            graphs::capture_ended();
        } else if self.2 {
            if let Some(graph) = graphs::capture_graph(self.0, self.1) {
                graphs::graph_created(graph);
            }
        }
    }
}

/// cuStreamEndCapture(_ptsz). A capture ends when the call succeeds, and
/// also when it fails because the capture was invalidated (the driver
/// destroys its graph then); a call that fails with the capture still
/// under way (another thread's) ends nothing.
pub struct CaptureEnd(pub CUstream, pub bool);

impl Event for CaptureEnd {
    /// the graph being captured into
    type State = u64;
    fn before(&self, _: &mut HookCx) -> Option<u64> {
        if !graphs::capturing() {
            return None;
        }
        graphs::capture_state(self.0, self.1).map(|(_, graph)| graph)
    }
    fn after(&self, _: &mut HookCx, graph: u64, result: c_int) {
        if result == CUDA_SUCCESS {
            graphs::capture_ended();
        } else if graphs::capture_state(self.0, self.1).is_none() {
            graphs::capture_ended();
            graphs::graph_destroyed(graph);
        }
    }
}

/// cuGraphCreate: a new graph, whose handle may be one a destroyed graph
/// had; its nodes start empty.
pub struct GraphCreate(pub *mut CUgraph);

impl Event for GraphCreate {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS && !self.0.is_null() {
            // SAFETY: the program's out parameter, written by the
            // successful call; read unaligned.
            graphs::graph_created(unsafe { self.0.read_unaligned() } as u64);
        }
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
    fn before(&self, _: &mut HookCx) -> Option<()> {
        // The stack is taken in `after`, for memory-alloc nodes only: a
        // graph built of thousands of kernel nodes pays nothing.
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
        let trace = cx.trace(api, MemoryKind::Graph);
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
/// into a stream being captured runs nothing now. Free nodes of memory the
/// graph did not allocate are taken out before the real call, as a free
/// call's block is (the driver may hand that memory out again as soon as
/// the launch has freed it), and put back if the launch fails.
pub struct GraphLaunch(pub CUgraphExec, pub CUstream, pub bool);

impl Event for GraphLaunch {
    type State = Vec<(u64, Option<cudaleak_core::record::Block>)>;
    fn before(&self, cx: &mut HookCx) -> Option<Self::State> {
        if !graphs::has_memory_nodes() {
            return None;
        }
        tracker::note_allocation_call();
        if graphs::capturing() && graphs::capture_graph(self.1, self.2).is_some() {
            return None;
        }
        Some(graphs::take_outside_frees(self.0 as u64, FREES_DEVICE, cx.thread))
    }
    fn after(&self, cx: &mut HookCx, taken: Self::State, result: c_int) {
        let ok = result == CUDA_SUCCESS;
        for (addr, block) in taken {
            if block.is_some() {
                tracker::finish_release(addr, block, ok, cx.thread);
            }
        }
        if ok {
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
