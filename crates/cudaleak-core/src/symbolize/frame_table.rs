//! The frames of one dump, each resolved once and stored once.
//!
//! Why: a dump of 131,072 distinct leaked stacks of 30 frames peaked
//! at 3.5 GiB, because every stack became a `Group` of owned strings (about
//! 27 KB each) before the cap on written groups applied. The stacks of a
//! program share their frames: here each distinct return address is
//! symbolized once per dump and each distinct Python frame resolved once,
//! their strings kept once, so a stack is a list of small ids into this
//! table and full frames are made only for the groups that are written.

use crate::base::hash::AddrHash;
use crate::record::python::{CodeTable, PyRawFrame, PythonFrame};
use crate::report::NativeFrame;
use crate::symbolize::SymbolSource;
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

/// A string of the table.
pub type StrId = u32;
/// A native frame of the table (one of the frames of a return address).
pub type NativeId = u32;
/// A resolved Python frame of the table.
pub type PythonId = u32;

/// Each distinct string once; the map and the list share one copy.
#[derive(Default)]
struct Strings {
    ids: HashMap<Rc<str>, StrId>,
    all: Vec<Rc<str>>,
}

impl Strings {
    fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.all.len() as StrId;
        let shared: Rc<str> = Rc::from(s);
        self.all.push(Rc::clone(&shared));
        self.ids.insert(shared, id);
        id
    }

    fn intern_opt(&mut self, s: Option<&str>) -> Option<StrId> {
        s.map(|s| self.intern(s))
    }
}

/// A [`NativeFrame`] with its strings in the table.
#[derive(Clone, Copy)]
struct Native {
    address: StrId,
    function: Option<StrId>,
    file: Option<StrId>,
    line: Option<i64>,
    module: Option<StrId>,
    offset: Option<StrId>,
    build_id: Option<StrId>,
}

/// A [`PythonFrame`] with its strings in the table.
#[derive(Clone, Copy)]
struct Python {
    function: StrId,
    file: StrId,
    line: Option<i64>,
}

/// Symbolized and resolved frames of one dump.
#[derive(Default)]
pub struct FrameTable {
    strings: Strings,
    native: Vec<Native>,
    /// the frames of each return address seen, innermost first: a range of
    /// `native`
    /// (addresses hashed by a multiply-shift, not SipHash: one lookup per
    /// frame of every trace of a dump)
    by_return_address: HashMap<u64, (NativeId, NativeId), AddrHash>,
    python: Vec<Python>,
    /// by (code object, guard, instruction offset): what resolution reads
    by_python_raw: HashMap<(u64, u64, u32), PythonId>,
}

impl FrameTable {
    pub fn new() -> FrameTable {
        FrameTable::default()
    }

    /// The frames of `return_address` (innermost first), symbolized by
    /// `symbols` the first time the table meets it.
    pub fn native_frames(&mut self, symbols: &mut dyn SymbolSource, return_address: u64) -> Range<NativeId> {
        if let Some(&(start, end)) = self.by_return_address.get(&return_address) {
            return start..end;
        }
        let start = self.native.len() as NativeId;
        for f in symbols.symbolize(return_address) {
            let s = &mut self.strings;
            let frame = Native {
                address: s.intern(&f.address),
                function: s.intern_opt(f.function.as_deref()),
                file: s.intern_opt(f.file.as_deref()),
                line: f.line,
                module: s.intern_opt(f.module.as_deref()),
                offset: s.intern_opt(f.offset.as_deref()),
                build_id: s.intern_opt(f.build_id.as_deref()),
            };
            self.native.push(frame);
        }
        let end = self.native.len() as NativeId;
        self.by_return_address.insert(return_address, (start, end));
        start..end
    }

    /// `raw` resolved by `codes`, the first time the table meets it.
    pub fn python_frame(&mut self, codes: &CodeTable, raw: &PyRawFrame) -> PythonId {
        let key = (raw.code, raw.guard, raw.offset);
        if let Some(&id) = self.by_python_raw.get(&key) {
            return id;
        }
        let f = codes.resolve(raw);
        let frame = Python {
            function: self.strings.intern(&f.function),
            file: self.strings.intern(&f.file),
            line: f.line,
        };
        let id = self.python.len() as PythonId;
        self.python.push(frame);
        self.by_python_raw.insert(key, id);
        id
    }

    pub fn string(&self, id: StrId) -> &str {
        &self.strings.all[id as usize]
    }

    fn opt(&self, id: Option<StrId>) -> Option<&str> {
        id.map(|id| self.string(id))
    }

    /// Frames of one physical frame (one return address) share it.
    pub fn address(&self, f: NativeId) -> StrId {
        self.native[f as usize].address
    }

    pub fn function(&self, f: NativeId) -> Option<&str> {
        self.opt(self.native[f as usize].function)
    }

    pub fn file(&self, f: NativeId) -> Option<&str> {
        self.opt(self.native[f as usize].file)
    }

    pub fn line(&self, f: NativeId) -> Option<i64> {
        self.native[f as usize].line
    }

    pub fn module(&self, f: NativeId) -> Option<&str> {
        self.opt(self.native[f as usize].module)
    }

    /// The names a suppression is matched against, in its order: function,
    /// file, module.
    pub fn native_names(&self, f: NativeId) -> [Option<StrId>; 3] {
        let n = &self.native[f as usize];
        [n.function, n.file, n.module]
    }

    /// The names a suppression is matched against: function, file.
    pub fn python_names(&self, p: PythonId) -> [StrId; 2] {
        let p = &self.python[p as usize];
        [p.function, p.file]
    }

    pub fn python_function(&self, p: PythonId) -> &str {
        self.string(self.python[p as usize].function)
    }

    pub fn python_file(&self, p: PythonId) -> &str {
        self.string(self.python[p as usize].file)
    }

    pub fn python_line(&self, p: PythonId) -> Option<i64> {
        self.python[p as usize].line
    }

    /// The frame as the report writes it.
    pub fn native_frame(&self, f: NativeId) -> NativeFrame {
        let n = &self.native[f as usize];
        let owned = |id: Option<StrId>| id.map(|id| self.string(id).to_string());
        NativeFrame {
            address: self.string(n.address).to_string(),
            function: owned(n.function),
            file: owned(n.file),
            line: n.line,
            module: owned(n.module),
            offset: owned(n.offset),
            build_id: owned(n.build_id),
        }
    }

    /// The frame as the report writes it.
    pub fn python_frame_owned(&self, p: PythonId) -> PythonFrame {
        let p = &self.python[p as usize];
        PythonFrame {
            function: self.string(p.function).to_string(),
            file: self.string(p.file).to_string(),
            line: p.line,
        }
    }

    /// Distinct strings, native frames and Python frames held.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.strings.all.len(), self.native.len(), self.python.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::linetable::LineFormat;
    use crate::record::python::CodeInfo;

    struct Counting(HashMap<u64, u32>);

    impl SymbolSource for Counting {
        fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
            *self.0.entry(ra).or_default() += 1;
            let frame = |function: &str| NativeFrame {
                address: format!("{:#x}", ra - 1),
                function: Some(function.into()),
                file: Some("app.c".into()),
                line: Some(ra as i64),
                module: Some("/usr/lib/libapp.so".into()),
                offset: Some("0x999".into()),
                build_id: Some("abcd".into()),
            };
            vec![frame("inlined"), frame(&format!("f{ra}"))]
        }
    }

    #[test]
    fn each_address_is_symbolized_once_and_each_string_kept_once() {
        let mut symbols = Counting(HashMap::new());
        let mut t = FrameTable::new();
        let a = t.native_frames(&mut symbols, 0x11);
        let b = t.native_frames(&mut symbols, 0x21);
        assert_eq!(t.native_frames(&mut symbols, 0x11), a);
        assert_eq!(symbols.0, HashMap::from([(0x11, 1), (0x21, 1)]));
        assert_eq!(a.len(), 2);
        assert_eq!(t.address(a.start), t.address(a.start + 1));
        assert_ne!(t.address(a.start), t.address(b.start));
        // "inlined", "app.c", the module, "0x999", "abcd" once; per address
        // its hex and its function.
        assert_eq!(t.sizes(), (5 + 2 * 2, 4, 0));
        let f = t.native_frame(b.start + 1);
        assert_eq!(f, symbols.symbolize(0x21)[1]);
    }

    #[test]
    fn python_frames_are_resolved_once_per_code_and_offset() {
        let codes = CodeTable::new();
        codes.insert(
            7,
            0,
            CodeInfo {
                filename: "train.py".into(),
                qualname: "step".into(),
                firstlineno: 3,
                format: LineFormat::Lnotab,
                linetable: vec![],
            },
        );
        let raw = |offset, flags| PyRawFrame {
            code: 7,
            guard: 0,
            offset,
            flags,
        };
        let mut t = FrameTable::new();
        let a = t.python_frame(&codes, &raw(0, 0));
        assert_eq!(
            t.python_frame(&codes, &raw(0, 1)),
            a,
            "flags do not change the frame"
        );
        let b = t.python_frame(&codes, &raw(2, 0));
        assert_ne!(a, b);
        assert_eq!(t.python_frame_owned(a), codes.resolve(&raw(0, 0)));
        assert_eq!(t.sizes().2, 2);
    }
}
