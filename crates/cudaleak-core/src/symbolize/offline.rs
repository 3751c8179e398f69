//! Symbolizing a report after the fact (`cudaleak report --symbolize`):
//! from a frame's module, offset and build-id to function, file and line,
//! read from the module file on disk when its build-id matches, or from a
//! debug file found by build-id (`<root>/.build-id/ab/cdef....debug`, as
//! gdb and debuginfod lay them out). Stripped libraries whose debug files
//! are installed later, and reports moved to another machine, then read
//! well.

use crate::report::{Group, MergedFrame, NativeFrame, Report};
use addr2line::gimli;
use object::{Object, ObjectSection};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Files are read once per command and kept to its end (the CLI exits
/// right after rendering), so their bytes are leaked to get `'static`.
type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// The largest module or debug file read.
const MAX_OBJECT_BYTES: u64 = 4 << 30;

/// The largest module file read when symbolizing by default (frames
/// without names), not asked for: a stripped libtorch_cuda.so of a few GiB
/// is not read whole on every `cudaleak report`. Debug files found by
/// build-id are always read, up to [`MAX_OBJECT_BYTES`].
const DEFAULT_MODULE_BYTES: u64 = 256 << 20;

/// The default root of build-id debug files.
pub const DEFAULT_DEBUG_ROOT: &str = "/usr/lib/debug";

struct Loaded {
    build_id: Option<String>,
    dwarf: Option<addr2line::Context<Reader>>,
    /// function symbols: (start, size, name), sorted by start
    symbols: Vec<(u64, u64, String)>,
}

impl Loaded {
    /// The file's build-id, and its debug information and symbols only
    /// when that build-id is `want` (a file of another build
    /// is never used, so its debug sections are not even read).
    fn read(path: &Path, cap: u64, want: Option<&str>) -> Option<Loaded> {
        let data = crate::base::safe_read::Mapped::open(path, cap)?.leak();
        let file = object::File::parse(data).ok()?;
        let build_id = file.build_id().ok().flatten().map(hex_bytes);
        if build_id.as_deref() != want {
            return Some(Loaded {
                build_id,
                dwarf: None,
                symbols: Vec::new(),
            });
        }
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let section = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            let bytes: &[u8] = file
                .section_by_name(id.name())
                .and_then(|s| s.data().ok())
                .unwrap_or(&[]);
            Ok(Reader::new(bytes, endian))
        };
        let dwarf = gimli::Dwarf::load(section)
            .ok()
            .and_then(|d| addr2line::Context::from_dwarf(d).ok());
        let mut symbols = crate::symbolize::function_symbols(&file);
        symbols.sort();
        symbols.dedup_by_key(|s| s.0);
        Some(Loaded {
            build_id,
            dwarf,
            symbols,
        })
    }

    /// Frames at `offset` (innermost inlined first), or None.
    fn frames_at(&self, offset: u64, template: &NativeFrame) -> Option<Vec<NativeFrame>> {
        let mut out = Vec::new();
        if let Some(ctx) = &self.dwarf {
            if let Ok(mut frames) = ctx.find_frames(offset).skip_all_loads() {
                while let Ok(Some(f)) = frames.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.raw_name().ok().map(|s| super::demangle(&s)));
                    let (file, line) = f.location.as_ref().map_or((None, None), |l| {
                        (l.file.map(str::to_string), l.line.map(i64::from))
                    });
                    if function.is_none() && file.is_none() {
                        continue;
                    }
                    out.push(NativeFrame {
                        function,
                        file,
                        line,
                        ..template.clone()
                    });
                }
            }
        }
        if out.iter().all(|f| f.function.is_none()) {
            let at = self.symbols.partition_point(|s| s.0 <= offset);
            if let Some((start, size, name)) = at.checked_sub(1).map(|i| &self.symbols[i]) {
                if offset < start.saturating_add(*size) {
                    let function = Some(super::demangle(name));
                    match out.first_mut() {
                        Some(f) => f.function = function,
                        None => out.push(NativeFrame {
                            function,
                            ..template.clone()
                        }),
                    }
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// Symbolizes frames from files found on this machine, each file read once.
pub struct OfflineSymbolizer {
    debug_roots: Vec<PathBuf>,
    files: HashMap<(PathBuf, Option<String>), Option<Loaded>>,
    /// frames symbolized by the last [`OfflineSymbolizer::symbolize_report`]
    pub symbolized: u64,
    /// the largest module file read (debug files: [`MAX_OBJECT_BYTES`])
    module_cap: u64,
}

impl OfflineSymbolizer {
    /// `debug_roots`: where `.build-id/xx/yyyy.debug` trees are looked for
    /// ([`DEFAULT_DEBUG_ROOT`] when empty).
    pub fn new(debug_roots: Vec<PathBuf>) -> OfflineSymbolizer {
        let debug_roots = if debug_roots.is_empty() {
            vec![PathBuf::from(DEFAULT_DEBUG_ROOT)]
        } else {
            debug_roots
        };
        OfflineSymbolizer {
            debug_roots,
            files: HashMap::new(),
            symbolized: 0,
            module_cap: MAX_OBJECT_BYTES,
        }
    }

    /// By path and the build-id asked for: a file read for a frame of
    /// another build holds neither DWARF nor symbols, and must not answer
    /// for the frames of its own build later.
    fn loaded(&mut self, path: PathBuf, cap: u64, want: Option<&str>) -> Option<&Loaded> {
        self.files
            .entry((path, want.map(str::to_string)))
            .or_insert_with_key(|(p, _)| Loaded::read(p, cap, want))
            .as_ref()
    }

    /// The frames for one frame, from a debug file whose build-id matches
    /// or the module itself when its build-id matches; None when no file
    /// here answers for it.
    pub fn frames_for(&mut self, f: &NativeFrame) -> Option<Vec<NativeFrame>> {
        let offset = parse_hex(f.offset.as_deref()?)?;
        let mut candidates = Vec::new();
        if let Some(id) = f.build_id.as_deref().filter(|id| id.len() > 2) {
            for root in &self.debug_roots {
                candidates.push((
                    root.join(".build-id")
                        .join(&id[..2])
                        .join(format!("{}.debug", &id[2..])),
                    MAX_OBJECT_BYTES,
                ));
            }
        }
        if let Some(m) = &f.module {
            candidates.push((PathBuf::from(m), self.module_cap));
        }
        for (c, cap) in candidates {
            let want = f.build_id.clone();
            let Some(file) = self.loaded(c, cap, want.as_deref()) else {
                continue;
            };
            // A file of another build would give confident wrong names.
            if file.build_id != want {
                continue;
            }
            if let Some(frames) = file.frames_at(offset, f) {
                return Some(frames);
            }
        }
        None
    }

    fn stack(&mut self, frames: &[NativeFrame], all: bool) -> Option<Vec<NativeFrame>> {
        let mut changed = false;
        let mut out = Vec::with_capacity(frames.len());
        let mut i = 0;
        while i < frames.len() {
            // Inlined frames share one address: replace them together.
            let end = (i + 1..frames.len())
                .find(|&j| frames[j].address != frames[i].address)
                .unwrap_or(frames.len());
            let wanted = all || frames[i..end].iter().all(|f| f.function.is_none());
            match wanted.then(|| self.frames_for(&frames[i])).flatten() {
                Some(new) => {
                    self.symbolized += 1;
                    changed = true;
                    out.extend(new);
                }
                None => out.extend_from_slice(&frames[i..end]),
            }
            i = end;
        }
        changed.then_some(out)
    }

    fn group(&mut self, g: &mut Group, all: bool) {
        self.stacks(&mut g.native_stack, &mut g.merged_stack, all);
    }

    fn stacks(&mut self, native: &mut Vec<NativeFrame>, merged_stack: &mut Vec<MergedFrame>, all: bool) {
        if let Some(s) = self.stack(native, all) {
            *native = s;
        }
        if merged_stack.is_empty() {
            return;
        }
        let mut merged = Vec::with_capacity(merged_stack.len());
        let mut run: Vec<NativeFrame> = Vec::new();
        let flush = |run: &mut Vec<NativeFrame>, merged: &mut Vec<MergedFrame>, me: &mut Self| {
            let new = me.stack(run, all).unwrap_or_else(|| run.clone());
            merged.extend(new.into_iter().map(MergedFrame::Native));
            run.clear();
        };
        for f in std::mem::take(merged_stack) {
            match f {
                MergedFrame::Native(n) => run.push(n),
                p @ MergedFrame::Python(_) => {
                    flush(&mut run, &mut merged, self);
                    merged.push(p);
                }
            }
        }
        flush(&mut run, &mut merged, self);
        *merged_stack = merged;
    }

    /// Symbolizes the frames of every group that have no function (all
    /// frames with an offset when `all`), in place.
    pub fn symbolize_report(&mut self, r: &mut Report, all: bool) {
        self.symbolized = 0;
        self.module_cap = if all {
            MAX_OBJECT_BYTES
        } else {
            DEFAULT_MODULE_BYTES
        };
        for list in [&mut r.leaks, &mut r.growth, &mut r.suppressed] {
            for g in list.iter_mut() {
                self.group(g, all);
            }
        }
        // Every stack the report holds, so that a timeline's call site or
        // the peak's group still matches its leak group by key (their
        // frames are the same; a frame named here in one and not in the
        // other would tell them apart).
        if let Some(t) = &mut r.timeline {
            for g in t.sites.iter_mut() {
                self.group(g, all);
            }
        }
        if let Some(p) = &mut r.peak {
            for g in p.groups.iter_mut() {
                self.group(g, all);
            }
        }
        if let Some(o) = &mut r.oom {
            self.stacks(&mut o.native_stack, &mut o.merged_stack, all);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_without_offsets_are_left_alone() {
        let mut s = OfflineSymbolizer::new(vec![PathBuf::from("/nonexistent")]);
        let f = NativeFrame {
            address: "0x1234".into(),
            module: Some("/nonexistent/lib.so".into()),
            ..NativeFrame::default()
        };
        assert!(s.frames_for(&f).is_none());
        assert!(s.stack(std::slice::from_ref(&f), true).is_none());
    }
}
