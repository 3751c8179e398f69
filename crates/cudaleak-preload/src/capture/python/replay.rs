//! Replay of the last frame walk when the chain is unchanged, and patches
//! of it when frames changed in place.

use super::code::guard;
use super::frame::{frame_unchanged, frame_words, owner_of, FrameOffsets, Visit};
use super::memory::{plausible, read};
use super::model::{fixed, FrameModelType};
use super::replay_log::{Guarded, PyReplayLog, PY_REPLAY_FRAMES};
use crate::capture::python_layouts::PyLayout;
use cudaleak_core::record::python::PyRawFrame;
use std::mem::MaybeUninit;

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
pub(super) fn copy_frames(frames: &[PyRawFrame], out: &mut [MaybeUninit<PyRawFrame>]) {
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
pub(super) enum Miss {
    At(usize),
    Other,
}

/// Replays the log if the chain is unchanged (see [`PyReplayLog`]): the
/// frames are the log's own (`log.out`), where they stay; `out` only
/// bounds their number. A capture takes them from there when it needs
/// them, which a trace already known by its generations does not
/// ([`take_frames`](super::take_frames)): a copy into the stack buffer on
/// every replay cost 112 instructions a capture of 30 frames (memcpy).
///
/// # Safety
/// As `walk::walk_full`; `log` is this thread's, written by its walks.
#[inline(always)]
pub(super) unsafe fn replay<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    log: &PyReplayLog,
    frame: usize,
    out: &mut [MaybeUninit<PyRawFrame>],
) -> Result<usize, Miss> {
    if log.visited == 0 || log.head != frame || log.recorded > out.len() {
        return Err(Miss::Other);
    }
    let l = fixed::<M>(l);
    let o = FrameOffsets::of::<M>(l);
    let mut at = frame;
    let visits = &log.visits[..log.visited];
    // A pointer and no index: an index cost one instruction a frame more.
    let range = visits.as_ptr_range();
    let mut next_visit = range.start;
    // Two visits a turn while two are left (one test of the loop for two
    // frames), then the last one if their count is odd. The second frame
    // is read only once the first is found unchanged: its address is the
    // first's `next` word.
    // SAFETY: at most `visits.len()` entries past its start.
    let pairs_end = unsafe { range.start.add(visits.len() & !1) };
    while next_visit != pairs_end {
        // SAFETY: `next_visit` and the entry after it are entries of
        // `visits`: before `pairs_end`, which leaves an even count.
        let (v, w) = unsafe { (&*next_visit, &*next_visit.add(1)) };
        // SAFETY: `at` is first `frame`, the chain's head (checked equal to
        // the logged walk's above), then the `next` word just read from
        // its predecessor and checked: a live frame of this thread's chain.
        if !unsafe { frame_unchanged::<M>(o, at, v) } {
            return Err(Miss::At(offset_in(visits, v)));
        }
        // SAFETY: `v.next`, the `next` word just read from `at` and checked
        // equal: a live frame of this thread's chain.
        if !unsafe { frame_unchanged::<M>(o, v.next, w) } {
            return Err(Miss::At(offset_in(visits, w)));
        }
        at = w.next;
        // SAFETY: at most `pairs_end`.
        next_visit = unsafe { next_visit.add(2) };
    }
    if next_visit != range.end {
        // SAFETY: the one entry left, before `range.end`.
        let v = unsafe { &*next_visit };
        // SAFETY: `at` is the chain's head (checked equal to the logged
        // walk's above) or the `next` word of the frame checked last, read
        // and checked equal: a live frame of this thread's chain.
        if !unsafe { frame_unchanged::<M>(o, at, v) } {
            return Err(Miss::At(offset_in(visits, v)));
        }
    }
    for g in &log.guards[..log.guarded] {
        // SAFETY: `g.code` is the code word of a frame checked unchanged
        // above, which the logging walk found plausible and a code object
        // (type-checked, or trusted under the checked layout as in
        // `walk_full`): the object a live frame executes, so live. On
        // 3.11 and 3.12 only the instruction word was compared
        // (`INSTR_NAMES_CODE`): the frame runs this object, or one
        // allocated over its freed memory that holds the same instruction
        // address; then these header words lie in the same allocator
        // block or pool as that live object's bytecode, mapped, and read
        // as plain words whose mismatch this test is there to find.
        if unsafe { guard(l, g.code) } != g.guard {
            return Err(Miss::Other);
        }
    }
    if M::SINCE_313 {
        for &code in &log.not_code[..log.not_codes] {
            // SAFETY: the executable word of a frame checked unchanged
            // above, which the logging walk found plausible: the object a
            // live frame executes, so live (not a code object), and its
            // `ob_type` is at the layout's offset.
            if unsafe { read::<usize>(code + l.ob_type) } == code_type {
                return Err(Miss::Other);
            }
        }
    }
    Ok(log.recorded)
}

#[cfg(test)]
thread_local! {
    /// Patched replays on this thread (tests: that they happen).
    pub(super) static PATCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
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
/// it if the patch fails), and the capture has a new generation. A patch
/// instead of a walk, because a walk of 22 frames cost 2,200 instructions
/// (3.11.7).
///
/// # Safety
/// As `walk::walk_full`, after `replay` found the frames before visit
/// `from` unchanged (`Miss::At`: `from` is that visit's place in bytes),
/// so `log` is usable, starts at `frame`, and its frames fit in `out`.
#[inline(never)]
pub(super) unsafe fn patch<M: FrameModelType>(
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
    let o = FrameOffsets::of::<M>(l);
    let mut at = if from == 0 {
        frame
    } else {
        log.visits[from - 1].next
    };
    let visited = log.visited.min(PY_REPLAY_FRAMES);
    let mut i = from;
    loop {
        // SAFETY: `at` is the frame of visit `i`: of `from` (this function's
        // contract: replay found the frames before it unchanged), then the
        // `next` word of the one before, checked: a live frame of this
        // thread's frozen chain.
        at = unsafe { patch_visit::<M>(l, code_type, log, i, at) }?;
        i += 1;
        // The frames after it unchanged, as replay checks them.
        while i < visited {
            // SAFETY: `at` is the `next` word of the visit before, just
            // checked or patched: a live frame of this thread's frozen
            // chain, and `o` the checked layout's offsets.
            if !unsafe { frame_unchanged::<M>(o, at, &log.visits[i]) } {
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
    if M::SINCE_313 {
        for &c in &log.not_code[..log.not_codes] {
            // SAFETY: the executable word of a frame checked unchanged or
            // patched above, found plausible by the walk that logged it:
            // the object a live frame executes, so live, and its `ob_type`
            // is at the layout's offset.
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
unsafe fn patch_visit<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    log: &mut PyReplayLog,
    i: usize,
    at: usize,
) -> Option<usize> {
    let v = log.visits[i];
    // SAFETY: `at` is a live frame of this thread's chain (this function's
    // contract), read at the offsets of `l`, the checked layout.
    let (next, code, instr, bytes) = unsafe { frame_words::<M>(FrameOffsets::of::<M>(l), at) };
    if next != v.next || (!M::FRAME_OBJECTS && bytes != v.bytes) {
        return None;
    }
    if code == v.code && instr == v.instr {
        return Some(next);
    }
    if M::SINCE_312 && owner_of::<M>(bytes) >= l.owner_c_entry.unwrap_or(u8::MAX) {
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
    let (Some(entry), first_used) = log.entry_of::<M>(l, i, code) else {
        return None;
    };
    // As the walk: each code object checked by type on 3.13+, before
    // only the first (then the others are code objects by construction).
    if M::SINCE_313 || first_used {
        // SAFETY: plausible, and what a live frame executes: a live
        // object, whose `ob_type` is at the layout's offset.
        if unsafe { read::<usize>(code + l.ob_type) } != code_type {
            return None;
        }
    }
    // SAFETY: a live code object, as in `walk_full`.
    let code_guard = unsafe { guard(l, code) };
    let offset = if !M::FRAME_OBJECTS {
        let offset = instr
            .checked_sub(code + l.code_code_adaptive.unwrap_or(0))
            .filter(|&o| o < 1 << 30)?;
        if let Some(first) = l.code_first_traceable {
            // SAFETY: `_co_firsttraceable` of the live code object.
            let first_traceable: i32 = unsafe { read(code + first) };
            if owner_of::<M>(bytes) != l.owner_generator.unwrap_or(u8::MAX)
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
