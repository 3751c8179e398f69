//! Entry points: after a `cuGetProcAddress*` / `cudaGetDriverEntryPoint*`
//! lookup, the hook is handed out in place of a function we wrap (the
//! `EntryPoint` event, `events/lookups.rs`), when the driver gives the same
//! function at the version the hook table was checked against.

use super::global::{offer, Handouts};
use super::scope::caller_implements;
use crate::base::loader::is_own_address;
use crate::cuda::driver_lookup::CU_GET_PROC_ADDRESS_V2;
use crate::cuda::ffi::*;
use crate::cuda::hook_table::{HookId, Layer};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Newest CUDA version whose entry-point names the hook table was checked
/// against (the CUDA 13.5 headers' cudaTypedefs.h). Lookups at a newer
/// version are substituted only if the driver returns the same function
/// for this version (a future `_v3` with another signature must never be
/// handed our `_v2` hook).
pub const CHECKED_CUDA_VERSION: c_int = 13050;

/// After a successful entry-point lookup that returned `*pfn`: hands out
/// a hook (`handouts`, from the hooks' floor) instead when the result is a
/// function we wrap.
///
/// `caller` tells who made the lookup (asked only for a hooked name): an
/// object that defines the function itself gets the function
/// ([`caller_implements`]).
///
/// # Safety
/// `symbol` is a C string and `pfn` the lookup's out parameter.
pub unsafe fn substitute_entry_point(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    handouts: Handouts,
    caller: impl FnOnce() -> usize,
) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: `pfn` is not null, and per the contract the lookup's out
    // parameter, which the driver has just written (the lookup succeeded):
    // a readable, aligned `void *`.
    let p = unsafe { *pfn } as usize;
    if p == 0 || is_own_address(p) {
        return;
    }
    // SAFETY: `symbol` is not null, and per the contract the name the
    // program passed to the lookup, a NUL-terminated string that outlives
    // this call (it is only read here, and `name` does not escape).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    // Version 0: cudaGetDriverEntryPoint, which asks for the runtime's own
    // version; check against our newest.
    let asked = if version == 0 { c_int::MAX } else { version };
    let Some(id) = HookId::for_entry_point(name, asked, flags) else {
        return;
    };
    // SAFETY: `symbol` is the C string checked above, as
    // `same_as_checked_version` asks.
    if asked > CHECKED_CUDA_VERSION && !unsafe { same_as_checked_version(symbol, p, flags) } {
        return;
    }
    if id.layer() == Layer::Driver && caller_implements(caller(), id) {
        return;
    }
    if let Some(hook) = offer(id, p, handouts) {
        // SAFETY: the same out parameter, writable: the driver wrote it,
        // and the program reads it when the lookup returns. The value is
        // a hook for `id`, which has the C type of the function the driver
        // put there: `for_entry_point` picked the variant the driver gives
        // at this version, and a version newer than the checked one passed
        // `same_as_checked_version`; `offer` chose the hook that calls `p`
        // or its equal.
        unsafe { *pfn = hook as *mut c_void };
    }
}

/// Whether the driver gives `p` for `symbol` at [`CHECKED_CUDA_VERSION`].
///
/// # Safety
/// `symbol` is a NUL-terminated string.
unsafe fn same_as_checked_version(symbol: *const c_char, p: usize, flags: u64) -> bool {
    let Some(get) = CU_GET_PROC_ADDRESS_V2.get::<GetProcAddressV2Fn>() else {
        return false;
    };
    let mut q: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    // SAFETY: `get` is the driver's own `cuGetProcAddress_v2` (the helper
    // looks past our hook, so this does not re-enter it), and
    // `GetProcAddressV2Fn` is its C type in cuda.h. Its arguments: the C
    // string this function's contract promises, and two locals as the
    // out parameters it writes.
    let r = unsafe { get(symbol, &mut q, CHECKED_CUDA_VERSION, flags, &mut status) };
    r == CUDA_SUCCESS && (q as usize == p || is_own_address(q as usize))
}
