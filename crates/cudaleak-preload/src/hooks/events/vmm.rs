//! Virtual memory management: physical allocations' handles released,
//! mapped and unmapped, retained, bound to multicast objects.

use super::*;

/// cuMemRelease: a physical allocation's handle given back (its memory
/// lives on while mapped). Not a free of an address.
pub struct ReleaseHandle(u64);

impl ReleaseHandle {
    pub fn new(handle: u64) -> ReleaseHandle {
        ReleaseHandle(handle)
    }
}

impl Event for ReleaseHandle {
    type State = tracker::HandleRelease;
    fn before(&self, _: &mut HookCx) -> Option<tracker::HandleRelease> {
        Some(tracker::release_handle_begin(self.0))
    }
    fn after(&self, _: &mut HookCx, st: tracker::HandleRelease, result: c_int) {
        tracker::release_handle_end(self.0, st, result == CUDA_SUCCESS);
    }
}

pub struct Map {
    va: u64,
    size: u64,
    handle: u64,
}

impl Map {
    pub fn new(va: u64, size: usize, handle: u64) -> Map {
        Map {
            va,
            size: size as u64,
            handle,
        }
    }
}

impl Event for Map {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            tracker::mapped(self.va, self.size, self.handle);
        }
    }
}

pub struct Unmap {
    va: u64,
    size: u64,
}

impl Unmap {
    pub fn new(va: u64, size: usize) -> Unmap {
        Unmap {
            va,
            size: size as u64,
        }
    }
}

impl Event for Unmap {
    type State = tracker::UnmapUndo;
    fn before(&self, _: &mut HookCx) -> Option<tracker::UnmapUndo> {
        Some(tracker::unmap_begin(self.va, self.size))
    }
    fn after(&self, _: &mut HookCx, undo: tracker::UnmapUndo, result: c_int) {
        tracker::unmap_finish(undo, result == CUDA_SUCCESS);
    }
}

/// cuMemRetainAllocationHandle: one more reference to the handle it
/// returns (the same handle the memory was mapped with).
pub struct Retain(*mut CUmemGenericAllocationHandle);

impl Retain {
    pub fn new(handle: *mut CUmemGenericAllocationHandle) -> Retain {
        Retain(handle)
    }
}

impl Event for Retain {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        (!self.0.is_null()).then_some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            // SAFETY: written by the successful call.
            tracker::handle_retained(unsafe { self.0.read_unaligned() });
        }
    }
}

/// cuMulticastBindMem/BindAddr(_v2): the bound memory lives as long as
/// the bind.
pub struct Bind {
    mc: u64,
    dev: CUdevice,
    offset: u64,
    mem: Option<u64>,
    addr: u64,
}

impl Bind {
    pub fn handle(mc: u64, dev: CUdevice, offset: usize, mem: u64) -> Bind {
        Bind {
            mc,
            dev,
            offset: offset as u64,
            mem: Some(mem),
            addr: 0,
        }
    }
    pub fn address(mc: u64, dev: CUdevice, offset: usize, addr: u64) -> Bind {
        Bind {
            mc,
            dev,
            offset: offset as u64,
            mem: None,
            addr,
        }
    }
}

impl Event for Bind {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            tracker::bound(self.mc, self.dev, self.offset, self.mem, self.addr);
        }
    }
}

/// cuMulticastUnbind: taken out before the call, put back if it fails
/// (case 3).
pub struct McUnbind {
    mc: u64,
    dev: CUdevice,
    offset: u64,
    size: u64,
}

impl McUnbind {
    pub fn new(mc: u64, dev: CUdevice, offset: usize, size: usize) -> McUnbind {
        McUnbind {
            mc,
            dev,
            offset: offset as u64,
            size: size as u64,
        }
    }
}

impl Event for McUnbind {
    type State = tracker::UnbindUndo;
    fn before(&self, _: &mut HookCx) -> Option<tracker::UnbindUndo> {
        Some(tracker::unbind_begin(self.mc, self.dev, self.offset, self.size))
    }
    fn after(&self, _: &mut HookCx, undo: tracker::UnbindUndo, result: c_int) {
        tracker::unbind_finish(undo, result == CUDA_SUCCESS);
    }
}
