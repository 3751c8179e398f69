//! Where CPython keeps what the frame reader needs, per version (x86-64
//! Linux, release build, default GIL build). Small on purpose: only the
//! fields `python/` reads.
//!
//! Sources: the structures of each version's headers (Include/cpython/
//! pystate.h: PyThreadState, _PyCFrame; Include/cpython/frameobject.h
//! (3.8-3.10) and Include/internal/pycore_frame.h (3.11+): frames;
//! Include/cpython/code.h: PyCodeObject; Include/cpython/bytesobject.h and
//! unicodeobject.h), with offsets computed by `offset_of!` over the
//! bindgen output of those headers that py-spy keeps per version
//! (src/python_bindings/v3_*.rs). Every table was then checked with
//! offsetof() against the installed headers of CPython 3.8.18, 3.9.18,
//! 3.10.13, 3.11.7, 3.12.1 and 3.13.0, and end to end by running
//! tests/python.rs under each (scripts/test-python-versions.sh). 3.13 is
//! also checked at run time against the interpreter's own
//! `_Py_DebugOffsets`, and 3.14 and later are read from them
//! (`python_debug_offsets.rs`).

use cudaleak_core::record::linetable::LineFormat;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameModel {
    /// 3.8–3.10: heap PyFrameObject chain, one eval-loop call per frame
    FrameObjects,
    /// 3.11: _PyInterpreterFrame with an `is_entry` flag
    Interpreter311,
    /// 3.12: _PyInterpreterFrame; C calls push a shim frame (FRAME_OWNED_BY_CSTACK)
    Interpreter312,
    /// 3.13: like 3.12; `f_executable` instead of `f_code`, `instr_ptr`
    Interpreter313,
    /// 3.14 and later: 3.13's, with `f_executable` a tagged stack reference
    Interpreter314,
}

#[derive(Debug, PartialEq, Eq)]
pub struct PyLayout {
    pub major: u32,
    pub minor: u32,
    pub frames: FrameModel,
    /// PyThreadState: `frame` (3.8–3.10), `cframe` (3.11–3.12), `current_frame` (3.13)
    pub tstate_frame: usize,
    /// _PyCFrame.current_frame (3.11–3.12)
    pub cframe_current_frame: Option<usize>,
    /// whether the unchecked getter reads a thread-local (3.12+) rather
    /// than the GIL holder's state
    pub attached_is_thread_local: bool,
    /// frame: f_code / f_executable
    pub frame_code: usize,
    /// frame: f_back / previous
    pub frame_back: usize,
    /// frame: f_lasti (i32, 3.8–3.10) / prev_instr / instr_ptr (pointers)
    pub frame_instr: usize,
    /// bytes per f_lasti unit: 1 (3.8, 3.9), 2 (3.10)
    pub lasti_unit_bytes: u32,
    /// _PyInterpreterFrame.is_entry (3.11)
    pub frame_is_entry: Option<usize>,
    /// _PyInterpreterFrame.owner (3.11+)
    pub frame_owner: Option<usize>,
    /// 3.12+: frames with an owner at or above this value are pushed by
    /// C code entering the eval loop, never Python frames: 3.12 and 3.13's
    /// FRAME_OWNED_BY_CSTACK (3, the largest owner there); 3.14's
    /// FRAME_OWNED_BY_INTERPRETER (3, the entry frame) and CSTACK (4)
    pub owner_c_entry: Option<u8>,
    /// 3.14+: `f_executable` is a tagged `_PyStackRef`: these low bits are
    /// tags (all set: a tagged int, not an object); 0 before
    pub executable_tag_mask: usize,
    pub ob_type: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: Option<usize>,
    pub code_firstlineno: usize,
    /// co_lnotab (3.8, 3.9) / co_linetable (3.10+)
    pub code_linetable: usize,
    /// start of the code units (3.11+)
    pub code_code_adaptive: Option<usize>,
    /// `_co_firsttraceable` (int, in code units; 3.11+): frames before it
    /// are incomplete (`python/walk.rs`, `instruction_offset`)
    pub code_first_traceable: Option<usize>,
    /// FRAME_OWNED_BY_GENERATOR (3.11+): such frames are never incomplete
    pub owner_generator: Option<u8>,
    pub line_format: LineFormat,
    pub bytes_size: usize,
    pub bytes_data: usize,
    pub unicode_length: usize,
    pub unicode_state: usize,
    /// sizeof(PyASCIIObject): where compact ASCII data starts
    pub unicode_ascii_size: usize,
    /// sizeof(PyCompactUnicodeObject): where compact non-ASCII data starts
    pub unicode_compact_size: usize,
}

/// Fields the same from 3.8 to 3.11 (strings still had `wstr`).
const UNICODE_WITH_WSTR: (usize, usize, usize, usize) = (16, 32, 48, 72);
/// 3.12+: `wstr` gone from PyASCIIObject and PyCompactUnicodeObject.
const UNICODE_NO_WSTR: (usize, usize, usize, usize) = (16, 32, 40, 56);

/// 3.8.0 and 3.9.5 (identical where it matters): PyFrameObject chain,
/// f_lasti in bytes, co_lnotab.
const fn frame_objects(
    minor: u32,
    f_lasti: usize,
    linetable: usize,
    lasti_unit_bytes: u32,
    line_format: LineFormat,
) -> PyLayout {
    PyLayout {
        major: 3,
        minor,
        frames: FrameModel::FrameObjects,
        tstate_frame: 24,
        cframe_current_frame: None,
        attached_is_thread_local: false,
        frame_code: 32,
        frame_back: 24,
        frame_instr: f_lasti,
        lasti_unit_bytes,
        frame_is_entry: None,
        frame_owner: None,
        owner_c_entry: None,
        executable_tag_mask: 0,
        ob_type: 8,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_firstlineno: 40,
        code_linetable: linetable,
        code_code_adaptive: None,
        code_first_traceable: None,
        owner_generator: None,
        line_format,
        bytes_size: 16,
        bytes_data: 32,
        unicode_length: UNICODE_WITH_WSTR.0,
        unicode_state: UNICODE_WITH_WSTR.1,
        unicode_ascii_size: UNICODE_WITH_WSTR.2,
        unicode_compact_size: UNICODE_WITH_WSTR.3,
    }
}

pub const PY38: PyLayout = frame_objects(8, 104, 120, 1, LineFormat::Lnotab);
pub const PY39: PyLayout = frame_objects(9, 104, 120, 1, LineFormat::Lnotab);
/// 3.10: f_lasti counts code units (2 bytes); co_linetable.
pub const PY310: PyLayout = frame_objects(10, 96, 120, 2, LineFormat::Linetable310);

/// 3.11: verified with offsetof() against the installed 3.11.7 headers too.
pub const PY311: PyLayout = PyLayout {
    major: 3,
    minor: 11,
    frames: FrameModel::Interpreter311,
    tstate_frame: 56,
    cframe_current_frame: Some(8),
    attached_is_thread_local: false,
    frame_code: 32,
    frame_back: 48,
    frame_instr: 56,
    lasti_unit_bytes: 2,
    frame_is_entry: Some(68),
    frame_owner: Some(69),
    owner_c_entry: None,
    executable_tag_mask: 0,
    ob_type: 8,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 72,
    code_linetable: 136,
    code_code_adaptive: Some(184),
    code_first_traceable: Some(168),
    owner_generator: Some(1),
    line_format: LineFormat::Locations311,
    bytes_size: 16,
    bytes_data: 32,
    unicode_length: UNICODE_WITH_WSTR.0,
    unicode_state: UNICODE_WITH_WSTR.1,
    unicode_ascii_size: UNICODE_WITH_WSTR.2,
    unicode_compact_size: UNICODE_WITH_WSTR.3,
};

/// 3.12: f_code first in the frame; the attached thread state is a
/// thread-local (`_Py_tss_tstate`); C calls push FRAME_OWNED_BY_CSTACK (3)
/// shim frames (Include/internal/pycore_frame.h, enum _frameowner);
/// `wstr` gone from strings. Fields not named are 3.11's.
pub const PY312: PyLayout = PyLayout {
    minor: 12,
    frames: FrameModel::Interpreter312,
    cframe_current_frame: Some(0),
    attached_is_thread_local: true,
    frame_code: 0,
    frame_back: 8,
    frame_is_entry: None,
    frame_owner: Some(70),
    owner_c_entry: Some(3),
    code_firstlineno: 68,
    code_code_adaptive: Some(192),
    code_first_traceable: Some(176),
    unicode_length: UNICODE_NO_WSTR.0,
    unicode_state: UNICODE_NO_WSTR.1,
    unicode_ascii_size: UNICODE_NO_WSTR.2,
    unicode_compact_size: UNICODE_NO_WSTR.3,
    ..PY311
};

/// 3.13: no _PyCFrame (tstate->current_frame), `f_executable`,
/// `instr_ptr` (the instruction executing, not the previous one). Fields
/// not named are 3.12's.
pub const PY313: PyLayout = PyLayout {
    minor: 13,
    frames: FrameModel::Interpreter313,
    tstate_frame: 72,
    cframe_current_frame: None,
    code_code_adaptive: Some(200),
    // Not in _Py_DebugOffsets; the int 16 bytes before co_code_adaptive,
    // which is checked, as in 3.11 and 3.12.
    code_first_traceable: Some(184),
    ..PY312
};

static LAYOUTS: &[&PyLayout] = &[&PY38, &PY39, &PY310, &PY311, &PY312, &PY313];

pub fn layout_for(major: u32, minor: u32) -> Option<&'static PyLayout> {
    LAYOUTS
        .iter()
        .copied()
        .find(|l| l.major == major && l.minor == minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_per_version_up_to_3_13() {
        for minor in 8..=13 {
            let l = layout_for(3, minor).unwrap_or_else(|| panic!("3.{minor}"));
            assert_eq!((l.major, l.minor), (3, minor));
        }
        assert!(layout_for(3, 7).is_none());
        // 3.14 and later: from the interpreter's own offsets only.
        assert!(layout_for(3, 14).is_none());
    }
}
