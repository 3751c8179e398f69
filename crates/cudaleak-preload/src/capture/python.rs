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
use crate::capture::python_layouts::{layout_for, FrameModel, PyLayout};
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
static STATUS: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

type TstateFn = unsafe extern "C" fn() -> usize;
type FinalizingFn = unsafe extern "C" fn() -> libc::c_int;

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
/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire): `probe` stored the
/// getters and `LAYOUT` before it (Release).
unsafe fn this_thread_state() -> usize {
    // SAFETY: ACTIVE implies a non-zero address of
    // `PyGILState_GetThisThreadState`, found by dlsym in `probe`; its C
    // type is `PyThreadState *(void)`, a `TstateFn`.
    let get_this: TstateFn = unsafe { std::mem::transmute(GET_THIS_THREAD_STATE.load(Ordering::Relaxed)) };
    // SAFETY: it reads this thread's slot of the interpreter's TSS key; it
    // takes neither the GIL nor a lock, from any thread (rule 2).
    let ours = unsafe { get_this() };
    let unchecked = GET_UNCHECKED.load(Ordering::Relaxed);
    if unchecked != 0 {
        // SAFETY: non-zero, so the address of
        // `_PyThreadState_UncheckedGet`/`PyThreadState_GetUnchecked` that
        // `probe` found, also `PyThreadState *(void)`.
        let get: TstateFn = unsafe { std::mem::transmute(unchecked) };
        // SAFETY: a read of the runtime's current (3.12+: thread-local)
        // thread state, no check, no lock (rule 2).
        let attached = unsafe { get() };
        // 3.12+: the attached state is thread-local and so always ours;
        // before 3.12 it is the GIL holder's, ours only when equal.
        // SAFETY: ACTIVE implies LAYOUT points to a static table or a
        // layout leaked in `choose_layout`, never freed.
        let layout = unsafe { &*LAYOUT.load(Ordering::Relaxed) };
        if attached != 0 && (layout.attached_is_thread_local || attached == ours) {
            return attached;
        }
    }
    ours
}

/// Fills `out` with the calling thread's Python frames, innermost first;
/// returns how many, and their generation: two captures on a thread with
/// the same generation have the same frames (0: none; otherwise the
/// log's, see [`PyReplayLog::generation`]). `held` is the generation
/// whose frames `out` already holds (0: none), and is set to the new one:
/// a replay of the frames `out` holds copies nothing (issue 24: a stack
/// buffer, taken in turn, usually holds the same frames as the last time).
#[inline]
pub fn capture(out: &mut [MaybeUninit<PyRawFrame>], log: &mut PyReplayLog, held: &mut u64) -> (usize, u64) {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => {}
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
    // SAFETY: see the module comment; every pointer is checked for
    // plausibility and every code object for its type before use.
    let n = unsafe { capture_active(out, log, *held) };
    // A walk that returned frames bumped the generation; a replay kept
    // the one of the walk it repeats.
    let generation = if n == 0 { 0 } else { log.generation };
    *held = generation;
    (n, generation)
}

/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire), on the thread whose
/// stack `out` and `log` belong to (see the module comment).
unsafe fn capture_active(out: &mut [MaybeUninit<PyRawFrame>], log: &mut PyReplayLog, held: u64) -> usize {
    let fin = IS_FINALIZING.load(Ordering::Relaxed);
    if fin != 0 {
        // SAFETY: non-zero, so the address of `Py_IsFinalizing` (3.13+) or
        // `_Py_IsFinalizing` that `probe` found; both are `int (void)`.
        let f: FinalizingFn = unsafe { std::mem::transmute(fin) };
        // SAFETY: a plain read of the runtime's finalizing flag (rule 2).
        if unsafe { f() } != 0 {
            return 0;
        }
    }
    // SAFETY: ACTIVE, as this function's caller guarantees.
    let tstate = unsafe { this_thread_state() };
    if !plausible(tstate, 8) {
        return 0;
    }
    // SAFETY: ACTIVE implies LAYOUT points to a static table or a layout
    // leaked in `choose_layout`, never freed.
    let l = unsafe { &*LAYOUT.load(Ordering::Relaxed) };
    let code_type = CODE_TYPE.load(Ordering::Relaxed);
    // SAFETY: `tstate` is this thread's own `PyThreadState`, live while the
    // thread runs; `l` was checked against this interpreter in `probe`, so
    // the offset is inside it.
    let mut frame: usize = unsafe { read(tstate + l.tstate_frame) };
    if let Some(cur) = l.cframe_current_frame {
        if !plausible(frame, 8) {
            return 0;
        }
        // SAFETY: 3.11 and 3.12: `frame` is the thread state's `cframe`, a
        // `_PyCFrame` in the thread state (`root_cframe`) or on this
        // thread's C stack in an eval loop below us, so live.
        frame = unsafe { read(frame + cur) };
    }
    // SAFETY: `frame` is this thread's innermost Python frame read under
    // the checked layout `l` of this interpreter, and `code_type` its
    // `PyCode_Type`: the contract of `walk_frames`. The chain is frozen
    // while this thread runs the hook (module comment, rule 1).
    unsafe {
        match l.frames {
            FrameModel::FrameObjects => walk_frames::<FRAME_OBJECTS>(l, code_type, frame, out, log, held),
            FrameModel::Interpreter311 => walk_frames::<INTERPRETER_311>(l, code_type, frame, out, log, held),
            FrameModel::Interpreter312 => walk_frames::<INTERPRETER_312>(l, code_type, frame, out, log, held),
            FrameModel::Interpreter313 => walk_frames::<INTERPRETER_313>(l, code_type, frame, out, log, held),
            FrameModel::Interpreter314 => walk_frames::<INTERPRETER_314>(l, code_type, frame, out, log, held),
        }
    }
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
pub struct PyReplayLog {
    /// frames visited; 0 when the log is not usable
    visited: usize,
    /// the chain's innermost frame, where the logged walk started
    head: usize,
    /// Bumped by every full walk (logged or not), kept by a replay: a
    /// capture's frames are those of the walk that made its generation,
    /// so a trace is reused by comparing generations, not frames
    /// (`capture.rs`, issue 24).
    generation: u64,
    visits: [Visit; PY_REPLAY_FRAMES],
    recorded: usize,
    out: [PyRawFrame; PY_REPLAY_FRAMES],
}

const PY_REPLAY_FRAMES: usize = 32;

/// One frame a walk visited. Its address is not kept: the first is the
/// log's `head`, each later one the `next` word of the one before, which
/// replay has just checked (one load less a frame; issue 24).
#[derive(Clone, Copy)]
struct Visit {
    next: usize,
    code: usize,
    instr: usize,
    /// owner | is_entry << 8 (interpreter frames)
    bytes: u16,
    /// what the walk made of the frame, and so what else replay checks
    fate: Fate,
    /// the guard, for frames whose code object the walk used
    guard: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// a C-stack shim frame: owner byte only
    Shim,
    /// 3.13: not a code object: still not one
    NotCode,
    /// recorded, or skipped as not started or incomplete: same code object
    UsedCode,
    /// as `UsedCode`, running the code object of the `UsedCode` visit
    /// before it (a recursion): the frame's code word is checked, the
    /// guard was checked there (an object at one address at one time is
    /// one object), so replay reads no code object for it (issue 24)
    SameCode,
}

impl PyReplayLog {
    pub const EMPTY: PyReplayLog = PyReplayLog {
        visited: 0,
        generation: 0,
        head: 0,
        visits: [Visit {
            next: 0,
            code: 0,
            instr: 0,
            bytes: 0,
            fate: Fate::Shim,
            guard: 0,
        }; PY_REPLAY_FRAMES],
        recorded: 0,
        out: [PyRawFrame {
            code: 0,
            guard: 0,
            offset: 0,
            flags: 0,
        }; PY_REPLAY_FRAMES],
    };
}

/// The words of a frame that decide what the walk makes of it.
///
/// # Safety
/// `frame` is a live frame (frame object or interpreter frame, as `MODEL`
/// says) of the calling thread's chain, and `l` the layout checked against
/// the running interpreter, so that each offset below lies in the frame.
#[inline(always)]
unsafe fn frame_words<const MODEL: u8>(l: &PyLayout, frame: usize) -> (usize, usize, usize, u16) {
    // SAFETY: fields of the live `frame` at the checked layout's offsets,
    // per the contract; plain words and bytes (so for the reads below).
    let next: usize = unsafe { read(frame + l.frame_back) };
    // SAFETY: as above.
    let code: usize = unsafe { read(frame + l.frame_code) };
    if MODEL == FRAME_OBJECTS {
        // SAFETY: as above (`f_lasti`).
        let lasti: i32 = unsafe { read(frame + l.frame_instr) };
        return (next, code, lasti as usize, 0);
    }
    // 3.14+: a tagged stack reference; all tag bits set is a tagged int,
    // not an object (0: the walk ends there). Only that model's walk
    // carries the test: 3.13's costs what it did.
    let code = if MODEL == INTERPRETER_314 {
        let tags = l.executable_tag_mask;
        if code & tags == tags {
            0
        } else {
            code & !tags
        }
    } else {
        code
    };
    // SAFETY: as above (`instr_ptr`/`prev_instr`).
    let instr: usize = unsafe { read(frame + l.frame_instr) };
    // SAFETY: as above (`owner`; 3.11+ layouts all have it, offset 0 is
    // the frame's first byte otherwise).
    let owner: u8 = unsafe { read(frame + l.frame_owner.unwrap_or(0)) };
    let entry: u8 = if MODEL == INTERPRETER_311 {
        // SAFETY: as above (3.11's `is_entry`).
        unsafe { read(frame + l.frame_is_entry.unwrap_or(0)) }
    } else {
        0
    };
    (next, code, instr, owner as u16 | (entry as u16) << 8)
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
) -> Option<usize> {
    if log.visited == 0 || log.head != frame || log.recorded > out.len() {
        return None;
    }
    let mut at = frame;
    for v in &log.visits[..log.visited] {
        // SAFETY: `at` is first `frame`, the chain's head (checked equal to
        // the logged walk's above), then the `next` word just read from
        // its predecessor and checked: a live frame of this thread's chain.
        if unsafe { frame_words::<MODEL>(l, at) } != (v.next, v.code, v.instr, v.bytes) {
            return None;
        }
        // Tested in the order of how often they come (a recursion's frames
        // are `SameCode`): a jump table cost 5 instructions a frame.
        if v.fate == Fate::UsedCode {
            // SAFETY: `v.code` is the frame's code word as read just now,
            // which the logging walk found plausible and a code object
            // (type-checked, or trusted under the checked layout as in
            // `walk_frames`): the object a live frame executes, so live.
            if unsafe { guard(l, v.code) } != v.guard {
                return None;
            }
        } else if v.fate == Fate::NotCode {
            // SAFETY: as above, a live object (not a code object), whose
            // `ob_type` is at the layout's offset.
            if unsafe { read::<usize>(v.code + l.ob_type) } == code_type {
                return None;
            }
        }
        at = v.next;
    }
    // `out` may hold this very walk's frames already (`capture`'s `held`).
    if held != log.generation {
        for (slot, f) in out.iter_mut().zip(&log.out[..log.recorded]) {
            slot.write(*f);
        }
    }
    Some(log.recorded)
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
#[inline(never)]
unsafe fn walk_frames<const MODEL: u8>(
    l: &PyLayout,
    code_type: usize,
    mut frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
    held: u64,
) -> usize {
    // SAFETY: this function's own contract, which `replay` shares.
    if let Some(n) = unsafe { replay::<MODEL>(l, code_type, log, frame, out, held) } {
        return n;
    }
    log.generation += 1;
    let interpreter_frames = MODEL != FRAME_OBJECTS;
    let owner_c_entry = l.owner_c_entry.unwrap_or(u8::MAX);
    let owner_generator = l.owner_generator.unwrap_or(u8::MAX);
    let ob_type = l.ob_type;
    let code_start = l.code_code_adaptive.unwrap_or(0);
    let first_traceable_at = l.code_first_traceable;
    let lasti_unit_bytes = l.lasti_unit_bytes;

    let head = frame;
    let mut n = 0;
    let mut visited = 0;
    // The walk is logged only if it ends where the chain ends.
    let mut loggable = true;
    // A chain longer than this is corrupt (or a recursion we cut).
    let mut budget = 4096;
    // The first code object is checked by type: a wrong layout stops here.
    let mut checked = false;
    // The code object of the last visit that used one (see `SameCode`).
    let mut last_used_code = 0;
    while plausible(frame, 8) && budget > 0 {
        if n == out.len() {
            loggable = false;
            break;
        }
        budget -= 1;
        // SAFETY: `frame` is plausible and is the head or a `previous` word
        // of this thread's frozen chain (the contract).
        let (next, code, instr, bytes) = unsafe { frame_words::<MODEL>(l, frame) };
        let owner = bytes as u8;
        let mut visit = Visit {
            next,
            code,
            instr,
            bytes,
            fate: Fate::Shim,
            guard: 0,
        };
        let mut log_visit = |visit: Visit| {
            if visited < PY_REPLAY_FRAMES {
                log.visits[visited] = visit;
            } else {
                loggable = false;
            }
            visited += 1;
        };
        if MODEL >= INTERPRETER_312 && owner >= owner_c_entry {
            // (1)
            if n > 0 {
                // SAFETY: `out[..n]` were written by this walk.
                unsafe { out[n - 1].assume_init_mut() }.flags |= PY_FRAME_ENTRY;
            }
            log_visit(visit);
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
                    visit.fate = Fate::NotCode;
                    log_visit(visit);
                    frame = next; // (2)
                    continue;
                }
                loggable = false;
                break;
            }
            checked = true;
        }
        visit.fate = if code == last_used_code {
            Fate::SameCode
        } else {
            Fate::UsedCode
        };
        last_used_code = code;
        // SAFETY: a live code object: its type checked above (before 3.13,
        // the first one checked proves the layout, and a frame's code word
        // is a code object there by construction).
        visit.guard = unsafe { guard(l, code) };
        log_visit(visit);
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
        } else if MODEL == INTERPRETER_311 && bytes >> 8 != 0 {
            PY_FRAME_ENTRY
        } else {
            0
        };
        out[n].write(PyRawFrame {
            code: code as u64,
            guard: visit.guard,
            offset,
            flags,
        });
        n += 1;
        frame = next;
    }
    if n > 0 {
        // The outermost frame was entered from C (the interpreter's main).
        // SAFETY: `out[..n]` were written by this walk.
        unsafe { out[n - 1].assume_init_mut() }.flags |= PY_FRAME_ENTRY;
    }
    if loggable && budget > 0 && visited > 0 && n <= PY_REPLAY_FRAMES {
        log.visited = visited;
        log.head = head;
        log.recorded = n;
        for (slot, f) in log.out.iter_mut().zip(&out[..n]) {
            // SAFETY: `out[..n]` were written by this walk.
            *slot = unsafe { f.assume_init() };
        }
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
    /// reading that code object once (`Fate::SameCode`), and a changed
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
