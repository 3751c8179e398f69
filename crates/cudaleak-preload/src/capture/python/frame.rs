//! A frame's words, read under the interpreter's frame model: what a walk
//! makes of a frame, and what replay checks of it.

use super::memory::read;
use super::model::FrameModelType;
use crate::capture::python_layouts::{PyLayout, PY311};

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
pub(super) struct FrameOffsets {
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
    pub(super) fn of<M: FrameModelType>(l: &PyLayout) -> FrameOffsets {
        let l = super::model::fixed::<M>(l);
        FrameOffsets {
            back: l.frame_back,
            code: l.frame_code,
            instr: l.frame_instr,
            // 3.11+ layouts all have them; 0 for frame objects (unread).
            bytes: if M::IS_311 {
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
/// `frame` is a live frame (frame object or interpreter frame, as `M`
/// says) of the calling thread's chain, and `o` the offsets of the layout
/// checked against the running interpreter ([`FrameOffsets::of`]), so
/// that each lies in the frame.
#[inline(always)]
pub(super) unsafe fn frame_words<M: FrameModelType>(
    o: FrameOffsets,
    frame: usize,
) -> (usize, usize, usize, usize) {
    // SAFETY: fields of the live `frame` at the checked layout's offsets,
    // per the contract; plain words and bytes (so for the reads below).
    let next: usize = unsafe { read(frame + o.back) };
    // SAFETY: the code word of the live `frame` at the checked layout's
    // offset, per the contract; a plain word.
    let code: usize = unsafe { read(frame + o.code) };
    if M::FRAME_OBJECTS {
        // SAFETY: `f_lasti` of the live frame object at the checked
        // layout's offset, per the contract; a plain integer.
        let lasti: i32 = unsafe { read(frame + o.instr) };
        return (next, code, lasti as usize, 0);
    }
    // 3.14+: a tagged stack reference; all tag bits set is a tagged int,
    // not an object (0: the walk ends there). Only that model's walk
    // carries the test: 3.13's costs what it did.
    let code = if M::SINCE_314 {
        if code & o.tags == o.tags {
            0
        } else {
            code & !o.tags
        }
    } else {
        code
    };
    // SAFETY: `instr_ptr`/`prev_instr` of the live interpreter frame at
    // the checked layout's offset, per the contract; a plain word.
    let instr: usize = unsafe { read(frame + o.instr) };
    let bytes = if M::IS_311 {
        // SAFETY: 3.11's `is_entry` and the `owner` byte after it
        // (asserted of PY311 above), in the live frame at the checked
        // layout's offset, per the contract; plain bytes.
        let both: [u8; 2] = unsafe { read(frame + o.bytes) };
        u16::from_le_bytes(both) as usize
    } else {
        // SAFETY: the `owner` byte of the live frame at the checked
        // layout's offset, per the contract; a plain byte.
        unsafe { read::<u8>(frame + o.bytes) as usize }
    };
    (next, code, instr, bytes)
}

/// The owner byte of [`frame_words`]' `bytes` (interpreter frames).
#[inline(always)]
pub(super) fn owner_of<M: FrameModelType>(bytes: usize) -> u8 {
    if M::IS_311 {
        (bytes >> 8) as u8
    } else {
        bytes as u8
    }
}

/// The words of one frame a walk visited, as [`frame_words`] read them.
/// Its address is not kept: the first is the log's `head`, each later one
/// the `next` word of the one before, which replay has just checked (one
/// load less a frame). What the walk made of the frame follows
/// from these words and the code object's facts, checked apart
/// ([`PyReplayLog`](super::replay_log::PyReplayLog)).
#[derive(Clone, Copy)]
pub(super) struct Visit {
    pub(super) next: usize,
    pub(super) code: usize,
    pub(super) instr: usize,
    /// the owner byte (3.12+), or 3.11's `is_entry` and owner bytes, read
    /// as one; 0 for frame objects
    pub(super) bytes: usize,
}

/// Whether `frame` has the words the walk logged in `v`.
///
/// # Safety
/// As [`frame_words`].
#[inline(always)]
pub(super) unsafe fn frame_unchanged<M: FrameModelType>(o: FrameOffsets, frame: usize, v: &Visit) -> bool {
    // SAFETY: `frame` is a live frame of this thread's chain and `o` the
    // checked layout's offsets (this function's contract, the same as
    // `frame_words`').
    let (next, code, instr, bytes) = unsafe { frame_words::<M>(o, frame) };
    // `previous` last: the next frame's loads wait on it anyway. The code
    // word only where the instruction word does not name it (a load and a
    // compare a frame less on 3.11 and 3.12).
    (M::INSTR_NAMES_CODE || code == v.code)
        && instr == v.instr
        && (M::FRAME_OBJECTS || bytes == v.bytes)
        && next == v.next
}
