//! The interpreter once probed: the state of Python capture, the layout
//! and functions the probe found, and this thread's thread state.

use crate::base::loader::real_dlsym;
use crate::capture::python_layouts::PyLayout;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

pub(super) const UNPROBED: u8 = 0;
pub(super) const PROBING: u8 = 1;
pub(super) const ACTIVE: u8 = 2;
const OFF: u8 = 3;

pub(super) static STATE: AtomicU8 = AtomicU8::new(UNPROBED);
pub(super) static LAYOUT: AtomicPtr<PyLayout> = AtomicPtr::new(std::ptr::null_mut());
pub(super) static GET_THIS_THREAD_STATE: AtomicUsize = AtomicUsize::new(0);
/// The unchecked thread-state getter, only where the layout says it reads
/// a thread-local (3.12+; see [`this_thread_state`]), else 0: one test a
/// capture instead of two.
pub(super) static GET_UNCHECKED: AtomicUsize = AtomicUsize::new(0);
pub(super) static IS_FINALIZING: AtomicUsize = AtomicUsize::new(0);
/// The word `IS_FINALIZING`'s getter loads, where its code showed it
/// (`finalizing`), else 0: a capture then loads it instead of the call.
pub(super) static FINALIZING_WORD: AtomicUsize = AtomicUsize::new(0);
pub(super) static CODE_TYPE: AtomicUsize = AtomicUsize::new(0);
/// `capture_active` for the interpreter's frame model, a [`CaptureFn`](super::walk::CaptureFn):
/// one indirect call where a `match` on the model cost a jump table and
/// a second function's prologue a capture.
pub(super) static CAPTURE: AtomicUsize = AtomicUsize::new(0);
static STATUS: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

type TstateFn = unsafe extern "C" fn() -> usize;
pub(super) type FinalizingFn = unsafe extern "C" fn() -> libc::c_int;

pub(super) fn set_status(s: String) {
    STATUS.store(Box::into_raw(Box::new(s)), Ordering::Release);
}

/// The state of Python capture, for reports (`python` field).
pub fn status() -> Option<String> {
    let p = STATUS.load(Ordering::Acquire);
    // SAFETY: leaked strings, never freed.
    (!p.is_null()).then(|| unsafe { (*p).clone() })
}

pub fn init(enabled: bool) {
    if !enabled {
        STATE.store(OFF, Ordering::Release);
        set_status("off (CUDALEAK_PYTHON=0)".into());
    }
}

pub(super) fn sym(name: &CStr) -> usize {
    real_dlsym(libc::RTLD_DEFAULT, name) as usize
}

/// (major, minor, micro, release level) of the running interpreter.
pub(super) fn version() -> Option<(u32, u32)> {
    let v = sym(c"Py_Version");
    if v != 0 {
        // SAFETY: `const unsigned long Py_Version` (3.11+): PY_VERSION_HEX.
        let hex: u64 = unsafe { *(v as *const libc::c_ulong) };
        return Some(((hex >> 24) as u32 & 0xff, (hex >> 16) as u32 & 0xff));
    }
    let f = sym(c"Py_GetVersion");
    if f == 0 {
        return None;
    }
    // SAFETY: Py_GetVersion returns a static "3.10.12 (main, ...)" string.
    let s = unsafe {
        let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(f);
        CStr::from_ptr(f()).to_string_lossy().into_owned()
    };
    let mut parts = s.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

pub(super) fn turn_off(why: String, notice: bool) {
    if notice {
        crate::base::settings::warn(&format!("cudaleak: {why}; Python stacks are off"));
    }
    set_status(format!("off ({why})"));
    STATE.store(OFF, Ordering::Release);
}

/// The calling thread's thread state, or 0 (rule 2).
///
/// 3.12+ (the layouts that say so; `probe` stores the unchecked getter
/// only for them): the attached thread state, a thread-local, is always ours; the
/// GIL-state getter is asked only when none is attached. Before 3.12 the
/// attached state is the GIL holder's, ours only when it equals the
/// GIL-state getter's answer, which is then the same value: so that getter
/// alone answers (asking both cost a call a capture).
///
/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire): `probe` stored the
/// getters and `LAYOUT` before it (Release).
#[inline(always)]
pub(super) unsafe fn this_thread_state() -> usize {
    let unchecked = GET_UNCHECKED.load(Ordering::Relaxed);
    if unchecked != 0 {
        // SAFETY: non-zero, so the address of
        // `_PyThreadState_UncheckedGet`/`PyThreadState_GetUnchecked` that
        // `probe` found, `PyThreadState *(void)`.
        let get: TstateFn = unsafe { std::mem::transmute(unchecked) };
        // SAFETY: a read of this thread's attached thread state (3.12+: a
        // thread-local), no check, no lock (rule 2).
        let attached = unsafe { get() };
        if attached != 0 {
            return attached;
        }
    }
    // SAFETY: ACTIVE implies a non-zero address of
    // `PyGILState_GetThisThreadState`, found by dlsym in `probe`; its C
    // type is `PyThreadState *(void)`, a `TstateFn`.
    let get_this: TstateFn = unsafe { std::mem::transmute(GET_THIS_THREAD_STATE.load(Ordering::Relaxed)) };
    // SAFETY: it reads this thread's slot of the interpreter's TSS key; it
    // takes neither the GIL nor a lock, from any thread (rule 2).
    unsafe { get_this() }
}
