//! Python frames: what a hook records, what is kept of each code object,
//! and how both become report frames at dump time.
//!
//! In the hook a frame is only (code object address, a guard read from the
//! code object, instruction offset, flags). The first time a trace with a
//! given code object is interned, the preload crate copies the code object's
//! file name, qualified name, first line and line table into a
//! [`CodeTable`]; that copy is what names and lines come from later, even
//! after the interpreter has freed the code object (interpreter teardown
//! runs before the exit report is written).
//!
//! The guard (a hash of fields of the code object) keeps a new code object
//! that reuses a freed one's address from being confused with it.

use crate::base::lock::FutexMutex;
use crate::record::linetable::{self, LineFormat};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Set on the outermost Python frame of one native eval-loop invocation:
/// the frame that C code entered. Frames between two such frames ran inside
/// the same `_PyEval_EvalFrameDefault` native frame.
pub const PY_FRAME_ENTRY: u32 = 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct PyRawFrame {
    pub code: u64,
    pub guard: u64,
    /// byte offset of the current instruction in the code object's bytecode
    pub offset: u32,
    pub flags: u32,
}

/// The frames as raw bytes: one memcmp instead of a field-by-field loop
/// when the depot compares a captured stack with a stored one.
pub fn frames_bytes(frames: &[PyRawFrame]) -> &[u8] {
    // SAFETY: PyRawFrame is repr(C) with no padding (8 + 8 + 4 + 4 bytes).
    unsafe { std::slice::from_raw_parts(frames.as_ptr().cast::<u8>(), std::mem::size_of_val(frames)) }
}

/// What is kept of one code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    pub filename: String,
    pub qualname: String,
    pub firstlineno: i32,
    pub format: LineFormat,
    pub linetable: Vec<u8>,
}

/// A resolved Python frame, as in the report schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct PythonFrame {
    pub function: String,
    pub file: String,
    pub line: Option<i64>,
}

/// Copies of code objects, keyed by (address, guard).
pub struct CodeTable {
    codes: FutexMutex<Option<HashMap<(u64, u64), CodeInfo>>>,
}

impl Default for CodeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl CodeTable {
    pub const fn new() -> CodeTable {
        CodeTable {
            codes: FutexMutex::new(None),
        }
    }

    pub fn contains(&self, code: u64, guard: u64) -> bool {
        self.codes
            .lock()
            .as_ref()
            .is_some_and(|m| m.contains_key(&(code, guard)))
    }

    pub fn insert(&self, code: u64, guard: u64, info: CodeInfo) {
        self.codes
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert((code, guard), info);
    }

    pub fn resolve(&self, frame: &PyRawFrame) -> PythonFrame {
        let codes = self.codes.lock();
        match codes.as_ref().and_then(|m| m.get(&(frame.code, frame.guard))) {
            Some(info) => PythonFrame {
                function: info.qualname.clone(),
                file: info.filename.clone(),
                line: linetable::line_for_offset(
                    info.format,
                    &info.linetable,
                    info.firstlineno,
                    frame.offset,
                )
                .map(i64::from),
            },
            None => PythonFrame {
                function: format!("<code object at {:#x}>", frame.code),
                file: "<unknown>".into(),
                line: None,
            },
        }
    }

    pub fn lock_for_fork(&self) {
        self.codes.raw_lock();
    }

    /// # Safety
    /// Must follow [`CodeTable::lock_for_fork`] on this thread.
    pub unsafe fn unlock_after_fork(&self) {
        // SAFETY: the caller took `codes` with `lock_for_fork` on this
        // thread (the fork prepare handler), so it is ours to release.
        unsafe { self.codes.raw_unlock() };
    }
}

/// Splits Python frames (innermost first) into eval-loop invocations: each
/// group ends with a frame flagged [`PY_FRAME_ENTRY`] (or the outermost
/// frame). Returns index ranges into `frames`.
pub fn eval_groups(frames: &[PyRawFrame]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, f) in frames.iter().enumerate() {
        if f.flags & PY_FRAME_ENTRY != 0 {
            groups.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < frames.len() {
        groups.push(start..frames.len());
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(code: u64, entry: bool) -> PyRawFrame {
        PyRawFrame {
            code,
            guard: 0,
            offset: 0,
            flags: if entry { PY_FRAME_ENTRY } else { 0 },
        }
    }

    #[test]
    fn frames_have_no_padding() {
        assert_eq!(std::mem::size_of::<PyRawFrame>(), 24);
        let f = [PyRawFrame {
            code: 1,
            guard: 2,
            offset: 3,
            flags: 4,
        }];
        assert_eq!(frames_bytes(&f).len(), 24);
    }

    #[test]
    fn groups_end_at_entry_frames() {
        let frames = [f(1, false), f(2, true), f(3, true), f(4, false), f(5, false)];
        assert_eq!(eval_groups(&frames), vec![0..2, 2..3, 3..5]);
        assert!(eval_groups(&[]).is_empty());
    }

    #[test]
    fn resolves_from_the_copy() {
        let t = CodeTable::new();
        t.insert(
            0x100,
            7,
            CodeInfo {
                filename: "train.py".into(),
                qualname: "Model.step".into(),
                firstlineno: 10,
                format: LineFormat::Lnotab,
                // (byte offset delta 6 → line +2)
                linetable: vec![6, 2],
            },
        );
        let r = t.resolve(&PyRawFrame {
            code: 0x100,
            guard: 7,
            offset: 8,
            flags: 0,
        });
        assert_eq!(r.function, "Model.step");
        assert_eq!(r.line, Some(12));
        // Same address, other guard: a different (reused) code object.
        let other = t.resolve(&PyRawFrame {
            code: 0x100,
            guard: 8,
            offset: 0,
            flags: 0,
        });
        assert_eq!(other.file, "<unknown>");
    }
}
