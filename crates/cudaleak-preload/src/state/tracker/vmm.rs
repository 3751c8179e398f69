//! Virtual memory management: physical allocations (handles) and their
//! references, mappings, and multicast binds.

use super::*;

/// What keeps a handle's memory alive: its references (1 from the call
/// that made it, +1 per cuMemRetainAllocationHandle, -1 per cuMemRelease)
/// and its mappings and multicast binds. It dies when both are 0.
#[derive(Clone, Copy, Default)]
struct HandleState {
    maps: u32,
    refs: u32,
}

/// Memory handle `mem` bound to multicast object `mc` at `offset`, for
/// device `dev` (-1: not known).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Bind {
    mc: u64,
    dev: i32,
    offset: u64,
    mem: u64,
}

pub(super) struct Vmm {
    /// mapped VA → (handle, size); ordered for range lookups in cuMemUnmap
    mappings: BTreeMap<u64, (u64, u64)>,
    handles: HashMap<u64, HandleState, AddrHash>,
    binds: Vec<Bind>,
}

impl Vmm {
    /// A handle just created (cuMemCreate): one reference, no mapping.
    pub(super) fn created(&mut self, handle: u64) {
        self.handles.insert(handle, HandleState { maps: 0, refs: 1 });
    }

    /// Empty, as in a fork child, whose parent's handles are not its own.
    pub(super) fn clear(&mut self) {
        self.mappings = BTreeMap::new();
        self.handles = HashMap::with_hasher(AddrHash);
        self.binds = Vec::new();
    }
}

pub(super) static VMM: FutexMutex<Vmm> = FutexMutex::new(Vmm {
    mappings: BTreeMap::new(),
    handles: HashMap::with_hasher(AddrHash),
    binds: Vec::new(),
});

pub enum HandleRelease {
    NotLive,
    Removed(Block),
    /// one reference less; still referenced or mapped: the memory lives on
    Deferred,
}

pub fn release_handle_begin(handle: u64) -> HandleRelease {
    let mut vmm = VMM.lock();
    let state = vmm.handles.get(&handle).copied();
    match state {
        Some(s) if s.refs == 0 => HandleRelease::NotLive,
        Some(s) if s.refs > 1 || s.maps > 0 => {
            if let Some(st) = vmm.handles.get_mut(&handle) {
                st.refs -= 1;
            }
            HandleRelease::Deferred
        }
        _ => match HANDLES.remove(me(), handle) {
            Some(b) => {
                vmm.handles.remove(&handle);
                HandleRelease::Removed(b)
            }
            None => HandleRelease::NotLive,
        },
    }
}

pub fn release_handle_end(handle: u64, st: HandleRelease, succeeded: bool) {
    match (st, succeeded) {
        (HandleRelease::NotLive, _) => {
            INVALID_FREES.fetch_add(1, Ordering::Relaxed);
        }
        (HandleRelease::Removed(b), true) => {
            sub_bytes(&b);
            if b.kind() == MemoryKind::Multicast {
                let gone = drop_binds_of(&mut VMM.lock(), handle);
                gone.iter().for_each(|(_, b)| sub_bytes(b));
            }
        }
        (HandleRelease::Removed(b), false) => {
            VMM.lock()
                .handles
                .insert(handle, HandleState { maps: 0, refs: 1 });
            HANDLES.restore(me(), handle, b);
        }
        (HandleRelease::Deferred, true) => {}
        (HandleRelease::Deferred, false) => {
            if let Some(s) = VMM.lock().handles.get_mut(&handle) {
                s.refs += 1;
            }
        }
    }
}

/// cuMemRetainAllocationHandle returned `handle`: one more reference,
/// which a cuMemRelease will give back.
pub fn handle_retained(handle: u64) {
    let mut vmm = VMM.lock();
    if HANDLES.get(me(), handle).is_some() {
        vmm.handles.entry(handle).or_default().refs += 1;
    }
}

pub fn mapped(va: u64, size: u64, handle: u64) {
    let mut vmm = VMM.lock();
    vmm.mappings.insert(va, (handle, size));
    vmm.handles.entry(handle).or_default().maps += 1;
}

/// The handle mapped at `addr`, anywhere in its mapping.
fn handle_mapped_at(vmm: &Vmm, addr: u64) -> Option<u64> {
    let (&va, &(handle, size)) = vmm.mappings.range(..=addr).next_back()?;
    (addr < va.saturating_add(size)).then_some(handle)
}

/// A multicast bind succeeded: memory handle `mem` (or the one mapped at
/// `addr`) lives at least until it is unbound or the object goes.
pub fn bound(mc: u64, dev: i32, offset: u64, mem: Option<u64>, addr: u64) {
    let mut vmm = VMM.lock();
    let Some(mem) = mem.or_else(|| handle_mapped_at(&vmm, addr)) else {
        return; // memory of a pool (cudaMallocAsync), not a handle
    };
    let dev = if dev >= 0 {
        dev
    } else {
        HANDLES
            .get(me(), mem)
            .and_then(|b| b.device())
            .map_or(-1, |d| d as i32)
    };
    vmm.binds.push(Bind { mc, dev, offset, mem });
    vmm.handles.entry(mem).or_default().maps += 1;
}

/// Takes one mapping or bind off handle `h`; when that was the last and
/// no reference is left, its block. `vmm` is locked.
fn unreference(vmm: &mut Vmm, h: u64) -> Option<(u64, Block)> {
    let st = vmm.handles.get_mut(&h)?;
    st.maps = st.maps.saturating_sub(1);
    if st.maps > 0 || st.refs > 0 {
        return None;
    }
    vmm.handles.remove(&h);
    HANDLES.remove(me(), h).map(|b| (h, b))
}

/// A multicast object is gone: its binds with it; the blocks that died.
fn drop_binds_of(vmm: &mut Vmm, mc: u64) -> Vec<(u64, Block)> {
    let mut gone = Vec::new();
    let mut i = 0;
    while i < vmm.binds.len() {
        if vmm.binds[i].mc == mc {
            let b = vmm.binds.swap_remove(i);
            gone.extend(unreference(vmm, b.mem));
        } else {
            i += 1;
        }
    }
    gone
}

/// What cuMulticastUnbind took out, to put back if the call fails.
pub struct UnbindUndo {
    binds: Vec<Bind>,
    handles: Vec<(u64, Block)>,
}

pub fn unbind_begin(mc: u64, dev: i32, offset: u64, size: u64) -> UnbindUndo {
    let mut vmm = VMM.lock();
    let end = offset.saturating_add(size);
    let mut undo = UnbindUndo {
        binds: Vec::new(),
        handles: Vec::new(),
    };
    let mut i = 0;
    while i < vmm.binds.len() {
        let b = vmm.binds[i];
        if b.mc == mc && (b.dev == dev || b.dev < 0) && (offset..end).contains(&b.offset) {
            vmm.binds.swap_remove(i);
            undo.handles.extend(unreference(&mut vmm, b.mem));
            undo.binds.push(b);
        } else {
            i += 1;
        }
    }
    undo
}

pub fn unbind_finish(undo: UnbindUndo, succeeded: bool) {
    if succeeded {
        undo.handles.iter().for_each(|(_, b)| sub_bytes(b));
        return;
    }
    let mut vmm = VMM.lock();
    for (h, b) in undo.handles {
        vmm.handles.insert(h, HandleState { maps: 0, refs: 0 });
        HANDLES.restore(me(), h, b);
    }
    for b in undo.binds {
        vmm.handles.entry(b.mem).or_default().maps += 1;
        vmm.binds.push(b);
    }
}

/// What cuMemUnmap took out, to put back if the call fails.
pub struct UnmapUndo {
    mappings: Vec<(u64, u64, u64)>,
    handles: Vec<(u64, Block)>,
}

pub fn unmap_begin(va: u64, size: u64) -> UnmapUndo {
    let mut vmm = VMM.lock();
    let end = va.saturating_add(size);
    let gone: Vec<(u64, u64, u64)> = vmm
        .mappings
        .range(va..end)
        .map(|(&a, &(h, s))| (a, h, s))
        .collect();
    let mut handles = Vec::new();
    for &(a, h, _) in &gone {
        vmm.mappings.remove(&a);
        handles.extend(unreference(&mut vmm, h));
    }
    UnmapUndo {
        mappings: gone,
        handles,
    }
}

pub fn unmap_finish(undo: UnmapUndo, succeeded: bool) {
    if succeeded {
        for (h, b) in &undo.handles {
            sub_bytes(b);
            if b.kind() == MemoryKind::Multicast {
                let gone = drop_binds_of(&mut VMM.lock(), *h);
                gone.iter().for_each(|(_, b)| sub_bytes(b));
            }
        }
        return;
    }
    let mut vmm = VMM.lock();
    for (h, b) in undo.handles {
        vmm.handles.insert(h, HandleState { maps: 0, refs: 0 });
        HANDLES.restore(me(), h, b);
    }
    for (a, h, s) in undo.mappings {
        vmm.mappings.insert(a, (h, s));
        vmm.handles.entry(h).or_default().maps += 1;
    }
}
