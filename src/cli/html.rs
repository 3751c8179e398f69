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
use cudaleak_core::report::{Group, MergedFrame, NativeFrame, Report, SampledTimeline, Trend};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

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

#[derive(Serialize)]
pub struct Series {
    pub label: String,
    /// the site's stack, innermost first, as indices into [`Page::frames`]
    /// (empty for "other")
    pub stack: Vec<u32>,
    pub values: Vec<u64>,
    /// why it is drawn: "largest at the end", "largest at the peak",
    /// "fastest growing"
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<&'static str>,
    /// index of its row in the table, when it has one: the legend gives
    /// the table's figure
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<usize>,
    /// what is missing when the series is not whole
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
    /// its bytes at the process's peak, exact (the report's `peak`), where
    /// the report has one: the values are samples, and the most a sample
    /// saw is not the peak
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_peak: Option<u64>,
    /// the site's group, to find it in the report's peak
    #[serde(skip)]
    key: Option<GroupKey>,
}

/// A call site's series before the choice of what to draw.
struct SiteRow<'a> {
    group: &'a Group,
    values: Vec<u64>,
    partial: Option<String>,
}

/// The call sites a timeline draws, chosen when the page is made from
/// every site's series (sites chosen early, or by their largest
/// sample, lost the ones that grew late to "other"): the largest at the
/// end, the largest at the highest point, and those that grew the most
/// over the second half of the run; then the largest at the end again up
/// to [`TIMELINE_SITES`]. Drawn largest at the end first (bottom band).
fn choose_sites(rows: &[SiteRow], total: &[u64]) -> Vec<(usize, Vec<&'static str>)> {
    let n = total.len();
    if n == 0 || rows.is_empty() {
        return Vec::new();
    }
    let last = n - 1;
    let peak = total
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(last, |(i, _)| i);
    let mid = n / 2;
    let at = |r: &SiteRow, i: usize| r.values.get(i).copied().unwrap_or(0);
    let order = |key: &dyn Fn(&SiteRow) -> i128| {
        let mut v: Vec<usize> = (0..rows.len()).filter(|&i| key(&rows[i]) > 0).collect();
        v.sort_by(|&a, &b| key(&rows[b]).cmp(&key(&rows[a])).then(a.cmp(&b)));
        v
    };
    let by_end = order(&|r| at(r, last) as i128);
    let by_peak = order(&|r| at(r, peak) as i128);
    let by_growth = order(&|r| at(r, last) as i128 - at(r, mid) as i128);
    let mut chosen: Vec<(usize, Vec<&'static str>)> = Vec::new();
    let add = |i: usize, why: &'static str, chosen: &mut Vec<(usize, Vec<&'static str>)>, room: bool| {
        if let Some(c) = chosen.iter_mut().find(|c| c.0 == i) {
            if !c.1.contains(&why) {
                c.1.push(why);
            }
        } else if room && chosen.len() < TIMELINE_SITES {
            chosen.push((i, vec![why]));
        }
    };
    // Each list's first share, then the rest by the end and by the peak.
    let shares = [
        (&by_end, TIMELINE_SITES / 2, "largest at the end"),
        (&by_peak, TIMELINE_SITES / 3, "largest at the peak"),
        (&by_growth, TIMELINE_SITES / 4, "fastest growing"),
    ];
    let fill = [
        (&by_end, usize::MAX, "largest at the end"),
        (&by_peak, usize::MAX, "largest at the peak"),
    ];
    for &(list, n, why) in shares.iter().chain(&fill) {
        for &i in list.iter().take(n) {
            add(i, why, &mut chosen, true);
        }
    }
    // Tags for every list a shown site is in, so the tooltip says all.
    for &(list, n, why) in &shares {
        for &i in list.iter().take(n) {
            add(i, why, &mut chosen, false);
        }
    }
    chosen.sort_by(|a, b| {
        at(&rows[b.0], last)
            .cmp(&at(&rows[a.0], last))
            .then(at(&rows[b.0], peak).cmp(&at(&rows[a.0], peak)))
            .then(a.0.cmp(&b.0))
    });
    chosen
}

/// The drawn series of `rows`, labelled so that they tell apart
/// ([`cudaleak_core::report::render::group_labels`]), with "other" for the rest.
fn chosen_series(
    rows: &[SiteRow],
    total: &[u64],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Vec<Series> {
    let chosen = choose_sites(rows, total);
    let groups: Vec<&Group> = chosen.iter().map(|&(i, _)| rows[i].group).collect();
    let labels = render::group_labels(&groups);
    let mut series: Vec<Series> = chosen
        .iter()
        .zip(labels)
        .map(|((i, why), label)| {
            let r = &rows[*i];
            Series {
                label,
                stack: frames_of(r.group, table).0,
                values: r.values.clone(),
                why: why.clone(),
                group: table_rows.get(&GroupKey::of(r.group)).copied(),
                partial: r.partial.clone(),
                at_peak: None,
                key: Some(GroupKey::of(r.group)),
            }
        })
        .collect();
    let other: Vec<u64> = total
        .iter()
        .enumerate()
        .map(|(k, &t)| {
            let listed = series.iter().map(|s| s.values[k]).fold(0u64, u64::saturating_add);
            t.saturating_sub(listed)
        })
        .collect();
    push_other(&mut series, other);
    series
}

/// The "other" series of a timeline: live bytes outside the listed call
/// sites, drawn only when there are any.
fn push_other(series: &mut Vec<Series>, other: Vec<u64>) {
    if other.iter().any(|&v| v > 0) {
        series.push(Series {
            label: "other".into(),
            stack: Vec::new(),
            values: other,
            why: Vec::new(),
            group: None,
            partial: None,
            at_peak: None,
            key: None,
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
    /// the out-of-memory episodes of the report
    pub ooms: Vec<OomMark>,
    /// call sites summed in "other"
    pub other_sites: usize,
    /// the report's own peak with its time (`peak`), when it has one
    pub report_peak: Option<ReportPeak>,
}

#[derive(Serialize)]
pub struct ReportPeak {
    pub t_ms: i64,
    pub bytes: u64,
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

/// A process's latest dump so far, and its groups' bytes.
type LatestDump<'a> = (&'a Report, Vec<(GroupKey, u64)>);

/// The timeline a set of dumps shows by themselves: one point per dump
/// (of every process, summed), one band per call site. Reports that carry
/// a sampled timeline give more points; see [`super::html_timeline`].
fn timeline_from_dumps(
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
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
    // Points at which a dump listed only some of its groups
    // (`groups_left_out`): a site absent there may only have been cut.
    let mut cut: Vec<bool> = Vec::new();
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
        let some_cut = current
            .values()
            .any(|(d, _)| d.totals.groups_left_out.is_some_and(|l| l.groups > 0));
        if t_ms.last() == Some(&r.timestamp_ms) {
            // Two processes dumped in the same millisecond: one point.
            t_ms.pop();
            total.pop();
            columns.pop();
            cut.pop();
        }
        t_ms.push(r.timestamp_ms);
        total.push(live);
        columns.push(column);
        cut.push(some_cut);
        marks.push(Mark {
            t_ms: r.timestamp_ms,
            trigger: r.trigger.name().to_string(),
            label: format!("{} dump #{} of pid {}", r.trigger.name(), r.sequence, r.pid),
        });
    }
    let rows: Vec<SiteRow> = (0..keys.len())
        .map(|i| SiteRow {
            group: key_group[i],
            values: columns.iter().map(|c| c.get(&i).copied().unwrap_or(0)).collect(),
            partial: columns
                .iter()
                .zip(&cut)
                .any(|(c, &cut)| cut && !c.contains_key(&i))
                .then(|| {
                    "partial: not listed at every dump (CUDALEAK_MAX_GROUPS left groups out)".to_string()
                }),
        })
        .collect();
    let series = chosen_series(&rows, &total, table, table_rows);
    let other_sites = rows.len()
        - series
            .iter()
            .filter(|s| s.label != "other" || !s.stack.is_empty())
            .count();
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
        ooms: Vec::new(),
        report_peak: None,
        other_sites,
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

/// The timeline a report carries (`CUDALEAK_TIMELINE`): one point per
/// sample, one band per call site among the largest, the rest "other".
fn timeline_from_samples(
    t: &SampledTimeline,
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
    if t.samples.is_empty() {
        return None;
    }
    let total: Vec<u64> = t.samples.iter().map(|s| s.live_bytes).collect();
    // Per site: its whole series where the report kept it,
    // else what the samples' largest 8 say of it (partial).
    let mut whole = t.whole_series();
    // Sites of one group (the same stack less the interpreter's return
    // addresses) are one series, as they are one row of the table.
    let mut rows: Vec<SiteRow> = Vec::new();
    let mut row_of: HashMap<GroupKey, usize> = HashMap::new();
    for (i, g) in t.sites.iter().enumerate() {
        let (values, partial) = match whole[i].take() {
            Some(v) => (v, None),
            // Whole where it is listed at every sample that left bytes
            // out; else it may hide in "other" there.
            None => (
                t.samples.iter().map(|s| s.listed(i)).collect(),
                t.samples
                    .iter()
                    .any(|s| s.other_bytes > 0 && !s.sites.iter().any(|&(j, _)| j as usize == i))
                    .then(|| {
                        format!(
                            "partial: only where it was among the {} largest at a sample",
                            cudaleak_core::timeline::site_timeline::SITES_PER_SAMPLE
                        )
                    }),
            ),
        };
        match row_of.entry(GroupKey::of(g)) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let r = &mut rows[*e.get()];
                for (a, b) in r.values.iter_mut().zip(values) {
                    *a = a.saturating_add(b);
                }
                r.partial = r.partial.take().or(partial);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(rows.len());
                rows.push(SiteRow {
                    group: g,
                    values,
                    partial,
                });
            }
        }
    }
    let series = chosen_series(&rows, &total, table, table_rows);
    let other_sites = rows.len()
        - series
            .iter()
            .filter(|s| s.label != "other" || !s.stack.is_empty())
            .count();
    let site_labels = render::group_labels(&t.sites.iter().collect::<Vec<_>>());
    let peak = t.peak.as_ref().map(|p| Peak {
        t_ms: p.timestamp_ms,
        bytes: p.live_bytes,
        sites: p
            .sites
            .iter()
            .filter_map(|&(i, bytes)| {
                site_labels.get(i as usize).map(|label| PeakSite {
                    label: label.clone(),
                    bytes,
                })
            })
            .collect(),
    });
    Some(thin(PageTimeline {
        source: "sampler",
        process_peak: t.samples.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
        t_ms: t.samples.iter().map(|s| s.timestamp_ms).collect(),
        total,
        series,
        peak,
        marks: dump_marks(all),
        ooms: Vec::new(),
        report_peak: None,
        other_sites,
    }))
}

/// The sampled timeline when the reports are of one process and the
/// newest carries one; else one point per dump.
fn page_timeline(
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
    let first = &all.first()?.1;
    let one_process = all
        .iter()
        .all(|(_, r)| combine::process_id(r) == combine::process_id(first));
    let newest = all
        .iter()
        .map(|(_, r)| r)
        .max_by_key(|r| (r.sequence, r.timestamp_ms))?;
    match &newest.timeline {
        Some(t) if one_process => timeline_from_samples(t, all, table, table_rows),
        _ => timeline_from_dumps(all, table, table_rows),
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

#[cfg(test)]
mod tests {
    use super::*;
    use cudaleak_core::record::MemoryKind;

    fn site(i: usize) -> Group {
        let mut g = Group::new(0, 0, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new());
        g.api = format!("site{i}");
        g
    }

    /// Issue 26: of 30 steady sites and one that starts late and grows,
    /// the late one is drawn (largest at the end and fastest growing), and
    /// so is the one that was largest at the peak though gone at the end.
    #[test]
    fn the_choice_keeps_late_growers_and_the_peak_s_sites() {
        let n = 100;
        let groups: Vec<Group> = (0..32).map(site).collect();
        let mut rows: Vec<SiteRow> = (0..30)
            .map(|i| SiteRow {
                group: &groups[i],
                values: vec![1000 + i as u64; n],
                partial: None,
            })
            .collect();
        rows.push(SiteRow {
            group: &groups[30],
            values: (0..n as u64)
                .map(|k| if k < 80 { 0 } else { (k - 79) * 5000 })
                .collect(),
            partial: None,
        });
        rows.push(SiteRow {
            group: &groups[31],
            values: (0..n).map(|k| if k == 50 { 1 << 30 } else { 0 }).collect(),
            partial: None,
        });
        let total: Vec<u64> = (0..n).map(|k| rows.iter().map(|r| r.values[k]).sum()).collect();
        let chosen = choose_sites(&rows, &total);
        assert_eq!(chosen.len(), TIMELINE_SITES);
        let late = chosen.iter().find(|c| c.0 == 30).expect("the late grower");
        assert!(late.1.contains(&"largest at the end") && late.1.contains(&"fastest growing"));
        assert_eq!(chosen[0].0, 30, "largest at the end first");
        let spike = chosen.iter().find(|c| c.0 == 31).expect("the peak's site");
        assert!(spike.1.contains(&"largest at the peak"));
    }
}
