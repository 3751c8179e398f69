//! Renderers: the LeakSanitizer-style text (exit summary and `cudaleak
//! report --format text`) and collapsed stacks for flamegraph tools.
//! JSON is the report model itself (serde).

use crate::python::PythonFrame;
use crate::report::{saturating_sum, Group, MergedFrame, NativeFrame, Report, SuppressionUse, Trend};
use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character (C0, DEL, C1) and bidirectional
/// override written as an escape (`\n`, `\x1b`, `\u{202e}`), and `\`
/// doubled when there is something to escape. Every string from a report
/// goes through it before it reaches text output: a report whose fields
/// held an ANSI escape and a newline could otherwise forge a
/// "cudaleak: 0 bytes leaked" line on the terminal (issue 15).
pub fn escape(s: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
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
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            max_groups: 10,
            max_frames: 16,
        }
    }
}

const RULE: &str = "=================================================================";
const THIN_RULE: &str = "-----------------------------------------------------";

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub fn native_label(f: &NativeFrame) -> String {
    match (&f.function, &f.module) {
        (Some(func), _) => escape(func).into_owned(),
        (None, Some(m)) => format!("{}+{}", escape(basename(m)), escape(&f.address)),
        (None, None) => escape(&f.address).into_owned(),
    }
}

pub fn python_label(f: &PythonFrame) -> String {
    match f.line {
        Some(l) => format!("{} {}:{}", escape(&f.function), escape(&f.file), l),
        None => format!("{} {}", escape(&f.function), escape(&f.file)),
    }
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
        _ => {
            if let Some(m) = &f.module {
                let _ = write!(s, " ({})", escape(m));
            }
        }
    }
    s
}

fn python_line(i: usize, f: &PythonFrame) -> String {
    format!("    #{i} in {} [python]", python_label(f))
}

/// The frames of a group for display: the merged stack when there is one,
/// else native frames followed by Python frames. Past `max` lines, native
/// frames are cut but Python frames are all kept: they are the lines
/// people look for, and with a stripped interpreter they come last.
pub fn display_frames(g: &Group, max: usize) -> Vec<String> {
    let mut lines: Vec<(bool, String)> = Vec::new();
    if !g.merged_stack.is_empty() {
        for (i, f) in g.merged_stack.iter().enumerate() {
            lines.push(match f {
                MergedFrame::Native(n) => (false, native_line(i, n)),
                MergedFrame::Python(p) => (true, python_line(i, p)),
            });
        }
    } else {
        let n = g.native_stack.len();
        for (i, f) in g.native_stack.iter().enumerate() {
            lines.push((false, native_line(i, f)));
        }
        for (i, f) in g.python_stack.iter().enumerate() {
            lines.push((true, python_line(n + i, f)));
        }
    }
    if lines.len() <= max {
        return lines.into_iter().map(|(_, l)| l).collect();
    }
    let mut out = Vec::new();
    let mut skipped = 0;
    for (i, (python, line)) in lines.into_iter().enumerate() {
        if i < max || python {
            if skipped > 0 {
                out.push(format!("    ... {skipped} more frame(s)"));
                skipped = 0;
            }
            out.push(line);
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        out.push(format!("    ... {skipped} more frame(s)"));
    }
    out
}

fn trend_note(t: Option<Trend>) -> &'static str {
    match t {
        Some(Trend::Growing) => " [suspected leak: grew at every recent dump]",
        Some(Trend::Bounded) => " [bounded: grew, then levelled off]",
        None => "",
    }
}

fn group_block(out: &mut String, verb: &str, g: &Group, opts: &TextOptions) {
    let _ = writeln!(
        out,
        "{verb} of {} byte(s) in {} block(s) allocated by {} ({} memory){}:",
        g.bytes,
        g.blocks,
        escape(&g.api),
        g.kind().name(),
        trend_note(g.trend)
    );
    for l in display_frames(g, opts.max_frames) {
        let _ = writeln!(out, "{l}");
    }
    if g.native_stack.is_empty() && g.python_stack.is_empty() {
        let _ = writeln!(out, "    (no stack recorded)");
    }
    out.push('\n');
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
pub fn summary_line(bytes: u64, blocks: u64) -> String {
    format!("cudaleak: {bytes} bytes leaked in {blocks} blocks")
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
                format!("{} {bytes} in {blocks}, address space only", k.name())
            } else if *k == crate::record::MemoryKind::Imported {
                format!("{} {bytes} in {blocks}, opened from another process", k.name())
            } else if *k == crate::record::MemoryKind::Pool {
                format!("{} {bytes} in {blocks}, pools never destroyed", k.name())
            } else {
                format!("{} {bytes} in {blocks}", k.name())
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
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
    if let Some(l) = t.groups_left_out {
        let _ = writeln!(
            out,
            "groups left out: {} more group(s), {} byte(s) in {} block(s) (CUDALEAK_MAX_GROUPS)",
            l.groups, l.bytes, l.blocks
        );
    }
}

/// What goes to stderr at exit when unsuppressed leaks remain.
pub fn exit_summary(r: &Report, report_path: Option<&str>, opts: &TextOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "=={}==ERROR: cudaleak: detected CUDA memory leaks", r.pid);
    out.push('\n');
    for g in r.leaks.iter().take(opts.max_groups) {
        group_block(&mut out, "Leak", g, opts);
    }
    if r.leaks.len() > opts.max_groups {
        let rest = &r.leaks[opts.max_groups..];
        let _ = writeln!(
            out,
            "... and {} more group(s), {} byte(s) in {} block(s): see the report.\n",
            rest.len(),
            saturating_sum(rest.iter().map(|g| g.bytes)),
            saturating_sum(rest.iter().map(|g| g.blocks))
        );
    }
    limits_reached(&mut out, &r.totals);
    suppressions_table(&mut out, &r.suppressions_used);
    let (bytes, blocks) = (r.leaked_bytes(), r.leaked_blocks());
    let _ = writeln!(
        out,
        "SUMMARY: cudaleak: {bytes} byte(s) leaked in {blocks} block(s) ({}).",
        by_kind(&r.leaks)
    );
    let mut last = summary_line(bytes, blocks);
    if let Some(p) = report_path {
        let _ = write!(last, "; report: {}", escape(p));
    }
    let _ = writeln!(out, "{last}");
    out
}

/// Full text rendering of one report (`cudaleak report --format text`).
pub fn text(r: &Report, source: Option<&str>, opts: &TextOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{RULE}");
    let cmd = escape(&r.command.join(" ")).into_owned();
    let _ = write!(
        out,
        "cudaleak report: pid {}, {} dump #{}",
        r.pid,
        r.trigger.name(),
        r.sequence
    );
    if let Some(rank) = r.rank {
        let _ = write!(out, ", rank {rank}");
    }
    if let Some(h) = &r.hostname {
        let _ = write!(out, ", host {}", escape(h));
    }
    out.push('\n');
    if !cmd.is_empty() {
        let _ = writeln!(out, "command: {cmd}");
    }
    if let Some(s) = source {
        let _ = writeln!(out, "file: {}", escape(s));
    }
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "reason: {}", escape(reason));
    }
    let t = &r.totals;
    let _ = writeln!(
        out,
        "totals: {} live block(s), {} live byte(s), peak {} byte(s); {} allocation(s), {} free(s), {} failed allocation(s), {} invalid free(s)",
        t.live_blocks, t.live_bytes, t.peak_bytes, t.allocations, t.frees, t.failed_allocations, t.invalid_frees
    );
    limits_reached(&mut out, t);
    out.push('\n');
    let verb = if r.trigger == crate::report::Trigger::Exit {
        "Leak"
    } else {
        "Live"
    };
    for g in r.leaks.iter().take(opts.max_groups) {
        group_block(&mut out, verb, g, opts);
    }
    if r.leaks.len() > opts.max_groups {
        let _ = writeln!(out, "... and {} more group(s)\n", r.leaks.len() - opts.max_groups);
    }
    if !r.growth.is_empty() && r.sequence > 1 {
        let _ = writeln!(out, "{THIN_RULE}");
        let _ = writeln!(out, "Growth since the previous dump:");
        for g in r.growth.iter().take(opts.max_groups) {
            let _ = writeln!(
                out,
                "  {:+} byte(s) {:+} block(s) {} at {}{}",
                g.bytes_delta.unwrap_or(0),
                g.blocks_delta.unwrap_or(0),
                escape(&g.api),
                g.top_frame_label(),
                trend_note(g.trend)
            );
        }
        out.push('\n');
    }
    if !r.suppressed.is_empty() {
        let _ = writeln!(
            out,
            "Suppressed: {} group(s), {} byte(s) in {} block(s).",
            r.suppressed.len(),
            saturating_sum(r.suppressed.iter().map(|g| g.bytes)),
            saturating_sum(r.suppressed.iter().map(|g| g.blocks))
        );
    }
    suppressions_table(&mut out, &r.suppressions_used);
    let (bytes, blocks) = (r.leaked_bytes(), r.leaked_blocks());
    if r.trigger == crate::report::Trigger::Exit {
        let _ = writeln!(out, "{}", summary_line(bytes, blocks));
    } else {
        let _ = writeln!(out, "cudaleak: {bytes} bytes live in {blocks} blocks");
    }
    out
}

fn folded_frame(f: &MergedFrame) -> String {
    let s = match f {
        MergedFrame::Native(n) => native_label(n),
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
    let mut out = String::new();
    for g in groups {
        let frames: Vec<MergedFrame> = if !g.merged_stack.is_empty() {
            g.merged_stack.clone()
        } else {
            g.native_stack
                .iter()
                .cloned()
                .map(MergedFrame::Native)
                .chain(g.python_stack.iter().cloned().map(MergedFrame::Python))
                .collect()
        };
        let mut parts: Vec<String> = frames.iter().rev().map(folded_frame).collect();
        parts.push(escape(&g.api).replace(';', ":"));
        let _ = writeln!(out, "{} {}", parts.join(";"), g.bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::PythonFrame;
    use crate::record::MemoryKind;

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
        let lines = display_frames(&g, 5);
        assert_eq!(lines.len(), 7, "{lines:#?}");
        assert_eq!(lines[5], "    ... 15 more frame(s)");
        assert_eq!(lines[6], "    #20 in step train.py:7 [python]");
    }
}
