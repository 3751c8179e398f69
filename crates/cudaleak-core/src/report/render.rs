//! Renderers: the LeakSanitizer-style text (exit summary and `cudaleak
//! report --format text`) and collapsed stacks for flamegraph tools.
//! JSON is the report model itself (serde).

use crate::base::units::{count, size, size_exact};
use crate::record::python::PythonFrame;
use crate::report::{
    saturating_sum, Group, MergedFrame, NativeFrame, OomRequest, Report, SuppressionUse, Trend, Trigger,
};
use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character (C0, DEL, C1) and bidirectional
/// override written as an escape (`\n`, `\x1b`, `\u{202e}`), and `\`
/// doubled when there is something to escape. Every string from a report
/// goes through it before it reaches text output: a report whose fields
/// held an ANSI escape and a newline could otherwise forge a
/// "cudaleak: 0 bytes leaked" line on the terminal.
/// The longest name (function, file, module) any rendering shows, in
/// bytes: a 50 MB function name made a 150 MB page.
pub const MAX_NAME_BYTES: usize = 4096;

/// `s` cut to at most [`MAX_NAME_BYTES`] bytes (at a character boundary)
/// with an ellipsis: the one place where text, folded, SVG and HTML
/// renderings cap the names a report brings.
pub fn cap_name(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_NAME_BYTES {
        return Cow::Borrowed(s);
    }
    let mut end = MAX_NAME_BYTES - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &s[..end]))
}

pub fn escape(s: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    let s = match cap_name(s) {
        Cow::Borrowed(s) => s,
        Cow::Owned(capped) => return Cow::Owned(escape(&capped).into_owned()),
    };
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 && unsafe_char(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

pub struct TextOptions {
    /// groups shown; the rest are counted in one line
    pub max_groups: usize,
    /// frames shown per group
    pub max_frames: usize,
    /// show every frame: program start, the interpreter's own frames and
    /// foreign-call machinery included (`--full-stacks`)
    pub full_stacks: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            max_groups: 10,
            max_frames: 16,
            full_stacks: false,
        }
    }
}

pub(crate) const RULE: &str = "=================================================================";
const THIN_RULE: &str = "-----------------------------------------------------";

fn basename(path: &str) -> &str {
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
/// Python module leaves the same out of a failure's text, from its
/// generated copy (python/cudaleak/_tables.py, issue 27).
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
fn merged_or_split(
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
fn is_hidden(f: &MergedFrame, stack: &[MergedFrame]) -> bool {
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
fn label_frames(stack: &[MergedFrame]) -> Vec<String> {
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

fn trend_note(t: Option<Trend>) -> &'static str {
    match t {
        Some(Trend::Growing) => " [suspected leak: grew at every recent dump]",
        Some(Trend::Bounded) => " [bounded: grew, then levelled off]",
        Some(Trend::Steady) => " [steady: unchanged since first seen]",
        None => "",
    }
}

fn group_block(out: &mut String, verb: &str, g: &Group, opts: &TextOptions) {
    // "Leaked 70.0 MiB (73400320 bytes) in 1 block, allocated by ...";
    // live dumps say "Live: ...", never "Live of N byte(s)".
    let _ = writeln!(
        out,
        "{verb} {} in {}, allocated by {} ({} memory){}:",
        size_exact(g.bytes),
        count(g.blocks, "block"),
        escape(&g.api),
        g.kind().name(),
        trend_note(g.trend)
    );
    if g.pytorch_cache_segment {
        let _ = writeln!(out, "    {PYTORCH_CACHE_NOTE}");
    }
    for l in display_frames_with(g, opts.max_frames, opts.full_stacks) {
        let _ = writeln!(out, "{l}");
    }
    if g.native_stack.is_empty() && g.python_stack.is_empty() {
        let _ = writeln!(out, "    (no stack recorded)");
    }
    out.push('\n');
}

/// What a group of PyTorch's caching allocator is.
pub const PYTORCH_CACHE_NOTE: &str =
    "(PyTorch cache segment: memory the caching allocator reserved, which holds tensors or none; not one tensor)";

/// The hint under a report that shows PyTorch cache segments.
pub const PYTORCH_CACHE_HINT: &str = "hint: groups marked \"PyTorch cache segment\" are reserved memory of PyTorch's caching allocator; run under `cudaleak run --pytorch` (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) to see each tensor with the line that made it";

/// Whether any group of `r` is a PyTorch cache segment.
fn shows_pytorch_cache(r: &Report) -> bool {
    let peak = r.peak.iter().flat_map(|p| &p.groups);
    r.leaks
        .iter()
        .chain(&r.suppressed)
        .chain(peak)
        .any(|g| g.pytorch_cache_segment)
}

/// The process's start (Unix ms), from its instance token
/// (`<start ms>-<random>`, `writer::instance_token`).
fn process_start_ms(r: &Report) -> Option<i64> {
    r.instance.as_deref()?.split('-').next()?.parse().ok()
}

/// When `at_ms` was, in words: `+12.3 s` after the process started, else
/// relative to the report.
fn moment(r: &Report, at_ms: i64) -> String {
    match process_start_ms(r) {
        // The peak's time comes from the coarse clock, which may read a
        // few milliseconds behind the start's.
        Some(start) if at_ms.saturating_add(1000) >= start => {
            format!("+{:.1} s", at_ms.saturating_sub(start).max(0) as f64 / 1000.0)
        }
        _ if at_ms <= r.timestamp_ms => format!(
            "{:.1} s before this dump",
            (r.timestamp_ms - at_ms) as f64 / 1000.0
        ),
        _ => format!(
            "{:.1} s after this dump",
            (at_ms - r.timestamp_ms) as f64 / 1000.0
        ),
    }
}

/// The failed request as a group, for its frames.
fn request_group(o: &OomRequest) -> Group {
    Group {
        merged_stack: o.merged_stack.clone(),
        ..Group::new(
            1,
            o.requested_bytes,
            &o.api,
            crate::record::MemoryKind::Device,
            o.native_stack.clone(),
            o.python_stack.clone(),
        )
    }
}

/// Where the failed request was made, labelled as the groups printed
/// beside it are ([`group_labels`]): the shortest run of its frames that
/// none of `beside` shares. Its innermost frame alone read `alloc
/// oom.py:5` beside holders at `alloc oom.py:5 < load_weights oom.py:9`,
/// when every allocation goes through one helper.
pub fn request_site(o: &OomRequest, beside: &[&Group]) -> String {
    let mine = label_frames(&merged_or_split(
        &o.merged_stack,
        &o.native_stack,
        &o.python_stack,
    ));
    if mine.is_empty() {
        return "<unknown>".into();
    }
    let others: Vec<Vec<String>> = beside.iter().map(|g| label_frames(&stack_of(g))).collect();
    let mut k = 1;
    while k < mine.len()
        && others
            .iter()
            .any(|other| *other != mine && other.len() >= k && other[..k] == mine[..k])
    {
        k += 1;
    }
    mine[..k].join(" < ")
}

/// `(free 256.0 MiB of 768.0 MiB)`, or what of it is known.
fn device_memory(o: &OomRequest) -> String {
    let dev = o.device.map(|d| format!("device {d}: ")).unwrap_or_default();
    match (o.device_free_bytes, o.device_total_bytes) {
        (Some(free), Some(total)) => format!("{dev}free {} of {}", size(free), size(total)),
        (Some(free), None) => format!("{dev}free {}", size(free)),
        _ => format!("{dev}free memory unknown"),
    }
}

/// The failed request, first in an `oom` report's text.
fn oom_block(out: &mut String, r: &Report, o: &OomRequest, opts: &TextOptions) {
    let _ = writeln!(
        out,
        "Out of memory: {} of {} ({} bytes) failed at {} ({}){}:",
        escape(&o.api),
        size(o.requested_bytes),
        o.requested_bytes,
        moment(r, o.timestamp_ms),
        device_memory(o),
        if o.failed_calls > 1 {
            format!("; {} failed calls within 1 s", o.failed_calls)
        } else {
            String::new()
        }
    );
    let g = request_group(o);
    for l in display_frames_with(&g, opts.max_frames, opts.full_stacks) {
        let _ = writeln!(out, "{l}");
    }
    if g.native_stack.is_empty() && g.python_stack.is_empty() {
        let _ = writeln!(out, "    (no stack recorded)");
    }
    let _ = writeln!(
        out,
        "\nWhat this process held at that moment: {} in {}.\n",
        size_exact(r.totals.live_bytes),
        count(r.totals.live_blocks, "block")
    );
}

/// Groups in the short lists (peak, stderr lines).
const SHORT_LIST: usize = 5;

/// "At the peak (1.4 GiB at +12.3 s):" and its largest groups, one line
/// each.
fn peak_section(out: &mut String, r: &Report) {
    let Some(p) = &r.peak else { return };
    if p.bytes == 0 {
        return;
    }
    let _ = writeln!(out, "{THIN_RULE}");
    let _ = writeln!(
        out,
        "At the peak ({} at {}):",
        size(p.bytes),
        moment(r, p.timestamp_ms)
    );
    let shown: Vec<&Group> = p.groups.iter().take(SHORT_LIST).collect();
    short_list(out, "  ", &shown);
    let rest: Vec<&Group> = p.groups.iter().skip(SHORT_LIST).collect();
    let left = p.groups_left_out.unwrap_or_default();
    let (more, bytes, blocks) = (
        rest.len() as u64 + left.groups,
        saturating_sum(rest.iter().map(|g| g.bytes)).saturating_add(left.bytes),
        saturating_sum(rest.iter().map(|g| g.blocks)).saturating_add(left.blocks),
    );
    if more > 0 {
        let _ = writeln!(
            out,
            "  ... and {}, {} in {}",
            count(more, "more group"),
            size(bytes),
            count(blocks, "block")
        );
    }
    out.push('\n');
}

/// What the library prints on stderr when it writes an `oom` report: one
/// line, then the largest groups live at that moment, one line each.
pub fn oom_lines(r: &Report, report_path: Option<&str>) -> String {
    let mut out = String::new();
    let Some(o) = &r.oom else { return out };
    let calls = if o.failed_calls > 1 {
        format!(" ({} failed calls within 1 s)", o.failed_calls)
    } else {
        String::new()
    };
    // What holds the memory, suppressed or not: the three largest. Only
    // kinds counted in "holds" are listed: PyTorch's expandable segments
    // reserve address space of more than the GPU's memory, which would
    // otherwise head the list and hide the pages that filled the GPU.
    let mut shown: Vec<&Group> = r
        .leaks
        .iter()
        .chain(&r.suppressed)
        .filter(|g| g.kind().counts_in_live_bytes())
        .collect();
    shown.sort_by_key(|g| std::cmp::Reverse(g.bytes));
    shown.truncate(3);
    let _ = write!(
        out,
        "cudaleak: out of memory: {} of {} at {} failed{calls} ({}); this process holds {} in {}",
        escape(&o.api),
        size(o.requested_bytes),
        request_site(o, &shown),
        device_memory(o),
        size(r.totals.live_bytes),
        count(r.totals.live_blocks, "block"),
    );
    match report_path {
        Some(p) => {
            let _ = writeln!(out, "; report: {}", escape(p));
        }
        None => out.push('\n'),
    }
    short_list(&mut out, "cudaleak:   ", &shown);
    out
}

/// `groups` one line each, after `prefix`: their size, blocks and label
/// among them (`  24.0 MiB in 4 blocks: cudaMalloc (device memory) at
/// ...`), as the peak section and the out-of-memory lines list them.
fn short_list(out: &mut String, prefix: &str, groups: &[&Group]) {
    for (g, label) in groups.iter().zip(group_labels(groups)) {
        let _ = writeln!(
            out,
            "{prefix}{} in {}: {label}{}",
            size(g.bytes),
            count(g.blocks, "block"),
            if g.pytorch_cache_segment {
                " [PyTorch cache segment]"
            } else {
                ""
            }
        );
    }
}

fn suppressions_table(out: &mut String, uses: &[SuppressionUse]) {
    if uses.is_empty() {
        return;
    }
    let _ = writeln!(out, "{THIN_RULE}");
    let _ = writeln!(out, "Suppressions used:");
    let _ = writeln!(out, "  count      bytes template");
    for u in uses {
        let _ = writeln!(out, "{:>7} {:>10} {}", u.groups, u.bytes, escape(&u.pattern));
    }
    let _ = writeln!(out, "{THIN_RULE}");
    out.push('\n');
}

/// The contract's last line: `cudaleak: N bytes leaked in M blocks`.
/// `cudaleak: N bytes leaked in M blocks` (`in 1 block`: issue 23).
pub fn summary_line(bytes: u64, blocks: u64) -> String {
    format!(
        "cudaleak: {bytes} bytes leaked in {}",
        crate::base::units::count(blocks, "block")
    )
}

fn by_kind(groups: &[Group]) -> String {
    let mut kinds: Vec<(crate::record::MemoryKind, u64, u64)> = Vec::new();
    for g in groups {
        match kinds.iter_mut().find(|k| k.0 == g.kind()) {
            Some(k) => {
                k.1 = k.1.saturating_add(g.bytes);
                k.2 = k.2.saturating_add(g.blocks);
            }
            None => kinds.push((g.kind(), g.bytes, g.blocks)),
        }
    }
    kinds.sort();
    kinds
        .iter()
        .map(|(k, bytes, blocks)| {
            if k.is_address_space() {
                format!(
                    "{} {} in {}, address space only",
                    k.name(),
                    size(*bytes),
                    count(*blocks, "block")
                )
            } else if *k == crate::record::MemoryKind::Imported {
                format!(
                    "{} {} in {}, opened from another process",
                    k.name(),
                    size(*bytes),
                    count(*blocks, "block")
                )
            } else if *k == crate::record::MemoryKind::Pool {
                format!(
                    "{} {} in {}, pools never destroyed",
                    k.name(),
                    size(*bytes),
                    count(*blocks, "block")
                )
            } else if *k == crate::record::MemoryKind::Registered {
                format!(
                    "{} {} in {}, host memory pinned and never unregistered",
                    k.name(),
                    size(*bytes),
                    count(*blocks, "block")
                )
            } else if *k == crate::record::MemoryKind::Multicast {
                format!(
                    "{} {} in {}, multicast objects never released",
                    k.name(),
                    size(*bytes),
                    count(*blocks, "block")
                )
            } else {
                format!("{} {} in {}", k.name(), size(*bytes), count(*blocks, "block"))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The line that says a report is incomplete, first in every rendering
/// (CONTRACT.md, "Incomplete reports"): parts of the live map could not be
/// read, so leaks may be missing from it.
pub fn incomplete_line(r: &crate::report::Report) -> Option<String> {
    (r.incomplete_shards > 0).then(|| {
        format!(
            "INCOMPLETE: {} of the live map could not be read in time (a thread held {}); leaks may be missing below, and `cudaleak run --fail-on-leak` does not pass it",
            count(r.incomplete_shards, "part"),
            if r.incomplete_shards == 1 { "it" } else { "them" }
        )
    })
}

/// The limits a dump reached (CONTRACT.md, "Limits"), one line each.
fn limits_reached(out: &mut String, t: &crate::report::Totals) {
    if t.stacks_dropped > 0 {
        let _ = writeln!(
            out,
            "stacks dropped: {} (CUDALEAK_MAX_STACKS distinct stacks reached; those blocks have no stack)",
            t.stacks_dropped
        );
    }
    if t.stacks_skipped_nested > 0 {
        let _ = writeln!(
            out,
            "stacks skipped: {} (allocated by a signal handler while the library captured a stack on the same thread; those blocks have no stack)",
            t.stacks_skipped_nested
        );
    }
    if let Some(l) = t.groups_left_out {
        let _ = writeln!(
            out,
            "groups left out: {}, {} in {} (CUDALEAK_MAX_GROUPS)",
            count(l.groups, "more group"),
            size_exact(l.bytes),
            count(l.blocks, "block")
        );
    }
}

/// What goes to stderr at exit when unsuppressed leaks remain.
pub fn exit_summary(r: &Report, report_path: Option<&str>, opts: &TextOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{RULE}");
    if r.leaks.is_empty() {
        let _ = writeln!(out, "=={}==ERROR: cudaleak: the exit report is incomplete", r.pid);
    } else {
        let _ = writeln!(out, "=={}==ERROR: cudaleak: detected CUDA memory leaks", r.pid);
    }
    if let Some(line) = incomplete_line(r) {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    for g in r.leaks.iter().take(opts.max_groups) {
        group_block(&mut out, "Leaked", g, opts);
    }
    if let Some(line) = left_out_line(&r.leaks, opts.max_groups) {
        let _ = writeln!(out, "{line}: see the report.\n");
    }
    limits_reached(&mut out, &r.totals);
    suppressions_table(&mut out, &r.suppressions_used);
    if r.leaks
        .iter()
        .take(opts.max_groups)
        .any(|g| g.pytorch_cache_segment)
    {
        let _ = writeln!(out, "{PYTORCH_CACHE_HINT}\n");
    }
    let (bytes, blocks) = (r.leaked_bytes(), r.leaked_blocks());
    let _ = writeln!(
        out,
        "SUMMARY: cudaleak: {} leaked in {} ({}).",
        size_exact(bytes),
        count(blocks, "block"),
        by_kind(&r.leaks)
    );
    let mut last = summary_line(bytes, blocks);
    if let Some(p) = report_path {
        let _ = write!(last, "; report: {}", escape(p));
    }
    let _ = writeln!(out, "{last}");
    out
}

/// What `--top` or the exit summary left out, as heaptrack's "and X from
/// N other places": "... and 3 more groups, 1.2 MiB (1258291 bytes) in 7
/// blocks". None when nothing was left out. Totals and the last line
/// always cover every group (`report --top 1` summed the shown
/// group only).
pub fn left_out_line(groups: &[Group], shown: usize) -> Option<String> {
    let rest = groups.get(shown..).filter(|r| !r.is_empty())?;
    Some(format!(
        "... and {}, {} in {}",
        count(rest.len() as u64, "more group"),
        size_exact(saturating_sum(rest.iter().map(|g| g.bytes))),
        count(saturating_sum(rest.iter().map(|g| g.blocks)), "block")
    ))
}

/// Full text rendering of one report (`cudaleak report --format text`).
pub fn text(r: &Report, source: Option<&str>, opts: &TextOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{RULE}");
    let cmd = escape(&r.command.join(" ")).into_owned();
    // A merged report names no single pid (two runs were added
    // together under a header that named one process).
    let merged = r.merged_from.len() > 1;
    if merged {
        let _ = write!(
            out,
            "cudaleak report: {} merged ({} dumps)",
            count(r.merged_from.len() as u64, "process"),
            r.trigger.name()
        );
    } else {
        let _ = write!(
            out,
            "cudaleak report: pid {}, {} dump #{}",
            r.pid,
            r.trigger.name(),
            r.sequence
        );
    }
    if let Some(id) = &r.run_id {
        let _ = write!(out, ", run {}", escape(id));
    }
    if let Some(rank) = r.rank {
        let _ = write!(out, ", rank {rank}");
    }
    if let Some(h) = &r.hostname {
        let _ = write!(out, ", host {}", escape(h));
    }
    out.push('\n');
    if let Some(line) = incomplete_line(r) {
        let _ = writeln!(out, "{line}");
    }
    if !cmd.is_empty() {
        let _ = writeln!(out, "command: {cmd}");
    }
    if let Some(s) = source {
        let _ = writeln!(out, "file: {}", escape(s));
    }
    if merged {
        for f in &r.merged_from {
            let _ = writeln!(out, "merged: {}", escape(f));
        }
    }
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "reason: {}", escape(reason));
    }
    let t = &r.totals;
    let _ = writeln!(
        out,
        "totals: {} live in {}, peak {}; {}, {}, {}, {}",
        size_exact(t.live_bytes),
        count(t.live_blocks, "block"),
        if merged {
            // Processes peak at different times: the sum bounds the peak.
            format!(
                "at most {} (the sum of each process's peak)",
                size_exact(t.peak_bytes)
            )
        } else {
            size_exact(t.peak_bytes)
        },
        count(t.allocations, "allocation"),
        count(t.frees, "free"),
        count(t.failed_allocations, "failed allocation"),
        count(t.invalid_frees, "invalid free")
    );
    limits_reached(&mut out, t);
    out.push('\n');
    if let Some(o) = &r.oom {
        oom_block(&mut out, r, o, opts);
    }
    let verb = if r.trigger == crate::report::Trigger::Exit {
        "Leaked"
    } else {
        "Live:"
    };
    for g in r.leaks.iter().take(opts.max_groups) {
        group_block(&mut out, verb, g, opts);
    }
    if let Some(line) = left_out_line(&r.leaks, opts.max_groups) {
        let _ = writeln!(out, "{line}\n");
    }
    if !r.growth.is_empty() && r.sequence > 1 {
        let _ = writeln!(out, "{THIN_RULE}");
        let _ = writeln!(out, "Growth since the previous dump:");
        let shown: Vec<&Group> = r.growth.iter().take(opts.max_groups).collect();
        for (g, label) in shown.iter().zip(group_labels(&shown)) {
            let _ = writeln!(
                out,
                "  {} {:+} {} {}{}",
                crate::base::units::size_delta(g.bytes_delta.unwrap_or(0)),
                g.blocks_delta.unwrap_or(0),
                if g.blocks_delta.unwrap_or(0).abs() == 1 {
                    "block"
                } else {
                    "blocks"
                },
                label,
                trend_note(g.trend)
            );
        }
        if let Some(line) = left_out_line(&r.growth, opts.max_groups) {
            let _ = writeln!(out, "  {line}");
        }
        out.push('\n');
    }
    if !r.suppressed.is_empty() {
        let _ = writeln!(
            out,
            "Suppressed: {}, {} in {}.",
            count(r.suppressed.len() as u64, "group"),
            size_exact(saturating_sum(r.suppressed.iter().map(|g| g.bytes))),
            count(saturating_sum(r.suppressed.iter().map(|g| g.blocks)), "block")
        );
    }
    suppressions_table(&mut out, &r.suppressions_used);
    peak_section(&mut out, r);
    if !r.oom_events.is_empty() && r.trigger != Trigger::Oom {
        let _ = writeln!(
            out,
            "Out of memory before this dump: {} ({} failed calls in all){}.",
            count(r.oom_events.len() as u64, "episode"),
            saturating_sum(r.oom_events.iter().map(|e| e.failed_calls)),
            match r.oom_events.iter().filter_map(|e| e.report.as_deref()).next() {
                Some(first) => format!("; the first report: {}", escape(first)),
                None => String::new(),
            }
        );
    }
    if shows_pytorch_cache(r) {
        let _ = writeln!(out, "{PYTORCH_CACHE_HINT}\n");
    }
    let (bytes, blocks) = (r.leaked_bytes(), r.leaked_blocks());
    if r.trigger == crate::report::Trigger::Exit {
        let _ = writeln!(out, "{}", summary_line(bytes, blocks));
    } else {
        let _ = writeln!(
            out,
            "cudaleak: {} live in {}",
            size_exact(bytes),
            count(blocks, "block")
        );
    }
    out
}

fn folded_frame(f: &MergedFrame) -> String {
    let s = match f {
        // Without a function: `module+0xOFFSET` where the offset is known,
        // else `[module]` (an absolute address was written as if
        // it were an offset).
        MergedFrame::Native(n) => match (&n.function, &n.module, &n.offset) {
            (None, Some(m), None) => format!("[{}]", escape(basename(m))),
            _ => native_label(n),
        },
        MergedFrame::Python(p) => match p.line {
            Some(l) => format!("{} [{}:{}]", escape(&p.function), escape(basename(&p.file)), l),
            None => format!("{} [{}]", escape(&p.function), escape(basename(&p.file))),
        },
    };
    // ';' separates frames and a trailing number is the weight.
    s.replace(';', ":")
}

/// Collapsed stacks, root first, weighted by bytes: one line per group.
pub fn folded(groups: &[Group]) -> String {
    folded_top(groups, usize::MAX)
}

/// The frames a picture of `g` shows (the SVG flame graph; the HTML page
/// applies the same rule to the `noise` flag of its frames), innermost
/// first. By default what the text report hides is folded away: frames
/// that are [`is_noise`] and, when the stack has Python frames, the native
/// frames outside its innermost Python frame (the interpreter and program
/// start around the Python code), so a Python program reads Python-first;
/// native frames below the innermost Python frame stay. `full`
/// keeps every frame.
pub fn picture_frames(g: &Group, full: bool) -> Vec<MergedFrame> {
    let stack = stack_of(g);
    if full {
        return stack;
    }
    let first_python = stack.iter().position(|f| matches!(f, MergedFrame::Python(_)));
    stack
        .iter()
        .enumerate()
        .filter(|(i, f)| {
            !is_hidden(f, &stack)
                && (matches!(f, MergedFrame::Python(_)) || first_python.is_none_or(|p| *i <= p))
        })
        .map(|(_, f)| f.clone())
        .collect()
}

/// [`folded`] of the frames a picture shows ([`picture_frames`]).
/// Each leaf is the API with the group's call site as its place
/// (`cudaMalloc [at raw sixty.py:8 < augment_1 sixty.py:285]`,
/// [`label_groups`]): a box too narrow for it shows the API, its tooltip
/// the site, as the HTML page's leaves do.
pub fn folded_picture(groups: &[Group], full: bool) -> String {
    let mut out = String::new();
    let refs: Vec<&Group> = groups.iter().collect();
    for (g, label) in groups.iter().zip(label_groups(&refs)) {
        let mut parts: Vec<String> = picture_frames(g, full).iter().rev().map(folded_frame).collect();
        parts.push(format!("{} [at {}]", escape(&g.api), label.site).replace(';', ":"));
        let _ = writeln!(out, "{} {}", parts.join(";"), g.bytes);
    }
    out
}

/// [`folded`] for the first `shown` groups, the rest as one line
/// `[N other groups] BYTES`, so that the flame graph's total stays the
/// report's total under `--top`.
pub fn folded_top(groups: &[Group], shown: usize) -> String {
    let mut out = String::new();
    for g in groups.iter().take(shown) {
        let mut parts: Vec<String> = stack_of(g).iter().rev().map(folded_frame).collect();
        parts.push(escape(&g.api).replace(';', ":"));
        let _ = writeln!(out, "{} {}", parts.join(";"), g.bytes);
    }
    if let Some(rest) = groups.get(shown..).filter(|r| !r.is_empty()) {
        let _ = writeln!(
            out,
            "[{}] {}",
            count(rest.len() as u64, "other group"),
            saturating_sum(rest.iter().map(|g| g.bytes))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::python::PythonFrame;
    use crate::record::MemoryKind;

    /// Issue 26: a picture of a Python program's group shows its Python
    /// frames and the native code below the innermost one, not program
    /// start, the interpreter or ctypes/libffi; `full` shows them all.
    #[test]
    fn pictures_fold_what_the_text_report_hides() {
        let native = |f: &str| NativeFrame {
            address: "0x1".into(),
            function: Some(f.into()),
            file: None,
            line: None,
            module: Some("/usr/bin/python3".into()),
            offset: None,
            build_id: None,
        };
        let py = |f: &str| PythonFrame {
            function: f.into(),
            file: "train.py".into(),
            line: Some(3),
        };
        let mut g = Group::new(1, 8, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new());
        g.merged_stack = vec![
            MergedFrame::Native(native("at::native::empty_cuda")),
            MergedFrame::Native(native("ffi_call")),
            MergedFrame::Native(native("_ctypes_callproc")),
            MergedFrame::Python(py("alloc")),
            MergedFrame::Native(native("_PyEval_EvalFrameDefault")),
            MergedFrame::Python(py("<module>")),
            MergedFrame::Native(native("main")),
            MergedFrame::Native(native("_start")),
        ];
        let names = |v: Vec<MergedFrame>| -> Vec<String> {
            v.iter()
                .map(|f| match f {
                    MergedFrame::Native(n) => n.function.clone().unwrap(),
                    MergedFrame::Python(p) => p.function.clone(),
                })
                .collect()
        };
        assert_eq!(
            names(picture_frames(&g, false)),
            ["at::native::empty_cuda", "alloc", "<module>"]
        );
        assert_eq!(picture_frames(&g, true).len(), 8);
        assert_eq!(
            folded_picture(&[g], false),
            "<module> [train.py:3];alloc [train.py:3];at::native::empty_cuda;cudaMalloc [at alloc train.py:3] 8\n"
        );
    }

    #[test]
    fn names_are_capped_with_an_ellipsis_in_every_rendering() {
        let long = "é".repeat(MAX_NAME_BYTES);
        let capped = cap_name(&long);
        assert!(
            capped.len() <= MAX_NAME_BYTES && capped.ends_with('…'),
            "{}",
            capped.len()
        );
        assert_eq!(escape(&long), capped);
        assert_eq!(cap_name("short"), "short");
        let f = NativeFrame {
            address: "0x1".into(),
            function: Some("f".repeat(50 << 20)),
            file: None,
            line: None,
            module: None,
            offset: None,
            build_id: None,
        };
        assert!(native_label(&f).len() <= MAX_NAME_BYTES);
    }

    #[test]
    fn the_summary_line_says_1_block() {
        assert_eq!(summary_line(100, 1), "cudaleak: 100 bytes leaked in 1 block");
        assert_eq!(summary_line(0, 0), "cudaleak: 0 bytes leaked in 0 blocks");
    }

    #[test]
    fn escape_writes_control_characters_visibly() {
        assert!(matches!(escape("plain name"), Cow::Borrowed(_)));
        assert_eq!(escape("a\\b"), "a\\b", "nothing to escape: unchanged");
        assert_eq!(
            escape("x\n\x1b[2K\r\t\u{7f}\u{9b}\u{202e}\\"),
            "x\\n\\x1b[2K\\r\\t\\x7f\\x9b\\u{202e}\\\\"
        );
    }

    #[test]
    fn python_frames_survive_truncation() {
        let native = |i: usize| NativeFrame {
            address: format!("{i:#x}"),
            function: Some(format!("f{i}")),
            file: None,
            line: None,
            module: None,
            ..NativeFrame::default()
        };
        let step = PythonFrame {
            function: "step".into(),
            file: "train.py".into(),
            line: Some(7),
        };
        let g = Group::new(
            1,
            1,
            "cudaMalloc",
            MemoryKind::Device,
            (1..=20).map(native).collect(),
            vec![step],
        );
        let lines = display_frames_with(&g, 5, true);
        assert_eq!(lines.len(), 7, "{lines:#?}");
        assert_eq!(lines[5], "    ... 15 more frames");
        assert_eq!(lines[6], "    #20 in step train.py:7 [python]");
    }

    #[test]
    fn labels_take_the_shortest_distinguishing_run_and_number_twins() {
        let frame = |f: &str, line: i64| NativeFrame {
            address: "0x1".into(),
            function: Some(f.into()),
            file: Some("train.c".into()),
            line: Some(line),
            ..NativeFrame::default()
        };
        let g = |callers: &[(&str, i64)]| {
            let stack = callers.iter().map(|(f, l)| frame(f, *l)).collect();
            Group::new(1, 1, "cudaMalloc", MemoryKind::Device, stack, vec![])
        };
        let a = g(&[("alloc", 9), ("train", 20), ("main", 1)]);
        let b = g(&[("alloc", 9), ("eval", 30), ("main", 1)]);
        let c = g(&[("other", 3), ("main", 1)]);
        let twin = a.clone();
        let labels = group_labels(&[&a, &b, &c, &twin]);
        assert_eq!(
            labels,
            [
                "cudaMalloc (device memory) at alloc train.c:9 < train train.c:20 [#1]",
                "cudaMalloc (device memory) at alloc train.c:9 < eval train.c:30",
                "cudaMalloc (device memory) at other train.c:3",
                "cudaMalloc (device memory) at alloc train.c:9 < train train.c:20 [#2]",
            ]
        );
    }

    /// A view that shows the site apart from the API (the HTML table's
    /// "call site" column) takes the same label in its two parts; a Python
    /// frame is named by its file's name, as a native one is.
    #[test]
    fn labels_come_in_two_parts_what_allocated_and_where() {
        let py = |f: &str, file: &str, line: i64| PythonFrame {
            function: f.into(),
            file: file.into(),
            line: Some(line),
        };
        let site = |caller: &str, line: i64| {
            Group::new(
                1,
                1,
                "cudaMalloc",
                MemoryKind::Device,
                vec![],
                vec![
                    py("raw", "/src/pkg/sixty.py", 8),
                    py(caller, "/src/pkg/sixty.py", line),
                ],
            )
        };
        let (a, b) = (site("augment_1", 285), site("augment_2", 290));
        let labels = label_groups(&[&a, &b]);
        assert_eq!(labels[0].what, "cudaMalloc (device memory)");
        assert_eq!(labels[0].site, "raw sixty.py:8 < augment_1 sixty.py:285");
        assert_eq!(labels[1].site, "raw sixty.py:8 < augment_2 sixty.py:290");
        assert_eq!(
            labels[1].to_string(),
            "cudaMalloc (device memory) at raw sixty.py:8 < augment_2 sixty.py:290"
        );
    }

    /// Some thirty frames of pytest, pluggy and runpy stand above every
    /// test's line: the text, the labels and the pictures leave them out
    /// as they leave the interpreter out, `--full-stacks` shows them, and a
    /// stack with no Python frame of the program's own keeps them.
    #[test]
    fn the_test_runners_frames_are_folded_as_the_interpreters_are() {
        let py = |f: &str, file: &str, line: i64| PythonFrame {
            function: f.into(),
            file: file.into(),
            line: Some(line),
        };
        let runner = [
            py(
                "pytest_pyfunc_call",
                "/venv/lib/python3.11/site-packages/_pytest/python.py",
                187,
            ),
            py(
                "_multicall",
                "/venv/lib/python3.11/site-packages/pluggy/_execution.py",
                147,
            ),
            py(
                "pytest_runtest_call",
                "/venv/lib/python3.11/site-packages/cudaleak/pytest_plugin.py",
                105,
            ),
            py("_run_module_as_main", "<frozen runpy>", 198),
        ];
        let mut stack = vec![py("test_leaks", "/src/tests/test_x.py", 24)];
        stack.extend(runner.iter().cloned());
        let g = Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], stack);
        let shown = display_frames(&g, 20).join("\n");
        assert!(shown.contains("in test_leaks /src/tests/test_x.py:24"), "{shown}");
        for f in &runner {
            assert!(!shown.contains(&f.function), "{shown}");
        }
        let full = display_frames_with(&g, 20, true).join("\n");
        assert!(runner.iter().all(|f| full.contains(&f.function)), "{full}");
        assert_eq!(
            group_labels(&[&g]),
            ["cudaMalloc (device memory) at test_leaks test_x.py:24"]
        );
        assert_eq!(picture_frames(&g, false).len(), 1);
        assert_eq!(picture_frames(&g, true).len(), 5);
        // Only the runner's frames: they are all there is to show.
        let alone = Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], runner.to_vec());
        assert_eq!(
            display_frames(&alone, 20).len(),
            4,
            "{:?}",
            display_frames(&alone, 20)
        );
    }

    /// Every allocation goes through one helper: the failed request is
    /// labelled as the holders beside it are, by the frames that tell it
    /// apart, not by the helper's line alone.
    #[test]
    fn the_oom_line_labels_the_request_as_the_holders_are() {
        let py = |f: &str, line: i64| PythonFrame {
            function: f.into(),
            file: "exp.py".into(),
            line: Some(line),
        };
        let holder = |caller: &str, line: i64, bytes: u64| {
            Group::new(
                1,
                bytes,
                "cudaMalloc",
                MemoryKind::Device,
                vec![],
                vec![py("alloc", 5), py(caller, line)],
            )
        };
        let mut r = Report::parse(
            r#"{"format": "cudaleak", "version": 1, "trigger": "oom", "sequence": 1, "pid": 7,
                "command": ["p"], "instance": "1000-abcdef01", "timestamp_ms": 3500,
                "totals": {"live_blocks": 2, "live_bytes": 3, "peak_bytes": 3,
                           "allocations": 2, "frees": 0, "failed_allocations": 1, "invalid_frees": 0},
                "leaks": [], "growth": []}"#,
        )
        .unwrap();
        r.leaks = vec![holder("load_weights", 9, 2), holder("fill_cache", 12, 1)];
        r.oom = Some(OomRequest {
            api: "cudaMalloc".into(),
            requested_bytes: 1 << 20,
            native_stack: vec![],
            python_stack: vec![py("alloc", 5), py("step", 20), py("main", 30)],
            merged_stack: vec![],
            device: Some(0),
            device_free_bytes: None,
            device_total_bytes: None,
            failed_calls: 1,
            timestamp_ms: 3500,
        });
        let lines = oom_lines(&r, None);
        let first = lines.lines().next().unwrap();
        assert!(
            first.contains(" at alloc exp.py:5 < step exp.py:20 failed"),
            "{lines}"
        );
        assert!(
            lines.contains("cudaMalloc (device memory) at alloc exp.py:5 < load_weights exp.py:9"),
            "{lines}"
        );

        // Expandable segments, as seen on an H200: a reservation larger
        // than the GPU is no holder; the pages mapped for the request are.
        let mut reservation = holder("reserve", 40, 157 << 30);
        reservation.api = "cuMemAddressReserve".into();
        reservation.memory = MemoryKind::Reservation;
        let mut pages = holder("step", 20, 139 << 30);
        pages.api = "cuMemCreate".into();
        pages.memory = MemoryKind::Physical;
        r.leaks = vec![reservation, pages, holder("load_weights", 9, 2)];
        let lines = oom_lines(&r, None);
        let listed: Vec<&str> = lines.lines().skip(1).collect();
        assert_eq!(listed.len(), 2, "{lines}");
        assert!(
            listed[0].contains("139.0 GiB in 1 block: cuMemCreate (physical memory)"),
            "{lines}"
        );
        assert!(!lines.contains("cuMemAddressReserve"), "{lines}");
    }

    /// The out-of-memory lines and the peak section escape what comes
    /// from the report (a name with an escape sequence and a newline
    /// cannot forge lines), and the oom report's text starts with the
    /// failed request.
    #[test]
    fn oom_and_peak_text_escape_what_the_report_holds() {
        let group = r#"{"blocks": 2, "bytes": 3145728, "api": "cudaMalloc", "memory": "device",
            "native_stack": [{"address": "0x10", "function": "evil\u001b[2K\nname", "file": "a.c",
                              "line": 3, "module": null}],
            "python_stack": []}"#;
        let text = format!(
            r#"{{"format": "cudaleak", "version": 1, "trigger": "oom", "sequence": 1, "pid": 7,
                "command": ["p"], "instance": "1000-abcdef01", "timestamp_ms": 3500,
                "totals": {{"live_blocks": 2, "live_bytes": 3145728, "peak_bytes": 4194304,
                            "allocations": 3, "frees": 1, "failed_allocations": 1, "invalid_frees": 0}},
                "leaks": [{group}], "growth": [],
                "oom": {{"api": "cudaMalloc", "requested_bytes": 1048576,
                         "native_stack": [], "python_stack": [{{"function": "step\u001b]0;x", "file": "t.py", "line": 9}}],
                         "device": 0, "device_free_bytes": 0, "device_total_bytes": 4194304,
                         "failed_calls": 3, "timestamp_ms": 3500}},
                "peak": {{"bytes": 4194304, "timestamp_ms": 2200, "groups": [{group}]}}}}"#
        );
        let r = Report::parse(&text).unwrap();
        let lines = oom_lines(&r, Some("/r/x\n.json"));
        assert!(!lines.contains('\u{1b}'), "{lines}");
        assert_eq!(
            lines.lines().collect::<Vec<_>>(),
            [
                "cudaleak: out of memory: cudaMalloc of 1.0 MiB at step\\x1b]0;x t.py:9 failed (3 failed calls within 1 s) \
                 (device 0: free 0 bytes of 4.0 MiB); this process holds 3.0 MiB in 2 blocks; report: /r/x\\n.json",
                "cudaleak:   3.0 MiB in 2 blocks: cudaMalloc (device memory) at evil\\x1b[2K\\nname a.c:3",
            ]
        );
        let full = super::text(&r, None, &TextOptions::default());
        assert!(!full.contains('\u{1b}'));
        let body: Vec<&str> = full.lines().skip_while(|l| !l.is_empty()).skip(1).collect();
        assert_eq!(
            body[0],
            "Out of memory: cudaMalloc of 1.0 MiB (1048576 bytes) failed at +2.5 s (device 0: free 0 bytes of 4.0 MiB); 3 failed calls within 1 s:"
        );
        assert!(full.contains("At the peak (4.0 MiB at +1.2 s):\n  3.0 MiB in 2 blocks: cudaMalloc (device memory) at evil\\x1b[2K\\nname a.c:3\n"), "{full}");
    }
}
