//! The out-of-memory sections (the failed request first in an `oom`
//! report's text, the lines the library prints on stderr) and the peak
//! section.

use super::escaping::escape;
use super::labels::{group_labels, label_frames, merged_or_split, stack_of, write_stack};
use super::{TextOptions, THIN_RULE};
use crate::base::units::{count, size, size_exact};
use crate::report::{saturating_sum, Group, OomRequest, Report};
use std::fmt::Write;

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
pub(super) fn oom_block(out: &mut String, r: &Report, o: &OomRequest, opts: &TextOptions) {
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
    write_stack(out, &request_group(o), opts);
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
pub(super) fn peak_section(out: &mut String, r: &Report) {
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
