//! `--format html`: one self-contained page (no network, no CDN) for
//! `report`, `diff` and `merge`. The page is a fixed template with a small
//! script written for it (src/cli/html/); the data goes in as JSON in a
//! `<script type="application/json">` element, escaped so that nothing in
//! a report (function names, file paths, Python source names) can end that
//! element or start markup: see [`embed_json`].

use cudaleak_core::combine::{self, GroupDelta, GroupKey, RankView};
use cudaleak_core::python::PythonFrame;
use cudaleak_core::report::{
    Group, MergedFrame, NativeFrame, Report, SampledTimeline, TimelineSample, Trend,
};
use cudaleak_core::units::{count, size_delta, size_exact};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

const TEMPLATE: &str = include_str!("html/template.html");
const SCRIPT: &str = include_str!("html/page.js");
const STYLE: &str = include_str!("html/page.css");

/// Groups put on a page (table and flame graph); the rest are summed in
/// the header. Keeps a page of a huge report near the ~2 MB goal.
const MAX_PAGE_GROUPS: usize = 1000;
/// Frames kept per group, innermost first.
const MAX_PAGE_FRAMES: usize = 96;
/// Call sites drawn as their own band of the timeline; the rest are "other".
pub const TIMELINE_SITES: usize = 12;
/// Points of the timeline on a page; older ones are merged pairwise,
/// keeping the higher, so that peaks survive.
const MAX_TIMELINE_POINTS: usize = 2000;

#[derive(Serialize, Clone, PartialEq, Eq, Hash)]
pub struct PageFrame {
    name: String,
    /// `file:line`, or the module and address of a native frame without
    /// line information
    loc: Option<String>,
    python: bool,
}

#[derive(Serialize, Default)]
pub struct PageGroup {
    /// the weight: bytes leaked (live bytes of a live dump; growth in a diff)
    bytes: u64,
    blocks: u64,
    api: String,
    memory: &'static str,
    /// bytes that are not memory of this process (reserved address space,
    /// imported memory, pools): listed, but not in sums or the flame graph
    uncounted: bool,
    trend: Option<&'static str>,
    /// innermost first, as indices into [`Page::frames`]
    frames: Vec<u32>,
    frames_cut: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    change: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_delta: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocks_delta: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    old_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ranks: Vec<String>,
    only_some: bool,
}

#[derive(Serialize)]
pub struct Series {
    pub label: String,
    /// the site's stack, innermost first, as indices into [`Page::frames`]
    /// (empty for "other")
    pub stack: Vec<u32>,
    pub values: Vec<u64>,
}

/// The "other" series of a timeline: live bytes outside the listed call
/// sites, drawn only when there are any.
fn push_other(series: &mut Vec<Series>, other: Vec<u64>) {
    if other.iter().any(|&v| v > 0) {
        series.push(Series {
            label: "other".into(),
            stack: Vec::new(),
            values: other,
        });
    }
}

#[derive(Serialize)]
pub struct Mark {
    pub t_ms: i64,
    /// exit, signal, interval, api, context-teardown, fatal-signal
    pub trigger: String,
    pub label: String,
}

#[derive(Serialize)]
pub struct PeakSite {
    pub label: String,
    pub bytes: u64,
}

#[derive(Serialize)]
pub struct Peak {
    pub t_ms: i64,
    pub bytes: u64,
    pub sites: Vec<PeakSite>,
}

#[derive(Serialize)]
pub struct PageTimeline {
    /// where the points come from: "dumps" or "sampler"
    pub source: &'static str,
    pub t_ms: Vec<i64>,
    /// total live bytes at each point (all kinds, all sites)
    pub total: Vec<u64>,
    /// one band per call site, largest first, "other" last
    pub series: Vec<Series>,
    pub peak: Option<Peak>,
    /// the process's own peak (`peak_bytes`), which a spike shorter than
    /// the sampling period can put above every sample
    pub process_peak: u64,
    pub marks: Vec<Mark>,
}

#[derive(Serialize, Default)]
pub struct Page {
    /// "report", "diff" or "merge"
    kind: &'static str,
    title: String,
    /// header lines: command, process, trigger, files
    facts: Vec<(String, String)>,
    /// what the flame graph weighs: "leaked bytes", "live bytes", "growth"
    weight: &'static str,
    summary: String,
    groups: Vec<PageGroup>,
    groups_cut: usize,
    timeline: Option<PageTimeline>,
    ranks: Vec<combine::RankSummary>,
    /// every distinct frame once: groups and series refer to them by
    /// index, which keeps a page with many similar stacks small
    frames: Vec<PageFrame>,
    /// for the test of the page itself: the version that made it
    generator: String,
}

fn native_frame(f: &NativeFrame) -> PageFrame {
    let loc = match (&f.file, f.line) {
        (Some(file), Some(line)) => Some(format!("{file}:{line}")),
        (Some(file), None) => Some(file.clone()),
        _ => f.module.as_ref().map(|m| format!("{m} {}", f.address)),
    };
    PageFrame {
        name: cudaleak_core::render::native_label(f),
        loc,
        python: false,
    }
}

fn python_frame(f: &PythonFrame) -> PageFrame {
    PageFrame {
        name: f.function.clone(),
        loc: Some(match f.line {
            Some(l) => format!("{}:{l}", f.file),
            None => f.file.clone(),
        }),
        python: true,
    }
}

/// Distinct frames of a page, each stored once.
#[derive(Default)]
struct FrameTable {
    frames: Vec<PageFrame>,
    index: HashMap<PageFrame, u32>,
}

impl FrameTable {
    fn intern(&mut self, mut f: PageFrame) -> u32 {
        // Names capped as in every rendering (issue 23: a 50 MB name).
        let cap = |s: &mut String| {
            if let std::borrow::Cow::Owned(c) = cudaleak_core::render::cap_name(s) {
                *s = c;
            }
        };
        cap(&mut f.name);
        if let Some(loc) = f.loc.as_mut() {
            cap(loc);
        }
        if let Some(&i) = self.index.get(&f) {
            return i;
        }
        let i = self.frames.len() as u32;
        self.index.insert(f.clone(), i);
        self.frames.push(f);
        i
    }
}

/// The group's frames, innermost first: the merged stack when there is
/// one, else native frames followed by Python frames (as the text report).
fn frames_of(g: &Group, table: &mut FrameTable) -> (Vec<u32>, usize) {
    let all: Vec<PageFrame> = if !g.merged_stack.is_empty() {
        g.merged_stack
            .iter()
            .map(|f| match f {
                MergedFrame::Native(n) => native_frame(n),
                MergedFrame::Python(p) => python_frame(p),
            })
            .collect()
    } else {
        g.native_stack
            .iter()
            .map(native_frame)
            .chain(g.python_stack.iter().map(python_frame))
            .collect()
    };
    let cut = all.len().saturating_sub(MAX_PAGE_FRAMES);
    // Keep the outermost frames when cutting: the flame graph is rooted there.
    (all.into_iter().skip(cut).map(|f| table.intern(f)).collect(), cut)
}

fn page_group(g: &Group, table: &mut FrameTable) -> PageGroup {
    let (frames, frames_cut) = frames_of(g, table);
    PageGroup {
        bytes: g.bytes,
        blocks: g.blocks,
        api: g.api.clone(),
        memory: g.kind().name(),
        uncounted: !g.kind().counts_in_live_bytes(),
        trend: g.trend.map(|t| match t {
            Trend::Growing => "growing",
            Trend::Bounded => "bounded",
        }),
        frames,
        frames_cut,
        ..PageGroup::default()
    }
}

fn time_label(ms: i64) -> String {
    // UTC, so the page reads the same wherever it is opened.
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn process_facts(r: &Report, files: &[PathBuf]) -> Vec<(String, String)> {
    let mut facts = Vec::new();
    if !r.command.is_empty() {
        facts.push(("command".into(), r.command.join(" ")));
    }
    let mut process = format!("pid {}", r.pid);
    if let Some(h) = &r.hostname {
        process.push_str(&format!(" on {h}"));
    }
    if let Some(rank) = r.rank {
        process.push_str(&format!(", rank {rank}"));
    }
    facts.push(("process".into(), process));
    facts.push((
        "dump".into(),
        format!(
            "{} #{} at {}",
            r.trigger.name(),
            r.sequence,
            time_label(r.timestamp_ms)
        ),
    ));
    let t = &r.totals;
    facts.push((
        "totals".into(),
        format!(
            "{} live bytes in {} blocks, peak {} bytes; {} allocations, {} frees",
            t.live_bytes, t.live_blocks, t.peak_bytes, t.allocations, t.frees
        ),
    ));
    match files {
        [] => {}
        [one] => facts.push(("file".into(), one.display().to_string())),
        many => facts.push(("files".into(), format!("{} reports", many.len()))),
    }
    facts
}

/// A process's latest dump so far, and its groups' bytes.
type LatestDump<'a> = (&'a Report, Vec<(GroupKey, u64)>);

/// The timeline a set of dumps shows by themselves: one point per dump
/// (of every process, summed), one band per call site. Reports that carry
/// a sampled timeline give more points; see [`super::html_timeline`].
fn timeline_from_dumps(all: &[(PathBuf, Report)], table: &mut FrameTable) -> Option<PageTimeline> {
    let mut dumps: Vec<&Report> = all.iter().map(|(_, r)| r).collect();
    if dumps.is_empty() {
        return None;
    }
    dumps.sort_by_key(|r| (r.timestamp_ms, r.sequence));
    // Per process, the groups of its latest dump so far.
    let mut current: HashMap<(String, i64, String), LatestDump> = HashMap::new();
    let mut keys: Vec<GroupKey> = Vec::new();
    let mut key_index: HashMap<GroupKey, usize> = HashMap::new();
    let mut key_group: Vec<&Group> = Vec::new();
    let mut t_ms = Vec::new();
    let mut total = Vec::new();
    let mut columns: Vec<HashMap<usize, u64>> = Vec::new();
    let mut marks = Vec::new();
    for r in &dumps {
        let mut row = Vec::new();
        for g in r.leaks.iter().filter(|g| g.kind().counts_in_live_bytes()) {
            let key = GroupKey::of(g);
            if !key_index.contains_key(&key) {
                key_index.insert(key.clone(), keys.len());
                keys.push(key.clone());
                key_group.push(g);
            }
            row.push((key, g.bytes));
        }
        current.insert(combine::process_id(r), (r, row));
        let mut column: HashMap<usize, u64> = HashMap::new();
        let mut live = 0u64;
        for (proc_report, row) in current.values() {
            live = live.saturating_add(proc_report.totals.live_bytes);
            for (k, b) in row {
                let e = column.entry(key_index[k]).or_default();
                *e = e.saturating_add(*b);
            }
        }
        if t_ms.last() == Some(&r.timestamp_ms) {
            // Two processes dumped in the same millisecond: one point.
            t_ms.pop();
            total.pop();
            columns.pop();
        }
        t_ms.push(r.timestamp_ms);
        total.push(live);
        columns.push(column);
        marks.push(Mark {
            t_ms: r.timestamp_ms,
            trigger: r.trigger.name().to_string(),
            label: format!("{} dump #{} of pid {}", r.trigger.name(), r.sequence, r.pid),
        });
    }
    let mut site_max: Vec<(u64, usize)> = (0..keys.len())
        .map(|i| {
            (
                columns
                    .iter()
                    .map(|c| c.get(&i).copied().unwrap_or(0))
                    .max()
                    .unwrap_or(0),
                i,
            )
        })
        .collect();
    site_max.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let shown: Vec<usize> = site_max.iter().take(TIMELINE_SITES).map(|&(_, i)| i).collect();
    let mut series: Vec<Series> = shown
        .iter()
        .map(|&i| Series {
            label: site_label(key_group[i]),
            stack: frames_of(key_group[i], table).0,
            values: columns.iter().map(|c| c.get(&i).copied().unwrap_or(0)).collect(),
        })
        .collect();
    // "other": the rest of the live bytes, including blocks that are not
    // in any listed group (suppressed, or below a `--top`).
    let other: Vec<u64> = columns
        .iter()
        .zip(&total)
        .map(|(c, &t)| {
            let listed: u64 = shown
                .iter()
                .map(|i| c.get(i).copied().unwrap_or(0))
                .fold(0, u64::saturating_add);
            t.saturating_sub(listed)
        })
        .collect();
    push_other(&mut series, other);
    let peak = total
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, &bytes)| Peak {
            t_ms: t_ms[i],
            bytes,
            sites: series
                .iter()
                .filter(|s| s.values[i] > 0)
                .map(|s| PeakSite {
                    label: s.label.clone(),
                    bytes: s.values[i],
                })
                .collect(),
        });
    Some(thin(PageTimeline {
        source: "dumps",
        process_peak: dumps.iter().map(|r| r.totals.peak_bytes).max().unwrap_or(0),
        t_ms,
        total,
        series,
        peak,
        marks,
    }))
}

fn dump_marks(all: &[(PathBuf, Report)]) -> Vec<Mark> {
    let mut dumps: Vec<&Report> = all.iter().map(|(_, r)| r).collect();
    dumps.sort_by_key(|r| (r.timestamp_ms, r.sequence));
    dumps
        .iter()
        .map(|r| Mark {
            t_ms: r.timestamp_ms,
            trigger: r.trigger.name().to_string(),
            label: format!("{} dump #{} of pid {}", r.trigger.name(), r.sequence, r.pid),
        })
        .collect()
}

fn site_label(g: &Group) -> String {
    format!("{} at {}", g.api, cudaleak_core::render::top_frame_label(g))
}

/// The timeline a report carries (`CUDALEAK_TIMELINE`): one point per
/// sample, one band per call site among the largest, the rest "other".
fn timeline_from_samples(
    t: &SampledTimeline,
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
) -> Option<PageTimeline> {
    if t.samples.is_empty() {
        return None;
    }
    let mut site_max: Vec<(u64, usize)> = t.sites.iter().enumerate().map(|(i, g)| (g.bytes, i)).collect();
    site_max.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let shown: Vec<usize> = site_max.iter().take(TIMELINE_SITES).map(|&(_, i)| i).collect();
    let value = |s: &TimelineSample, site: usize| {
        s.sites
            .iter()
            .find(|&&(i, _)| i as usize == site)
            .map_or(0, |&(_, b)| b)
    };
    let mut series: Vec<Series> = shown
        .iter()
        .map(|&i| Series {
            label: site_label(&t.sites[i]),
            stack: frames_of(&t.sites[i], table).0,
            values: t.samples.iter().map(|s| value(s, i)).collect(),
        })
        .collect();
    let other: Vec<u64> = t
        .samples
        .iter()
        .map(|s| {
            let listed = shown.iter().map(|&i| value(s, i)).fold(0u64, u64::saturating_add);
            s.live_bytes.saturating_sub(listed)
        })
        .collect();
    push_other(&mut series, other);
    let peak = t.peak.as_ref().map(|p| Peak {
        t_ms: p.timestamp_ms,
        bytes: p.live_bytes,
        sites: p
            .sites
            .iter()
            .filter_map(|&(i, bytes)| {
                t.sites.get(i as usize).map(|g| PeakSite {
                    label: site_label(g),
                    bytes,
                })
            })
            .collect(),
    });
    Some(thin(PageTimeline {
        source: "sampler",
        process_peak: t.samples.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
        t_ms: t.samples.iter().map(|s| s.timestamp_ms).collect(),
        total: t.samples.iter().map(|s| s.live_bytes).collect(),
        series,
        peak,
        marks: dump_marks(all),
    }))
}

/// The sampled timeline when the reports are of one process and the
/// newest carries one; else one point per dump.
fn page_timeline(all: &[(PathBuf, Report)], table: &mut FrameTable) -> Option<PageTimeline> {
    let first = &all.first()?.1;
    let one_process = all
        .iter()
        .all(|(_, r)| combine::process_id(r) == combine::process_id(first));
    let newest = all
        .iter()
        .map(|(_, r)| r)
        .max_by_key(|r| (r.sequence, r.timestamp_ms))?;
    match &newest.timeline {
        Some(t) if one_process => timeline_from_samples(t, all, table),
        _ => timeline_from_dumps(all, table),
    }
}

/// Past [`MAX_TIMELINE_POINTS`], merges neighbouring points (keeping the
/// one with more live bytes) until it fits.
fn thin(mut t: PageTimeline) -> PageTimeline {
    while t.t_ms.len() > MAX_TIMELINE_POINTS {
        let keep: Vec<usize> = (0..t.t_ms.len())
            .step_by(2)
            .map(|i| {
                if i + 1 < t.total.len() && t.total[i + 1] > t.total[i] {
                    i + 1
                } else {
                    i
                }
            })
            .collect();
        t.t_ms = keep.iter().map(|&i| t.t_ms[i]).collect();
        t.total = keep.iter().map(|&i| t.total[i]).collect();
        for s in &mut t.series {
            s.values = keep.iter().map(|&i| s.values[i]).collect();
        }
    }
    t
}

/// The page for `cudaleak report`: `all` is every dump read; `merged` the
/// view of the newest dump of each process.
pub fn report_page(all: &[(PathBuf, Report)], merged: &Report) -> String {
    let files: Vec<PathBuf> = all.iter().map(|(p, _)| p.clone()).collect();
    let live = merged.trigger != cudaleak_core::report::Trigger::Exit;
    let mut table = FrameTable::default();
    let groups = merged
        .leaks
        .iter()
        .take(MAX_PAGE_GROUPS)
        .map(|g| page_group(g, &mut table))
        .collect();
    let groups_cut = merged.leaks.len().saturating_sub(MAX_PAGE_GROUPS);
    let timeline = page_timeline(all, &mut table);
    let (bytes, blocks) = (merged.leaked_bytes(), merged.leaked_blocks());
    let page = Page {
        kind: "report",
        title: format!("cudaleak report: pid {}", merged.pid),
        facts: process_facts(merged, &files),
        weight: if live { "live bytes" } else { "leaked bytes" },
        summary: page_summary(bytes, blocks, if live { "live" } else { "leaked" }),
        groups,
        groups_cut,
        timeline,
        frames: table.frames,
        ..page_base()
    };
    render(&page)
}

/// The page's one-line summary, as people read it, exact bytes kept:
/// "cudaleak: 72.0 MiB (75497472 bytes) leaked in 6 blocks" (the text
/// report's contract line keeps its fixed wording; a page is read, not
/// parsed).
fn page_summary(bytes: u64, blocks: u64, state: &str) -> String {
    format!(
        "cudaleak: {} {state} in {}",
        size_exact(bytes),
        count(blocks, "block")
    )
}

pub fn diff_page(old: (&PathBuf, &Report), new: (&PathBuf, &Report), changes: &[GroupDelta]) -> String {
    let mut table = FrameTable::default();
    let groups = changes
        .iter()
        .take(MAX_PAGE_GROUPS)
        .map(|c| PageGroup {
            // The flame graph shows growth only; the table shows all.
            bytes: c.bytes_delta.max(0) as u64,
            change: Some(match c.change {
                combine::Change::New => "new",
                combine::Change::Grew => "grew",
                combine::Change::Shrank => "shrank",
                combine::Change::Gone => "gone",
                combine::Change::Same => "same",
            }),
            bytes_delta: Some(c.bytes_delta),
            blocks_delta: Some(c.blocks_delta),
            old_bytes: Some(c.old_bytes),
            new_bytes: Some(c.new_bytes),
            blocks: c.group.blocks,
            ..page_group(&c.group, &mut table)
        })
        .collect();
    let (groups, groups_cut) = (groups, changes.len().saturating_sub(MAX_PAGE_GROUPS));
    let delta = combine::delta(new.1.leaked_bytes(), old.1.leaked_bytes());
    let page = Page {
        kind: "diff",
        title: "cudaleak diff".into(),
        facts: vec![
            ("old".into(), old.0.display().to_string()),
            ("new".into(), new.0.display().to_string()),
        ],
        weight: "growth",
        frames: table.frames,
        summary: format!(
            "cudaleak: {} leaked ({} -> {})",
            size_delta(delta),
            size_exact(old.1.leaked_bytes()),
            size_exact(new.1.leaked_bytes())
        ),
        groups,
        groups_cut,
        ..page_base()
    };
    render(&page)
}

pub fn merge_page(dir: &std::path::Path, processes: usize, view: &RankView, merged: &Report) -> String {
    let mut table = FrameTable::default();
    let groups = view
        .groups
        .iter()
        .take(MAX_PAGE_GROUPS)
        .map(|s| PageGroup {
            ranks: s.ranks.clone(),
            only_some: s.only_some,
            ..page_group(&s.group, &mut table)
        })
        .collect();
    let (groups, groups_cut) = (groups, view.groups.len().saturating_sub(MAX_PAGE_GROUPS));
    let page = Page {
        kind: "merge",
        title: format!("cudaleak merge: {}", count(processes as u64, "process")),
        facts: vec![("directory".into(), dir.display().to_string())],
        weight: "leaked bytes",
        summary: format!(
            "{} across {}",
            page_summary(merged.leaked_bytes(), merged.leaked_blocks(), "leaked"),
            count(processes as u64, "process")
        ),
        groups,
        groups_cut,
        ranks: view.ranks.clone(),
        frames: table.frames,
        ..page_base()
    };
    render(&page)
}

fn page_base() -> Page {
    Page {
        generator: format!("cudaleak {}", env!("CARGO_PKG_VERSION")),
        ..Page::default()
    }
}

/// JSON that can sit inside a `<script>` element: `<`, `>` and `&` are
/// written as `\u003c`, `\u003e`, `\u0026` (so `</script>` or `<!--` in a
/// file path cannot end the element or open a comment), and U+2028/U+2029
/// as escapes too (line terminators to older JavaScript parsers). In JSON
/// these characters can only occur inside strings, where the escapes mean
/// the same characters, so `JSON.parse` gives back the same data.
pub fn embed_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// Text for an HTML text node (the title).
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn render(page: &Page) -> String {
    let json = serde_json::to_string(page).unwrap_or_else(|_| "null".into());
    // Placeholders are replaced in one pass from left to right, so text
    // from the data can never be taken for a later placeholder.
    let mut out = String::with_capacity(TEMPLATE.len() + SCRIPT.len() + STYLE.len() + json.len());
    let mut rest = TEMPLATE;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let name = &rest[start + 2..start + len];
        match name {
            "TITLE" => out.push_str(&html_text(&page.title)),
            "STYLE" => out.push_str(STYLE),
            "SCRIPT" => out.push_str(SCRIPT),
            "DATA" => out.push_str(&embed_json(&json)),
            other => {
                out.push_str("{{");
                out.push_str(other);
                out.push_str("}}");
            }
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}
