//! The driver's functions found without a hook in the way: globally
//! (`dlsym(RTLD_NEXT)`), else in a libcuda.so.1 that a runtime or JAX
//! loaded privately (RTLD_LOCAL); and the driver functions the tracker
//! calls itself ([`Helper`]). Below the tracking state, which asks the
//! current context with them, and below `resolve`, which finds the hooks'
//! real functions the same way.

use crate::base::loader::{loaded_generation, real_dlclose, real_dlsym};
use crate::cuda::hook_table::Layer;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// libcuda.so.1 when it is already loaded, even with RTLD_LOCAL (JAX,
/// every CUDA runtime). RTLD_NOLOAD never loads anything; the reference it
/// takes is given back at once, so that a program's own `dlclose` of
/// libcuda still unloads it (the handle is forgotten then, [`forget_unloaded`]).
fn loaded_libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // SAFETY: NOLOAD lookup of a library name.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        real_dlclose(h);
        LIBCUDA.store(h as usize, Ordering::Release);
    }
    h
}
static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

pub fn lookup_next(name: &CStr, layer: Layer) -> usize {
    let p = real_dlsym(libc::RTLD_NEXT, name) as usize;
    if p != 0 || layer == Layer::Runtime {
        return p;
    }
    let h = loaded_libcuda();
    if h.is_null() {
        return 0;
    }
    real_dlsym(h, name) as usize
}

/// Driver functions the tracker calls itself (not hooked). A driver may
/// lack one (`cuCtxGetCurrent` on an old or partial driver): the failure
/// is remembered until the set of loaded objects changes.
pub struct Helper {
    name: &'static CStr,
    addr: AtomicUsize,
    missing_at: AtomicU64,
}

impl Helper {
    pub const fn new(name: &'static CStr) -> Helper {
        Helper {
            name,
            addr: AtomicUsize::new(0),
            missing_at: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn get<F: Copy>(&self) -> Option<F> {
        let mut p = self.addr.load(Ordering::Acquire);
        if p == 0 {
            p = self.resolve();
            if p == 0 {
                return None;
            }
        }
        // SAFETY: F matches the helper's C signature.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }

    #[cold]
    fn resolve(&self) -> usize {
        let generation = loaded_generation();
        if self.missing_at.load(Ordering::Relaxed) == generation {
            return 0;
        }
        let p = lookup_next(self.name, Layer::Driver);
        if p == 0 {
            self.missing_at.store(generation, Ordering::Relaxed);
        } else {
            self.addr.store(p, Ordering::Release);
        }
        p
    }

    /// Forgets the address when its object is gone.
    fn forget_if_unloaded(&self, is_gone: &dyn Fn(usize) -> bool) {
        let p = self.addr.load(Ordering::Acquire);
        if p != 0 && is_gone(p) {
            self.addr.store(0, Ordering::Release);
        }
    }
}

pub static CU_CTX_GET_CURRENT: Helper = Helper::new(c"cuCtxGetCurrent");
pub static CU_CTX_GET_DEVICE: Helper = Helper::new(c"cuCtxGetDevice");
pub static CU_GET_PROC_ADDRESS_V2: Helper = Helper::new(c"cuGetProcAddress_v2");
/// The size of memory opened from another process (cuIpcOpenMemHandle_v2).
pub static CU_MEM_GET_ADDRESS_RANGE_V2: Helper = Helper::new(c"cuMemGetAddressRange_v2");
/// Free and total device memory when an allocation ran out (`oom.rs`).
pub static CU_MEM_GET_INFO_V2: Helper = Helper::new(c"cuMemGetInfo_v2");
/// Whether a stream is being captured, and into which graph (`graphs.rs`).
pub static CU_STREAM_GET_CAPTURE_INFO_V2: Helper = Helper::new(c"cuStreamGetCaptureInfo_v2");

/// After a `dlclose` unloaded objects (`dlsym_override.rs`): forgets the helpers
/// that pointed into them, and the libcuda handle (looked up again).
pub fn forget_unloaded(is_gone: &dyn Fn(usize) -> bool) {
    for helper in [
        &CU_CTX_GET_CURRENT,
        &CU_CTX_GET_DEVICE,
        &CU_GET_PROC_ADDRESS_V2,
        &CU_MEM_GET_ADDRESS_RANGE_V2,
        &CU_MEM_GET_INFO_V2,
        &CU_STREAM_GET_CAPTURE_INFO_V2,
    ] {
        helper.forget_if_unloaded(is_gone);
    }
    LIBCUDA.store(0, Ordering::Release);
}
