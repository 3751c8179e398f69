//! Context creation, destruction and resets: blocks of a destroyed
//! context become leaks the device no longer holds.

use super::*;

pub enum ContextEvent {
    Destroy(u64),
    Attach(*mut CUcontext),
    Detach(u64),
    PrimaryRetain(*mut CUcontext, CUdevice),
    PrimaryRelease(CUdevice),
    /// the hook (v1 or _v2), for the runtime call it may serve
    PrimaryReset(HookId, CUdevice),
    GreenCreate(*mut CUgreenCtx, CUdevice),
    GreenDestroy(u64),
    GreenContext(*mut CUcontext, u64),
}

impl ContextEvent {
    pub fn destroy(ctx: CUcontext) -> ContextEvent {
        ContextEvent::Destroy(ctx as u64)
    }
    pub fn attach(pctx: *mut CUcontext) -> ContextEvent {
        ContextEvent::Attach(pctx)
    }
    pub fn detach(ctx: CUcontext) -> ContextEvent {
        ContextEvent::Detach(ctx as u64)
    }
    pub fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRetain(pctx, dev)
    }
    pub fn primary_release(dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryRelease(dev)
    }
    pub fn primary_reset(id: HookId, dev: CUdevice) -> ContextEvent {
        ContextEvent::PrimaryReset(id, dev)
    }
    pub fn green_create(pgreen: *mut CUgreenCtx, dev: CUdevice) -> ContextEvent {
        ContextEvent::GreenCreate(pgreen, dev)
    }
    pub fn green_destroy(green: CUgreenCtx) -> ContextEvent {
        ContextEvent::GreenDestroy(green as u64)
    }
    pub fn green_context(pctx: *mut CUcontext, green: CUgreenCtx) -> ContextEvent {
        ContextEvent::GreenContext(pctx, green as u64)
    }
}

impl Event for ContextEvent {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS {
            return;
        }
        // The reads below: the program's non-null out parameters, written
        // by the successful call.
        match *self {
            ContextEvent::Destroy(ctx) => tracker::teardown_context(ctx),
            ContextEvent::Attach(pctx) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::context_attached(unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::Detach(ctx) => tracker::context_detached(ctx),
            ContextEvent::PrimaryRetain(pctx, dev) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::primary_retained(dev, unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::PrimaryRelease(dev) => tracker::primary_released(dev),
            ContextEvent::PrimaryReset(id, dev) => {
                if let Some((_, rc)) = calling_runtime(cx.thread, id) {
                    rc.torn_down.set(true);
                }
                tracker::primary_reset(dev)
            }
            ContextEvent::GreenCreate(pgreen, dev) if !pgreen.is_null() => {
                // SAFETY: `pgreen` is non-null and the call wrote the handle.
                tracker::green_created(unsafe { pgreen.read_unaligned() } as u64, dev)
            }
            ContextEvent::GreenDestroy(green) => tracker::green_destroyed(green),
            ContextEvent::GreenContext(pctx, green) if !pctx.is_null() => {
                // SAFETY: `pctx` is non-null and the call wrote the context.
                tracker::green_context(green, unsafe { pctx.read_unaligned() } as u64)
            }
            ContextEvent::Attach(..)
            | ContextEvent::PrimaryRetain(..)
            | ContextEvent::GreenCreate(..)
            | ContextEvent::GreenContext(..) => {}
        }
    }
}
