//! Release calls of addresses (case 3): taken out before the real call,
//! put back if it fails; a stream-ordered free on a captured stream is a
//! node of the capture's graph instead.

use super::*;

pub struct Free {
    addr: u64,
    accepts: KindSet,
}

impl Free {
    pub fn new(addr: u64, accepts: KindSet) -> Free {
        Free { addr, accepts }
    }

    /// cuMemFreeAsync (and `_ptsz`).
    pub fn stream_ordered(addr: u64, stream: CUstream, per_thread: bool) -> StreamFree {
        StreamFree {
            free: Free::new(addr, FREES_DEVICE),
            stream,
            per_thread,
        }
    }
}

pub struct Removed(Option<cudaleak_core::record::Block>);

impl Event for Free {
    type State = Removed;

    fn before(&self, cx: &mut HookCx) -> Option<Removed> {
        if self.addr == 0 {
            // Freeing NULL is not a bad free, and records nothing.
            return None;
        }
        Some(Removed(tracker::remove_block(self.addr, self.accepts, cx.thread)))
    }

    fn after(&self, cx: &mut HookCx, removed: Removed, result: c_int) {
        tracker::finish_release(self.addr, removed.0, result == CUDA_SUCCESS, cx.thread);
    }
}

/// A stream-ordered free: on a stream being captured it frees nothing now
/// but adds a free node to the capture's graph (`state/graphs.rs`). An
/// event of its own, as [`StreamAlloc`] is.
pub struct StreamFree {
    free: Free,
    stream: CUstream,
    per_thread: bool,
}

pub enum StreamRemoved {
    Now(Removed),
    /// a free node of this graph
    Captured(u64),
}

impl Event for StreamFree {
    type State = StreamRemoved;

    fn before(&self, cx: &mut HookCx) -> Option<StreamRemoved> {
        if self.free.addr != 0 && graphs::capturing() {
            if let Some(graph) = graphs::capture_graph(self.stream, self.per_thread) {
                return Some(StreamRemoved::Captured(graph));
            }
        }
        self.free.before(cx).map(StreamRemoved::Now)
    }

    fn after(&self, cx: &mut HookCx, removed: StreamRemoved, result: c_int) {
        match removed {
            StreamRemoved::Now(r) => self.free.after(cx, r, result),
            StreamRemoved::Captured(graph) if result == CUDA_SUCCESS => {
                graphs::free_node_added(graph, self.free.addr)
            }
            StreamRemoved::Captured(_) => {}
        }
    }
}
