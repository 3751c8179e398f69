//! The frame walk: the calling thread's Python frames, replayed from one
//! of its logs when unchanged, patched or walked in full otherwise.

use super::code::guard;
use super::frame::{frame_words, owner_of, FrameOffsets, Visit};
use super::interpreter::{
    this_thread_state, FinalizingFn, CODE_TYPE, FINALIZING_WORD, IS_FINALIZING, LAYOUT,
};
use super::memory::{plausible, read};
use super::model::{fixed, FrameModelType};
use super::replay::{patch, replay, Miss};
use super::replay_log::{Guarded, PyReplayLog, PyReplayLogs, PY_LOGS, PY_REPLAY_FRAMES, VISIT_SHIFT};
use crate::capture::looks::pair_mut;
use crate::capture::python_layouts::PyLayout;
use cudaleak_core::record::python::{PyRawFrame, PY_FRAME_ENTRY};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A `capture_active::<M>`, as `probe` stores it in `CAPTURE`.
pub(super) type CaptureFn = unsafe fn(&mut [MaybeUninit<PyRawFrame>], &mut PyReplayLogs) -> usize;

/// The capture for the interpreter's frame model `M` (the layout's):
/// `probe` picks one ([`CAPTURE`](super::interpreter::CAPTURE)). A replay of the last log runs
/// inline here; anything more (the guess first) is another call
/// ([`walk_logs`]).
///
/// # Safety
/// Only once `STATE` was read as ACTIVE (Acquire), on the thread whose
/// stack `out` and `logs` belong to (see the module comment), and with
/// `M` the frame model of `LAYOUT`.
pub(super) unsafe fn capture_active<M: FrameModelType>(
    out: &mut [MaybeUninit<PyRawFrame>],
    logs: &mut PyReplayLogs,
) -> usize {
    let word = FINALIZING_WORD.load(Ordering::Relaxed);
    let finalizing = if word != 0 {
        // SAFETY: the aligned word of `_PyRuntime` that the finalizing
        // getter loads (`finalizing`), static for the interpreter's life;
        // CPython writes it atomically.
        unsafe { (*(word as *const AtomicUsize)).load(Ordering::Relaxed) != 0 }
    } else {
        is_finalizing()
    };
    if finalizing {
        logs.last().forget();
        return 0;
    }
    // SAFETY: ACTIVE implies LAYOUT points to a static table or a layout
    // leaked in `choose_layout`, never freed.
    let l = fixed::<M>(unsafe { &*LAYOUT.load(Ordering::Relaxed) });
    // SAFETY: ACTIVE, as this function's caller guarantees.
    let tstate = unsafe { this_thread_state() };
    if !plausible(tstate, 8) {
        logs.last().forget();
        return 0;
    }
    let code_type = CODE_TYPE.load(Ordering::Relaxed);
    // SAFETY: `tstate` is this thread's own `PyThreadState`, live while the
    // thread runs; `l` was checked against this interpreter in `probe`, so
    // the offset is inside it.
    let mut frame: usize = unsafe { read(tstate + l.tstate_frame) };
    if let Some(cur) = l.cframe_current_frame {
        if !plausible(frame, 8) {
            logs.last().forget();
            return 0;
        }
        // SAFETY: 3.11 and 3.12: `frame` is the thread state's `cframe`, a
        // `_PyCFrame` in the thread state (`root_cframe`) or on this
        // thread's C stack in an eval loop below us, so live.
        frame = unsafe { read(frame + cur) };
    }
    // SAFETY: `frame` is this thread's innermost Python frame read under
    // the checked layout `l` of this interpreter (of model `M`), and
    // `code_type` its `PyCode_Type`: the contract of `walk_logs`. The
    // chain is frozen while this thread runs the hook (module comment,
    // rule 1).
    unsafe { walk_logs::<M>(l, code_type, frame, out, logs) }
}

/// The finalizing getter's answer, where its code did not show the word
/// it loads (`finalizing`). Out of line: most interpreters never call it.
#[cold]
#[inline(never)]
fn is_finalizing() -> bool {
    let fin = IS_FINALIZING.load(Ordering::Relaxed);
    if fin == 0 {
        return false;
    }
    // SAFETY: non-zero, so the address of `Py_IsFinalizing` (3.13+) or
    // `_Py_IsFinalizing` that `probe` found; both are `int (void)`.
    let f: FinalizingFn = unsafe { std::mem::transmute(fin) };
    // SAFETY: a plain read of the runtime's finalizing flag (rule 2).
    unsafe { f() != 0 }
}

/// The frame walk through the thread's logs: a replay of the guess (the
/// log that followed the last one the time before), of the last one, or
/// of another ([`other_logs`]); or a patch of one or a walk into one
/// ([`walk_full`]).
///
/// # Safety
/// As [`walk_full`]; `logs` are this thread's, written by its walks.
#[inline(always)]
pub(super) unsafe fn walk_logs<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    logs: &mut PyReplayLogs,
) -> usize {
    if logs.choice.guessing() {
        // SAFETY: this function's contract, which `replay_guess` shares.
        if let Some(n) = unsafe { replay_guess::<M>(l, code_type, frame, out, logs) } {
            return n;
        }
    }
    // SAFETY: this function's contract, which `replay` shares.
    match unsafe { replay::<M>(l, code_type, logs.last(), frame, out) } {
        Ok(n) => n,
        // SAFETY: this function's contract, which `other_logs` shares, and
        // `miss` is what `replay` of the last log just made of this chain.
        Err(miss) => unsafe { other_logs::<M>(l, code_type, frame, out, logs, miss) },
    }
}

/// A replay of the guess, another log than the last ([`walk_logs`]), out
/// of line: a thread whose path repeats does not guess. A chain that
/// changed since the guess's walk gives None, and the next capture after
/// the last log guesses that log again. Cold, so that the call takes no
/// registers from the replay of the last log inlined beside it: without,
/// a repeating path paid 13 instructions for it, 6 with.
///
/// # Safety
/// As [`walk_full`]; `logs` are this thread's, written by its walks.
#[cold]
#[inline(never)]
unsafe fn replay_guess<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    logs: &mut PyReplayLogs,
) -> Option<usize> {
    let guess = logs.choice.guess();
    // SAFETY: this function's contract, which `replay` shares; the log is
    // this thread's, written by its walks.
    let replayed = unsafe { replay::<M>(l, code_type, &logs.logs[guess], frame, out) };
    crate::capture::looks::count_guess(replayed.is_ok());
    match replayed {
        Ok(n) => {
            logs.choice.followed(guess);
            Some(n)
        }
        Err(_) => {
            logs.choice.guessed_wrong();
            None
        }
    }
}

/// The rest of [`walk_logs`], out of line: the last log did not replay.
/// The other logs are tried from the one after it (call paths taken in
/// turn were logged in turn). Where the last log missed at a frame whose
/// words changed, a log is tried only if it logged that frame with its
/// words now (one frame's words read once, compared with each log's: the
/// paths of a training step's ops differ there); otherwise only if it
/// starts at the same frame. When none replays, the least recently used
/// log becomes a copy of the last and is patched (or walked into): the
/// last keeps its own path.
///
/// # Safety
/// As [`walk_full`]; `miss` is what `replay` of the last log made of
/// this chain (`Miss::At`: the frames before that visit unchanged).
#[inline(never)]
unsafe fn other_logs<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    logs: &mut PyReplayLogs,
    miss: Miss,
) -> usize {
    let current = logs.choice.missed();
    let slot = if !logs.choice.look_now() {
        // Looking has not paid lately: the last log is patched or walked
        // in place, as a thread with one log would.
        current
    } else {
        // The visit where the last log missed, and the frame's words there.
        let changed = match miss {
            Miss::At(at) => {
                let i = at / size_of::<Visit>();
                let last = &logs.logs[current];
                let address = if i == 0 { frame } else { last.visits[i - 1].next };
                // SAFETY: replay found the frames before visit `i`
                // unchanged, so `address`, the head or the `previous` word
                // of the last of them, is a live frame of this thread's
                // frozen chain; `l` is the checked layout.
                let (next, code, instr, bytes) =
                    unsafe { frame_words::<M>(FrameOffsets::of::<M>(l), address) };
                Some((
                    i,
                    Visit {
                        next,
                        code,
                        instr,
                        bytes,
                    },
                ))
            }
            Miss::Other => None,
        };
        let mut all_kept = true;
        for k in 1..PY_LOGS {
            let i = (current + k) % PY_LOGS;
            let log = &logs.logs[i];
            all_kept &= log.visited != 0;
            if log.visited == 0 || log.head != frame {
                continue;
            }
            if let Some((at, v)) = changed {
                let w = if at < log.visited {
                    &log.visits[at]
                } else {
                    continue;
                };
                if (w.next, w.code, w.instr) != (v.next, v.code, v.instr)
                    || (!M::FRAME_OBJECTS && w.bytes != v.bytes)
                {
                    continue;
                }
            }
            // SAFETY: this function's contract, which `replay` shares; the
            // log is this thread's, written by its walks.
            if let Ok(n) = unsafe { replay_apart::<M>(l, code_type, log, frame, out) } {
                logs.choice.found(i);
                return n;
            }
        }
        logs.choice.found_none(all_kept);
        let v = logs.choice.victim();
        if matches!(miss, Miss::At(_)) {
            // The patch starts from the last log's walk.
            let (from, into) = pair_mut(&mut logs.logs, current, v);
            into.copy_from(from);
        }
        v
    };
    logs.choice.take(slot);
    // SAFETY: this function's contract; the log at `slot` is the last
    // one or a copy of it when `miss` is `Miss::At`, as `rewalk` needs.
    let n = unsafe { rewalk::<M>(l, code_type, frame, out, &mut logs.logs[slot], miss) };
    logs.renew(slot);
    n
}

/// [`replay`] in a function of its own, for [`other_logs`]: inlined
/// there, among that function's other values, its loop kept the layout's
/// offsets on the stack and read four of them a frame again (19
/// instructions a frame, against 13.5 in a function of its own).
///
/// # Safety
/// As [`replay`].
#[inline(never)]
unsafe fn replay_apart<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    log: &PyReplayLog,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
) -> Result<usize, Miss> {
    // SAFETY: this function's contract.
    unsafe { replay::<M>(l, code_type, log, frame, out) }
}

/// The walk with one log: a replay of it, else a patch of it or a walk
/// into it ([`rewalk`]), as a capture through the thread's logs
/// ([`walk_logs`]) does with the log it takes. The replay tests use it;
/// a replay's frames are copied from the log into `out`, as a capture
/// takes them when it needs them.
///
/// # Safety
/// As [`walk_full`].
#[cfg(test)]
pub(super) unsafe fn walk_frames<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
) -> usize {
    // SAFETY: this function's own contract, which `replay` and `rewalk`
    // share.
    unsafe {
        match replay::<M>(l, code_type, log, frame, out) {
            Ok(n) => {
                super::replay::copy_frames(&log.out[..n], out);
                n
            }
            Err(miss) => rewalk::<M>(l, code_type, frame, out, log, miss),
        }
    }
}

/// After a replay of `log` missed: a patch of it where frames changed in
/// place, else (or when the patch fails) a full walk into it.
///
/// # Safety
/// As [`walk_full`]; `miss` is what `replay` of `log` made of this
/// chain.
#[inline(always)]
unsafe fn rewalk<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
    miss: Miss,
) -> usize {
    // SAFETY: this function's contract, which `patch` (after a replay
    // that missed at `at`) and `walk_full` share.
    unsafe {
        match miss {
            Miss::At(at) => match patch::<M>(l, code_type, log, frame, at, out) {
                Some(n) => n,
                None => walk_full::<M>(l, code_type, frame, out, log),
            },
            Miss::Other => walk_full::<M>(l, code_type, frame, out, log),
        }
    }
}

/// The frame walk proper, compiled once per frame model (`M`) so that
/// each version's walk carries only its own tests, with the layout's
/// offsets copied into locals (registers) first. One generic walk that
/// asked the layout at every frame cost about 100 instructions a frame
/// (callgrind over bench/py_pairs.py). An unchanged chain is replayed
/// from one of the thread's logs instead ([`walk_logs`]). Out of line, so
/// that a replay (inline in `capture_active`) saves no registers for it.
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
unsafe fn walk_full<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    mut frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
    log: &mut PyReplayLog,
) -> usize {
    log.generation += 1;
    let interpreter_frames = !M::FRAME_OBJECTS;
    let owner_c_entry = l.owner_c_entry.unwrap_or(u8::MAX);
    let owner_generator = l.owner_generator.unwrap_or(u8::MAX);
    let ob_type = l.ob_type;
    let code_start = l.code_code_adaptive.unwrap_or(0);
    let first_traceable_at = l.code_first_traceable;
    let lasti_unit_bytes = l.lasti_unit_bytes;
    let offsets = FrameOffsets::of::<M>(l);

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
        let (next, code, instr, bytes) = unsafe { frame_words::<M>(offsets, frame) };
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
        let owner = owner_of::<M>(bytes);
        let shim = M::SINCE_312 && owner >= owner_c_entry;
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
        if M::SINCE_313 || !checked {
            // SAFETY: `code` is plausible and is what a live frame executes,
            // so a live object, whose `ob_type` is at the layout's offset.
            if unsafe { read::<usize>(code + ob_type) } != code_type {
                if M::SINCE_313 {
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
        } else if M::IS_311 && bytes as u8 != 0 {
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

#[cfg(test)]
mod tests {
    use super::super::model::Interpreter314;
    use super::*;
    use crate::capture::python_layouts::{FrameModel, PY313};

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
            let n = unsafe { walk_frames::<Interpreter314>(&l, code_type, frame(frames, 0), out, log) };
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
            let n =
                unsafe { walk_frames::<Interpreter314>(&l, code_type, frame(frames, 0), &mut out, &mut log) };
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
