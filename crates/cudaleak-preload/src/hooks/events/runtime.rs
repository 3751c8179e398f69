//! Runtime entry points (case 1): attribution of the driver call they
//! make to the program's call, and what they record themselves when the
//! runtime reached the driver some way we did not see.

use super::*;

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
