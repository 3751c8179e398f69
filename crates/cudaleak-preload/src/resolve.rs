//! Finding the real functions behind the hooks, and handing out hooks in
//! their place on every path a program can take to a CUDA function:
//!
//! 1. direct symbol binding: the loader binds to our exports (we are
//!    preloaded); the real function of a driver hook is
//!    `dlsym(RTLD_NEXT, name)` (or libcuda's, loaded privately); that of a
//!    runtime hook is the one the *calling object's* own scope holds (an
//!    RTLD_LOCAL plugin's libcudart; see "runtime hooks" below);
//! 2. `dlsym(handle, name)` on a dlopen'ed libcuda/libcudart (JAX/XLA, and
//!    every runtime: it dlopens libcuda.so.1 with RTLD_LOCAL, so RTLD_NEXT
//!    from here cannot see it). Our `dlsym` override looks the name up for
//!    the caller and returns the hook, remembering the real address;
//! 3. `cuGetProcAddress*` / `cudaGetDriverEntryPoint*`: the `EntryPoint`
//!    event (`events.rs`) maps the requested name and version to a hook.
//!
//! Rules, each from a bug other interposers hit:
//! - The `dlsym` override neither allocates nor locks, and keeps the
//!   caller's `RTLD_NEXT` semantics: for a name we do not wrap it does not
//!   *call* the real `dlsym` but *jumps* to it, so glibc sees the original
//!   return address and searches after the caller's object, not ours.
//! - Only names in the hook table are intercepted, compared in full:
//!   cudnn*, cublas* and curl* also start with "cu".
//! - A hook never records itself as its own real function (that would
//!   recurse forever when a lookup returns the hook, e.g. a second
//!   `cuGetProcAddress` through our own hook).
//! - Objects go: our `dlclose` forgets every cached pointer into an object
//!   it unloaded, so no later call jumps into unmapped memory.

use crate::ffi::*;
use crate::hooks::{hook_address, HookId, Layer, ALL_HOOKS, HOOK_COUNT};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

static REAL: [AtomicUsize; HOOK_COUNT] = [const { AtomicUsize::new(0) }; HOOK_COUNT];

/// The real `dlsym`; the override jumps here for every name it does not wrap.
static CUDALEAK_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Looks up the real `dlsym` with `dlvsym`, which we do not override.
fn real_dlsym_fn() -> Option<DlsymFn> {
    let mut p = CUDALEAK_REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        // glibc >= 2.34 versions dlsym as GLIBC_2.34 in libc; older ones as
        // GLIBC_2.2.5 (x86-64) / GLIBC_2.17 (aarch64) in libdl.
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: plain loader lookup with valid C strings.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            return None;
        }
        CUDALEAK_REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is the address of glibc's dlsym.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// `dlsym` without our override in the way.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym_fn() {
        // SAFETY: valid handle semantics are the caller's; name is C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

fn hook_name_c(id: HookId) -> [u8; 64] {
    let mut buf = [0u8; 64];
    let n = id.name().as_bytes();
    buf[..n.len()].copy_from_slice(n);
    buf
}

// ---- the set of loaded objects ----

/// A number that changes whenever an object is loaded or unloaded:
/// glibc's `dlpi_adds + dlpi_subs`, read from the first object that
/// `dl_iterate_phdr` visits (no allocation, one short loader lock).
pub fn loaded_generation() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
        let end_of_subs = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
        if size >= end_of_subs {
            let info = &*info;
            *(data as *mut u64) = info.dlpi_adds.wrapping_add(info.dlpi_subs);
        }
        1
    }
    let mut g: u64 = 0;
    // SAFETY: the callback only reads the info it is given.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut g as *mut u64 as *mut c_void) };
    // 0 means "never failed" to the callers below.
    g.max(1)
}

/// Whether `addr` lies in a loaded segment of some loaded object.
fn is_loaded_address(addr: usize) -> bool {
    crate::unwind::module_range(addr).is_some()
}

/// libcuda.so.1 when it is already loaded, even with RTLD_LOCAL (JAX,
/// every CUDA runtime). RTLD_NOLOAD never loads anything; the reference it
/// takes is given back at once, so that a program's own `dlclose` of
/// libcuda still unloads it (the handle is forgotten then, [`unloaded`]).
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

fn lookup_next(name: &CStr, layer: Layer) -> usize {
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

// ---- one real function per name (the driver, and runtime fallbacks) ----

/// Loaded-object generation at which the global lookup of a name last
/// failed (0: it has not). Retried only once the generation moves, so a
/// missing name costs a `dl_iterate_phdr` per call, not a failing `dlsym`
/// (which formats and frees a loader error message each time).
static REAL_MISSING_AT: [AtomicU64; HOOK_COUNT] = [const { AtomicU64::new(0) }; HOOK_COUNT];

/// The real function behind hook `id`, resolving it on first use.
#[inline]
pub fn real<F: Copy>(id: HookId) -> Option<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    let p = global_real(id);
    if p == 0 {
        return None;
    }
    // SAFETY: F is the function-pointer type of the hooked signature.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

#[inline]
fn global_real(id: HookId) -> usize {
    match REAL[id as usize].load(Ordering::Acquire) {
        0 => resolve_slow(id),
        p => p,
    }
}

#[cold]
fn resolve_slow(id: HookId) -> usize {
    let failed_at = REAL_MISSING_AT[id as usize].load(Ordering::Relaxed);
    let generation = loaded_generation();
    if failed_at == generation {
        return 0;
    }
    let name = hook_name_c(id);
    let Ok(cname) = CStr::from_bytes_until_nul(&name) else {
        return 0;
    };
    let p = lookup_next(cname, id.layer());
    if p == 0 || p == hook_address(id) {
        REAL_MISSING_AT[id as usize].store(generation, Ordering::Relaxed);
        return 0;
    }
    match REAL[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

// ---- runtime hooks: the real function of the caller's own scope ----
//
// The bug (issue 11): a plugin dlopen'ed with RTLD_LOCAL links libcudart;
// its cudaMalloc binds to our export (preloaded objects come first in the
// global scope), and `dlsym(RTLD_NEXT)` from here searches the global
// scope only, where that libcudart is not. Without us the call worked.
// So a runtime hook asks the loader what the *calling object* binds:
// `dlsym` through the caller's own link map searches that object's
// dependency scope (the plugin, then its libcudart), exactly the lookup
// the loader made for the plugin's relocation. When that scope has no
// such name, or its first definition is ours (the main program, whose
// scope starts with the preloaded library), the global lookup answers.

/// One object that has called a runtime hook: its address range, its link
/// map (glibc's `dlopen` handle for it), and the real function of each
/// runtime hook in its scope. A slot is filled once and never reused: an
/// unload marks every slot dead (range emptied) and callers take new ones,
/// so a reader never sees one object's functions under another's range.
struct CallerObject {
    lo: AtomicUsize,
    hi: AtomicUsize,
    map: AtomicUsize,
    real: [AtomicUsize; HOOK_COUNT],
}

/// `real` entry: this object's scope has no definition of its own.
const USE_GLOBAL: usize = 1;
const MAX_CALLERS: usize = 256;

static CALLERS: [CallerObject; MAX_CALLERS] = [const {
    CallerObject {
        lo: AtomicUsize::new(0),
        hi: AtomicUsize::new(0),
        map: AtomicUsize::new(0),
        real: [const { AtomicUsize::new(0) }; HOOK_COUNT],
    }
}; MAX_CALLERS];
/// Slots handed out so far (a prefix of CALLERS; may pass MAX_CALLERS).
/// Claimed without a lock (a child forked while a parent thread claimed
/// must not wait for it): a slot is readable once its `lo` is nonzero.
static CALLERS_USED: AtomicUsize = AtomicUsize::new(0);
/// The last return address that lay in no loaded object (JIT code): the
/// global lookup answers for it without asking the loader again.
static LAST_UNKNOWN_CALLER: AtomicUsize = AtomicUsize::new(0);

/// Called by each runtime hook's entry stub with its return address:
/// the real function for that caller, or 0 (after one warning per name
/// that says which object asked). Must not unwind (called from assembly).
pub extern "C" fn cudaleak_enter_runtime(caller: usize, id: u32) -> usize {
    std::panic::catch_unwind(|| {
        let id = ALL_HOOKS.get(id as usize).copied()?;
        let real = real_for_caller(id, caller);
        if real == 0 {
            warn_missing(id, caller);
        }
        Some(real)
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// The real runtime function `id` for a call returning to `caller`.
/// After the first call from an object: a short scan of the known objects
/// (one compare each), then a load.
#[inline]
fn real_for_caller(id: HookId, caller: usize) -> usize {
    let used = CALLERS_USED.load(Ordering::Acquire).min(MAX_CALLERS);
    for obj in &CALLERS[..used] {
        let lo = obj.lo.load(Ordering::Acquire);
        if lo != 0 && lo <= caller && caller < obj.hi.load(Ordering::Relaxed) {
            return match obj.real[id as usize].load(Ordering::Acquire) {
                0 => resolve_in_scope(obj, id),
                USE_GLOBAL => global_real(id),
                p => p,
            };
        }
    }
    if caller == 0 || caller == LAST_UNKNOWN_CALLER.load(Ordering::Relaxed) {
        return global_real(id);
    }
    let (own_lo, own_hi) = crate::unwind::own_range();
    if own_lo <= caller && caller < own_hi {
        // We called it: a runtime function our hook called tail-called
        // another exported one (the simulated cudaGetDriverEntryPoint
        // ends in `jmp cudaGetDriverEntryPointByVersion@plt`), so the
        // return address is ours. The global definition answers, else
        // the first runtime scope that has one.
        return match global_real(id) {
            0 => any_scope_real(id),
            p => p,
        };
    }
    match claim_caller(caller) {
        Some(obj) => resolve_in_scope(obj, id),
        None => global_real(id),
    }
}

/// The definition of `id` some known caller's scope resolved.
#[cold]
fn any_scope_real(id: HookId) -> usize {
    let used = CALLERS_USED.load(Ordering::Acquire).min(MAX_CALLERS);
    CALLERS[..used]
        .iter()
        .map(|o| o.real[id as usize].load(Ordering::Acquire))
        .find(|&p| p > USE_GLOBAL)
        .unwrap_or(0)
}

/// A slot for the object holding `caller`. The loader is asked without
/// any lock of ours held (a loader lock is taken inside, and a hook may
/// run under the loader lock, from a constructor).
#[cold]
fn claim_caller(caller: usize) -> Option<&'static CallerObject> {
    let Some((lo, hi)) = crate::unwind::module_range(caller) else {
        LAST_UNKNOWN_CALLER.store(caller, Ordering::Relaxed);
        return None;
    };
    // No handle (the program itself, or no loader name): the slot answers
    // with the global lookup for every name.
    let map = scope_handle_of(caller).unwrap_or(0);
    // Two threads claiming for one object at once get a slot each, both
    // valid; the scan takes the first.
    let obj = CALLERS.get(CALLERS_USED.fetch_add(1, Ordering::AcqRel))?;
    obj.map.store(map, Ordering::Relaxed);
    obj.hi.store(hi, Ordering::Relaxed);
    obj.lo.store(lo, Ordering::Release);
    Some(obj)
}

/// glibc's `dladdr1` flag for the link map (dlfcn.h), absent from libc.
const RTLD_DL_LINKMAP: c_int = 2;

/// A `dlsym` handle whose lookups search the dependency scope of the
/// object containing `addr`: `dlopen(its path, RTLD_NOLOAD)`, which also
/// sets up that scope for an object the loader loaded as a dependency
/// (its bare link map has none, and `dlsym` through it would crash). The
/// reference NOLOAD takes is given back at once; the object stays loaded
/// for as long as it is in use (it is the caller).
fn scope_handle_of(addr: usize) -> Option<usize> {
    // SAFETY: zeroed Dl_info is a valid out parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 only reads loader state; both out pointers are valid.
    let ok = unsafe {
        libc::dladdr1(
            addr as *const c_void,
            &mut info,
            &mut map as *mut *mut c_void,
            RTLD_DL_LINKMAP,
        )
    };
    if ok == 0 || map.is_null() || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: NOLOAD lookups never load anything.
    let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !main.is_null() {
        real_dlclose(main);
        if main == map {
            // The program itself: its scope starts with us (preloaded).
            return None;
        }
    }
    // SAFETY: the loader's own name for a loaded object.
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    real_dlclose(h);
    Some(h as usize)
}

#[cold]
fn resolve_in_scope(obj: &CallerObject, id: HookId) -> usize {
    let name = hook_name_c(id);
    let Ok(cname) = CStr::from_bytes_until_nul(&name) else {
        return 0;
    };
    let map = obj.map.load(Ordering::Relaxed);
    let p = if map == 0 {
        0
    } else {
        real_dlsym(map as *mut c_void, cname) as usize
    };
    let found = if p == 0 || is_hook_address(p) {
        USE_GLOBAL
    } else {
        p
    };
    let found = match obj.real[id as usize].compare_exchange(0, found, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => found,
        Err(existing) => existing,
    };
    if found == USE_GLOBAL {
        global_real(id)
    } else {
        found
    }
}

/// Result when the real driver function cannot be found: the error a
/// program gets from CUDA without a usable driver, and one warning.
pub fn missing_result(id: HookId) -> c_int {
    crate::lifecycle::warn_once_about_missing(id);
    missing_code(id)
}

/// One warning per name that says which object asked for it.
#[cold]
fn warn_missing(id: HookId, caller: usize) {
    static WARNED: [AtomicBool; HOOK_COUNT] = [const { AtomicBool::new(false) }; HOOK_COUNT];
    if caller == 0 {
        crate::lifecycle::warn_once_about_missing(id);
        return;
    }
    if WARNED[id as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    let asker =
        cudaleak_core::symbolize::module_of(caller as u64).unwrap_or_else(|| format!("code at {caller:#x}"));
    crate::lifecycle::warn(&format!(
        "cudaleak: {asker} called {}, but no real {} is loaded in its scope or globally; \
         passing error {} back (is the CUDA {} installed?)",
        id.name(),
        id.name(),
        missing_code(id),
        match id.layer() {
            Layer::Driver => "driver",
            Layer::Runtime => "runtime",
        }
    ));
}

/// The error a hook returns when its real function is missing.
pub fn missing_code(id: HookId) -> c_int {
    match id.layer() {
        Layer::Driver => CUDA_ERROR_NOT_FOUND,
        Layer::Runtime => CUDA_ERROR_INSUFFICIENT_DRIVER,
    }
}

/// Someone looked up `id` and got `p`. Returns whether the hook may be
/// handed out in its place (and records `p` as the real function).
pub fn offer(id: HookId, p: usize) -> bool {
    if p == 0 {
        return false;
    }
    if ALL_HOOKS.iter().any(|h| hook_address(*h) == p) {
        // Already one of ours (the lookup went through a hook).
        return p == hook_address(id);
    }
    match REAL[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        // Driver: one libcuda per process, every address it gives for a
        // name is the same function. Runtime: a second, different libcudart
        // copy keeps its own function (the driver hooks still see its
        // allocations, without runtime attribution).
        Err(existing) => existing == p || id.layer() == Layer::Driver,
    }
}

pub fn is_hook_address(p: usize) -> bool {
    ALL_HOOKS.iter().any(|h| hook_address(*h) == p)
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
    fn forget_if_unloaded(&self) {
        let p = self.addr.load(Ordering::Acquire);
        if p != 0 && !is_loaded_address(p) {
            self.addr.store(0, Ordering::Release);
        }
    }
}

pub static CU_CTX_GET_CURRENT: Helper = Helper::new(c"cuCtxGetCurrent");
pub static CU_CTX_GET_DEVICE: Helper = Helper::new(c"cuCtxGetDevice");
pub static CU_GET_PROC_ADDRESS_V2: Helper = Helper::new(c"cuGetProcAddress_v2");
/// The size of memory opened from another process (cuIpcOpenMemHandle_v2).
pub static CU_MEM_GET_ADDRESS_RANGE_V2: Helper = Helper::new(c"cuMemGetAddressRange_v2");

/// Newest CUDA version whose entry-point names this table was checked
/// against. Lookups at a newer version are substituted only if the driver
/// returns the same function for this version (a future `_v3` with another
/// signature must never be handed our `_v2` hook).
pub const CHECKED_CUDA_VERSION: c_int = 13000;

/// Which hook a `cuGetProcAddress(name, version, flags)` result is, by
/// the driver's versioned-name rules ("cuMemAlloc" at >= 3020 is
/// cuMemAlloc_v2; the per-thread flag selects `_ptsz` variants).
pub fn hook_for_entry_point(name: &[u8], version: c_int, flags: u64) -> Option<HookId> {
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let since = |v: c_int| version >= v;
    Some(match name {
        b"cuMemAlloc" if since(3020) => HookId::cuMemAlloc_v2,
        b"cuMemAllocPitch" if since(3020) => HookId::cuMemAllocPitch_v2,
        b"cuMemFree" if since(3020) => HookId::cuMemFree_v2,
        b"cuMemAllocHost" if since(3020) => HookId::cuMemAllocHost_v2,
        b"cuMemHostAlloc" => HookId::cuMemHostAlloc,
        b"cuMemAllocManaged" => HookId::cuMemAllocManaged,
        b"cuMemFreeHost" => HookId::cuMemFreeHost,
        b"cuMemAllocAsync" if per_thread => HookId::cuMemAllocAsync_ptsz,
        b"cuMemAllocAsync" => HookId::cuMemAllocAsync,
        b"cuMemFreeAsync" if per_thread => HookId::cuMemFreeAsync_ptsz,
        b"cuMemFreeAsync" => HookId::cuMemFreeAsync,
        b"cuMemAllocFromPoolAsync" if per_thread => HookId::cuMemAllocFromPoolAsync_ptsz,
        b"cuMemAllocFromPoolAsync" => HookId::cuMemAllocFromPoolAsync,
        b"cuMemCreate" => HookId::cuMemCreate,
        b"cuMemRelease" => HookId::cuMemRelease,
        b"cuMemMap" => HookId::cuMemMap,
        b"cuMemUnmap" => HookId::cuMemUnmap,
        b"cuMemAddressReserve" => HookId::cuMemAddressReserve,
        b"cuMemAddressFree" => HookId::cuMemAddressFree,
        b"cuArrayCreate" if since(3020) => HookId::cuArrayCreate_v2,
        b"cuArray3DCreate" if since(3020) => HookId::cuArray3DCreate_v2,
        b"cuArrayDestroy" => HookId::cuArrayDestroy,
        b"cuMipmappedArrayCreate" => HookId::cuMipmappedArrayCreate,
        b"cuMipmappedArrayDestroy" => HookId::cuMipmappedArrayDestroy,
        b"cuIpcOpenMemHandle" if since(11000) => HookId::cuIpcOpenMemHandle_v2,
        b"cuIpcCloseMemHandle" => HookId::cuIpcCloseMemHandle,
        b"cuMemImportFromShareableHandle" => HookId::cuMemImportFromShareableHandle,
        b"cuMemPoolCreate" => HookId::cuMemPoolCreate,
        b"cuMemPoolDestroy" => HookId::cuMemPoolDestroy,
        b"cuCtxDestroy" if since(4000) => HookId::cuCtxDestroy_v2,
        b"cuDevicePrimaryCtxRetain" => HookId::cuDevicePrimaryCtxRetain,
        b"cuDevicePrimaryCtxRelease" if since(11000) => HookId::cuDevicePrimaryCtxRelease_v2,
        b"cuDevicePrimaryCtxReset" if since(11000) => HookId::cuDevicePrimaryCtxReset_v2,
        b"cuGetProcAddress" if since(12000) => HookId::cuGetProcAddress_v2,
        b"cuGetProcAddress" => HookId::cuGetProcAddress,
        _ => return None,
    })
}

/// After a successful entry-point lookup that returned `*pfn`: hands out
/// the hook instead when the result is a function we wrap.
///
/// # Safety
/// `symbol` is a C string and `pfn` the lookup's out parameter.
pub unsafe fn substitute_entry_point(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    let p = *pfn as usize;
    if p == 0 || is_hook_address(p) {
        return;
    }
    let name = CStr::from_ptr(symbol).to_bytes();
    // Version 0: cudaGetDriverEntryPoint, which asks for the runtime's own
    // version; check against our newest.
    let asked = if version == 0 { c_int::MAX } else { version };
    let Some(id) = hook_for_entry_point(name, asked, flags) else {
        return;
    };
    if asked > CHECKED_CUDA_VERSION && !same_as_checked_version(symbol, p, flags) {
        return;
    }
    if offer(id, p) {
        *pfn = hook_address(id) as *mut c_void;
    }
}

/// Whether the driver gives `p` for `symbol` at [`CHECKED_CUDA_VERSION`].
unsafe fn same_as_checked_version(symbol: *const c_char, p: usize, flags: u64) -> bool {
    let Some(get) = CU_GET_PROC_ADDRESS_V2.get::<GetProcAddressV2Fn>() else {
        return false;
    };
    let mut q: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    let r = get(symbol, &mut q, CHECKED_CUDA_VERSION, flags, &mut status);
    r == CUDA_SUCCESS && (q as usize == p || is_hook_address(q as usize))
}

// ---- the dlclose override: objects that go ----

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

fn real_dlclose_fn() -> Option<DlcloseFn> {
    let mut p = REAL_DLCLOSE.load(Ordering::Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: plain loader lookup with valid C strings.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlclose".as_ptr(), version.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            return None;
        }
        REAL_DLCLOSE.store(p, Ordering::Release);
    }
    // SAFETY: p is the address of glibc's dlclose.
    Some(unsafe { std::mem::transmute::<usize, DlcloseFn>(p) })
}

/// `dlclose` without our override in the way.
fn real_dlclose(handle: *mut c_void) -> c_int {
    match real_dlclose_fn() {
        // SAFETY: the handle came from dlopen.
        Some(f) => unsafe { f(handle) },
        None => -1,
    }
}

/// Objects loaded just before a `dlclose`, on the caller's stack (the
/// override neither allocates nor locks): their ranges, and whether
/// their names were kept in [`NAMES`].
struct LoadedSnapshot {
    ranges: [(usize, usize); SNAPSHOT_MAX],
    n: usize,
    named: bool,
}
const SNAPSHOT_MAX: usize = 256;
const NAME_MAX: usize = 256;

/// Names of the snapshot's objects, copied before the real `dlclose`
/// frees them. Taken with a try-flag: a second thread closing at the same
/// moment skips the names (its unloaded objects are then reported by
/// address only), it never waits.
static NAMES_BUSY: AtomicBool = AtomicBool::new(false);
static NAMES: NameTable = NameTable(std::cell::UnsafeCell::new([[0; NAME_MAX]; SNAPSHOT_MAX]));
struct NameTable(std::cell::UnsafeCell<[[u8; NAME_MAX]; SNAPSHOT_MAX]>);
// SAFETY: accessed only by the thread holding NAMES_BUSY.
unsafe impl Sync for NameTable {}

fn snapshot_loaded(snap: &mut LoadedSnapshot) {
    struct Walk<'a> {
        snap: &'a mut LoadedSnapshot,
        names: Option<&'a mut [[u8; NAME_MAX]; SNAPSHOT_MAX]>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        let w = &mut *(data as *mut Walk);
        if w.snap.n >= SNAPSHOT_MAX {
            return 1;
        }
        let info = &*info;
        let Some((lo, hi)) = crate::unwind::load_range(info) else {
            return 0;
        };
        if let Some(names) = w.names.as_deref_mut() {
            let slot = &mut names[w.snap.n];
            slot[0] = 0;
            if !info.dlpi_name.is_null() {
                let name = CStr::from_ptr(info.dlpi_name).to_bytes();
                let k = name.len().min(NAME_MAX - 1);
                slot[..k].copy_from_slice(&name[..k]);
                slot[k] = 0;
            }
        }
        w.snap.ranges[w.snap.n] = (lo, hi);
        w.snap.n += 1;
        0
    }
    // SAFETY: NAMES is ours while NAMES_BUSY is held.
    let names = snap.named.then(|| unsafe { &mut *NAMES.0.get() });
    let mut w = Walk { snap, names };
    // SAFETY: the callback only reads the loader's program headers.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut w as *mut Walk as *mut c_void) };
}

/// Our `dlclose`. After the real one, if objects went away, everything
/// that pointed into them is forgotten: cached real functions (a later
/// call must never jump into unmapped memory), the callers' scopes,
/// unwind rules; and their names are kept so that blocks they allocated
/// still name their module (`symbolize.rs`).
///
/// # Safety
/// Called as `dlclose` by the program.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose_fn() else {
        return -1;
    };
    let generation = loaded_generation();
    let mut snap = LoadedSnapshot {
        ranges: [(0, 0); SNAPSHOT_MAX],
        n: 0,
        named: !NAMES_BUSY.swap(true, Ordering::Acquire),
    };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| snapshot_loaded(&mut snap))).is_err() {
        snap.n = 0;
    }
    let result = real(handle);
    if loaded_generation() != generation {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| forget_unloaded(&snap)));
    }
    if snap.named {
        NAMES_BUSY.store(false, Ordering::Release);
    }
    result
}

/// Drops what pointed into objects of `before` that are no longer loaded.
fn forget_unloaded(before: &LoadedSnapshot) {
    for (i, &(lo, hi)) in before.ranges[..before.n].iter().enumerate() {
        if crate::unwind::module_range(lo) == Some((lo, hi)) {
            continue;
        }
        let name: &[u8] = if before.named {
            // SAFETY: NAMES_BUSY is held by this thread (before.named).
            let slot = unsafe { &(*NAMES.0.get())[i] };
            let len = slot.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
            &slot[..len]
        } else {
            b""
        };
        cudaleak_core::symbolize::note_unloaded(lo as u64, hi as u64, name);
    }
    // Callers whose object is gone: their slots die (never reused).
    let used = CALLERS_USED.load(Ordering::Acquire).min(MAX_CALLERS);
    for obj in &CALLERS[..used] {
        let (lo, hi) = (obj.lo.load(Ordering::Relaxed), obj.hi.load(Ordering::Relaxed));
        if lo != 0 && lo < hi && crate::unwind::module_range(lo) != Some((lo, hi)) {
            obj.lo.store(usize::MAX, Ordering::Relaxed);
            obj.hi.store(0, Ordering::Relaxed);
        }
    }
    LAST_UNKNOWN_CALLER.store(0, Ordering::Relaxed);
    for slot in &REAL {
        let p = slot.load(Ordering::Acquire);
        if p != 0 && !is_loaded_address(p) {
            let _ = slot.compare_exchange(p, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
    for helper in [
        &CU_CTX_GET_CURRENT,
        &CU_CTX_GET_DEVICE,
        &CU_GET_PROC_ADDRESS_V2,
        &CU_MEM_GET_ADDRESS_RANGE_V2,
    ] {
        helper.forget_if_unloaded();
    }
    LIBCUDA.store(0, Ordering::Release);
    crate::unwind::forget_unloaded_rules();
}

// ---- the dlsym override ----

/// Decides what our `dlsym` returns: 0 = let the real `dlsym` answer (the
/// override jumps to it with the caller's return address intact);
/// 1 = return NULL; anything else is returned as is (a hook).
extern "C" fn cudaleak_dlsym_decide(handle: *mut c_void, name: *const c_char) -> usize {
    // Make sure the jump target exists before deciding anything.
    if real_dlsym_fn().is_none() || name.is_null() {
        return 0;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: dlsym's contract: name is a C string.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let Some(id) = HookId::by_name(bytes) else {
            return 0;
        };
        // SAFETY: the caller's handle, passed on unchanged.
        let p = real_dlsym(handle, unsafe { CStr::from_ptr(name) }) as usize;
        if p == 0 {
            return 0; // not there: the real dlsym says so, and sets dlerror
        }
        if p == hook_address(id) {
            // The lookup found our own export first (RTLD_DEFAULT): the
            // hook stands in only if a real function exists behind it.
            return if real::<usize>(id).is_some() { p } else { 1 };
        }
        if offer(id, p) {
            hook_address(id)
        } else {
            0
        }
    })
    .unwrap_or(0)
}

/// Our `dlsym`. A naked function: it must not have a frame of its own when
/// it jumps to the real `dlsym`, which reads its caller from the return
/// address (glibc's `RETURN_ADDRESS (0)` for RTLD_NEXT).
///
/// # Safety
/// Called as `dlsym` by the program.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        // Keep the arguments for the jump; realign the stack for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "cmp rax, 1",
        "jne 1f",
        "xor eax, eax",
        "1:",
        "ret",
        // Tail jump: the real dlsym sees our caller's return address.
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym cudaleak_dlsym_decide,
        real = sym CUDALEAK_REAL_DLSYM,
    )
}

/// See the x86-64 version.
///
/// # Safety
/// Called as `dlsym` by the program.
#[cfg(all(target_arch = "aarch64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x9, 2f",
        "cmp x9, #1",
        "csel x0, xzr, x9, eq",
        "ret",
        "2:",
        "adrp x9, {real}",
        "ldr x9, [x9, :lo12:{real}]",
        "br x9",
        decide = sym cudaleak_dlsym_decide,
        real = sym CUDALEAK_REAL_DLSYM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_names_follow_the_driver_rules() {
        assert_eq!(
            hook_for_entry_point(b"cuMemAlloc", 3020, 0),
            Some(HookId::cuMemAlloc_v2)
        );
        assert_eq!(
            hook_for_entry_point(b"cuMemAlloc", 12040, 0),
            Some(HookId::cuMemAlloc_v2)
        );
        assert_eq!(hook_for_entry_point(b"cuMemAlloc", 3010, 0), None);
        assert_eq!(
            hook_for_entry_point(
                b"cuMemAllocAsync",
                12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            ),
            Some(HookId::cuMemAllocAsync_ptsz)
        );
        assert_eq!(
            hook_for_entry_point(b"cuGetProcAddress", 12000, 0),
            Some(HookId::cuGetProcAddress_v2)
        );
        assert_eq!(
            hook_for_entry_point(b"cuGetProcAddress", 11080, 0),
            Some(HookId::cuGetProcAddress)
        );
        assert_eq!(hook_for_entry_point(b"cuDevicePrimaryCtxReset", 10020, 0), None);
        assert_eq!(hook_for_entry_point(b"cuMemcpy", 12000, 0), None);
        assert_eq!(hook_for_entry_point(b"cublasCreate", 12000, 0), None);
    }

    #[test]
    fn finds_the_real_dlsym() {
        let p = real_dlsym(libc::RTLD_DEFAULT, c"malloc");
        assert!(!p.is_null());
    }
}
