//! `--format html`: one self-contained page (no network, no CDN) for
//! `report`, `diff` and `merge`. The page is a fixed template with a small
//! script written for it (src/cli/html/); the data goes in as JSON in a
//! `<script type="application/json">` element, escaped so that nothing in
//! a report (function names, file paths, Python source names) can end that
//! element or start markup: see [`embed_json`].

use cudaleak_core::base::units::{count, size_delta, size_exact};
use cudaleak_core::combine::{self, GroupDelta, GroupKey, RankView};
use cudaleak_core::record::python::PythonFrame;
use cudaleak_core::report::render;
use cudaleak_core::report::{Group, MergedFrame, NativeFrame, Report, Trend};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

mod timeline;

use timeline::{page_timeline, PageTimeline, ReportPeak};

const TEMPLATE: &str = include_str!("html/template.html");
const SCRIPT: &str = include_str!("html/page.js");
const STYLE: &str = include_str!("html/page.css");
/// The labels of flame graphs' boxes, in the page and the SVG alike.
pub const SHORT_NAME: &str = include_str!("html/short_name.js");

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
    /// machinery the text report hides by default (program start, the
    /// interpreter, ctypes/libffi, the test runner's Python frames):
    /// [`render::is_noise`], [`render::is_runner`],
    /// so that the page folds exactly what the text report folds
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    noise: bool,
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
    /// where it was allocated, as the labels that tell groups apart say it
    /// ([`render::label_groups`] over the page's groups): the table's "call
    /// site" column and the flame graphs' tooltips
    site: String,
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
    /// memory PyTorch's caching allocator reserved
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pytorch_cache_segment: bool,
}

/// The failed request of an `oom` report, shown first.
#[derive(Serialize)]
pub struct PageOom {
    api: String,
    requested_bytes: u64,
    device: Option<u32>,
    device_free_bytes: Option<u64>,
    device_total_bytes: Option<u64>,
    failed_calls: u64,
    t_ms: i64,
    /// where the request was made, labelled as the groups beside it are
    site: String,
    /// innermost first, as indices into [`Page::frames`]
    frames: Vec<u32>,
    frames_cut: usize,
}

/// The process's peak and the groups live at that moment.
#[derive(Serialize)]
pub struct PagePeak {
    bytes: u64,
    t_ms: i64,
    groups: Vec<PageGroup>,
    /// groups past the report's cap and the page's, with their bytes
    groups_left_out: u64,
    bytes_left_out: u64,
}

/// One out-of-memory episode, marked on the timeline.
#[derive(Serialize)]
pub struct OomMark {
    pub t_ms: i64,
    pub api: String,
    pub requested_bytes: u64,
    pub failed_calls: u64,
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
    oom: Option<PageOom>,
    peak: Option<PagePeak>,
    /// the note on a PyTorch cache segment and the hint under the table,
    /// the text report's own words
    pytorch_note: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pytorch_hint: Option<&'static str>,
    /// `--full-stacks`: the page opens with every frame shown
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    full_stacks: bool,
}

fn native_frame(f: &NativeFrame) -> PageFrame {
    let loc = match (&f.file, f.line) {
        (Some(file), Some(line)) => Some(format!("{file}:{line}")),
        (Some(file), None) => Some(file.clone()),
        _ => f.module.as_ref().map(|m| format!("{m} {}", f.address)),
    };
    PageFrame {
        name: cudaleak_core::report::render::native_label(f),
        loc,
        python: false,
        noise: cudaleak_core::report::render::is_noise(f),
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
        // The test runner's frames (pytest, pluggy): folded as the text
        // folds them, when the stack has Python frames of its own.
        noise: render::is_runner(f),
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
        // Names capped as in every rendering (a 50 MB name).
        let cap = |s: &mut String| {
            if let std::borrow::Cow::Owned(c) = cudaleak_core::report::render::cap_name(s) {
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

/// `groups` as the page lists them, each labelled by the site that tells
/// it apart from the others ([`render::label_groups`]).
fn page_groups<'a>(groups: impl Iterator<Item = &'a Group>, table: &mut FrameTable) -> Vec<PageGroup> {
    let groups: Vec<&Group> = groups.take(MAX_PAGE_GROUPS).collect();
    render::label_groups(&groups)
        .into_iter()
        .zip(&groups)
        .map(|(label, g)| page_group(g, label.site, table))
        .collect()
}

fn page_group(g: &Group, site: String, table: &mut FrameTable) -> PageGroup {
    let (frames, frames_cut) = frames_of(g, table);
    PageGroup {
        site,
        bytes: g.bytes,
        blocks: g.blocks,
        api: g.api.clone(),
        memory: g.kind().name(),
        uncounted: !g.kind().counts_in_live_bytes(),
        trend: g.trend.map(|t| match t {
            Trend::Growing => "growing",
            Trend::Bounded => "bounded",
            Trend::Steady => "steady",
        }),
        frames,
        frames_cut,
        pytorch_cache_segment: g.pytorch_cache_segment,
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
    if let Some(line) = cudaleak_core::report::render::incomplete_line(r) {
        facts.push(("incomplete".into(), line));
    }
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

/// The page for `cudaleak report`: `all` is every dump read; `merged` the
/// view of the newest dump of each process.
pub fn report_page(all: &[(PathBuf, Report)], merged: &Report) -> String {
    report_page_with(all, merged, false)
}

/// [`report_page`]; `full_stacks` opens it with every frame shown.
pub fn report_page_with(all: &[(PathBuf, Report)], merged: &Report, full_stacks: bool) -> String {
    let files: Vec<PathBuf> = all.iter().map(|(p, _)| p.clone()).collect();
    let live = merged.trigger != cudaleak_core::report::Trigger::Exit;
    let mut table = FrameTable::default();
    let groups = page_groups(merged.leaks.iter(), &mut table);
    let groups_cut = merged.leaks.len().saturating_sub(MAX_PAGE_GROUPS);
    let table_rows: HashMap<GroupKey, usize> = merged
        .leaks
        .iter()
        .take(MAX_PAGE_GROUPS)
        .enumerate()
        .map(|(i, g)| (GroupKey::of(g), i))
        .collect();
    let mut timeline = page_timeline(all, &mut table, &table_rows);
    if let Some(t) = &mut timeline {
        t.ooms = merged
            .oom_events
            .iter()
            .map(|e| OomMark {
                t_ms: e.timestamp_ms,
                api: e.api.clone(),
                requested_bytes: e.requested_bytes,
                failed_calls: e.failed_calls,
            })
            .collect();
        // An `oom` report carries its own request even when no episode
        // list came with it.
        if let Some(o) = merged.oom.as_ref().filter(|_| t.ooms.is_empty()) {
            t.ooms.push(OomMark {
                t_ms: o.timestamp_ms,
                api: o.api.clone(),
                requested_bytes: o.requested_bytes,
                failed_calls: o.failed_calls,
            });
        }
        t.report_peak = merged.peak.as_ref().filter(|p| p.bytes > 0).map(|p| ReportPeak {
            t_ms: p.timestamp_ms,
            bytes: p.bytes,
        });
        if let Some(p) = merged.peak.as_ref().filter(|p| p.bytes > 0) {
            // A site missing from a whole list of the peak's groups held
            // nothing then; from a cut list, it is not known.
            let whole = p.groups_left_out.is_none_or(|l| l.groups == 0);
            let at_peak: HashMap<GroupKey, u64> =
                p.groups.iter().map(|g| (GroupKey::of(g), g.bytes)).collect();
            for s in &mut t.series {
                if let Some(key) = &s.key {
                    s.at_peak = at_peak.get(key).copied().or(whole.then_some(0));
                }
            }
        }
    }
    let oom = merged.oom.as_ref().map(|o| {
        let request = Group {
            merged_stack: o.merged_stack.clone(),
            ..Group::new(
                1,
                o.requested_bytes,
                &o.api,
                cudaleak_core::record::MemoryKind::Device,
                o.native_stack.clone(),
                o.python_stack.clone(),
            )
        };
        let (frames, frames_cut) = frames_of(&request, &mut table);
        let beside: Vec<&Group> = merged.leaks.iter().take(MAX_PAGE_GROUPS).collect();
        PageOom {
            site: render::request_site(o, &beside),
            api: o.api.clone(),
            requested_bytes: o.requested_bytes,
            device: o.device,
            device_free_bytes: o.device_free_bytes,
            device_total_bytes: o.device_total_bytes,
            failed_calls: o.failed_calls,
            t_ms: o.timestamp_ms,
            frames,
            frames_cut,
        }
    });
    let peak = merged.peak.as_ref().filter(|p| p.bytes > 0).map(|p| {
        let shown = page_groups(p.groups.iter(), &mut table);
        let rest = p.groups.iter().skip(MAX_PAGE_GROUPS);
        let left = p.groups_left_out.unwrap_or_default();
        PagePeak {
            bytes: p.bytes,
            t_ms: p.timestamp_ms,
            groups: shown,
            groups_left_out: left.groups + rest.clone().count() as u64,
            bytes_left_out: cudaleak_core::report::saturating_sum(rest.map(|g| g.bytes))
                .saturating_add(left.bytes),
        }
    });
    let pytorch = merged
        .leaks
        .iter()
        .chain(merged.peak.iter().flat_map(|p| &p.groups))
        .any(|g| g.pytorch_cache_segment);
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
        oom,
        peak,
        pytorch_hint: pytorch.then_some(cudaleak_core::report::render::PYTORCH_CACHE_HINT),
        full_stacks,
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
    let shown: Vec<&Group> = changes.iter().take(MAX_PAGE_GROUPS).map(|c| &c.group).collect();
    let groups = changes
        .iter()
        .zip(render::label_groups(&shown))
        .map(|(c, label)| PageGroup {
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
            ..page_group(&c.group, label.site, &mut table)
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
    let shown: Vec<&Group> = view
        .groups
        .iter()
        .take(MAX_PAGE_GROUPS)
        .map(|s| &s.group)
        .collect();
    let groups = view
        .groups
        .iter()
        .zip(render::label_groups(&shown))
        .map(|(s, label)| PageGroup {
            ranks: s.ranks.clone(),
            only_some: s.only_some,
            ..page_group(&s.group, label.site, &mut table)
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
        pytorch_note: cudaleak_core::report::render::PYTORCH_CACHE_NOTE,
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
            "SCRIPT" => {
                out.push_str(SCRIPT);
                out.push_str(SHORT_NAME);
            }
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
