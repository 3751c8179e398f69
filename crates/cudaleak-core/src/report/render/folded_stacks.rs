//! Collapsed stacks for flame graph tools, and the frames a picture shows.

use super::escaping::escape;
use super::labels::{basename, is_hidden, label_groups, native_label, stack_of};
use crate::base::units::count;
use crate::report::{saturating_sum, Group, MergedFrame};
use std::fmt::Write;

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
/// that are [`is_noise`](super::labels::is_noise) and, when the stack has Python frames, the native
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
