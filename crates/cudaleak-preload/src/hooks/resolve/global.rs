//! One real function per name, found by the global lookup: every driver
//! hook's, and a runtime hook's when its caller's scope has none; the
//! error and the one warning when there is none.

use crate::base::loader::{is_own_address, loaded_generation};
use crate::cuda::driver_lookup::lookup_next;
use crate::cuda::ffi::*;
use crate::cuda::hook_table::{HookId, Layer, HOOK_COUNT};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub(super) static REAL: [AtomicUsize; HOOK_COUNT] = [const { AtomicUsize::new(0) }; HOOK_COUNT];

/// A driver function that a lookup gave and that is not the global
/// definition of its name: a quota or GPU-sharing shim that is
/// libcuda.so.1 and hands out its own function through `cuGetProcAddress`
/// (the real driver loaded beside it), or a driver loaded by path behind
/// such a wrapper. Its hook is the alternate one ([`Handouts`]), which
/// calls this function: what the caller would have reached without us.
static ALTERNATE: [AtomicUsize; HOOK_COUNT] = [const { AtomicUsize::new(0) }; HOOK_COUNT];

/// The hooks that may be handed out for a function: `hook`, the export,
/// which calls the global definition of the name; and for driver
/// functions `alternate`, which calls the [`ALTERNATE`] function (0 for
/// runtime functions). From the hooks' floor (`hooks/mod.rs`).
#[derive(Clone, Copy)]
pub struct Handouts {
    pub hook: fn(HookId) -> usize,
    pub alternate: fn(HookId) -> usize,
}

/// Loaded-object generation at which the global lookup of a name last
/// failed (0: it has not). Retried only once the generation moves, so a
/// missing name costs a `dl_iterate_phdr` per call, not a failing `dlsym`
/// (which formats and frees a loader error message each time).
static REAL_MISSING_AT: [AtomicU64; HOOK_COUNT] = [const { AtomicU64::new(0) }; HOOK_COUNT];

/// The function behind hook `id`'s alternate (see [`ALTERNATE`]).
#[inline]
pub fn alternate_real<F: Copy>(id: HookId) -> Option<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    let p = ALTERNATE[id as usize].load(Ordering::Acquire);
    // SAFETY: F is the function-pointer type of the hooked signature, and
    // `p` a function a lookup of that name gave.
    (p != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

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
pub fn global_real(id: HookId) -> usize {
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
    let p = lookup_next(id.c_name(), id.layer());
    if p == 0 || is_own_address(p) {
        REAL_MISSING_AT[id as usize].store(generation, Ordering::Relaxed);
        return 0;
    }
    match REAL[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Result when the real driver function cannot be found: the error a
/// program gets from CUDA without a usable driver, and one warning.
pub fn missing_result(id: HookId) -> c_int {
    warn_missing(id, 0);
    missing_code(id)
}

/// One warning per name; it says which object asked, when known.
#[cold]
pub(super) fn warn_missing(id: HookId, caller: usize) {
    static WARNED: [AtomicBool; HOOK_COUNT] = [const { AtomicBool::new(false) }; HOOK_COUNT];
    if WARNED[id as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    let kind = match id.layer() {
        Layer::Driver => "driver",
        Layer::Runtime => "runtime",
    };
    if caller == 0 {
        crate::base::settings::warn(&format!(
            "cudaleak: the real {} was not found; passing an error back (is the CUDA {kind} installed?)",
            id.name()
        ));
        return;
    }
    let asker =
        cudaleak_core::symbolize::module_of(caller as u64).unwrap_or_else(|| format!("code at {caller:#x}"));
    crate::base::settings::warn(&format!(
        "cudaleak: {asker} called {}, but no real {} is loaded in its scope or globally; \
         passing error {} back (is the CUDA {kind} installed?)",
        id.name(),
        id.name(),
        missing_code(id),
    ));
}

/// The error a hook returns when its real function is missing.
pub fn missing_code(id: HookId) -> c_int {
    match id.layer() {
        Layer::Driver => CUDA_ERROR_NOT_FOUND,
        Layer::Runtime => CUDA_ERROR_INSUFFICIENT_DRIVER,
    }
}

/// Someone looked up `id` and got `p`: the hook to hand out in its place,
/// or None to leave `p`. A hook calls what the caller would have reached
/// without us: the export when `p` is the global definition, the
/// alternate when `p` is another function of that name.
pub fn offer(id: HookId, p: usize, handouts: Handouts) -> Option<usize> {
    if p == 0 {
        return None;
    }
    let hook = (handouts.hook)(id);
    if is_own_address(p) {
        // Already one of ours (the lookup went through a hook).
        return (p == hook || p == (handouts.alternate)(id)).then_some(hook);
    }
    if id.layer() == Layer::Runtime {
        // A runtime copy is per caller scope (see [`ADOPTED`]);
        // the global table holds only what the global lookup finds.
        return (p == global_real(id)).then_some(hook);
    }
    let global = match global_real(id) {
        // No global definition: `p` is the driver (loaded by path), and
        // becomes the export's real function, unless another thread's
        // lookup made another one so meanwhile.
        0 => match REAL[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p,
            Err(q) => q,
        },
        g => g,
    };
    if p == global {
        Some(hook)
    } else {
        alternate(id, p, handouts)
    }
}

/// `p`, a driver function other than the global definition, behind the
/// alternate hook. One alternate per name: a third function of the same
/// name (two shims handing out their own) is left to the caller as it is,
/// and its calls are not seen, rather than sent to the wrong function.
fn alternate(id: HookId, p: usize, handouts: Handouts) -> Option<usize> {
    let alternate = (handouts.alternate)(id);
    if alternate == 0 {
        return None;
    }
    match ALTERNATE[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(alternate),
        Err(q) if q == p => Some(alternate),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::base::loader::real_dlsym;

    #[test]
    fn finds_the_real_dlsym() {
        let p = real_dlsym(libc::RTLD_DEFAULT, c"malloc");
        assert!(!p.is_null());
    }
}
