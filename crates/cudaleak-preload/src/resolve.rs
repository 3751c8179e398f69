//! Finding the real functions behind the hooks, and handing out hooks in
//! their place on every path a program can take to a CUDA function:
//!
//! 1. direct symbol binding: the loader binds to our exports (we are
//!    preloaded); the real function is `dlsym(RTLD_NEXT, name)`;
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

use crate::ffi::*;
use crate::hooks::{hook_address, HookId, Layer, ALL_HOOKS, HOOK_COUNT};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// libcuda.so.1 when it is already loaded, even with RTLD_LOCAL (JAX,
/// every CUDA runtime). RTLD_NOLOAD never loads anything.
fn loaded_libcuda() -> *mut c_void {
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
    let h = HANDLE.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // SAFETY: NOLOAD lookup of a library name.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        HANDLE.store(h as usize, Ordering::Release);
    }
    h
}

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

/// The real function behind hook `id`, resolving it on first use.
#[inline]
pub fn real<F: Copy>(id: HookId) -> Option<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    let mut p = REAL[id as usize].load(Ordering::Acquire);
    if p == 0 {
        p = resolve_slow(id);
        if p == 0 {
            return None;
        }
    }
    // SAFETY: F is the function-pointer type of the hooked signature.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

#[cold]
fn resolve_slow(id: HookId) -> usize {
    let name = hook_name_c(id);
    let Ok(cname) = CStr::from_bytes_until_nul(&name) else {
        return 0;
    };
    let p = lookup_next(cname, id.layer());
    if p == 0 || p == hook_address(id) {
        return 0;
    }
    match REAL[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Result when the real function cannot be found (no driver at all).
pub fn missing_result(id: HookId) -> c_int {
    crate::lifecycle::warn_once_about_missing(id);
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

/// Driver functions the tracker calls itself (not hooked).
pub struct Helper {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Helper {
    pub const fn new(name: &'static CStr) -> Helper {
        Helper {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    pub fn get<F: Copy>(&self) -> Option<F> {
        let mut p = self.addr.load(Ordering::Acquire);
        if p == 0 {
            p = lookup_next(self.name, Layer::Driver);
            if p == 0 {
                return None;
            }
            self.addr.store(p, Ordering::Release);
        }
        // SAFETY: F matches the helper's C signature.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }
}

pub static CU_CTX_GET_CURRENT: Helper = Helper::new(c"cuCtxGetCurrent");
pub static CU_CTX_GET_DEVICE: Helper = Helper::new(c"cuCtxGetDevice");
pub static CU_GET_PROC_ADDRESS_V2: Helper = Helper::new(c"cuGetProcAddress_v2");

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
