//! Where CPython keeps what the frame reader needs, per version (x86-64
//! Linux, release build, default GIL build). Small on purpose: only the
//! fields `python.rs` reads.
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
//! `_Py_DebugOffsets`.

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
    /// `_co_firsttraceable` (int, in code units; 3.11+): frames before it
    /// are incomplete (`python.rs`, `instruction_offset`)
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
        owner_cstack: None,
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
    owner_cstack: None,
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
    owner_cstack: Some(3),
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

/// Where 3.13's `_Py_DebugOffsets` (the first member of `_PyRuntime`,
/// Include/internal/pycore_runtime.h) keeps the offsets we use: byte
/// positions inside that struct, each a u64.
mod debug_offsets_313 {
    pub const COOKIE: &[u8; 8] = b"xdebugpy";
    pub const VERSION: usize = 8;
    pub const FREE_THREADED: usize = 16;
    pub const TSTATE_CURRENT_FRAME: usize = 152 + 32;
    pub const FRAME_PREVIOUS: usize = 224 + 8;
    pub const FRAME_EXECUTABLE: usize = 224 + 16;
    pub const FRAME_INSTR_PTR: usize = 224 + 24;
    pub const FRAME_OWNER: usize = 224 + 40;
    pub const CODE_FILENAME: usize = 272 + 8;
    pub const CODE_NAME: usize = 272 + 16;
    pub const CODE_QUALNAME: usize = 272 + 24;
    pub const CODE_LINETABLE: usize = 272 + 32;
    pub const CODE_FIRSTLINENO: usize = 272 + 40;
    pub const CODE_ADAPTIVE: usize = 272 + 72;
    pub const OB_TYPE: usize = 352 + 8;
    pub const BYTES_SIZE: usize = 512 + 8;
    pub const BYTES_SVAL: usize = 512 + 16;
    pub const UNICODE_STATE: usize = 536 + 8;
    pub const UNICODE_LENGTH: usize = 536 + 16;
    pub const UNICODE_ASCII_SIZE: usize = 536 + 24;
}

/// Checks a layout against what the running interpreter says about itself
/// where it says anything: on 3.13+, `_Py_DebugOffsets` at the start of
/// `_PyRuntime` (the cookie, the version, not free-threaded, and every
/// offset we read).
pub fn check_against_runtime(layout: &PyLayout, runtime: usize) -> Result<(), String> {
    use debug_offsets_313 as d;
    if layout.minor < 13 {
        return Ok(());
    }
    if runtime == 0 {
        return Err("_PyRuntime not found".into());
    }
    // SAFETY: _PyRuntime is a static of the interpreter, at least as large
    // as the debug offsets that start it (checked by the cookie first).
    let read = |at: usize| unsafe { ((runtime + at) as *const u64).read_unaligned() };
    let cookie = unsafe { std::slice::from_raw_parts(runtime as *const u8, 8) };
    if cookie != d::COOKIE {
        return Err("no _Py_DebugOffsets cookie".into());
    }
    let hex = read(d::VERSION);
    if ((hex >> 24) & 0xff, (hex >> 16) & 0xff) != (layout.major as u64, layout.minor as u64) {
        return Err(format!("_Py_DebugOffsets is for version {:#x}", hex));
    }
    if read(d::FREE_THREADED) != 0 {
        return Err("free-threaded build".into());
    }
    let checks: [(&str, usize, usize); 16] = [
        (
            "thread_state.current_frame",
            d::TSTATE_CURRENT_FRAME,
            layout.tstate_frame,
        ),
        ("interpreter_frame.previous", d::FRAME_PREVIOUS, layout.frame_back),
        (
            "interpreter_frame.executable",
            d::FRAME_EXECUTABLE,
            layout.frame_code,
        ),
        (
            "interpreter_frame.instr_ptr",
            d::FRAME_INSTR_PTR,
            layout.frame_instr,
        ),
        (
            "interpreter_frame.owner",
            d::FRAME_OWNER,
            layout.frame_owner.unwrap_or(usize::MAX),
        ),
        ("code_object.filename", d::CODE_FILENAME, layout.code_filename),
        ("code_object.name", d::CODE_NAME, layout.code_name),
        (
            "code_object.qualname",
            d::CODE_QUALNAME,
            layout.code_qualname.unwrap_or(usize::MAX),
        ),
        ("code_object.linetable", d::CODE_LINETABLE, layout.code_linetable),
        (
            "code_object.firstlineno",
            d::CODE_FIRSTLINENO,
            layout.code_firstlineno,
        ),
        (
            "code_object.co_code_adaptive",
            d::CODE_ADAPTIVE,
            layout.code_code_adaptive.unwrap_or(usize::MAX),
        ),
        ("pyobject.ob_type", d::OB_TYPE, layout.ob_type),
        ("bytes_object.ob_size", d::BYTES_SIZE, layout.bytes_size),
        ("bytes_object.ob_sval", d::BYTES_SVAL, layout.bytes_data),
        ("unicode_object.state", d::UNICODE_STATE, layout.unicode_state),
        ("unicode_object.length", d::UNICODE_LENGTH, layout.unicode_length),
    ];
    for (name, at, ours) in checks {
        let theirs = read(at);
        if theirs != ours as u64 {
            return Err(format!("_Py_DebugOffsets.{name} is {theirs}, not {ours}"));
        }
    }
    if read(d::UNICODE_ASCII_SIZE) != layout.unicode_ascii_size as u64 {
        return Err("_Py_DebugOffsets.unicode_object.asciiobject_size differs".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_layout_per_supported_version() {
        for minor in 8..=13 {
            let l = layout_for(3, minor).unwrap_or_else(|| panic!("3.{minor}"));
            assert_eq!((l.major, l.minor), (3, minor));
        }
        assert!(layout_for(3, 7).is_none());
        assert!(layout_for(3, 14).is_none());
    }

    /// A fake _PyRuntime whose debug offsets say what PY313 says passes;
    /// one that disagrees, or claims free threading, does not.
    #[test]
    fn debug_offsets_are_checked() {
        use debug_offsets_313 as d;
        let mut rt = vec![0u64; 80];
        let put = |rt: &mut Vec<u64>, at: usize, v: u64| rt[at / 8] = v;
        let l = &PY313;
        put(&mut rt, 0, u64::from_le_bytes(*d::COOKIE));
        put(&mut rt, d::VERSION, 0x030d_00f0);
        for (at, v) in [
            (d::TSTATE_CURRENT_FRAME, l.tstate_frame),
            (d::FRAME_PREVIOUS, l.frame_back),
            (d::FRAME_EXECUTABLE, l.frame_code),
            (d::FRAME_INSTR_PTR, l.frame_instr),
            (d::FRAME_OWNER, 70),
            (d::CODE_FILENAME, l.code_filename),
            (d::CODE_NAME, l.code_name),
            (d::CODE_QUALNAME, 128),
            (d::CODE_LINETABLE, l.code_linetable),
            (d::CODE_FIRSTLINENO, l.code_firstlineno),
            (d::CODE_ADAPTIVE, 200),
            (d::OB_TYPE, l.ob_type),
            (d::BYTES_SIZE, l.bytes_size),
            (d::BYTES_SVAL, l.bytes_data),
            (d::UNICODE_STATE, l.unicode_state),
            (d::UNICODE_LENGTH, l.unicode_length),
            (d::UNICODE_ASCII_SIZE, l.unicode_ascii_size),
        ] {
            put(&mut rt, at, v as u64);
        }
        let base = rt.as_ptr() as usize;
        assert_eq!(check_against_runtime(l, base), Ok(()));
        put(&mut rt, d::CODE_ADAPTIVE, 208);
        assert!(check_against_runtime(l, rt.as_ptr() as usize)
            .unwrap_err()
            .contains("co_code_adaptive"));
        put(&mut rt, d::CODE_ADAPTIVE, 200);
        put(&mut rt, d::FREE_THREADED, 1);
        assert_eq!(
            check_against_runtime(l, rt.as_ptr() as usize),
            Err("free-threaded build".into())
        );
        // Versions before 3.13 have nothing to check against.
        assert_eq!(check_against_runtime(&PY311, 0), Ok(()));
    }
}
