//! The real function of a runtime hook for each caller: what the calling
//! object's own scope binds (an RTLD_LOCAL plugin's libcudart), cached
//! per object; else the global definition, else the one adopted from a
//! private handle (ctypes.CDLL). Also whether a caller defines a driver
//! function itself, and forgetting what pointed into unloaded objects.
//!
//! The bug: a plugin dlopen'ed with RTLD_LOCAL links libcudart;
//! its cudaDeviceReset (a runtime function we hook; the runtime's
//! allocations are recorded at the driver, not hooked) binds to our
//! export (preloaded objects come first in the global scope), and
//! `dlsym(RTLD_NEXT)` from here searches the global
//! scope only, where that libcudart is not. Without us the call worked.
//! So a runtime hook asks the loader what the *calling object* binds:
//! `dlsym` through the caller's own link map searches that object's
//! dependency scope (the plugin, then its libcudart), exactly the lookup
//! the loader made for the plugin's relocation. When that scope has no
//! such name, or its first definition is ours (the main program, whose
//! scope starts with the preloaded library), the global lookup answers.

use super::global::{global_real, warn_missing, REAL};
use crate::base::loader::{is_own_address, module_range, own_range, real_dlclose, real_dlsym};
use crate::cuda::hook_table::{HookId, ALL_HOOKS, HOOK_COUNT};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One object that has called a runtime hook: its address range, its link
/// map (glibc's `dlopen` handle for it), and the real function of each
/// runtime hook in its scope.
///
/// Slots are reused once their object is unloaded (a program that loads
/// and unloads plugins in a loop would otherwise run out of them and its
/// 257th plugin would fail its cudaDeviceReset). `seq` is a sequence lock: odd
/// while a slot is (re)claimed, dies, or has a lookup cached, and bumped
/// by each of these, so a reader that saw the same even `seq` before and
/// after reading never mixes one object's functions with another's range.
/// A lookup that is being cached also holds `users`, so the slot is not
/// reused under it (see [`cache_in_slot`]).
struct CallerObject {
    seq: AtomicUsize,
    users: AtomicUsize,
    lo: AtomicUsize,
    hi: AtomicUsize,
    map: AtomicUsize,
    real: [AtomicUsize; HOOK_COUNT],
}

/// `real` entry: this object's scope has no definition of its own.
const USE_GLOBAL: usize = 1;
/// `lo` of a slot whose object was unloaded: no address matches it, and
/// it may be claimed again.
const DEAD: usize = usize::MAX;
const MAX_CALLERS: usize = 256;

static CALLERS: [CallerObject; MAX_CALLERS] = [const {
    CallerObject {
        seq: AtomicUsize::new(0),
        users: AtomicUsize::new(0),
        lo: AtomicUsize::new(0),
        hi: AtomicUsize::new(0),
        map: AtomicUsize::new(0),
        real: [const { AtomicUsize::new(0) }; HOOK_COUNT],
    }
}; MAX_CALLERS];
/// Slots handed out so far (a prefix of CALLERS; at most MAX_CALLERS).
/// Claimed without a lock (a child forked while a parent thread claimed
/// must not wait for it).
static CALLERS_USED: AtomicUsize = AtomicUsize::new(0);
/// The last return address that lay in no loaded object (JIT code): the
/// global lookup answers for it without asking the loader again.
static LAST_UNKNOWN_CALLER: AtomicUsize = AtomicUsize::new(0);

/// The slot (index, seq) this thread's last runtime call came from:
/// checked first (most threads call from one object), and the scope of a
/// runtime function that our own hook's real function called (see
/// [`real_for_caller`]). Kept in the thread's initial-exec block
/// (`ThreadState::last_caller`, index + 1): a `thread_local!` here was a
/// `__tls_get_addr` call, about 22 instructions, on every runtime call.
#[inline(always)]
fn last_hit() -> (usize, usize) {
    let (slot, seq) = crate::base::thread::current().last_caller.get();
    (slot.wrapping_sub(1), seq)
}

#[inline(always)]
fn set_last_hit(i: usize, seq: usize) {
    crate::base::thread::current().last_caller.set((i + 1, seq));
}

/// A consistent view of one slot: (seq, lo, hi, `real[id]`); None while it
/// is being written.
#[inline]
fn read_slot(obj: &CallerObject, id: HookId) -> Option<(usize, usize, usize, usize)> {
    let seq = obj.seq.load(Ordering::Acquire);
    if seq & 1 != 0 {
        return None;
    }
    let lo = obj.lo.load(Ordering::Relaxed);
    let hi = obj.hi.load(Ordering::Relaxed);
    let real = obj.real[id as usize].load(Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Acquire);
    (obj.seq.load(Ordering::Relaxed) == seq).then_some((seq, lo, hi, real))
}

/// Takes a slot's sequence lock (even -> odd); false when someone else
/// holds it.
fn lock_slot(obj: &CallerObject, seq: usize) -> bool {
    seq & 1 == 0
        && obj
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        && {
            std::sync::atomic::fence(Ordering::Release);
            true
        }
}

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
/// After the first call from an object: this thread's last slot is
/// checked (a few loads and compares), else a short scan of the known
/// objects, then a load.
#[inline]
pub fn real_for_caller(id: HookId, caller: usize) -> usize {
    let (last, last_seq) = last_hit();
    if let Some(obj) = CALLERS.get(last) {
        if let Some((seq, lo, hi, real)) = read_slot(obj, id) {
            if seq == last_seq && lo <= caller && caller < hi {
                return slot_answer(obj, seq, id, real);
            }
        }
    }
    let used = CALLERS_USED.load(Ordering::Acquire).min(MAX_CALLERS);
    for (i, obj) in CALLERS[..used].iter().enumerate() {
        if let Some((seq, lo, hi, real)) = read_slot(obj, id) {
            // A dead slot's lo (DEAD) is above every address.
            if lo != 0 && lo <= caller && caller < hi {
                set_last_hit(i, seq);
                return slot_answer(obj, seq, id, real);
            }
        }
    }
    if caller == 0 || caller == LAST_UNKNOWN_CALLER.load(Ordering::Relaxed) {
        return global_or_adopted(id);
    }
    let (own_lo, own_hi) = own_range();
    if own_lo <= caller && caller < own_hi {
        return real_for_our_own_call(id);
    }
    match claim_caller(caller) {
        Some((i, seq)) => {
            set_last_hit(i, seq);
            slot_answer(&CALLERS[i], seq, id, 0)
        }
        // Every slot holds a loaded object: correct, uncached.
        None => match module_scope_lookup(caller, id) {
            USE_GLOBAL => global_or_adopted(id),
            p => p,
        },
    }
}

/// We called it: a runtime function our hook called tail-called another
/// exported one (the simulated cudaGetDriverEntryPoint ends in
/// `jmp cudaGetDriverEntryPointByVersion@plt`), so the return address is
/// ours. The scope is that of the outer hook's caller on this thread (the
/// libcudart copy that made the call is in it), else the global one.
#[cold]
fn real_for_our_own_call(id: HookId) -> usize {
    let (last, last_seq) = last_hit();
    if let Some(obj) = CALLERS.get(last) {
        if let Some((seq, lo, _, real)) = read_slot(obj, id) {
            if seq == last_seq && lo != 0 && lo != DEAD {
                return slot_answer(obj, seq, id, real);
            }
        }
    }
    global_or_adopted(id)
}

/// What slot `obj` (seen at `seq`) answers for `id`, `real` being its
/// cached entry.
#[inline(always)]
fn slot_answer(obj: &CallerObject, seq: usize, id: HookId, real: usize) -> usize {
    match real {
        0 => resolve_into_slot(obj, seq, id),
        USE_GLOBAL => global_or_adopted(id),
        p => p,
    }
}

/// The first lookup of `id` for a slot's object, cached in the slot.
#[cold]
#[inline(never)]
fn resolve_into_slot(obj: &CallerObject, seq: usize, id: HookId) -> usize {
    let found = match obj.map.load(Ordering::Relaxed) {
        0 => USE_GLOBAL,
        map => scope_lookup(
            map,
            (obj.lo.load(Ordering::Relaxed), obj.hi.load(Ordering::Relaxed)),
            id,
        ),
    };
    cache_in_slot(obj, seq, id, 0, found);
    match found {
        USE_GLOBAL => global_or_adopted(id),
        p => p,
    }
}

/// Replaces `real[id]` of slot `obj` (seen at `seq`) from `expected` by
/// `value`, unless the slot changed owner meanwhile; whether it did.
/// `users` and `seq` form a handshake with [`claim_caller`]: either the
/// claimer sees a user and leaves the slot alone, or this sees the new
/// `seq` and stores nothing.
fn cache_in_slot(obj: &CallerObject, seq: usize, id: HookId, expected: usize, value: usize) -> bool {
    obj.users.fetch_add(1, Ordering::SeqCst);
    let stored = obj.seq.load(Ordering::SeqCst) == seq
        && obj.real[id as usize]
            .compare_exchange(expected, value, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
    obj.users.fetch_sub(1, Ordering::SeqCst);
    stored
}

/// `id` in the dependency scope of the object whose `dlopen` handle is
/// `map` and whose code is `range`: the definition its scope binds, or
/// [`USE_GLOBAL`] when it has none, when the first is ours (the main
/// program's scope starts with us, preloaded), or when the first is the
/// object's own. An object that defines the function itself is a wrapper
/// calling on to the next definition (`dlsym(RTLD_NEXT)`): a quota shim
/// preloaded before us, whose next is our hook. What it reaches without
/// us is the definition after it, which is the one after us: the global
/// one. Answering with its own definition made the hook call the shim
/// again, once more per call, until its quota ran out.
fn scope_lookup(map: usize, range: (usize, usize), id: HookId) -> usize {
    let p = real_dlsym(map as *mut c_void, id.c_name()) as usize;
    if p == 0 || is_own_address(p) || (range.0 <= p && p < range.1) {
        USE_GLOBAL
    } else {
        p
    }
}

/// [`scope_lookup`] for the object holding `caller`, without a slot.
fn module_scope_lookup(caller: usize, id: HookId) -> usize {
    match (scope_handle_of(caller), module_range(caller)) {
        (Some(map), Some(range)) => scope_lookup(map, range, id),
        _ => USE_GLOBAL,
    }
}

/// A slot for the object holding `caller`: (index, seq). The loader is
/// asked without any lock of ours held (a loader lock is taken inside,
/// and a hook may run under the loader lock, from a constructor).
#[cold]
fn claim_caller(caller: usize) -> Option<(usize, usize)> {
    note_scope_event();
    let Some((lo, hi)) = module_range(caller) else {
        LAST_UNKNOWN_CALLER.store(caller, Ordering::Relaxed);
        return None;
    };
    // No handle (the program itself, or no loader name): the slot answers
    // with the global lookup for every name.
    let map = scope_handle_of(caller).unwrap_or(0);
    // Two threads claiming for one object at once get a slot each, both
    // valid; the scan takes the first.
    let fill = |obj: &CallerObject, seq: usize| {
        for r in &obj.real {
            r.store(0, Ordering::Relaxed);
        }
        obj.map.store(map, Ordering::Relaxed);
        obj.hi.store(hi, Ordering::Relaxed);
        obj.lo.store(lo, Ordering::Relaxed);
        obj.seq.store(seq + 2, Ordering::Release);
        seq + 2
    };
    let fresh = CALLERS_USED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_CALLERS).then_some(n + 1)
        })
        .ok();
    if let Some(i) = fresh {
        let obj = &CALLERS[i];
        let seq = obj.seq.load(Ordering::Acquire);
        if lock_slot(obj, seq) {
            return Some((i, fill(obj, seq)));
        }
    }
    // Reuse a dead slot, one that no lookup is caching into.
    for (i, obj) in CALLERS.iter().enumerate() {
        let seq = obj.seq.load(Ordering::Acquire);
        if obj.lo.load(Ordering::Relaxed) != DEAD || !lock_slot(obj, seq) {
            continue;
        }
        if obj.lo.load(Ordering::Relaxed) == DEAD && obj.users.load(Ordering::SeqCst) == 0 {
            return Some((i, fill(obj, seq)));
        }
        obj.seq.store(seq + 2, Ordering::Release);
    }
    None
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

/// Runtime functions handed out for a private libcudart handle
/// (`dlsym(dlopen("libcudart.so", RTLD_LOCAL), "cudaDeviceReset")`, Python's
/// ctypes.CDLL) that no caller's scope nor the global one has: the
/// function pointer may be called from anywhere (ctypes calls it from
/// libffi, not from the object that looked it up), so it answers for
/// every caller that finds nothing else. Kept apart from [`REAL`]: a
/// caller whose scope or the global one has a runtime keeps calling that
/// one, never a private copy.
static ADOPTED: [AtomicUsize; HOOK_COUNT] = [const { AtomicUsize::new(0) }; HOOK_COUNT];

/// Moments at which a global runtime definition can have appeared for a
/// caller whose scope has none: a new object calls a runtime hook for the
/// first time ([`claim_caller`]), the program looks a runtime name up
/// through our `dlsym`, or something is unloaded. Counted by us, so that
/// reading it is one load, not `dl_iterate_phdr` under the loader lock.
static SCOPE_EVENTS: AtomicU64 = AtomicU64::new(1);
/// [`SCOPE_EVENTS`] when the global lookup of runtime function `id` last
/// found nothing while an adopted function answered (0: never).
static GLOBAL_ABSENT_AT: [AtomicU64; HOOK_COUNT] = [const { AtomicU64::new(0) }; HOOK_COUNT];

/// Counts a moment at which a runtime name's global answer can change
/// (see [`SCOPE_EVENTS`]).
pub fn note_scope_event() {
    SCOPE_EVENTS.fetch_add(1, Ordering::AcqRel);
}

/// The global definition of runtime function `id`, else the adopted one.
///
/// The bug: with a runtime loaded by `ctypes.CDLL` (RTLD_LOCAL)
/// the global slot stays empty, and every call asked the loader whether
/// one had appeared since (`dl_iterate_phdr`, glibc's loader lock, four
/// times per Python pair: +470 instructions). A global definition can
/// only matter to a caller that reaches this hook anew, and each way to
/// do that is one of our [`SCOPE_EVENTS`]; between them the adopted
/// answer stands after one compare.
#[inline]
fn global_or_adopted(id: HookId) -> usize {
    let p = REAL[id as usize].load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    let adopted = ADOPTED[id as usize].load(Ordering::Acquire);
    if adopted != 0
        && GLOBAL_ABSENT_AT[id as usize].load(Ordering::Acquire) == SCOPE_EVENTS.load(Ordering::Acquire)
    {
        return adopted;
    }
    global_or_adopted_slow(id)
}

#[cold]
#[inline(never)]
fn global_or_adopted_slow(id: HookId) -> usize {
    // Read before the lookup: an event during it makes the next call look again.
    let events = SCOPE_EVENTS.load(Ordering::Acquire);
    match global_real(id) {
        0 => {
            let adopted = ADOPTED[id as usize].load(Ordering::Acquire);
            if adopted != 0 {
                GLOBAL_ABSENT_AT[id as usize].store(events, Ordering::Release);
            }
            adopted
        }
        p => p,
    }
}

/// A runtime function `p` that the object holding `caller` looked up by
/// handle: whether the hook may be handed out in its place. It may when
/// the hook, called from that object, reaches `p` (what its scope binds
/// anyway), or when nothing answers for it and `p` becomes the adopted
/// fallback (see [`ADOPTED`]).
pub fn adopt_for_caller(id: HookId, p: usize, caller: usize) -> bool {
    match real_for_caller(id, caller) {
        0 => match ADOPTED[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(existing) => existing == p,
        },
        now => now == p,
    }
}

/// Whether the object holding `caller` wraps the driver: it defines driver
/// function `id` itself, or it hands out driver functions of its own
/// (it defines `cuGetProcAddress_v2`). Such a library (a GPU-sharing or
/// quota shim, an API remoting layer, installed as libcuda.so.1) looking
/// up a function in the driver below it gets that function, not our hook:
/// - a wrapper that defines `id`: the hook's real function is the global
///   definition, the wrapper's own, and the two would call each other
///   until the stack overflows;
/// - a shim that hands out its own function for `id` through its
///   `cuGetProcAddress`, and recognizes the driver's answer by comparing
///   it with what its `dlsym` of the driver gave: given our hook, it never
///   recognized it, and its quota was skipped. What it hands out reaches
///   the program through our `cuGetProcAddress` hook, which substitutes
///   the hook that calls it (`global::offer`).
pub fn caller_implements(caller: usize, id: HookId) -> bool {
    if caller == 0 || is_own_address(caller) {
        return false;
    }
    let Some((lo, hi)) = module_range(caller) else {
        return false;
    };
    // The program's own scope starts with the program itself; any other
    // object's with the object.
    let handle = match scope_handle_of(caller) {
        Some(h) => h as *mut c_void,
        None => {
            // SAFETY: NOLOAD lookup of the program, given back at once.
            let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if main.is_null() {
                return false;
            }
            real_dlclose(main);
            main
        }
    };
    let defines = |name: &CStr| {
        let p = real_dlsym(handle, name) as usize;
        p != 0 && lo <= p && p < hi
    };
    defines(id.c_name()) || defines(c"cuGetProcAddress_v2")
}

/// Drops what pointed into objects that `is_gone` says are no longer
/// loaded.
pub fn forget_unloaded(is_gone: &dyn Fn(usize) -> bool) {
    note_scope_event();
    let used = CALLERS_USED.load(Ordering::Acquire).min(MAX_CALLERS);
    for obj in &CALLERS[..used] {
        let lo = obj.lo.load(Ordering::Relaxed);
        if lo == 0 || lo == DEAD {
            continue;
        }
        let dies = is_gone(lo);
        let stale = |r: &AtomicUsize| {
            let p = r.load(Ordering::Relaxed);
            p > USE_GLOBAL && is_gone(p)
        };
        if !dies && !obj.real.iter().any(stale) {
            continue;
        }
        // Wait out a claim or a caching lookup (a few loader calls), but
        // not forever: a signal handler of this thread may hold it.
        let mut tries = 0u32;
        let seq = loop {
            let seq = obj.seq.load(Ordering::Acquire);
            if lock_slot(obj, seq) {
                break Some(seq);
            }
            tries += 1;
            if tries > 1_000_000 {
                break None;
            }
            std::hint::spin_loop();
        };
        // A dead slot's functions are cleared too: nothing may find a
        // pointer into an unloaded object through it.
        for r in &obj.real {
            if dies || stale(r) {
                r.store(0, Ordering::Relaxed);
            }
        }
        if dies {
            obj.hi.store(0, Ordering::Relaxed);
            obj.lo.store(DEAD, Ordering::Relaxed);
        }
        if let Some(seq) = seq {
            obj.seq.store(seq + 2, Ordering::Release);
        }
    }
    LAST_UNKNOWN_CALLER.store(0, Ordering::Relaxed);
    for slot in REAL.iter().chain(&ADOPTED) {
        let p = slot.load(Ordering::Acquire);
        if p != 0 && is_gone(p) {
            let _ = slot.compare_exchange(p, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
    crate::cuda::driver_lookup::forget_unloaded(is_gone);
    crate::capture::unwind::forget_unloaded_rules(is_gone);
}
