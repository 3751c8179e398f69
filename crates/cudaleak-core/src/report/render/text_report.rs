//! The LeakSanitizer-style text: the exit summary and `cudaleak report
//! --format text`.

use super::escaping::escape;
use super::labels::{group_labels, write_stack};
use super::oom::{oom_block, peak_section};
use super::{TextOptions, RULE, THIN_RULE};
use crate::base::units::{count, size, size_exact};
use crate::report::{saturating_sum, Group, Report, SuppressionUse, Trend, Trigger};
use std::fmt::Write;

fn trend_note(t: Option<Trend>) -> &'static str {
    match t {
        Some(Trend::Growing) => " [suspected leak: grew at every recent dump]",
        Some(Trend::Bounded) => " [bounded: grew, then levelled off]",
        Some(Trend::Steady) => " [steady: unchanged since first seen]",
        None => "",
    }
}

fn group_block(out: &mut String, verb: &str, g: &Group, opts: &TextOptions) {
    // A loaded module is reported, never called a leak.
    let verb = if g.kind().is_leak() {
        verb
    } else {
        "Module loaded:"
    };
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
    if g.torn_down_blocks > 0 {
        // Leaked, but not in the live bytes or the peak: say why.
        let _ = writeln!(
            out,
            "    ({} ({} bytes) of it went with its context (a device reset, cuCtxDestroy or the last primary-context release): leaked, no longer on the device)",
            count(g.torn_down_blocks, "block"),
            g.torn_down_bytes
        );
    }
    write_stack(out, g, opts);
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

/// The contract's last line: `cudaleak: N bytes leaked in M blocks`, and
/// `in 1 block` for one (it read `in 1 blocks`).
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
    if !r.has_leaks() {
        let _ = writeln!(out, "=={}==ERROR: cudaleak: the exit report is incomplete", r.pid);
    } else {
        let _ = writeln!(out, "=={}==ERROR: cudaleak: detected CUDA memory leaks", r.pid);
    }
    if let Some(line) = incomplete_line(r) {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    // Loaded modules are left to the report: a program built with nvcc or
    // on PyTorch keeps dozens loaded to the end, and none is a leak.
    let leaks: Vec<Group> = r.leaks.iter().filter(|g| g.kind().is_leak()).cloned().collect();
    for g in leaks.iter().take(opts.max_groups) {
        group_block(&mut out, "Leaked", g, opts);
    }
    if let Some(line) = left_out_line(&leaks, opts.max_groups) {
        let _ = writeln!(out, "{line}: see the report.\n");
    }
    let modules: Vec<&Group> = r.leaks.iter().filter(|g| !g.kind().is_leak()).collect();
    if !modules.is_empty() {
        let _ = writeln!(
            out,
            "Not leaks: {} loaded and never unloaded, {} of device globals (in the report, memory_kind \"module\").\n",
            count(saturating_sum(modules.iter().map(|g| g.blocks)), "module"),
            size_exact(saturating_sum(modules.iter().map(|g| g.bytes)))
        );
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
        by_kind(&leaks)
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
