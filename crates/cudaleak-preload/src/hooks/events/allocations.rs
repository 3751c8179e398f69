//! Allocation calls of the driver: what a successful one records, and
//! a failed one's out-of-memory moment (case 5).

use super::*;

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
    api: Api,
    kind: MemoryKind,
    out: Out,
    size: Size,
    device: Option<u8>,
}

/// A stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync
/// and `_ptsz`): on a stream being captured, the call adds a node to the
/// capture's graph instead of allocating (`state/graphs.rs`). An event of
/// its own, so that every other allocation's stays as small as it was.
pub struct StreamAlloc {
    alloc: Alloc,
    stream: CUstream,
    /// a per-thread (`_ptsz`) entry point: stream 0 is the thread's own
    per_thread: bool,
}

impl Alloc {
    pub fn new(api: Api, kind: MemoryKind, out: *mut u64, size: usize) -> Alloc {
        Alloc {
            api,
            kind,
            out: Out::Address(out),
            size: Size::Bytes(size as u64),
            device: None,
        }
    }

    /// cuMemAllocAsync, cuMemAllocFromPoolAsync (and `_ptsz`).
    pub fn stream_ordered(
        api: Api,
        out: *mut u64,
        size: usize,
        stream: CUstream,
        per_thread: bool,
    ) -> StreamAlloc {
        StreamAlloc {
            alloc: Alloc::new(api, MemoryKind::Device, out, size),
            stream,
            per_thread,
        }
    }

    pub fn pitched(api: Api, out: *mut u64, pitch: *mut usize, width: usize, height: usize) -> Alloc {
        Alloc {
            size: Size::Pitch(pitch, height, (width as u64).saturating_mul(height as u64)),
            ..Alloc::new(api, MemoryKind::Device, out, 0)
        }
    }

    /// The 32-bit cuMemAlloc of CUDA < 3.2.
    pub fn narrow(api: Api, out: *mut u32, size: usize) -> Alloc {
        Alloc {
            out: Out::Address32(out),
            ..Alloc::new(api, MemoryKind::Device, std::ptr::null_mut(), size)
        }
    }

    /// The 32-bit cuMemAllocPitch of CUDA < 3.2.
    pub fn pitched_narrow(out: *mut u32, pitch: *mut u32, width: u32, height: u32) -> Alloc {
        Alloc {
            out: Out::Address32(out),
            size: Size::Pitch32(pitch, height as usize, u64::from(width) * u64::from(height)),
            ..Alloc::new(Api::cuMemAllocPitch, MemoryKind::Device, std::ptr::null_mut(), 0)
        }
    }

    /// cuIpcOpenMemHandle(_v2), cuMemPoolImportPointer: memory another
    /// process allocated; its size is asked from the driver once opened.
    pub fn imported(api: Api, out: *mut u64) -> Alloc {
        Alloc {
            size: Size::OfAddress,
            ..Alloc::new(api, MemoryKind::Imported, out, 0)
        }
    }

    /// cuMemHostRegister(_v2): the program's own host memory, pinned.
    pub fn registered(api: Api, p: *mut c_void, size: usize) -> Alloc {
        Alloc {
            out: Out::Key(p as u64),
            ..Alloc::new(api, MemoryKind::Registered, std::ptr::null_mut(), size)
        }
    }

    /// cuMemCreate: the device comes from the allocation properties.
    pub fn physical(handle: *mut u64, size: usize, prop: *const CUmemAllocationProp) -> Alloc {
        // SAFETY: prop is the caller's argument; read only when non-null.
        let device = (!prop.is_null())
            .then(|| unsafe { (*prop).location_id })
            .and_then(|d| u8::try_from(d).ok());
        Alloc {
            device,
            ..Alloc::new(Api::cuMemCreate, MemoryKind::Physical, handle, size)
        }
    }
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

    /// This driver call ran out of memory (case 5). Out of line: the hot path of a successful call stays as it was.
    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, cx: &mut HookCx) {
        let (thread, api, kind) = (cx.thread, self.api, self.kind);
        let failure = oom::Failure {
            api,
            requested: self.requested(),
            device: self.device,
        };
        oom::on_out_of_memory(failure, thread, &mut || cx.trace(api, kind));
    }
}

impl Event for Alloc {
    type State = ();

    fn before(&self, _: &mut HookCx) -> Option<()> {
        tracker::note_allocation_call();
        Some(())
    }

    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        self.finish(cx, result, None);
    }
}

impl Event for StreamAlloc {
    type State = ();

    fn before(&self, cx: &mut HookCx) -> Option<()> {
        self.alloc.before(cx)
    }

    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        let capture = graphs::capturing().then_some((self.stream, self.per_thread));
        self.alloc.finish(cx, result, capture);
    }
}

impl Alloc {
    /// What a call did, recorded; `capture`: the stream of a stream-ordered
    /// allocation while some stream is being captured.
    #[inline(always)]
    fn finish(&self, cx: &mut HookCx, result: c_int, capture: Option<(CUstream, bool)>) {
        if result != CUDA_SUCCESS {
            tracker::note_failed_allocation();
            if result == CUDA_ERROR_OUT_OF_MEMORY {
                self.out_of_memory(cx);
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
        let (thread, api) = (cx.thread, self.api);
        if let Some((stream, per_thread)) = capture {
            if let Some(graph) = graphs::capture_graph(stream, per_thread) {
                // Captured: a node of the capture's graph, allocated when a
                // launch runs it (`graphs.rs`, case 1).
                let trace = cx.trace(api, MemoryKind::Graph);
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
        let trace = cx.trace(api, self.kind);
        tracker::record_traced_allocation(key, size, api, self.kind, trace, self.device, thread);
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
