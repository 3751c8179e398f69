//! Release calls of addresses (case 3): taken out before the real call,
//! put back if it fails; a stream-ordered free on a captured stream is a
//! node of the capture's graph instead.

use super::*;

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
