//! Frames in one line, the machinery left out of them (noise, the test
//! runner), the frames a group shows, and the labels that tell groups
//! apart.

use super::escaping::escape;
use super::TextOptions;
use crate::base::units::count;
use crate::record::python::PythonFrame;
use crate::report::{Group, MergedFrame, NativeFrame};
use std::fmt::Write;

pub(super) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A frame in one line: its function, else where it is in its module as
/// LeakSanitizer writes it (`libfoo.so+0x1139`), never an absolute address
/// dressed as an offset (`libfoo.so+0x7f3a...` read like one).
pub fn native_label(f: &NativeFrame) -> String {
    match (&f.function, &f.module, &f.offset) {
        (Some(func), _, _) => escape(func).into_owned(),
        (None, Some(m), Some(off)) => format!("{}+{}", escape(basename(m)), escape(off)),
        (None, Some(m), None) => format!("{} {}", escape(basename(m)), escape(&f.address)),
        (None, None, _) => escape(&f.address).into_owned(),
    }
}

pub fn python_label(f: &PythonFrame) -> String {
    match f.line {
        Some(l) => format!("{} {}:{}", escape(&f.function), escape(&f.file), l),
        None => format!("{} {}", escape(&f.function), escape(&f.file)),
    }
}

/// A group's innermost frame that names something, for one-line
/// summaries and as a sort tie-breaker. Here, not in `report`, so that the
/// report model does not reach up into its renderer.
pub fn top_frame_label(g: &Group) -> String {
    stack_label(g.python_stack.first(), &g.native_stack)
}

/// [`top_frame_label`] of a stack given by its frames: the innermost
/// Python frame, else the first native frame with a function. A dump's
/// sort reads one frame per group through it, without making a `Group`.
pub fn stack_label(python_top: Option<&PythonFrame>, native: &[NativeFrame]) -> String {
    if let Some(p) = python_top {
        return python_label(p);
    }
    native
        .iter()
        .find(|f| f.function.is_some())
        .map(native_label)
        .unwrap_or_else(|| "<unknown>".into())
}

fn native_line(i: usize, f: &NativeFrame) -> String {
    let mut s = format!("    #{i} {}", escape(&f.address));
    if let Some(func) = &f.function {
        let _ = write!(s, " in {}", escape(func));
    }
    match (&f.file, f.line) {
        (Some(file), Some(line)) => {
            let _ = write!(s, " {}:{line}", escape(file));
        }
        (Some(file), None) => {
            let _ = write!(s, " {}", escape(file));
        }
        _ => match (&f.module, &f.offset) {
            (Some(m), Some(off)) => {
                let _ = write!(s, " ({}+{})", escape(m), escape(off));
            }
            (Some(m), None) => {
                let _ = write!(s, " ({})", escape(m));
            }
            _ => {}
        },
    }
    s
}

/// Function names that are machinery, not the program's code: shown with
/// `--full-stacks`, kept in JSON, left out of text by default.
/// Program start, the interpreter's own frames between Python frames, and
/// the foreign-call machinery between a Python line and the CUDA call. The
/// Python module leaves the same out of a failure's text, from its copy
/// python/cudaleak/_tables.py, which scripts/gen-python-tables.sh writes
/// from this table and tests/python.rs checks against it, so that the two
/// cannot drift apart.
pub const NOISE_PREFIXES: &[&str] = &[
    "_start",
    "__libc_start_",
    "_PyEval_",
    "PyEval_Eval",
    "PyObject_Call",
    "_PyObject_Call",
    "PyObject_Vectorcall",
    "_PyObject_Vectorcall",
    "_PyObject_MakeTpCall",
    "_PyObject_FastCall",
    "_PyFunction_Vectorcall",
    "_PyVectorcall",
    "PyVectorcall_",
    "slot_tp_",
    "type_call",
    "method_vectorcall",
    "cfunction_call",
    "cfunction_vectorcall",
    "_PyCFunction",
    "PyCFunction_Call",
    "vectorcall_method",
    "object_vacall",
    "call_function",
    "do_call_core",
    "run_eval_code_obj",
    "run_mod",
    "pyrun_",
    "_PyRun_",
    "PyRun_",
    "Py_RunMain",
    "Py_BytesMain",
    "pymain_",
    "ffi_call",
    "ffi_closure",
    "_ctypes_callproc",
    "PyCFuncPtr_call",
];

/// Module files that are foreign-call machinery as a whole.
pub const NOISE_MODULES: &[&str] = &["libffi.so", "_ctypes."];

/// Python files of the test runner that calls the program's code: pytest,
/// pluggy, `python -m` (runpy) and cudaleak's own pytest plugin. A test's
/// stack holds some thirty of them above the test's own line; text, labels
/// and pictures leave them out as they leave the interpreter out. The
/// Python module leaves the same out of a failure's text
/// (python/cudaleak/_tables.py).
pub const RUNNER_FILE_PARTS: &[&str] = &[
    "/_pytest/",
    "/pluggy/",
    "/site-packages/pytest.py",
    "/site-packages/pytest/__main__.py",
    "<frozen runpy>",
    "/runpy.py",
    "/cudaleak/pytest_plugin.py",
    "/cudaleak/__init__.py",
];

/// A Python frame of the test runner ([`RUNNER_FILE_PARTS`]).
pub fn is_runner(f: &PythonFrame) -> bool {
    RUNNER_FILE_PARTS.iter().any(|part| f.file.contains(part))
}

/// Machinery, not the program: see [`NOISE_PREFIXES`].
pub fn is_noise(f: &NativeFrame) -> bool {
    if let Some(func) = f.function.as_deref() {
        if NOISE_PREFIXES.iter().any(|p| func.starts_with(p)) {
            return true;
        }
    }
    f.module
        .as_deref()
        .map(basename)
        .is_some_and(|m| NOISE_MODULES.iter().any(|n| m.starts_with(n)))
}

fn python_line(i: usize, f: &PythonFrame) -> String {
    format!("    #{i} in {} [python]", python_label(f))
}

/// The frames of a group in stack order (innermost first): the merged
/// stack when there is one, else native frames followed by Python frames.
pub fn stack_of(g: &Group) -> Vec<MergedFrame> {
    merged_or_split(&g.merged_stack, &g.native_stack, &g.python_stack)
}

/// `merged` when there is one, else `native` followed by `python`: the
/// stack order of a group's or a failed request's frames.
pub(super) fn merged_or_split(
    merged: &[MergedFrame],
    native: &[NativeFrame],
    python: &[PythonFrame],
) -> Vec<MergedFrame> {
    if !merged.is_empty() {
        return merged.to_vec();
    }
    native
        .iter()
        .cloned()
        .map(MergedFrame::Native)
        .chain(python.iter().cloned().map(MergedFrame::Python))
        .collect()
}

/// The frames of a group for display. By default noise ([`is_noise`]) is
/// left out, and a group with Python frames reads as a traceback: its
/// Python frames first, outermost first and the allocating line last,
/// then one line naming the native code that line called into (the first native frame below it
/// that is not machinery). `full` shows every frame in stack order. Past
/// `max` lines native frames are cut but Python frames are all kept:
/// they are the lines people look for.
pub fn display_frames_with(g: &Group, max: usize, full: bool) -> Vec<String> {
    let stack = stack_of(g);
    let mut lines: Vec<(bool, String)> = Vec::new();
    let hidden = |f: &MergedFrame| !full && is_hidden(f, &stack);
    let first_python = stack.iter().position(|f| matches!(f, MergedFrame::Python(_)));
    match first_python {
        Some(first) if !full => {
            // Outermost first, the allocating line last, as a Python
            // traceback reads; the native code it called comes below.
            for (i, f) in stack.iter().enumerate().rev() {
                match f {
                    MergedFrame::Python(p) if !hidden(f) => lines.push((true, python_line(i, p))),
                    _ => {}
                }
            }
            // The native frame the innermost Python line called into: the
            // outermost frame above it that is not machinery.
            let called = stack[..first].iter().enumerate().rev().find(|(_, f)| !hidden(f));
            match called {
                Some((i, MergedFrame::Native(n))) => {
                    let below = stack[..i].iter().filter(|f| !hidden(f)).count();
                    let mut line = format!("    called into native code: {}", native_line(i, n).trim_start());
                    if below > 0 {
                        let _ = write!(
                            line,
                            ", then {} down to {}",
                            count(below as u64, "more frame"),
                            escape(&g.api)
                        );
                    }
                    lines.push((true, line));
                }
                // Only machinery (ctypes, libffi) between the line and the
                // CUDA call: the line called the API itself.
                _ if first > 0 => {
                    lines.push((true, format!("    called into native code: {}", escape(&g.api))))
                }
                _ => {}
            }
        }
        _ => {
            for (i, f) in stack.iter().enumerate() {
                if hidden(f) {
                    continue;
                }
                lines.push(match f {
                    MergedFrame::Native(n) => (false, native_line(i, n)),
                    MergedFrame::Python(p) => (true, python_line(i, p)),
                });
            }
        }
    }
    if lines.len() <= max {
        return lines.into_iter().map(|(_, l)| l).collect();
    }
    let mut out = Vec::new();
    let mut skipped = 0u64;
    for (i, (python, line)) in lines.into_iter().enumerate() {
        if i < max || python {
            if skipped > 0 {
                out.push(format!("    ... {}", count(skipped, "more frame")));
                skipped = 0;
            }
            out.push(line);
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        out.push(format!("    ... {}", count(skipped, "more frame")));
    }
    out
}

/// A frame the text, labels and pictures leave out of `stack` unless
/// every frame is asked for: native machinery ([`is_noise`]) and the test
/// runner's Python frames ([`is_runner`]), these only when the stack has
/// Python frames of its own to show instead.
pub(super) fn is_hidden(f: &MergedFrame, stack: &[MergedFrame]) -> bool {
    match f {
        MergedFrame::Native(n) => is_noise(n),
        MergedFrame::Python(p) => {
            is_runner(p)
                && stack
                    .iter()
                    .any(|o| matches!(o, MergedFrame::Python(q) if !is_runner(q)))
        }
    }
}

/// [`display_frames_with`], noise hidden.
pub fn display_frames(g: &Group, max: usize) -> Vec<String> {
    display_frames_with(g, max, false)
}

/// The frames of `g` under its heading in the text (a leaked group, the
/// failed request), one line each ([`display_frames_with`]), or a line
/// saying it has none.
pub(super) fn write_stack(out: &mut String, g: &Group, opts: &TextOptions) {
    for l in display_frames_with(g, opts.max_frames, opts.full_stacks) {
        let _ = writeln!(out, "{l}");
    }
    if g.native_stack.is_empty() && g.python_stack.is_empty() {
        let _ = writeln!(out, "    (no stack recorded)");
    }
}

/// One short label per frame, for group labels: symbols only, never
/// addresses, which differ between processes.
fn frame_key_label(f: &MergedFrame) -> Option<String> {
    match f {
        // The file's name, as for native frames: a label is one line.
        MergedFrame::Python(p) => Some(match p.line {
            Some(l) => format!("{} {}:{l}", escape(&p.function), escape(basename(&p.file))),
            None => format!("{} {}", escape(&p.function), escape(basename(&p.file))),
        }),
        MergedFrame::Native(n) if is_noise(n) => None,
        MergedFrame::Native(n) => Some(match (&n.function, &n.file, n.line) {
            (Some(func), Some(file), Some(line)) => {
                format!("{} {}:{line}", escape(func), escape(basename(file)))
            }
            _ => native_label(n),
        }),
    }
}

/// The frames a label is made of, outermost last: Python frames first (as
/// [`display_frames`] shows them), then native ones, noise left out.
pub(super) fn label_frames(stack: &[MergedFrame]) -> Vec<String> {
    let python = stack.iter().filter(|f| matches!(f, MergedFrame::Python(_)));
    let native = stack.iter().filter(|f| matches!(f, MergedFrame::Native(_)));
    python
        .chain(native)
        .filter(|f| !is_hidden(f, stack))
        .filter_map(frame_key_label)
        .collect()
}

/// A group's label in its two parts: what allocated
/// (`cudaMalloc (device memory)`) and where (`site`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLabel {
    pub what: String,
    /// the shortest run of frames from the top of the stack that no other
    /// group labelled with it shares (`raw sixty.py:8 < augment_1
    /// sixty.py:285`), `[#1]`, `[#2]` after stacks alike in every symbol
    pub site: String,
}

impl std::fmt::Display for GroupLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.what, self.site)
    }
}

/// The labels that tell `groups` apart, in every view that names a group
/// in one line: the text report, diff, growth, merge, the HTML table and
/// legend, the trace's tracks, the flame graphs' tooltips and the
/// out-of-memory line (CONTRACT.md, "Group labels"). The API, then the
/// shortest run of frames from the top of the stack (Python frames first,
/// as [`display_frames`] shows them) that no other group shares; a number
/// when two groups share even their whole stacks (two different leaks
/// both read "cudaMalloc at cuda_malloc train.py:9"). The innermost frame
/// alone named all sixty sites of a program that allocates through one
/// helper alike.
pub fn label_groups(groups: &[&Group]) -> Vec<GroupLabel> {
    let chains: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let mut v = label_frames(&stack_of(g));
            v.insert(0, format!("{} ({} memory)", escape(&g.api), g.memory.name()));
            v
        })
        .collect();
    let mut labels: Vec<GroupLabel> = chains
        .iter()
        .enumerate()
        .map(|(i, chain)| {
            let mut k = chain.len().min(2);
            while k < chain.len()
                && chains
                    .iter()
                    .enumerate()
                    // Twins (the same symbols throughout) are numbered below.
                    .any(|(j, other)| {
                        j != i && other != chain && other.len() >= k && other[..k] == chain[..k]
                    })
            {
                k += 1;
            }
            GroupLabel {
                what: chain[0].clone(),
                site: match k {
                    0 | 1 => "<unknown>".into(),
                    _ => chain[1..k].join(" < "),
                },
            }
        })
        .collect();
    // Stacks the same in every symbol: number them.
    for i in 0..labels.len() {
        let same: Vec<usize> = (0..labels.len()).filter(|&j| labels[j] == labels[i]).collect();
        if same.len() > 1 {
            for (n, j) in same.into_iter().enumerate() {
                labels[j].site = format!("{} [#{}]", labels[j].site, n + 1);
            }
        }
    }
    labels
}

/// [`label_groups`], each as one string (`API (KIND memory) at SITE`).
pub fn group_labels(groups: &[&Group]) -> Vec<String> {
    label_groups(groups).iter().map(ToString::to_string).collect()
}
