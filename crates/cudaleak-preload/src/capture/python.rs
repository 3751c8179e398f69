//! Python stacks, read from the calling thread's own frames.
//!
//! Rules (each from a way this has gone wrong elsewhere):
//! 1. No GIL and no Python C API in a hook. PyTorch calls cudaMalloc with
//!    the GIL released while holding its allocator mutex, and ctypes.CDLL
//!    releases it too: taking it can deadlock (and on 3.11 run the garbage
//!    collector). The hook reads this thread's frame chain from memory: a
//!    thread that released the GIL is stopped in C, so its chain is frozen
//!    under it; a thread holding it is running us, not Python.
//! 2. The only calls are two thread-state getters the issue allows
//!    (`PyGILState_GetThisThreadState`, the unchecked current-thread-state
//!    getter) and the finalization check, all plain reads of runtime state.
//!    Symbols are found with `dlsym` at the first capture; libpython is
//!    never linked, and a process without Python pays one atomic load.
//! 3. Per-version layouts (`python_layouts.rs`), each checked against the
//!    running interpreter before use (3.13: against `_Py_DebugOffsets`);
//!    an unknown version, a debug or a free-threaded build turns capture
//!    off with one notice.
//! 4. A hook records (code object, guard, instruction offset, flags); the
//!    first time a trace is stored, its code objects' names, first line and
//!    line table are copied (`remember_code_objects`), so the exit report
//!    can name them after the interpreter is gone.

use crate::base::loader::real_dlsym;
use crate::capture::python_debug_offsets;
use crate::capture::python_layouts::{layout_for, FrameModel, PyLayout, PY311};
use cudaleak_core::record::python::{CodeInfo, CodeTable, PyRawFrame, PY_FRAME_ENTRY};
use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// The code objects seen in captured stacks, with their names and line
/// tables, read while they were alive ([`remember_code_objects`]); the
/// dump resolves Python frames with it.
pub static CODES: CodeTable = CodeTable::new();

const UNPROBED: u8 = 0;
const PROBING: u8 = 1;
const ACTIVE: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNPROBED);
static LAYOUT: AtomicPtr<PyLayout> = AtomicPtr::new(std::ptr::null_mut());
static GET_THIS_THREAD_STATE: AtomicUsize = AtomicUsize::new(0);
static GET_UNCHECKED: AtomicUsize = AtomicUsize::new(0);
static IS_FINALIZING: AtomicUsize = AtomicUsize::new(0);
static CODE_TYPE: AtomicUsize = AtomicUsize::new(0);
/// `capture_active` for the interpreter's frame model, a [`CaptureFn`]:
/// one indirect call where a `match` on the model cost a jump table and
/// a second function's prologue a capture.
static CAPTURE: AtomicUsize = AtomicUsize::new(0);
static STATUS: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

type TstateFn = unsafe extern "C" fn() -> usize;
type FinalizingFn = unsafe extern "C" fn() -> libc::c_int;
type CaptureFn = unsafe fn(&mut [MaybeUninit<PyRawFrame>], &mut PyReplayLog, u64) -> usize;

fn set_status(s: String) {
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

fn sym(name: &CStr) -> usize {
    real_dlsym(libc::RTLD_DEFAULT, name) as usize
}

/// (major, minor, micro, release level) of the running interpreter.
fn version() -> Option<(u32, u32)> {
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

fn turn_off(why: String, notice: bool) {
    if notice {
        crate::base::settings::warn(&format!("cudaleak: {why}; Python stacks are off"));
    }
    set_status(format!("off ({why})"));
    STATE.store(OFF, Ordering::Release);
}

/// First capture: find the interpreter and decide whether to read it.
#[cold]
fn probe() -> bool {
    if STATE
        .compare_exchange(UNPROBED, PROBING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == ACTIVE;
    }
    let get_this = sym(c"PyGILState_GetThisThreadState");
    let Some((major, minor)) = version().filter(|_| get_this != 0) else {
        turn_off("no Python interpreter in this process".into(), false);
        return false;
    };
    // Py_REF_DEBUG (implied by Py_DEBUG) builds export these.
    if sym(c"_Py_RefTotal") != 0 || sym(c"_Py_NegativeRefcount") != 0 {
        turn_off(format!("Python {major}.{minor} is a debug build"), true);
        return false;
    }
    // Free-threaded builds (3.13t) have another object layout; only they
    // define the biased-refcount merge function.
    if sym(c"_Py_MergeZeroLocalRefcount") != 0 {
        turn_off(format!("Python {major}.{minor} is a free-threaded build"), true);
        return false;
    }
    let Some((layout, how)) = choose_layout(major, minor) else {
        return false;
    };
    let unchecked = if minor >= 13 {
        sym(c"PyThreadState_GetUnchecked")
    } else {
        sym(c"_PyThreadState_UncheckedGet")
    };
    let finalizing = if minor >= 13 {
        sym(c"Py_IsFinalizing")
    } else {
        sym(c"_Py_IsFinalizing")
    };
    let code_type = sym(c"PyCode_Type");
    if code_type == 0 {
        turn_off(format!("Python {major}.{minor}: PyCode_Type not found"), true);
        return false;
    }
    GET_THIS_THREAD_STATE.store(get_this, Ordering::Release);
    GET_UNCHECKED.store(unchecked, Ordering::Release);
    IS_FINALIZING.store(finalizing, Ordering::Release);
    CODE_TYPE.store(code_type, Ordering::Release);
    let capture: CaptureFn = match layout.frames {
        FrameModel::FrameObjects => capture_active::<FRAME_OBJECTS>,
        FrameModel::Interpreter311 => capture_active::<INTERPRETER_311>,
        FrameModel::Interpreter312 => capture_active::<INTERPRETER_312>,
        FrameModel::Interpreter313 => capture_active::<INTERPRETER_313>,
        FrameModel::Interpreter314 => capture_active::<INTERPRETER_314>,
    };
    CAPTURE.store(capture as usize, Ordering::Release);
    LAYOUT.store(layout as *const PyLayout as *mut PyLayout, Ordering::Release);
    set_status(format!("CPython {major}.{minor}{how}"));
    STATE.store(ACTIVE, Ordering::Release);
    true
}

/// The frame model for the running interpreter, and how it was found (for
/// the status), or None after turning capture off with a notice.
///
/// 3.8-3.12 (and 3.13 by default): the version's table, which on 3.13 must
/// agree with the interpreter's `_Py_DebugOffsets`. 3.14 and later (and
/// 3.13 with CUDALEAK_PYTHON_OFFSETS=1): a model built from
/// `_Py_DebugOffsets` itself, the layout that out-of-process debuggers of
/// those versions rely on (`python_debug_offsets::layout_from_debug_offsets`).
fn choose_layout(major: u32, minor: u32) -> Option<(&'static PyLayout, &'static str)> {
    let runtime = sym(c"_PyRuntime");
    let has_offsets = major == 3 && minor >= 13;
    match layout_for(major, minor) {
        Some(table) if !(has_offsets && crate::base::settings::config().python_offsets) => {
            // SAFETY: `runtime` is what dlsym found for `_PyRuntime` in
            // this process (the interpreter's own), or 0.
            if let Err(why) = unsafe { python_debug_offsets::check_against_runtime(table, runtime) } {
                turn_off(format!("Python {major}.{minor}: {why}"), true);
                return None;
            }
            Some((table, ""))
        }
        _ if has_offsets => {
            // SAFETY: `_PyRuntime` of this interpreter, or 0.
            match unsafe { python_debug_offsets::layout_from_runtime(runtime, major, minor) } {
                // Leaked once per process, like the tables are static.
                Ok(l) => Some((
                    Box::leak(Box::new(l)),
                    if minor > python_debug_offsets::NEWEST_KNOWN_MINOR {
                        " (frame layout from _Py_DebugOffsets; newer than the newest known, 3.14)"
                    } else {
                        " (frame layout from _Py_DebugOffsets)"
                    },
                )),
                Err(why) => {
                    turn_off(format!("Python {major}.{minor}: {why}"), true);
                    None
                }
            }
        }
        _ => {
            turn_off(
                format!("Python {major}.{minor} is not supported (3.8 and later are)"),
                true,
            );
            None
        }
    }
}

/// # Safety
/// `addr..addr + size_of::<T>()` must be readable memory; `T` is a plain
/// integer or address, for which every bit pattern is valid.
#[inline(always)]
unsafe fn read<T: Copy>(addr: usize) -> T {
    // SAFETY: readable per the caller; `read_unaligned` needs no alignment,
    // and any bytes there make a valid plain-data `T`.
    unsafe { (addr as *const T).read_unaligned() }
}

/// Plausible user-space pointer, aligned to `align`.
#[inline(always)]
fn plausible(p: usize, align: usize) -> bool {
    (4096..(1 << 56)).contains(&p) && p.is_multiple_of(align)
}

/// The calling thread's thread state, or 0 (rule 2).
///
/// 3.12+: the attached thread state, a thread-local, is always ours; the
/// GIL-state getter is asked only when none is attached. Before 3.12 the
/// attached state is the GIL holder's, ours only when it equals the
/// GIL-state getter's answer, which is then the same value: so that getter
/// alone answers (asking both cost a call a capture; issue 24).
///
/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire): `probe` stored the
/// getters and `LAYOUT` before it (Release).
#[inline(always)]
unsafe fn this_thread_state(l: &PyLayout) -> usize {
    let unchecked = GET_UNCHECKED.load(Ordering::Relaxed);
    if l.attached_is_thread_local && unchecked != 0 {
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

/// Fills `out` with the calling thread's Python frames, innermost first;
/// returns how many, and their generation: two captures on a thread with
/// the same generation have the same frames (0: none; otherwise the
/// log's, see [`PyReplayLog::generation`]). `held` is the generation
/// whose frames `out` already holds (0: none), and is set to the new one:
/// a replay of the frames `out` holds copies nothing (a stack
/// buffer, taken in turn, usually holds the same frames as the last time).
#[inline]
pub fn capture(out: &mut [MaybeUninit<PyRawFrame>], log: &mut PyReplayLog, held: &mut u64) -> (usize, u64) {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => {}
        // Not ACTIVE: STATE never leaves ACTIVE, so no capture has walked
        // yet: `log` is still EMPTY, its group count 0.
        UNPROBED => {
            if !probe() {
                *held = 0;
                return (0, 0);
            }
        }
        _ => {
            *held = 0;
            return (0, 0);
        }
    }
    // SAFETY: ACTIVE, so `probe` stored (Release, read Acquire above) the
    // address of a `capture_active::<MODEL>`, a `CaptureFn`, in `CAPTURE`.
    let capture_active: CaptureFn = unsafe { std::mem::transmute(CAPTURE.load(Ordering::Relaxed)) };
    // SAFETY: see the module comment; every pointer is checked for
    // plausibility and every code object for its type before use. ACTIVE,
    // on this thread, with its own buffers: `capture_active`'s contract.
    let n = unsafe { capture_active(out, log, *held) };
    // A walk that returned frames bumped the generation; a replay kept
    // the one of the walk it repeats.
    let generation = if n == 0 { 0 } else { log.generation };
    *held = generation;
    (n, generation)
}

/// The capture for the interpreter's frame model `MODEL` (the layout's):
/// `probe` picks one ([`CAPTURE`]). A replay runs inline here; only a
/// full walk is another call ([`walk_frames`]).
///
/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire), on the thread whose
/// stack `out` and `log` belong to (see the module comment), and with
/// `MODEL` the frame model of `LAYOUT`.
unsafe fn capture_active<const MODEL: u8>(
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
    held: u64,
) -> usize {
    let fin = IS_FINALIZING.load(Ordering::Relaxed);
    if fin != 0 {
        // SAFETY: non-zero, so the address of `Py_IsFinalizing` (3.13+) or
        // `_Py_IsFinalizing` that `probe` found; both are `int (void)`.
        let f: FinalizingFn = unsafe { std::mem::transmute(fin) };
        // SAFETY: a plain read of the runtime's finalizing flag (rule 2).
        if unsafe { f() } != 0 {
            log.forget();
            return 0;
        }
    }
    // SAFETY: ACTIVE implies LAYOUT points to a static table or a layout
    // leaked in `choose_layout`, never freed.
    let l = unsafe { &*LAYOUT.load(Ordering::Relaxed) };
    // SAFETY: ACTIVE, as this function's caller guarantees.
    let tstate = unsafe { this_thread_state(l) };
    if !plausible(tstate, 8) {
        log.forget();
        return 0;
    }
    let code_type = CODE_TYPE.load(Ordering::Relaxed);
    // SAFETY: `tstate` is this thread's own `PyThreadState`, live while the
    // thread runs; `l` was checked against this interpreter in `probe`, so
    // the offset is inside it.
    let mut frame: usize = unsafe { read(tstate + l.tstate_frame) };
    if let Some(cur) = l.cframe_current_frame {
        if !plausible(frame, 8) {
            log.forget();
            return 0;
        }
        // SAFETY: 3.11 and 3.12: `frame` is the thread state's `cframe`, a
        // `_PyCFrame` in the thread state (`root_cframe`) or on this
        // thread's C stack in an eval loop below us, so live.
        frame = unsafe { read(frame + cur) };
    }
    // SAFETY: `frame` is this thread's innermost Python frame read under
    // the checked layout `l` of this interpreter (of model `MODEL`), and
    // `code_type` its `PyCode_Type`: the contract of `walk_frames`. The
    // chain is frozen while this thread runs the hook (module comment,
    // rule 1).
    unsafe { walk_frames::<MODEL>(l, code_type, frame, out, log, held) }
}

// `FrameModel`s as const generic arguments of `walk_frames`.
const FRAME_OBJECTS: u8 = 0;
const INTERPRETER_311: u8 = 1;
const INTERPRETER_312: u8 = 2;
const INTERPRETER_313: u8 = 3;
const INTERPRETER_314: u8 = 4;

/// What the last full frame walk on a thread saw, for replay.
///
/// A walk's result is a function of its first frame, the frame words it
/// reads (`previous`, code, instruction, owner and entry bytes) and facts
/// of the code objects it meets, which do not change while the object
/// lives: its type, its `_co_firsttraceable`, and the guard words
/// (`guard`). So when a capture starts at the same frame and every logged
/// frame word and guard still holds, the walk would produce the same
/// frames: they are copied from the log. The checks are independent
/// loads, where the walk is a chain of dependent ones and a dozen tests a
/// frame: a loop that allocates from the same Python line (a training
/// step) pays a fraction of a walk. Only walks of up to `PY_REPLAY_FRAMES`
/// frames that ended at the end of the chain are logged.
///
/// Replay checks in two passes. First the frames' words, in chain order:
/// each frame's address is the `previous` word of the one before, just
/// checked. Then the code objects: the guard of each one the walk used
/// (`guards`; a run of frames running one code object, a recursion, logs
/// it once), and on 3.13+ that each executable the walk found not to be a
/// code object still is not one (`not_code`). Every object the second pass
/// reads is the code word of a frame the first pass found unchanged, so the
/// object that live frame executes, live, as when the walk read it; and an
/// object at one address at one time is one object, so one check serves
/// all the frames that run it. One pass that asked each frame what else to
/// check (a fate byte per visit) cost 24 instructions a frame where these
/// cost 15 (3.11, callgrind over bench/py_pairs.py; issue 24).
///
/// When frames changed in place (another line, or another function
/// called from the same frame), the others are checked so and those
/// frames alone walked ([`patch`]).
pub struct PyReplayLog {
    /// frames visited; 0 when the log is not usable
    visited: usize,
    /// the chain's innermost frame, where the logged walk started
    head: usize,
    /// Bumped by every full walk (logged or not) and every patched
    /// replay, kept by a replay: a capture's frames are those of the walk
    /// or patch that made its generation, so a trace is reused by
    /// comparing generations, not frames (`capture.rs`, issue 24).
    generation: u64,
    /// eval-loop groups of the frames the last capture returned
    /// ([`PyReplayLog::eval_groups`])
    groups: usize,
    /// entries of `guards` and `not_code` in use
    guarded: usize,
    not_codes: usize,
    recorded: usize,
    visits: [Visit; PY_REPLAY_FRAMES],
    /// the visit that recorded each frame of `out` (`patch`)
    visit_of: [u8; PY_REPLAY_FRAMES],
    guards: [Guarded; PY_REPLAY_FRAMES],
    /// 3.13+: frames' executables that were not code objects (skip case 2
    /// of [`walk_frames`])
    not_code: [usize; PY_REPLAY_FRAMES],
    out: [PyRawFrame; PY_REPLAY_FRAMES],
}

const PY_REPLAY_FRAMES: usize = 32;

/// The words of one frame a walk visited, as [`frame_words`] read them.
/// Its address is not kept: the first is the log's `head`, each later one
/// the `next` word of the one before, which replay has just checked (one
/// load less a frame; issue 24). What the walk made of the frame follows
/// from these words and the code object's facts, checked apart
/// ([`PyReplayLog`]).
#[derive(Clone, Copy)]
struct Visit {
    next: usize,
    code: usize,
    instr: usize,
    /// the owner byte (3.12+), or 3.11's `is_entry` and owner bytes, read
    /// as one; 0 for frame objects
    bytes: usize,
}

/// Where a walk keeps the visit that recorded a frame in its flags
/// until it ends (`walk_full`); the flags proper are below.
const VISIT_SHIFT: u32 = 8;

/// A code object the walk used, and its guard then.
#[derive(Clone, Copy)]
struct Guarded {
    code: usize,
    guard: u64,
}

impl PyReplayLog {
    pub const EMPTY: PyReplayLog = PyReplayLog {
        visited: 0,
        generation: 0,
        head: 0,
        groups: 0,
        guarded: 0,
        not_codes: 0,
        recorded: 0,
        visit_of: [0; PY_REPLAY_FRAMES],
        visits: [Visit {
            next: 0,
            code: 0,
            instr: 0,
            bytes: 0,
        }; PY_REPLAY_FRAMES],
        guards: [Guarded { code: 0, guard: 0 }; PY_REPLAY_FRAMES],
        not_code: [0; PY_REPLAY_FRAMES],
        out: [PyRawFrame {
            code: 0,
            guard: 0,
            offset: 0,
            flags: 0,
        }; PY_REPLAY_FRAMES],
    };

    /// After [`capture`] with this log: how many eval-loop invocations
    /// the frames it returned came from, that is how many of them are
    /// flagged `PY_FRAME_ENTRY` (`eval_groups(frames).len()`); 0 when it
    /// returned none. A replayed capture costs nothing more: the count is
    /// the logged walk's. It tells the native unwinder how many
    /// `_PyEval_EvalFrameDefault` frames the Python frames account for.
    pub fn eval_groups(&self) -> usize {
        self.groups
    }

    /// Whether the walk used visit `i`'s code object (and so checked its
    /// guard): not a shim, and on 3.13+ a code object; in a logged walk
    /// every other visit did.
    #[inline(always)]
    fn used<const MODEL: u8>(&self, l: &PyLayout, i: usize) -> bool {
        let v = &self.visits[i];
        let shim =
            MODEL >= INTERPRETER_312 && owner_of::<MODEL>(v.bytes) >= l.owner_c_entry.unwrap_or(u8::MAX);
        let not_code = MODEL >= INTERPRETER_313 && self.not_code[..self.not_codes].contains(&v.code);
        !shim && !not_code
    }

    /// What `patch` needs of the walk that is not in its frames, for visit
    /// `i`, which used its code object and is to run `new_code` instead:
    /// that object's `guards` entry if no other visit relies on it and no
    /// visit next to it runs `new_code`, and whether `i` is the first visit
    /// that used one (before 3.13 the walk checks only its code object by
    /// type). The walk logged an entry where a visit's code object
    /// differed from the last one logged, so a run of visits running one
    /// object (a recursion) shares one; a patch keeps that so (a visit
    /// patched to its neighbour's code object would join its run with an
    /// entry of its own, and the entries after it would be miscounted
    /// here). Worked out when a patch is tried, not by the walk: kept
    /// there, it cost the walk 25 instructions a frame, and worked out for
    /// every visit, a patch 500.
    fn entry_of<const MODEL: u8>(&self, l: &PyLayout, i: usize, new_code: usize) -> (Option<usize>, bool) {
        let code = self.visits[i].code;
        let mut entry = usize::MAX;
        let mut last = 0;
        let mut first = true;
        let mut shared = false;
        for j in 0..=i {
            if !self.used::<MODEL>(l, j) {
                continue;
            }
            let c = self.visits[j].code;
            if j == i {
                // the visit before it (that used one) runs it too, or would
                shared = c == last || new_code == last;
            }
            if c != last {
                entry = entry.wrapping_add(1);
                last = c;
            }
            first &= j == i;
        }
        if let Some(j) = (i + 1..self.visited).find(|&j| self.used::<MODEL>(l, j)) {
            shared |= self.visits[j].code == code || self.visits[j].code == new_code;
        }
        ((!shared).then_some(entry), first)
    }

    /// Makes the log unusable and its group count 0: a capture that
    /// returns no frames without walking.
    #[cold]
    fn forget(&mut self) {
        self.visited = 0;
        self.groups = 0;
    }
}

/// 3.11's `is_entry` and `owner` are adjacent bytes (`bool is_entry; char
/// owner;` in `_PyInterpreterFrame`), so [`frame_words`] reads both with
/// one load; the 3.11 model comes only from this table.
const _: () = match (PY311.frame_is_entry, PY311.frame_owner) {
    (Some(entry), Some(owner)) => assert!(owner == entry + 1),
    _ => panic!("3.11 has is_entry and owner"),
};

/// Where a frame's words are ([`frame_words`]), copied out of the layout
/// into locals: read through the layout's pointer (`LAYOUT`), which the
/// compiler cannot assume readable ahead of the loop, each frame reloaded
/// them.
#[derive(Clone, Copy)]
struct FrameOffsets {
    back: usize,
    code: usize,
    instr: usize,
    /// the owner byte (3.12+) or 3.11's `is_entry`
    bytes: usize,
    /// 3.14+: `executable_tag_mask`
    tags: usize,
}

impl FrameOffsets {
    #[inline(always)]
    fn of<const MODEL: u8>(l: &PyLayout) -> FrameOffsets {
        FrameOffsets {
            back: l.frame_back,
            code: l.frame_code,
            instr: l.frame_instr,
            // 3.11+ layouts all have them; 0 for frame objects (unread).
            bytes: if MODEL == INTERPRETER_311 {
                l.frame_is_entry.unwrap_or(0)
            } else {
                l.frame_owner.unwrap_or(0)
            },
            tags: l.executable_tag_mask,
        }
    }
}

/// The words of a frame that decide what the walk makes of it: `previous`,
/// code, instruction, and the owner and entry bytes (see [`Visit`]).
///
/// # Safety
/// `frame` is a live frame (frame object or interpreter frame, as `MODEL`
/// says) of the calling thread's chain, and `o` the offsets of the layout
/// checked against the running interpreter ([`FrameOffsets::of`]), so
/// that each lies in the frame.
#[inline(always)]
unsafe fn frame_words<const MODEL: u8>(o: FrameOffsets, frame: usize) -> (usize, usize, usize, usize) {
    // SAFETY: fields of the live `frame` at the checked layout's offsets,
    // per the contract; plain words and bytes (so for the reads below).
    let next: usize = unsafe { read(frame + o.back) };
    // SAFETY: as above.
    let code: usize = unsafe { read(frame + o.code) };
    if MODEL == FRAME_OBJECTS {
        // SAFETY: as above (`f_lasti`).
        let lasti: i32 = unsafe { read(frame + o.instr) };
        return (next, code, lasti as usize, 0);
    }
    // 3.14+: a tagged stack reference; all tag bits set is a tagged int,
    // not an object (0: the walk ends there). Only that model's walk
    // carries the test: 3.13's costs what it did.
    let code = if MODEL == INTERPRETER_314 {
        if code & o.tags == o.tags {
            0
        } else {
            code & !o.tags
        }
    } else {
        code
    };
    // SAFETY: as above (`instr_ptr`/`prev_instr`).
    let instr: usize = unsafe { read(frame + o.instr) };
    let bytes = if MODEL == INTERPRETER_311 {
        // SAFETY: as above: 3.11's `is_entry` and the `owner` byte after
        // it (asserted of PY311 above).
        let both: [u8; 2] = unsafe { read(frame + o.bytes) };
        u16::from_le_bytes(both) as usize
    } else {
        // SAFETY: as above (`owner`).
        unsafe { read::<u8>(frame + o.bytes) as usize }
    };
    (next, code, instr, bytes)
}

/// The owner byte of [`frame_words`]' `bytes` (interpreter frames).
#[inline(always)]
fn owner_of<const MODEL: u8>(bytes: usize) -> u8 {
    if MODEL == INTERPRETER_311 {
        (bytes >> 8) as u8
    } else {
        bytes as u8
    }
}

/// Whether `frame` has the words the walk logged in `v`.
///
/// # Safety
/// As [`frame_words`].
#[inline(always)]
unsafe fn frame_unchanged<const MODEL: u8>(o: FrameOffsets, frame: usize, v: &Visit) -> bool {
    // SAFETY: the contract.
    let (next, code, instr, bytes) = unsafe { frame_words::<MODEL>(o, frame) };
    // `previous` last: the next frame's loads wait on it anyway.
    code == v.code && instr == v.instr && (MODEL == FRAME_OBJECTS || bytes == v.bytes) && next == v.next
}

/// Where `v` is in `visits`, in bytes (`Miss::At`): where replay fails,
/// so that its loop keeps no index (an index, or the division to one,
/// cost an instruction a frame).
#[inline(always)]
fn offset_in(visits: &[Visit], v: &Visit) -> usize {
    v as *const Visit as usize - visits.as_ptr() as usize
}

/// Copies `frames` to the start of `out` (no longer than it): one
/// `memcpy`, where a loop cost 6 instructions a frame.
#[inline(always)]
fn copy_frames(frames: &[PyRawFrame], out: &mut [MaybeUninit<PyRawFrame>]) {
    let out = &mut out[..frames.len()];
    // SAFETY: two distinct buffers (a log and a stack buffer) of
    // `frames.len()` frames each; `MaybeUninit<T>` has `T`'s layout.
    unsafe {
        std::ptr::copy_nonoverlapping(
            frames.as_ptr(),
            out.as_mut_ptr().cast::<PyRawFrame>(),
            frames.len(),
        )
    };
}

/// Why a replay failed: a frame's words changed, the frames before it
/// unchanged (the others not checked yet; its visit's place in the log's
/// `visits`, in bytes), or something else.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Miss {
    At(usize),
    Other,
}

/// Replays the log if the chain is unchanged (see [`PyReplayLog`]).
///
/// # Safety
/// As [`walk_frames`]; `log` is this thread's, written by its walks.
#[inline(always)]
unsafe fn replay<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    log: &PyReplayLog,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    held: u64,
) -> Result<usize, Miss> {
    if log.visited == 0 || log.head != frame || log.recorded > out.len() {
        return Err(Miss::Other);
    }
    let o = FrameOffsets::of::<MODEL>(l);
    let mut at = frame;
    let visits = &log.visits[..log.visited];
    // Not empty (`visited` > 0): tested at the bottom, the loop costs one
    // test a frame fewer than a `for`, and with a pointer and no index one
    // more.
    let range = visits.as_ptr_range();
    let mut next_visit = range.start;
    loop {
        // SAFETY: `range.start <= next_visit < range.end`: an entry of
        // `visits` (not empty; stepped by one below while before the end).
        let v = unsafe { &*next_visit };
        // SAFETY: `at` is first `frame`, the chain's head (checked equal to
        // the logged walk's above), then the `next` word just read from
        // its predecessor and checked: a live frame of this thread's chain.
        if !unsafe { frame_unchanged::<MODEL>(o, at, v) } {
            return Err(Miss::At(offset_in(visits, v)));
        }
        at = v.next;
        // SAFETY: at most one past the end of `visits`.
        next_visit = unsafe { next_visit.add(1) };
        if next_visit == range.end {
            break;
        }
    }
    for g in &log.guards[..log.guarded] {
        // SAFETY: `g.code` is the code word of a frame checked unchanged
        // above, which the logging walk found plausible and a code object
        // (type-checked, or trusted under the checked layout as in
        // `walk_frames`): the object a live frame executes, so live.
        if unsafe { guard(l, g.code) } != g.guard {
            return Err(Miss::Other);
        }
    }
    if MODEL >= INTERPRETER_313 {
        for &code in &log.not_code[..log.not_codes] {
            // SAFETY: as above, a live object (not a code object), whose
            // `ob_type` is at the layout's offset.
            if unsafe { read::<usize>(code + l.ob_type) } == code_type {
                return Err(Miss::Other);
            }
        }
    }
    // `out` may hold this very walk's frames already (`capture`'s `held`).
    if held != log.generation {
        copy_frames(&log.out[..log.recorded], out);
    }
    Ok(log.recorded)
}

#[cfg(test)]
thread_local! {
    /// Patched replays on this thread (tests: that they happen).
    static PATCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A replay that found a frame's code word or instruction changed in
/// place, its `previous` word and owner and entry bytes the same: a loop
/// that allocates from one line and then another of a function, or calls
/// one function and then another from a frame (and so the callers' lines
/// change too: a model's forward calling its layers in turn). Goes on
/// from that visit, `from`: every frame changed so is walked alone, the
/// others checked as replay checks them, then every code object.
///
/// The rest of a walk depends on what it made of a visit only through
/// whether it recorded a frame there (it must again: `out_at`) and the
/// guard entry of its code object, which must be that visit's alone
/// (`entry`; a recursion's frames share one); a shim's code and
/// instruction words are not read. A patched frame keeps its flags: they
/// come from its entry byte, a shim after it and being the outermost, all
/// checked unchanged. The log is patched in place (a walk rewrites all of
/// it if the patch fails), and the capture has a new generation (issue
/// 24: a walk of 22 frames cost 2,200 instructions, 3.11.7).
///
/// # Safety
/// As [`walk_frames`], after `replay` found the frames before visit
/// `from` unchanged (`Miss::At`: `from` is that visit's place in bytes),
/// so `log` is usable, starts at `frame`, and its frames fit in `out`.
#[inline(never)]
unsafe fn patch<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    log: &mut PyReplayLog,
    frame: usize,
    from: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
) -> Option<usize> {
    // (In bytes from replay: divided there, the division became an index
    // its loop kept, an instruction a frame.)
    let from = from / size_of::<Visit>();
    let o = FrameOffsets::of::<MODEL>(l);
    let mut at = if from == 0 {
        frame
    } else {
        log.visits[from - 1].next
    };
    let visited = log.visited.min(PY_REPLAY_FRAMES);
    let mut i = from;
    loop {
        // SAFETY: `at` is the frame of visit `i`: of `from` (the contract),
        // then the `next` word of the one before, checked.
        at = unsafe { patch_visit::<MODEL>(l, code_type, log, i, at) }?;
        i += 1;
        // The frames after it unchanged, as replay checks them.
        while i < visited {
            // SAFETY: as above.
            if !unsafe { frame_unchanged::<MODEL>(o, at, &log.visits[i]) } {
                break;
            }
            at = log.visits[i].next;
            i += 1;
        }
        if i == visited {
            break;
        }
    }
    for g in &log.guards[..log.guarded] {
        // SAFETY: as in `replay`: each entry's code object is that of a
        // frame checked above or before `from`, unchanged or patched.
        if unsafe { guard(l, g.code) } != g.guard {
            return None;
        }
    }
    if MODEL >= INTERPRETER_313 {
        for &c in &log.not_code[..log.not_codes] {
            // SAFETY: as in `replay`.
            if unsafe { read::<usize>(c + l.ob_type) } == code_type {
                return None;
            }
        }
    }
    #[cfg(test)]
    PATCHES.with(|c| c.set(c.get() + 1));
    log.generation += 1;
    copy_frames(&log.out[..log.recorded], out);
    Some(log.recorded)
}

/// One visit of [`patch`], `i`, whose frame `at` changed: walks it alone
/// and patches the log, returning its `next` word; None if the walk would
/// make another thing of it (see `patch`).
///
/// # Safety
/// `at` is a live frame of the calling thread's chain, the one the log's
/// visit `i` (< `visited`) visited; `l` and `code_type` as in `patch`.
#[inline(always)]
unsafe fn patch_visit<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    log: &mut PyReplayLog,
    i: usize,
    at: usize,
) -> Option<usize> {
    let v = log.visits[i];
    // SAFETY: the contract.
    let (next, code, instr, bytes) = unsafe { frame_words::<MODEL>(FrameOffsets::of::<MODEL>(l), at) };
    if next != v.next || (MODEL != FRAME_OBJECTS && bytes != v.bytes) {
        return None;
    }
    if code == v.code && instr == v.instr {
        return Some(next);
    }
    if MODEL >= INTERPRETER_312 && owner_of::<MODEL>(bytes) >= l.owner_c_entry.unwrap_or(u8::MAX) {
        log.visits[i] = Visit {
            next,
            code,
            instr,
            bytes,
        };
        return Some(next);
    }
    let out_at = log.visit_of[..log.recorded]
        .iter()
        .position(|&v| v as usize == i)?;
    if !plausible(code, 8) {
        return None;
    }
    // (A visit that recorded a frame used its code object.)
    let (Some(entry), first_used) = log.entry_of::<MODEL>(l, i, code) else {
        return None;
    };
    // As the walk: each code object checked by type on 3.13+, before
    // only the first (then the others are code objects by construction).
    if MODEL >= INTERPRETER_313 || first_used {
        // SAFETY: plausible, and what a live frame executes: a live
        // object, whose `ob_type` is at the layout's offset.
        if unsafe { read::<usize>(code + l.ob_type) } != code_type {
            return None;
        }
    }
    // SAFETY: a live code object, as in `walk_full`.
    let code_guard = unsafe { guard(l, code) };
    let offset = if MODEL != FRAME_OBJECTS {
        let offset = instr
            .checked_sub(code + l.code_code_adaptive.unwrap_or(0))
            .filter(|&o| o < 1 << 30)?;
        if let Some(first) = l.code_first_traceable {
            // SAFETY: `_co_firsttraceable` of the live code object.
            let first_traceable: i32 = unsafe { read(code + first) };
            if owner_of::<MODEL>(bytes) != l.owner_generator.unwrap_or(u8::MAX)
                && (offset as i64) < first_traceable as i64 * 2
            {
                return None;
            }
        }
        offset as u32 & !1
    } else {
        ((instr as i32).max(0) as u32).saturating_mul(l.lasti_unit_bytes)
    };
    log.visits[i] = Visit {
        next,
        code,
        instr,
        bytes,
    };
    log.guards[entry] = Guarded {
        code,
        guard: code_guard,
    };
    let recorded = &mut log.out[out_at];
    *recorded = PyRawFrame {
        code: code as u64,
        guard: code_guard,
        offset,
        flags: recorded.flags,
    };
    Some(next)
}

/// The frame walk proper, compiled once per frame model (`MODEL`) so that
/// each version's walk carries only its own tests, with the layout's
/// offsets copied into locals (registers) first. One generic walk that
/// asked the layout at every frame cost about 100 instructions a frame
/// (callgrind over bench/py_pairs.py). An unchanged chain is replayed
/// from the thread's log instead ([`PyReplayLog`]).
///
/// Frames are skipped, as CPython's own tracebacks skip them:
/// 1. 3.12+: the shim frame a C call into Python pushes (3.12, 3.13:
///    FRAME_OWNED_BY_CSTACK; 3.14: FRAME_OWNED_BY_INTERPRETER, and CSTACK
///    above it); the Python frame just inside it was entered from C.
/// 2. 3.13+: frames whose `f_executable` is not a code object (C code).
/// 3. 3.11+: frames not started yet (instruction before the code).
/// 4. 3.11+: incomplete frames, as `_PyFrame_IsIncomplete`
///    (Include/internal/pycore_frame.h) defines them: not owned by a
///    generator, and the instruction before the code's
///    `_co_firsttraceable`. Such a frame is still in its prelude
///    (MAKE_CELL, COPY_FREE_VARS), or it is 3.13's `__init__` shim: once a
///    class call is specialized (CALL_ALLOC_AND_ENTER_INIT), the
///    interpreter pushes a frame running `_Py_InitCleanup`
///    (Python/specialize.c), a code object named `__init__` in a file named
///    `__init__`, parked at offset 0 below its RESUME, between the caller
///    and the real `__init__`. Without this test that shim shows up as a
///    bogus Python frame on 3.13.
///
/// # Safety
/// `frame` is 0 (or implausible) or the calling thread's innermost frame,
/// read under `l`, the layout checked against the running interpreter,
/// whose `PyCode_Type` is at `code_type`. The chain from it is frozen
/// while this thread runs (module comment, rule 1), so each `previous`
/// word leads to a live frame or ends the chain.
#[inline(always)]
unsafe fn walk_frames<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
    held: u64,
) -> usize {
    // SAFETY: this function's own contract, which `replay` and
    // `walk_full` share.
    unsafe {
        match replay::<MODEL>(l, code_type, log, frame, out, held) {
            Ok(n) => n,
            Err(Miss::At(at)) => match patch::<MODEL>(l, code_type, log, frame, at, out) {
                Some(n) => n,
                None => walk_full::<MODEL>(l, code_type, frame, out, log),
            },
            Err(Miss::Other) => walk_full::<MODEL>(l, code_type, frame, out, log),
        }
    }
}

/// [`walk_frames`] without the replay: out of line, so that a replay
/// (inline in `capture_active`) saves no registers for it.
///
/// # Safety
/// As [`walk_frames`].
#[inline(never)]
unsafe fn walk_full<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    mut frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
) -> usize {
    log.generation += 1;
    let interpreter_frames = MODEL != FRAME_OBJECTS;
    let owner_c_entry = l.owner_c_entry.unwrap_or(u8::MAX);
    let owner_generator = l.owner_generator.unwrap_or(u8::MAX);
    let ob_type = l.ob_type;
    let code_start = l.code_code_adaptive.unwrap_or(0);
    let first_traceable_at = l.code_first_traceable;
    let lasti_unit_bytes = l.lasti_unit_bytes;
    let offsets = FrameOffsets::of::<MODEL>(l);

    let head = frame;
    let mut n = 0;
    let mut visited = 0;
    let mut guarded = 0;
    let mut not_codes = 0;
    // The walk is logged only if it ends where the chain ends.
    let mut loggable = true;
    // A chain longer than this is corrupt (or a recursion we cut).
    let mut budget = 4096;
    // The first code object is checked by type: a wrong layout stops here.
    let mut checked = false;
    // The code object last logged in `guards`: a recursion's frames run
    // one code object, whose guard replay checks once.
    let mut last_guarded = 0;
    while plausible(frame, 8) && budget > 0 {
        if n == out.len() {
            loggable = false;
            break;
        }
        budget -= 1;
        // SAFETY: `frame` is plausible and is the head or a `previous` word
        // of this thread's frozen chain (the contract).
        let (next, code, instr, bytes) = unsafe { frame_words::<MODEL>(offsets, frame) };
        // While `loggable`, `visited` < PY_REPLAY_FRAMES, and so are the
        // counts of the other lists, which take at most one entry a visit.
        if visited < PY_REPLAY_FRAMES {
            log.visits[visited] = Visit {
                next,
                code,
                instr,
                bytes,
            };
        } else {
            loggable = false;
        }
        let owner = owner_of::<MODEL>(bytes);
        let shim = MODEL >= INTERPRETER_312 && owner >= owner_c_entry;
        visited += 1;
        if shim {
            // (1)
            if n > 0 {
                // SAFETY: `out[..n]` were written by this walk.
                unsafe { out[n - 1].assume_init_mut() }.flags |= PY_FRAME_ENTRY;
            }
            frame = next;
            continue;
        }
        if !plausible(code, 8) {
            loggable = false;
            break;
        }
        if MODEL >= INTERPRETER_313 || !checked {
            // SAFETY: `code` is plausible and is what a live frame executes,
            // so a live object, whose `ob_type` is at the layout's offset.
            if unsafe { read::<usize>(code + ob_type) } != code_type {
                if MODEL >= INTERPRETER_313 {
                    if loggable {
                        log.not_code[not_codes] = code;
                        not_codes += 1;
                    }
                    frame = next; // (2)
                    continue;
                }
                loggable = false;
                break;
            }
            checked = true;
        }
        // SAFETY: a live code object: its type checked above (before 3.13,
        // the first one checked proves the layout, and a frame's code word
        // is a code object there by construction).
        let code_guard = unsafe { guard(l, code) };
        if code != last_guarded && loggable {
            log.guards[guarded] = Guarded {
                code,
                guard: code_guard,
            };
            guarded += 1;
            last_guarded = code;
        }
        let offset = if interpreter_frames {
            let Some(offset) = instr.checked_sub(code + code_start).filter(|&o| o < 1 << 30) else {
                frame = next; // (3)
                continue;
            };
            if let Some(at) = first_traceable_at {
                // SAFETY: `_co_firsttraceable` of the live code object, as
                // for the guard above.
                let first_traceable: i32 = unsafe { read(code + at) };
                if owner != owner_generator && (offset as i64) < first_traceable as i64 * 2 {
                    frame = next; // (4)
                    continue;
                }
            }
            offset as u32 & !1
        } else {
            ((instr as i32).max(0) as u32).saturating_mul(lasti_unit_bytes)
        };
        let flags = if !interpreter_frames {
            // Each frame object ran in its own eval-loop invocation.
            PY_FRAME_ENTRY
        } else if MODEL == INTERPRETER_311 && bytes as u8 != 0 {
            // 3.11's `is_entry`
            PY_FRAME_ENTRY
        } else {
            0
        };
        out[n].write(PyRawFrame {
            code: code as u64,
            guard: code_guard,
            offset,
            // The visit that recorded it rides in bits 8-15 until the walk
            // ends (`VISIT_SHIFT`): a store of its own here cost the walk
            // 10 instructions a frame (registers).
            flags: flags | ((visited - 1) as u8 as u32) << VISIT_SHIFT,
        });
        n += 1;
        frame = next;
    }
    if n > 0 {
        // The outermost frame was entered from C (the interpreter's main).
        // SAFETY: `out[..n]` were written by this walk.
        unsafe { out[n - 1].assume_init_mut() }.flags |= PY_FRAME_ENTRY;
    }
    let mut groups = 0;
    for (k, f) in out[..n].iter_mut().enumerate() {
        // SAFETY: `out[..n]` were written by this walk.
        let f = unsafe { f.assume_init_mut() };
        // (Written whether logged or not; an unlogged walk's are not read.)
        log.visit_of[k.min(PY_REPLAY_FRAMES - 1)] = (f.flags >> VISIT_SHIFT) as u8;
        f.flags &= (1 << VISIT_SHIFT) - 1;
        groups += usize::from(f.flags & PY_FRAME_ENTRY != 0);
    }
    log.groups = groups;
    if loggable && budget > 0 && visited > 0 && n <= PY_REPLAY_FRAMES {
        log.visited = visited;
        log.head = head;
        log.recorded = n;
        log.guarded = guarded;
        log.not_codes = not_codes;
        // SAFETY: `out[..n]` were written by this walk; `MaybeUninit<T>`
        // has `T`'s layout.
        let frames = unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<PyRawFrame>(), n) };
        log.out[..n].copy_from_slice(frames);
    } else {
        log.visited = 0;
    }
    n
}

/// Tells a code object from a later one at the same (freed and reused)
/// address: its qualified-name and line-table objects, which sit on one
/// cache line of the code object. A new code object at the same address
/// with both the same is, for our purposes, the same code.
///
/// # Safety
/// `code` is a live code object of the interpreter `l` was checked against.
#[inline(always)]
unsafe fn guard(l: &PyLayout, code: usize) -> u64 {
    // SAFETY: two pointer fields of the live code object at the checked
    // layout's offsets (the contract).
    let name: usize = unsafe { read(code + l.code_qualname.unwrap_or(l.code_name)) };
    // SAFETY: as above.
    let table: usize = unsafe { read(code + l.code_linetable) };
    (name as u64) ^ (table as u64).rotate_left(32)
}

/// Reads a str object (compact layout) into a String.
///
/// # Safety
/// `obj` is implausible (then None) or a live str object of the
/// interpreter `l` was checked against (a code object's name or file).
unsafe fn read_str(l: &PyLayout, obj: usize) -> Option<String> {
    if !plausible(obj, 8) {
        return None;
    }
    // SAFETY: `ob_size`-like header field of the live str (the contract).
    let len: isize = unsafe { read(obj + l.unicode_length) };
    if !(0..=(1 << 20)).contains(&len) {
        return None;
    }
    // SAFETY: the str's `state` bit field, as above.
    let state: u32 = unsafe { read(obj + l.unicode_state) };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact {
        return None;
    }
    let len = len as usize;
    if ascii {
        // SAFETY: a compact ASCII str keeps its `len` bytes inline, right
        // after the `PyASCIIObject` header; the object is live and not
        // mutated (strs are immutable), and `len` is capped above.
        let data = unsafe { std::slice::from_raw_parts((obj + l.unicode_ascii_size) as *const u8, len) };
        return Some(String::from_utf8_lossy(data).into_owned());
    }
    let data = obj + l.unicode_compact_size;
    // SAFETY: a compact non-ASCII str keeps `len` code units of `kind`
    // bytes (1, 2 or 4, matched below) inline after the
    // `PyCompactUnicodeObject` header, allocated and aligned by CPython
    // for that kind; immutable and live, `len` capped above.
    let chars: String = unsafe {
        match kind {
            1 => std::slice::from_raw_parts(data as *const u8, len)
                .iter()
                .map(|&b| b as char)
                .collect(),
            2 => char::decode_utf16(
                std::slice::from_raw_parts(data as *const u16, len)
                    .iter()
                    .copied(),
            )
            .map(|c| c.unwrap_or('\u{fffd}'))
            .collect(),
            4 => std::slice::from_raw_parts(data as *const u32, len)
                .iter()
                .map(|&c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect(),
            _ => return None,
        }
    };
    Some(chars)
}

/// Copies a bytes object's content.
///
/// # Safety
/// `obj` is implausible (then None) or a live bytes object of the
/// interpreter `l` was checked against (a code object's line table).
unsafe fn read_bytes(l: &PyLayout, obj: usize) -> Option<Vec<u8>> {
    if !plausible(obj, 8) {
        return None;
    }
    // SAFETY: `ob_size` of the live bytes object (the contract).
    let len: isize = unsafe { read(obj + l.bytes_size) };
    if !(0..=(1 << 24)).contains(&len) {
        return None;
    }
    // SAFETY: a bytes object keeps its `ob_size` bytes inline at `ob_sval`;
    // live and immutable, `len` capped above.
    Some(unsafe { std::slice::from_raw_parts((obj + l.bytes_data) as *const u8, len as usize) }.to_vec())
}

/// Copies what reports need of each code object of `frames` not copied
/// yet. Runs when a new trace is stored (rule 4); the code objects are
/// alive, their frames are on this thread's stack.
pub fn remember_code_objects(frames: &[PyRawFrame]) {
    if frames.is_empty() || STATE.load(Ordering::Acquire) != ACTIVE {
        return;
    }
    // SAFETY: ACTIVE means LAYOUT is set.
    let l = unsafe { &*LAYOUT.load(Ordering::Acquire) };
    for f in frames {
        if CODES.contains(f.code, f.guard) {
            continue;
        }
        let code = f.code as usize;
        // SAFETY: a live code object, checked by type in capture.
        let info = unsafe {
            CodeInfo {
                filename: read_str(l, read(code + l.code_filename)).unwrap_or_else(|| "<unknown>".into()),
                qualname: read_str(l, read(code + l.code_qualname.unwrap_or(l.code_name)))
                    .unwrap_or_else(|| "<unknown>".into()),
                firstlineno: read(code + l.code_firstlineno),
                format: l.line_format,
                linetable: read_bytes(l, read(code + l.code_linetable)).unwrap_or_default(),
            }
        };
        CODES.insert(f.code, f.guard, info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::python_layouts::PY313;

    /// The 3.14 layout (x86-64, GIL build) the walk's tests use.
    fn layout_3_14() -> PyLayout {
        PyLayout {
            minor: 14,
            frames: FrameModel::Interpreter314,
            executable_tag_mask: 3,
            frame_owner: Some(74),
            code_code_adaptive: Some(208),
            code_first_traceable: Some(192),
            ..PY313
        }
    }

    /// A 3.14 frame chain in memory, laid out as the v3.14.0 headers give
    /// it (x86-64, GIL build): `f_executable` a tagged `_PyStackRef`, owner
    /// at 74, the C entry frame owned by FRAME_OWNED_BY_INTERPRETER (3),
    /// `_co_firsttraceable` 16 bytes before `co_code_adaptive` (208). No
    /// 3.14 interpreter can be installed here; this is the walk's check.
    #[test]
    fn the_3_14_walk_untags_executables_and_skips_entry_and_incomplete_frames() {
        let l = layout_3_14();
        static CODE_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        // Code objects: type, qualname and line table (the guard), first
        // traceable instruction (in code units).
        let mut codes = vec![[0u64; 40]; 3];
        for (i, c) in codes.iter_mut().enumerate() {
            c[1] = code_type as u64;
            c[128 / 8] = 0x1000 + i as u64;
            c[136 / 8] = 0x2000 + i as u64;
        }
        codes[2][192 / 8] = 2; // the __init__ shim: parked before its RESUME
        let code = |i: usize| codes[i].as_ptr() as usize;
        let mut frames = vec![[0u64; 11]; 5];
        let frame = |frames: &Vec<[u64; 11]>, i: usize| frames[i].as_ptr() as usize;
        // (executable stack ref, instruction offset in bytes, owner)
        let chain: [(usize, usize, u8); 5] = [
            (code(0) | 1, 4, 0), // innermost, a borrowed (tagged) reference
            (code(2), 0, 0),     // incomplete: skipped
            (0x4000 | 1, 0, 3),  // C entry frame: skipped, marks entry
            (code(1), 6, 1),     // a generator's frame, untagged
            (0x5000 | 1, 0, 3),  // the outermost entry frame
        ];
        for (i, &(exe, offset, owner)) in chain.iter().enumerate() {
            let next = if i + 1 < chain.len() {
                frame(&frames, i + 1)
            } else {
                0
            };
            let code_addr = exe & !3;
            let f = &mut frames[i];
            f[0] = exe as u64;
            f[1] = next as u64;
            f[56 / 8] = (code_addr + 208 + offset) as u64;
            f[72 / 8] = (owner as u64) << 16;
        }
        let mut out = [MaybeUninit::<PyRawFrame>::uninit(); 8];
        let mut log = PyReplayLog::EMPTY;
        let walk = |out: &mut [MaybeUninit<PyRawFrame>], log: &mut PyReplayLog, frames: &Vec<[u64; 11]>| {
            // SAFETY: every address is in `codes` or `frames`, alive.
            let n = unsafe { walk_frames::<INTERPRETER_314>(&l, code_type, frame(frames, 0), out, log, 0) };
            out[..n]
                .iter()
                // SAFETY: the walk wrote `out[..n]`.
                .map(|f| unsafe { f.assume_init() })
                .map(|f| (f.code as usize, f.offset, f.flags))
                .collect::<Vec<_>>()
        };
        let expected = vec![(code(0), 4, PY_FRAME_ENTRY), (code(1), 6, PY_FRAME_ENTRY)];
        assert_eq!(walk(&mut out, &mut log, &frames), expected);
        // Unchanged: replayed from the log, the same frames.
        assert!(log.visited > 0);
        assert_eq!(walk(&mut out, &mut log, &frames), expected);
        // A tagged int where the executable should be ends the walk there.
        frames[3][0] = 0x7003;
        assert_eq!(
            walk(&mut out, &mut log, &frames),
            vec![(code(0), 4, PY_FRAME_ENTRY)]
        );
    }

    /// A recursion (one code object in consecutive frames) is replayed
    /// reading that code object once (one `guards` entry), and a changed
    /// guard of it still ends the replay: the walk sees the new code.
    #[test]
    fn a_recursion_checks_its_code_object_once_and_still_sees_it_change() {
        let l = layout_3_14();
        static CODE_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        let mut code = vec![0u64; 40];
        code[1] = code_type as u64;
        code[128 / 8] = 0x1000;
        code[136 / 8] = 0x2000;
        let code_addr = code.as_ptr() as usize;
        let mut frames = vec![[0u64; 11]; 4];
        let frame = |frames: &Vec<[u64; 11]>, i: usize| frames[i].as_ptr() as usize;
        // three frames of one function, then the outermost entry frame
        for i in 0..4 {
            let next = if i + 1 < 4 { frame(&frames, i + 1) } else { 0 };
            let f = &mut frames[i];
            if i < 3 {
                f[0] = code_addr as u64;
                f[56 / 8] = (code_addr + 208 + 2 * i) as u64;
            } else {
                f[0] = 0x5000 | 1;
                f[72 / 8] = 3 << 16;
            }
            f[1] = next as u64;
        }
        let mut out = [MaybeUninit::<PyRawFrame>::uninit(); 8];
        let mut log = PyReplayLog::EMPTY;
        let mut walk = |frames: &Vec<[u64; 11]>| {
            // SAFETY: every address is in `code` or `frames`, alive.
            let n = unsafe {
                walk_frames::<INTERPRETER_314>(&l, code_type, frame(frames, 0), &mut out, &mut log, 0)
            };
            let got = out[..n]
                .iter()
                // SAFETY: the walk wrote `out[..n]`.
                .map(|f| unsafe { f.assume_init() })
                .map(|f| (f.code as usize, f.guard, f.offset))
                .collect::<Vec<_>>();
            (got, log.generation)
        };
        let (first, g1) = walk(&frames);
        assert_eq!(first.iter().map(|f| f.2).collect::<Vec<_>>(), [0, 2, 4]);
        assert!(first.iter().all(|f| f.0 == code_addr && f.1 == first[0].1));
        // Unchanged: replayed, the same generation.
        assert_eq!(walk(&frames), (first.clone(), g1));
        // The code object's name changes (a new object at the address):
        // walked again, with the new guard.
        code[128 / 8] = 0x3000;
        let (again, g2) = walk(&frames);
        assert_ne!(g2, g1);
        assert_eq!(again.len(), 3);
        assert!(again.iter().all(|f| f.1 != first[0].1));
    }
}

/// Replay against full walks of 3.11 and 3.14 chains in memory: each word
/// a walk reads, changed alone, must make the next capture walk again and
/// see it; unchanged, the capture is a replay (same generation). Each
/// test here failed with the check it guards taken out of `replay`.
#[cfg(test)]
mod replay_tests {
    use super::*;
    use cudaleak_core::record::python::eval_groups;

    /// What a capture returned: (code, guard, offset, flags) per frame,
    /// the generation, and the log's group count.
    type Got = (Vec<(usize, u64, u32, u32)>, u64, usize);

    /// # Safety
    /// `head` is 0 or a frame of a chain in live memory laid out as `l`
    /// says, whose code objects have type `code_type`.
    unsafe fn capture_from<const MODEL: u8>(
        l: &PyLayout,
        code_type: usize,
        head: usize,
        log: &mut PyReplayLog,
    ) -> Got {
        // SAFETY: the contract.
        unsafe { capture_within::<MODEL>(l, code_type, head, log, 16) }
    }

    /// As `capture_from`, into `out_len` frames at most.
    ///
    /// # Safety
    /// As `capture_from`.
    unsafe fn capture_within<const MODEL: u8>(
        l: &PyLayout,
        code_type: usize,
        head: usize,
        log: &mut PyReplayLog,
        out_len: usize,
    ) -> Got {
        let mut out = [MaybeUninit::<PyRawFrame>::uninit(); 16];
        let out = &mut out[..out_len];
        // SAFETY: the contract.
        let n = unsafe { walk_frames::<MODEL>(l, code_type, head, out, log, 0) };
        let frames: Vec<PyRawFrame> = out[..n]
            .iter()
            // SAFETY: the walk wrote `out[..n]`.
            .map(|f| unsafe { f.assume_init() })
            .collect();
        assert_eq!(log.eval_groups(), eval_groups(&frames).len());
        let frames = frames
            .iter()
            .map(|f| (f.code as usize, f.guard, f.offset, f.flags))
            .collect();
        (frames, log.generation, log.eval_groups())
    }

    /// CPython 3.11 (x86-64): code objects with their type, qualname and
    /// line table (the guard) and `_co_firsttraceable`, code at 184;
    /// `_PyInterpreterFrame`s with f_code at 32, previous at 48,
    /// prev_instr at 56, is_entry at 68 and owner at 69.
    struct Chain311 {
        codes: Vec<[u64; 40]>,
        frames: Vec<[u64; 9]>,
    }

    impl Chain311 {
        /// `codes` code objects of type `code_type` (and guard words
        /// 0x1000 + i, 0x2000 + i), `frames` zeroed frames.
        fn new(codes: usize, frames: usize, code_type: usize) -> Chain311 {
            let mut c = Chain311 {
                codes: vec![[0u64; 40]; codes],
                frames: vec![[0u64; 9]; frames],
            };
            for (i, code) in c.codes.iter_mut().enumerate() {
                code[1] = code_type as u64;
                code[128 / 8] = 0x1000 + i as u64;
                code[136 / 8] = 0x2000 + i as u64;
            }
            c
        }
        fn code(&self, i: usize) -> usize {
            self.codes[i].as_ptr() as usize
        }
        fn frame(&self, i: usize) -> usize {
            self.frames[i].as_ptr() as usize
        }
        fn set_frame(&mut self, i: usize, code: usize, offset: usize, entry: u64, owner: u64) {
            let f = &mut self.frames[i];
            f[32 / 8] = code as u64;
            f[56 / 8] = (code + 184 + offset) as u64;
            f[64 / 8] = entry << 32 | owner << 40;
        }
        fn link(&mut self, i: usize, next: usize) {
            self.frames[i][48 / 8] = next as u64;
        }
    }

    #[test]
    fn a_3_11_replay_sees_each_frame_word_entry_and_owner_byte_and_guard_change() {
        let l = &PY311;
        static CODE_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        // Code objects A, B, C, D (incomplete below offset 6), E.
        let mut c = Chain311::new(5, 5, code_type);
        c.codes[3][168 / 8] = 3; // `_co_firsttraceable`, in code units
        let (a, b, cc, d, e) = (c.code(0), c.code(1), c.code(2), c.code(3), c.code(4));
        // innermost A; D in its prelude (skipped); B twice (a recursion,
        // the outer one entered from C); C outermost.
        c.set_frame(0, a, 10, 0, 0);
        c.set_frame(1, d, 2, 0, 0);
        c.set_frame(2, b, 4, 0, 0);
        c.set_frame(3, b, 6, 1, 0);
        c.set_frame(4, cc, 8, 0, 0);
        for i in 0..4 {
            let next = c.frame(i + 1);
            c.link(i, next);
        }
        let head = c.frame(0);
        let mut log = PyReplayLog::EMPTY;
        let mut capture = |c: &Chain311| {
            let _ = c;
            // SAFETY: every address is in `c.codes` or `c.frames`, alive.
            unsafe { capture_from::<INTERPRETER_311>(l, code_type, head, &mut log) }
        };
        let guard_of = |c: &Chain311, i: usize| c.codes[i][16] ^ c.codes[i][17].rotate_left(32);
        let expected = |c: &Chain311| {
            vec![
                (a, guard_of(c, 0), 10, 0),
                (b, guard_of(c, 1), 4, 0),
                (b, guard_of(c, 1), 6, PY_FRAME_ENTRY),
                (cc, guard_of(c, 2), 8, PY_FRAME_ENTRY),
            ]
        };
        let (first, g1, groups) = capture(&c);
        assert_eq!((first.clone(), groups), (expected(&c), 2));
        // Unchanged: a replay (the same generation), the same frames.
        assert_eq!(capture(&c), (first.clone(), g1, 2));

        // Each change: walked again (a new generation), and seen; then
        // changed back: walked again, the first frames.
        let mut check = |c: &mut Chain311,
                         what: &str,
                         change: &dyn Fn(&mut Chain311),
                         frames: Vec<(usize, u64, u32, u32)>| {
            let saved = (c.codes.clone(), c.frames.clone());
            change(c);
            let (got, g, groups) = capture(c);
            assert_ne!(g, g1, "{what}: replayed");
            assert_eq!(got, frames, "{what}");
            let mut own_log = PyReplayLog::EMPTY;
            // SAFETY: as for `capture`; a walk with a log of its own.
            let fresh = unsafe { capture_from::<INTERPRETER_311>(l, code_type, head, &mut own_log) };
            assert_eq!(
                (&got, groups),
                (&fresh.0, fresh.2),
                "{what}: not what a walk sees"
            );
            assert_eq!(groups, eval_groups_of(&got), "{what}");
            // The log of the changed chain replays it.
            assert_eq!(capture(c), (got, g, groups), "{what}: not replayed");
            c.codes.copy_from_slice(&saved.0);
            c.frames.copy_from_slice(&saved.1);
            let (back, g_back, _) = capture(c);
            assert_ne!(g_back, g, "{what}: changed back, replayed");
            assert_eq!(back, first, "{what}: changed back");
        };
        let ex = expected(&c);
        // The outermost frame's instruction (a word deep in the chain).
        let mut changed = ex.clone();
        changed[3].2 = 12;
        check(&mut c, "instruction", &|c| c.set_frame(4, cc, 12, 0, 0), changed);
        // A `previous` word: the outer B frame left out.
        let changed = vec![ex[0], ex[1], ex[3]];
        check(
            &mut c,
            "previous",
            &|c| {
                let next = c.frame(4);
                c.link(2, next)
            },
            changed,
        );
        // An entry flag cleared, and one set.
        let mut changed = ex.clone();
        changed[2].3 = 0;
        check(
            &mut c,
            "is_entry cleared",
            &|c| c.set_frame(3, b, 6, 0, 0),
            changed,
        );
        let mut changed = ex.clone();
        changed[0].3 = PY_FRAME_ENTRY;
        check(&mut c, "is_entry set", &|c| c.set_frame(0, a, 10, 1, 0), changed);
        // The owner byte: D owned by a generator is never incomplete.
        let changed = vec![ex[0], (d, guard_of(&c, 3), 2, 0), ex[1], ex[2], ex[3]];
        check(&mut c, "owner", &|c| c.set_frame(1, d, 2, 0, 1), changed);
        // Another code object in the innermost frame (A stays alive: only
        // the frame's code word tells), its instruction in E's code; and
        // alone, the instruction left in A's (a frame not started, or an
        // offset out of E: what the walk makes of it, which depends on
        // where E lies).
        let mut changed = ex.clone();
        changed[0] = (e, guard_of(&c, 4), 10, 0);
        check(
            &mut c,
            "code and instruction",
            &|c| c.set_frame(0, e, 10, 0, 0),
            changed,
        );
        let mut changed = ex.clone();
        if e > a {
            changed.remove(0);
        } else {
            changed[0] = (e, guard_of(&c, 4), (a - e + 10) as u32, 0);
        }
        check(&mut c, "code word", &|c| c.frames[0][32 / 8] = e as u64, changed);
        // A new code object at A's address (its qualname differs), and at
        // B's, the recursion's (its line table differs), and at C's, the
        // last one checked.
        for (i, what) in [(0, "A replaced"), (1, "B replaced"), (2, "C replaced")] {
            let mut changed = ex.clone();
            let new_guard = {
                let mut n = c.codes[i];
                n[16 + (i == 1) as usize] ^= 0x40;
                n[16] ^ n[17].rotate_left(32)
            };
            for f in changed.iter_mut().filter(|f| f.0 == c.code(i)) {
                f.1 = new_guard;
            }
            check(
                &mut c,
                what,
                &|c| c.codes[i][16 + (i == 1) as usize] ^= 0x40,
                changed,
            );
        }
    }

    /// A random chain in memory under layout `l`, changed one random way
    /// at a time: after each change a capture with the thread's log must
    /// return what a walk with a fresh log returns, and with no change it
    /// must be a replay (when the last walk was logged).
    fn differential<const MODEL: u8>(l: &PyLayout, seed: u64, rounds: usize) -> (usize, usize) {
        static CODE_TYPE_OBJECT: u64 = 0;
        static OTHER_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        let other_type = &OTHER_TYPE_OBJECT as *const u64 as usize;
        let mut state = seed;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let code_start = l.code_code_adaptive.unwrap_or(0);
        let first_traceable = l.code_first_traceable.unwrap_or(0);
        let mut codes = vec![[0u64; 40]; CODES];
        let mut frames = vec![[0u64; 12]; 14];
        let code_addr = |codes: &Vec<[u64; 40]>, i: usize| codes[i].as_ptr() as usize;
        let frame_addr = |frames: &Vec<[u64; 12]>, i: usize| frames[i].as_ptr() as usize;
        for (i, c) in codes.iter_mut().enumerate() {
            c[1] = code_type as u64;
            c[128 / 8] = 0x1000 + i as u64;
            c[136 / 8] = 0x2000 + i as u64;
            c[first_traceable / 8] = [0, 0, 2][i % 3];
        }
        // 3.13+: one object that is not a code object, at first.
        if MODEL >= INTERPRETER_313 {
            codes[5][1] = other_type as u64;
        }
        let owners: &[u64] = match MODEL {
            INTERPRETER_311 => &[0, 0, 0, 1],
            INTERPRETER_314 => &[0, 0, 0, 1, 3, 4],
            _ => &[0, 0, 0, 1, 3],
        };
        // (code index, instruction offset, entry, owner, tag) of a frame
        type Words = (usize, i64, u64, u64, usize);
        let write = |frames: &mut Vec<[u64; 12]>, codes: &Vec<[u64; 40]>, i: usize, w: Words| {
            let (c, offset, entry, owner, tag) = w;
            let code = code_addr(codes, c);
            let base = frames[i].as_mut_ptr() as usize;
            let exe = if tag == 3 { 0x7003 } else { code | tag };
            let instr = (code + code_start) as i64 + offset;
            // SAFETY: offsets of the layout, all inside the 96-byte frame
            // (`frames[i]`), written as the interpreter would.
            unsafe {
                ((base + l.frame_code) as *mut usize).write_unaligned(exe);
                ((base + l.frame_instr) as *mut i64).write_unaligned(instr);
                if let Some(at) = l.frame_is_entry {
                    ((base + at) as *mut u8).write(entry as u8);
                }
                ((base + l.frame_owner.unwrap_or(0)) as *mut u8).write(owner as u8);
            }
        };
        let link = |frames: &mut Vec<[u64; 12]>, chain: &[usize]| {
            for (k, &i) in chain.iter().enumerate() {
                let next = chain.get(k + 1).map_or(0, |&j| frames[j].as_ptr() as usize);
                let base = frames[i].as_mut_ptr() as usize;
                // SAFETY: `previous` inside the frame, as above.
                unsafe { ((base + l.frame_back) as *mut usize).write_unaligned(next) };
            }
        };
        let random_words = |rand: &mut dyn FnMut(u64) -> u64| -> Words {
            let tag = if MODEL == INTERPRETER_314 {
                // borrowed (1) or owned references, rarely a tagged int (3)
                if rand(24) == 0 {
                    3
                } else {
                    rand(2) as usize
                }
            } else {
                0
            };
            (
                rand(CODES as u64) as usize,
                rand(24) as i64 - 4,
                u64::from(MODEL == INTERPRETER_311 && rand(3) == 0),
                owners[rand(owners.len() as u64) as usize],
                tag,
            )
        };
        let mut words: Vec<Words> = (0..frames.len()).map(|_| random_words(&mut rand)).collect();
        // Recursions: runs of one code object.
        let new_chain = |rand: &mut dyn FnMut(u64) -> u64| {
            let mut pool: Vec<usize> = (0..14).collect();
            let len = 1 + rand(12) as usize;
            (0..len)
                .map(|_| pool.remove(rand(pool.len() as u64) as usize))
                .collect::<Vec<_>>()
        };
        let mut chain = new_chain(&mut rand);
        for (i, &w) in words.iter().enumerate() {
            write(&mut frames, &codes, i, w);
        }
        link(&mut frames, &chain);
        let mut log = PyReplayLog::EMPTY;
        let mut last_generation = 0;
        let mut replays = 0;
        let patches = PATCHES.with(|c| c.get());
        // Guard words given to new code objects, never repeated.
        let mut fresh = 1u64 << 40;
        for round in 0..rounds {
            // One change, or two (the innermost frame's and another).
            let change = rand(14);
            let also = if change >= 2 && rand(2) == 0 {
                2 + rand(12)
            } else {
                change
            };
            for change in [change, also].into_iter().take(1 + usize::from(also != change)) {
                match change {
                    0 | 1 => {}
                    2 => {
                        let i = chain[rand(chain.len() as u64) as usize];
                        words[i].1 = rand(24) as i64 - 4;
                    }
                    3 => {
                        let i = chain[rand(chain.len() as u64) as usize];
                        let old = words[i].0;
                        words[i].0 = rand(CODES as u64) as usize;
                        if rand(2) == 0 {
                            // the same code object as the frame after it or
                            // before it: a recursion
                            let k = chain.iter().position(|&f| f == i).unwrap_or(0);
                            let j = if rand(2) == 0 {
                                chain.get(k + 1)
                            } else {
                                k.checked_sub(1).map(|k| &chain[k])
                            };
                            if let Some(&j) = j {
                                words[i].0 = words[j].0;
                            }
                        }
                        if rand(2) == 0 {
                            // the code word alone: the instruction word kept
                            words[i].1 +=
                                code_addr(&codes, old) as i64 - code_addr(&codes, words[i].0) as i64;
                        }
                    }
                    4 => {
                        let i = chain[rand(chain.len() as u64) as usize];
                        words[i].2 ^= u64::from(MODEL == INTERPRETER_311);
                        words[i].3 = owners[rand(owners.len() as u64) as usize];
                    }
                    5 => {
                        // A new code object at an old one's address: its
                        // guard differs, and maybe its first traceable one.
                        let c = rand(CODES as u64) as usize;
                        // (A value never used before: two changes in a round
                        // must not cancel, leaving a new object with the old
                        // guard, which replay takes for the old object.)
                        fresh += 1;
                        codes[c][16 + rand(2) as usize] = fresh;
                        if rand(2) == 0 {
                            codes[c][first_traceable / 8] = rand(3);
                        }
                    }
                    6 => chain = new_chain(&mut rand),
                    10 => {
                        // Other innermost frames over the same outer ones: a
                        // call from another line, deeper or less deep.
                        let k = rand(chain.len() as u64) as usize;
                        let mut inner: Vec<usize> = (0..14).filter(|f| !chain.contains(f)).collect();
                        inner.truncate(rand(3) as usize);
                        for &f in &inner {
                            words[f] = random_words(&mut rand);
                        }
                        chain.splice(..k, inner);
                        if chain.is_empty() {
                            chain = new_chain(&mut rand);
                        }
                    }
                    11..=13 => {
                        // The innermost frame at another line, or running
                        // another code object (a loop that allocates from two
                        // lines or calls in turn).
                        let i = chain[0];
                        if rand(2) == 0 {
                            words[i].1 = rand(24) as i64 - 4;
                        } else {
                            words[i].0 = rand(CODES as u64) as usize;
                        }
                    }
                    7 => {
                        let k = rand(chain.len() as u64) as usize;
                        if chain.len() > 1 && rand(2) == 0 {
                            chain.remove(k);
                        } else if let Some(f) = (0..14).find(|f| !chain.contains(f)) {
                            chain.insert(k, f);
                        }
                    }
                    8 => {
                        let i = chain[rand(chain.len() as u64) as usize];
                        words[i] = random_words(&mut rand);
                    }
                    9 => {
                        // 3.13+: a new object at an old one's address, a code
                        // object where none was or none where one was (the
                        // guard, the identity replay relies on, differs:
                        // `guard`).
                        if MODEL >= INTERPRETER_313 {
                            let c = rand(CODES as u64) as usize;
                            fresh += 1;
                            codes[c][16] = fresh;
                            codes[c][1] = if codes[c][1] == code_type as u64 {
                                other_type as u64
                            } else {
                                code_type as u64
                            };
                        }
                    }
                    _ => unreachable!(),
                }
            }
            for (i, &w) in words.iter().enumerate() {
                write(&mut frames, &codes, i, w);
            }
            link(&mut frames, &chain);
            let head = frame_addr(&frames, chain[0]);
            let was_logged = log.visited > 0;
            // Mostly room for all frames; sometimes not (the walk stops
            // where `out` is full).
            let out_len = if rand(4) == 0 { 1 + rand(12) as usize } else { 16 };
            // SAFETY: every address in the chain is in `frames` or `codes`,
            // alive; tagged ints end the walk.
            let got = unsafe { capture_within::<MODEL>(l, code_type, head, &mut log, out_len) };
            let mut own_log = PyReplayLog::EMPTY;
            // SAFETY: as above.
            let fresh = unsafe { capture_within::<MODEL>(l, code_type, head, &mut own_log, out_len) };
            assert_eq!(
                (&got.0, got.2),
                (&fresh.0, fresh.2),
                "round {round}, change {change}"
            );
            assert!(
                got.0.iter().all(|f| f.3 & !PY_FRAME_ENTRY == 0),
                "flags: {:?}",
                got.0
            );
            if change <= 1 && was_logged && out_len == 16 {
                assert_eq!(got.1, last_generation, "round {round}: unchanged, not replayed");
                replays += 1;
            }
            last_generation = got.1;
        }
        (replays, PATCHES.with(|c| c.get()) - patches)
    }

    /// Runs `differential` over SEEDS seeds and checks that replays and
    /// patched heads came (that the test tests them, not only walks).
    fn differential_seeds<const MODEL: u8>(l: &PyLayout) {
        let rounds = 500;
        let (mut replays, mut patches) = (0, 0);
        for seed in 1..=SEEDS {
            let (r, p) = differential::<MODEL>(l, seed * 0x9e37_79b9_7f4a_7c15, rounds);
            replays += r;
            patches += p;
        }
        let runs = SEEDS as usize * rounds;
        assert!(replays > runs / 20, "only {replays} replays in {runs} rounds");
        assert!(
            patches > runs / 100,
            "only {patches} heads patched in {runs} rounds"
        );
    }

    /// Seeds of each model's differential test (about 1 s in all).
    const SEEDS: u64 = 3000;
    /// Code objects of the differential test's chains.
    const CODES: usize = 12;

    #[test]
    fn replay_returns_what_a_walk_returns_on_random_3_11_chains() {
        differential_seeds::<INTERPRETER_311>(&PY311);
    }

    #[test]
    fn replay_returns_what_a_walk_returns_on_random_3_12_chains() {
        differential_seeds::<INTERPRETER_312>(&crate::capture::python_layouts::PY312);
    }

    #[test]
    fn replay_returns_what_a_walk_returns_on_random_3_14_chains() {
        let l = PyLayout {
            minor: 14,
            frames: FrameModel::Interpreter314,
            executable_tag_mask: 3,
            frame_owner: Some(74),
            owner_c_entry: Some(3),
            code_code_adaptive: Some(208),
            code_first_traceable: Some(192),
            ..crate::capture::python_layouts::PY313
        };
        differential_seeds::<INTERPRETER_314>(&l);
    }

    fn eval_groups_of(frames: &[(usize, u64, u32, u32)]) -> usize {
        frames.iter().filter(|f| f.3 & PY_FRAME_ENTRY != 0).count()
    }

    /// 3.13+: an executable that is not a code object is skipped; one that
    /// has become a code object since (a new object at the address) is a
    /// frame of the next capture.
    #[test]
    fn a_3_14_replay_sees_an_executable_become_a_code_object() {
        let l = PyLayout {
            minor: 14,
            frames: FrameModel::Interpreter314,
            executable_tag_mask: 3,
            frame_owner: Some(74),
            code_code_adaptive: Some(208),
            code_first_traceable: Some(192),
            ..crate::capture::python_layouts::PY313
        };
        static CODE_TYPE_OBJECT: u64 = 0;
        static OTHER_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        let other_type = &OTHER_TYPE_OBJECT as *const u64 as usize;
        let mut objects = vec![[0u64; 40]; 2];
        for (i, o) in objects.iter_mut().enumerate() {
            o[1] = code_type as u64;
            o[128 / 8] = 0x1000 + i as u64;
            o[136 / 8] = 0x2000 + i as u64;
        }
        objects[1][1] = other_type as u64; // not a code object (yet)
        let obj = |objects: &Vec<[u64; 40]>, i: usize| objects[i].as_ptr() as usize;
        let (a, x) = (obj(&objects, 0), obj(&objects, 1));
        let mut frames = vec![[0u64; 11]; 3];
        let frame = |frames: &Vec<[u64; 11]>, i: usize| frames[i].as_ptr() as usize;
        // (executable, instruction offset, owner): A; X; the entry frame
        let chain = [(a, 4, 0u64), (x, 2, 0), (0x5000 | 1, 0, 3)];
        for (i, &(exe, offset, owner)) in chain.iter().enumerate() {
            let next = if i + 1 < chain.len() {
                frame(&frames, i + 1)
            } else {
                0
            };
            let f = &mut frames[i];
            f[0] = exe as u64;
            f[1] = next as u64;
            f[56 / 8] = ((exe & !3) + 208 + offset) as u64;
            f[72 / 8] = owner << 16;
        }
        let mut log = PyReplayLog::EMPTY;
        let head = frame(&frames, 0);
        let mut capture = |objects: &Vec<[u64; 40]>| {
            let _ = objects;
            // SAFETY: every address is in `objects` or `frames`, alive.
            unsafe { capture_from::<INTERPRETER_314>(&l, code_type, head, &mut log) }
        };
        let (first, g1, groups) = capture(&objects);
        assert_eq!(first.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(), [(a, 4)]);
        assert_eq!(groups, 1);
        assert_eq!(capture(&objects), (first, g1, 1));
        objects[1][1] = code_type as u64;
        let (now, g2, groups) = capture(&objects);
        assert_ne!(g2, g1);
        assert_eq!(
            now.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(),
            [(a, 4), (x, 2)]
        );
        assert_eq!(groups, 1);
    }

    /// The group count is the last capture's, 0 after one that returned no
    /// frames without walking (`forget`) and after an empty chain.
    #[test]
    fn the_group_count_is_the_last_captures() {
        let l = &PY311;
        static CODE_TYPE_OBJECT: u64 = 0;
        let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
        let mut c = Chain311::new(1, 3, code_type);
        let a = c.code(0);
        // three frames of A, each entered from C: three groups
        for i in 0..3 {
            c.set_frame(i, a, 2 * i, 1, 0);
            let next = if i < 2 { c.frame(i + 1) } else { 0 };
            c.link(i, next);
        }
        let mut log = PyReplayLog::EMPTY;
        // SAFETY: every address is in `c`, alive.
        let (_, g1, groups) = unsafe { capture_from::<INTERPRETER_311>(l, code_type, c.frame(0), &mut log) };
        assert_eq!(groups, 3);
        // SAFETY: as above.
        let (_, again, _) = unsafe { capture_from::<INTERPRETER_311>(l, code_type, c.frame(0), &mut log) };
        assert_eq!(again, g1);
        assert_eq!(log.eval_groups(), 3);
        // Another head: walked, not replayed.
        // SAFETY: as above.
        let (_, g2, groups) = unsafe { capture_from::<INTERPRETER_311>(l, code_type, c.frame(1), &mut log) };
        assert_ne!(g2, g1);
        assert_eq!(groups, 2);
        log.forget();
        assert_eq!(log.eval_groups(), 0);
        // SAFETY: as above: walked again (the log was forgotten).
        let (_, g3, groups) = unsafe { capture_from::<INTERPRETER_311>(l, code_type, c.frame(1), &mut log) };
        assert_ne!(g3, g2);
        assert_eq!(groups, 2);
        // SAFETY: no chain.
        let none = unsafe { capture_from::<INTERPRETER_311>(l, code_type, 0, &mut log) };
        assert_eq!(none, (vec![], g3 + 1, 0));
    }
}
