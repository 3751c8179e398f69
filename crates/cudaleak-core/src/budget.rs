//! Memory budgets: each process's peak against a ceiling (`cudaleak run
//! --max-peak`) or against a stored run (`--peak-baseline`, `cudaleak diff
//! --peak`), with the call sites whose bytes at the peak changed most, and
//! the verdict in the forms CI systems read (Markdown, JUnit XML).
//!
//! Everything here reads reports only: the gate in the command line calls
//! it after the run, and its tests need no process.
//!
//! A call site is matched across two builds by its frames without their
//! lines ([`site_key`]): an edit above a site moves its lines, not its
//! functions and files.

use crate::base::units::{parse_size, size, size_delta, size_exact};
use crate::combine::rank_label;
use crate::report::render::{escape, label_groups, picture_frames};
use crate::report::{Group, MergedFrame, Report};
use std::collections::HashMap;
use std::fmt::Write;

/// `--peak-tolerance` when none is given: a peak may grow by 5 % of the
/// baseline's.
pub const DEFAULT_TOLERANCE_PERCENT: f64 = 5.0;

/// How many call sites a verdict names.
pub const SITES_SHOWN: usize = 5;

/// How much a peak may grow over its baseline: the larger of a share of
/// the baseline's peak and a number of bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub percent: f64,
    pub bytes: u64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            percent: DEFAULT_TOLERANCE_PERCENT,
            bytes: 0,
        }
    }
}

impl Tolerance {
    /// `specs` as `--peak-tolerance` takes them: each `5%` or a size
    /// (`64MiB`, `1000000`); both forms may be given, and the larger
    /// allowance wins. None given: the default, 5 %.
    pub fn parse(specs: &[String]) -> Result<Tolerance, String> {
        if specs.is_empty() {
            return Ok(Tolerance::default());
        }
        let mut t = Tolerance {
            percent: 0.0,
            bytes: 0,
        };
        for spec in specs {
            let s = spec.trim();
            if let Some(p) = s.strip_suffix('%') {
                let v: f64 = p
                    .trim()
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("--peak-tolerance: not a percentage: {}", escape(s)))?;
                t.percent = t.percent.max(v);
            } else {
                let b = parse_size(s).ok_or_else(|| {
                    format!(
                        "--peak-tolerance: not a percentage or a size: {} (write e.g. 5% or 64MiB)",
                        escape(s)
                    )
                })?;
                t.bytes = t.bytes.max(b);
            }
        }
        Ok(t)
    }

    /// The bytes a peak of `old` may grow by.
    pub fn allowance(&self, old: u64) -> u64 {
        let share = (old as f64 * self.percent / 100.0).floor();
        let share = if share >= u64::MAX as f64 {
            u64::MAX
        } else {
            share as u64
        };
        share.max(self.bytes)
    }

    /// `5%`, `64.0 MiB`, or `5% or 64.0 MiB, whichever is larger`.
    pub fn describe(&self) -> String {
        let pct = format!("{}%", self.percent);
        match (self.percent > 0.0, self.bytes > 0) {
            (true, true) => format!("{pct} or {}, whichever is larger", size(self.bytes)),
            (false, true) => size(self.bytes),
            _ => pct,
        }
    }
}

/// A call site as two builds of one program share it: the API, the kind
/// of memory and, from the allocating frame outwards, each frame's
/// function and file's name without its line (a frame without a function:
/// its module's name). The frames are those a report shows (machinery
/// folded away, [`picture_frames`]). Two lines of one function with the
/// same callers are one site here.
pub fn site_key(g: &Group) -> String {
    let mut key = format!("{}|{}", g.api, g.memory.name());
    for f in picture_frames(g, false) {
        key.push('|');
        match &f {
            MergedFrame::Python(p) => {
                let _ = write!(key, "py:{}@{}", p.function, basename(&p.file));
            }
            MergedFrame::Native(n) => match (&n.function, &n.file, &n.module) {
                (Some(func), Some(file), _) => {
                    let _ = write!(key, "{func}@{}", basename(file));
                }
                (Some(func), None, _) => key.push_str(func),
                (None, _, Some(m)) => {
                    let _ = write!(key, "[{}]", basename(m));
                }
                (None, _, None) => key.push_str("[?]"),
            },
        }
    }
    key
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A call site's bytes at the peak, before (in the baseline) and now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteChange {
    /// the group label of the site among those shown
    pub label: String,
    /// bytes at the baseline's peak (None: no baseline)
    pub old_bytes: Option<u64>,
    pub new_bytes: u64,
    /// the site's stack as the text report shows it
    pub stack: Vec<String>,
}

impl SiteChange {
    pub fn delta(&self) -> i64 {
        let old = self.old_bytes.unwrap_or(0);
        crate::combine::delta(self.new_bytes, old)
    }
}

/// The groups live at `r`'s peak, by [`site_key`], bytes summed.
fn sites_at_peak(r: &Report) -> Vec<(String, &Group, u64)> {
    let mut out: Vec<(String, &Group, u64)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for g in r.peak.iter().flat_map(|p| &p.groups) {
        let key = site_key(g);
        match index.get(&key) {
            Some(&i) => out[i].2 = out[i].2.saturating_add(g.bytes),
            None => {
                index.insert(key.clone(), out.len());
                out.push((key, g, g.bytes));
            }
        }
    }
    out
}

/// A site of either peak: its group, bytes at the baseline's peak (None:
/// no baseline), bytes at this peak.
type SiteBytes<'a> = (&'a Group, Option<u64>, u64);

/// The call sites at `new`'s peak and at `old`'s (when given), matched by
/// [`site_key`], those that changed most first (without a baseline, those
/// that held most), at most `max`.
pub fn peak_sites(old: Option<&Report>, new: &Report, max: usize) -> Vec<SiteChange> {
    let now = sites_at_peak(new);
    let before = old.map(sites_at_peak).unwrap_or_default();
    let before_by_key: HashMap<&str, u64> = before.iter().map(|(k, _, b)| (k.as_str(), *b)).collect();
    let now_keys: HashMap<&str, ()> = now.iter().map(|(k, _, _)| (k.as_str(), ())).collect();
    // Every site of either side: (group, old bytes, new bytes).
    let mut all: Vec<SiteBytes> = now
        .iter()
        .map(|(k, g, b)| {
            (
                *g,
                old.map(|_| before_by_key.get(k.as_str()).copied().unwrap_or(0)),
                *b,
            )
        })
        .collect();
    all.extend(
        before
            .iter()
            .filter(|(k, _, _)| !now_keys.contains_key(k.as_str()))
            .map(|(_, g, b)| (*g, Some(*b), 0)),
    );
    let change = |(_, o, n): &SiteBytes| match o {
        Some(o) => crate::combine::delta(*n, *o).unsigned_abs(),
        None => *n,
    };
    // Labelled among every site of both peaks, so that a label tells its
    // site from all the others, shown or not.
    let groups: Vec<&Group> = all.iter().map(|(g, _, _)| *g).collect();
    let mut labelled: Vec<(String, SiteBytes)> = label_groups(&groups)
        .into_iter()
        .map(|l| l.to_string())
        .zip(all)
        .collect();
    labelled.sort_by_key(|(_, e)| std::cmp::Reverse(change(e)));
    if old.is_some() {
        labelled.retain(|(_, e)| change(e) > 0);
    }
    labelled.truncate(max);
    labelled
        .into_iter()
        .map(|(label, (g, old_bytes, new_bytes))| SiteChange {
            label,
            old_bytes,
            new_bytes,
            stack: crate::report::render::display_frames(g, 12),
        })
        .collect()
}

/// Which budget a check is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetKind {
    /// `--max-peak`: a ceiling
    MaxPeak,
    /// `--peak-baseline`: growth over a stored run
    Baseline,
}

impl BudgetKind {
    pub fn name(self) -> &'static str {
        match self {
            BudgetKind::MaxPeak => "max-peak",
            BudgetKind::Baseline => "peak-baseline",
        }
    }
}

/// One process checked against one budget.
#[derive(Clone, Debug)]
pub struct Check {
    pub kind: BudgetKind,
    /// `rank 0 (python train.py)`
    pub process: String,
    pub peak: u64,
    /// the baseline's peak
    pub old_peak: Option<u64>,
    /// the most the peak may be
    pub limit: u64,
    pub passed: bool,
    /// what the verdict rests on, in one line
    pub verdict: String,
    pub sites: Vec<SiteChange>,
    /// the peak is PyTorch's reserved memory (its caching allocator's
    /// segments), not its tensors
    pub pytorch_reserved: bool,
}

impl Check {
    /// By how much the peak passed its limit.
    pub fn excess(&self) -> u64 {
        self.peak.saturating_sub(self.limit)
    }
}

/// `rank 0 (python train.py)`: how verdicts name a process.
pub fn process_name(r: &Report) -> String {
    let cmd = r.command.join(" ");
    let cmd: String = if cmd.chars().count() > 60 {
        cmd.chars().take(59).chain(std::iter::once('\u{2026}')).collect()
    } else {
        cmd
    };
    format!("{} ({})", rank_label(r), escape(&cmd))
}

fn reserved(r: &Report) -> bool {
    r.peak
        .iter()
        .flat_map(|p| &p.groups)
        .any(|g| g.pytorch_cache_segment)
}

/// `r`'s peak against `max` bytes.
pub fn check_max_peak(r: &Report, max: u64) -> Check {
    let peak = r.totals.peak_bytes;
    let passed = peak <= max;
    let verdict = if passed {
        format!("peak {} within the budget of {}", size_exact(peak), size(max))
    } else {
        format!(
            "peak {} is over the budget of {} by {}",
            size_exact(peak),
            size(max),
            size(peak - max)
        )
    };
    Check {
        kind: BudgetKind::MaxPeak,
        process: process_name(r),
        peak,
        old_peak: None,
        limit: max,
        passed,
        verdict,
        sites: peak_sites(None, r, SITES_SHOWN),
        pytorch_reserved: reserved(r),
    }
}

/// `new`'s peak against `old`'s, `tol` allowed.
pub fn check_baseline(old: &Report, new: &Report, tol: &Tolerance) -> Check {
    let (before, peak) = (old.totals.peak_bytes, new.totals.peak_bytes);
    let limit = before.saturating_add(tol.allowance(before));
    let passed = peak <= limit;
    let grew = crate::combine::delta(peak, before);
    let pct = if before > 0 {
        format!(" ({:+.1}%)", grew as f64 * 100.0 / before as f64)
    } else {
        String::new()
    };
    let verdict = format!(
        "peak {} -> {}: {}{pct}, {} (tolerance {})",
        size(before),
        size(peak),
        size_delta(grew),
        if passed {
            "within the baseline"
        } else {
            "over the baseline"
        },
        tol.describe()
    );
    Check {
        kind: BudgetKind::Baseline,
        process: process_name(new),
        peak,
        old_peak: Some(before),
        limit,
        passed,
        verdict,
        sites: peak_sites(Some(old), new, SITES_SHOWN),
        pytorch_reserved: reserved(new),
    }
}

/// For each process of `run`, its process in `baseline`: the same rank;
/// else (neither has a rank) the same command line, each path in it by
/// its file's name (a build or a checkout elsewhere runs
/// `/ci/pr/build/train` where the main branch ran `/ci/main/build/train`);
/// else, when each side is one process, each other. Each baseline process
/// is taken once.
pub fn match_processes<'a>(baseline: &'a [Report], run: &[&Report]) -> Vec<Option<&'a Report>> {
    let names = |r: &Report| -> Vec<String> { r.command.iter().map(|a| basename(a).to_string()).collect() };
    let mut taken = vec![false; baseline.len()];
    let mut out: Vec<Option<&'a Report>> = run
        .iter()
        .map(|r| {
            let found = baseline.iter().enumerate().position(|(i, b)| {
                !taken[i]
                    && match (r.rank, b.rank) {
                        (Some(x), Some(y)) => x == y,
                        (None, None) => names(r) == names(b),
                        _ => false,
                    }
            });
            found.map(|i| {
                taken[i] = true;
                &baseline[i]
            })
        })
        .collect();
    if let ([only], [b]) = (out.as_mut_slice(), baseline) {
        if only.is_none() && run.first().is_some_and(|r| r.rank.is_none() && b.rank.is_none()) {
            *only = Some(b);
        }
    }
    out
}

/// The failed check of a baseline that matched none of the run's
/// processes: nothing was compared, so nothing is vouched for.
pub fn unmatched_baseline(path: &str, baseline: usize, run: usize) -> Check {
    Check {
        kind: BudgetKind::Baseline,
        process: format!("the run ({})", plural(run, "process")),
        peak: 0,
        old_peak: None,
        limit: 0,
        passed: false,
        verdict: format!(
            "none of its processes matches one of the baseline's {} in {path} (by rank, else by command line): nothing compared",
            plural(baseline, "process")
        ),
        sites: Vec::new(),
        pytorch_reserved: false,
    }
}

/// The text a check prints: its verdict line, then its sites with the
/// first lines of their stacks.
pub fn check_text(c: &Check) -> String {
    let mut out = format!(
        "cudaleak: {}: {} {}: {}",
        c.kind.name(),
        c.process,
        if c.passed { "passed" } else { "FAILED" },
        c.verdict
    );
    if c.pytorch_reserved {
        out.push_str(
            "\n  (the peak counts PyTorch's reserved memory, its caching allocator's segments: run with --pytorch to count tensors)",
        );
    }
    if c.passed {
        return out;
    }
    let heading = match c.kind {
        BudgetKind::MaxPeak => "call sites that held the most at the peak:",
        BudgetKind::Baseline => "call sites whose bytes at the peak changed most:",
    };
    let _ = write!(out, "\n  {heading}");
    for s in &c.sites {
        let figure = match s.old_bytes {
            Some(o) => format!("{} ({} -> {})", size_delta(s.delta()), size(o), size(s.new_bytes)),
            None => size(s.new_bytes),
        };
        let _ = write!(out, "\n    {figure}  {}", s.label);
        for line in s.stack.iter().take(6) {
            let _ = write!(out, "\n      {}", line.trim_start());
        }
    }
    out
}

/// Markdown for a CI job's summary (`$GITHUB_STEP_SUMMARY`): the verdict,
/// each process's peak before and after, and the sites that changed most.
pub fn markdown(checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| !c.passed).count();
    let mut out = String::from("## cudaleak: GPU memory budgets\n\n");
    let _ = writeln!(
        out,
        "{}\n",
        if failed == 0 {
            format!("**Passed**: {} within budget.", plural(checks.len(), "check"))
        } else {
            format!(
                "**Failed**: {} of {} over budget.",
                failed,
                plural(checks.len(), "check")
            )
        }
    );
    out.push_str("| process | budget | peak before | peak after | limit | verdict |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for c in checks {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            md_cell(&c.process),
            c.kind.name(),
            c.old_peak.map(size).unwrap_or_else(|| "-".into()),
            size(c.peak),
            size(c.limit),
            if c.passed { "passed" } else { "**failed**" }
        );
    }
    for c in checks.iter().filter(|c| !c.passed && !c.sites.is_empty()) {
        let _ = writeln!(out, "\n### {}: {}\n", md_cell(&c.process), c.kind.name());
        out.push_str(match c.kind {
            BudgetKind::MaxPeak => "| bytes at the peak | call site |\n| --- | --- |\n",
            BudgetKind::Baseline => "| change at the peak | call site |\n| --- | --- |\n",
        });
        for s in &c.sites {
            let figure = match s.old_bytes {
                Some(o) => format!("{} ({} -> {})", size_delta(s.delta()), size(o), size(s.new_bytes)),
                None => size(s.new_bytes),
            };
            let _ = writeln!(
                out,
                "| {figure} | `{}` |",
                s.label.replace('`', "'").replace('|', "\\|")
            );
        }
    }
    out.push('\n');
    out
}

fn plural(n: usize, noun: &str) -> String {
    crate::base::units::count(n as u64, noun)
}

/// A table cell: no line breaks, `|` escaped.
fn md_cell(s: &str) -> String {
    s.replace(['\n', '\r'], " ").replace('|', "\\|")
}

/// JUnit XML (the form every CI system displays): one test suite, one
/// test case per process and budget, a failure with the verdict and the
/// sites for each that failed.
pub fn junit(checks: &[Check]) -> String {
    let failures = checks.iter().filter(|c| !c.passed).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"cudaleak\" tests=\"{}\" failures=\"{failures}\">",
        checks.len()
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"cudaleak budgets\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\">",
        checks.len()
    );
    let names = stable_names(checks);
    for (c, name) in checks.iter().zip(&names) {
        let _ = write!(
            out,
            "    <testcase classname=\"cudaleak.{}\" name=\"{}\"",
            c.kind.name(),
            xml(name)
        );
        if c.passed {
            let _ = writeln!(out, "><system-out>{}</system-out></testcase>", xml(&c.verdict));
            continue;
        }
        let _ = writeln!(out, ">");
        let _ = writeln!(
            out,
            "      <failure message=\"{}\" type=\"{}\">{}</failure>",
            xml(&c.verdict),
            c.kind.name(),
            xml(&check_text(c))
        );
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

/// Test case names that stay the same from one CI run to the next: a
/// process's rank label and command (`rank 1 (python train.py)`), else
/// its command line without the pid, numbered when two checks of one
/// budget would share one.
fn stable_names(checks: &[Check]) -> Vec<String> {
    let base: Vec<String> = checks
        .iter()
        .map(|c| match c.process.split_once(" (") {
            Some((label, cmd)) if label.starts_with("pid ") => {
                cmd.strip_suffix(')').unwrap_or(cmd).to_string()
            }
            _ => c.process.clone(),
        })
        .collect();
    (0..base.len())
        .map(|i| {
            let same = |j: usize| base[j] == base[i] && checks[j].kind == checks[i].kind;
            let before = (0..i).filter(|&j| same(j)).count();
            let total = (0..base.len()).filter(|&j| same(j)).count();
            if total > 1 {
                format!("{} [#{}]", base[i], before + 1)
            } else {
                base[i].clone()
            }
        })
        .collect()
}

/// Text for XML content and attributes; characters XML 1.0 cannot hold
/// are left out.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(' '),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::python::PythonFrame;
    use crate::record::MemoryKind;
    use crate::report::Peak;

    fn py(f: &str, line: i64) -> PythonFrame {
        PythonFrame {
            function: f.into(),
            file: "/src/train.py".into(),
            line: Some(line),
        }
    }

    fn site(caller: &str, line: i64, bytes: u64) -> Group {
        Group::new(
            1,
            bytes,
            "cudaMalloc",
            MemoryKind::Device,
            vec![],
            vec![py("alloc", 5), py(caller, line)],
        )
    }

    fn report(rank: Option<i64>, peak: Vec<Group>) -> Report {
        let mut r = Report::empty_for_tests();
        r.rank = rank;
        r.command = vec!["python".into(), "train.py".into()];
        r.totals.peak_bytes = peak.iter().map(|g| g.bytes).sum();
        r.peak = Some(Peak {
            bytes: r.totals.peak_bytes,
            timestamp_ms: 0,
            groups: peak,
            groups_left_out: None,
        });
        r
    }

    #[test]
    fn tolerances_take_the_larger_allowance() {
        let t = Tolerance::parse(&[]).unwrap();
        assert_eq!(t.allowance(1000), 50);
        let t = Tolerance::parse(&["10%".into(), "64 KiB".into()]).unwrap();
        assert_eq!(t.allowance(1000), 65536);
        assert_eq!(t.allowance(10 << 20), 1 << 20);
        assert_eq!(
            Tolerance::parse(&["1MiB".into()]).unwrap().allowance(1 << 30),
            1 << 20
        );
        assert!(Tolerance::parse(&["-5%".into()]).is_err());
        assert!(Tolerance::parse(&["lots".into()]).is_err());
    }

    /// An edit above every site moves their lines: the sites still match,
    /// and the one that grew is named first.
    #[test]
    fn sites_match_across_builds_whose_lines_moved() {
        let old = report(Some(0), vec![site("weights", 10, 100), site("cache", 20, 50)]);
        let new = report(
            Some(0),
            vec![
                site("weights", 13, 100),
                site("cache", 23, 50),
                site("planted", 40, 300),
            ],
        );
        let c = check_baseline(&old, &new, &Tolerance::default());
        assert!(!c.passed);
        assert_eq!(c.peak, 450);
        assert_eq!(c.limit, 157);
        assert_eq!(c.sites.len(), 1, "{:?}", c.sites);
        assert_eq!(
            c.sites[0].label,
            "cudaMalloc (device memory) at alloc train.py:5 < planted train.py:40"
        );
        assert_eq!((c.sites[0].old_bytes, c.sites[0].new_bytes), (Some(0), 300));
        let text = check_text(&c);
        assert!(
            text.contains("FAILED") && text.contains("+300 bytes (0 bytes -> 300 bytes)"),
            "{text}"
        );
        // Within a tolerance that absorbs it.
        let wide = Tolerance::parse(&["300 bytes".into()]).unwrap();
        assert!(check_baseline(&old, &new, &wide).passed);
    }

    #[test]
    fn a_ceiling_names_the_sites_that_held_most() {
        let r = report(None, vec![site("small", 1, 10), site("big", 2, 1000)]);
        let c = check_max_peak(&r, 500);
        assert!(!c.passed);
        assert_eq!(c.excess(), 510);
        assert!(c.sites[0].label.contains("big"), "{:?}", c.sites);
        assert!(check_max_peak(&r, 1010).passed);
    }

    #[test]
    fn processes_match_by_rank_else_by_command() {
        let base = vec![report(Some(1), vec![]), report(Some(0), vec![])];
        let run = [report(Some(0), vec![]), report(Some(2), vec![])];
        let refs: Vec<&Report> = run.iter().collect();
        let m = match_processes(&base, &refs);
        assert_eq!(m[0].map(|r| r.rank), Some(Some(0)));
        assert!(m[1].is_none());
        let base = vec![report(None, vec![])];
        let run = [report(None, vec![]), report(None, vec![])];
        let refs: Vec<&Report> = run.iter().collect();
        let m = match_processes(&base, &refs);
        assert!(m[0].is_some() && m[1].is_none(), "each baseline process once");
        // Paths by their file's name; one process each: each other.
        let mut moved = report(None, vec![]);
        moved.command = vec!["/usr/bin/python3".into(), "/ci/pr/train.py".into()];
        let mut main = report(None, vec![]);
        main.command = vec!["python3".into(), "/ci/main/train.py".into()];
        let mut other = report(None, vec![]);
        other.command = vec!["python3".into(), "eval.py".into()];
        let base = vec![other.clone(), main];
        let m = match_processes(&base, &[&moved]);
        assert_eq!(m[0].map(|r| r.command[1].as_str()), Some("/ci/main/train.py"));
        let m = match_processes(&base[..1], &[&moved]);
        assert_eq!(
            m[0].map(|r| r.command[1].as_str()),
            Some("eval.py"),
            "one process each"
        );
    }

    #[test]
    fn junit_names_stay_the_same_from_run_to_run() {
        let mut a = report(None, vec![site("x", 1, 100)]);
        a.pid = 4242;
        let mut b = a.clone();
        b.pid = 4343;
        let checks = [check_max_peak(&a, 10), check_max_peak(&b, 10)];
        assert!(
            checks[0].process.starts_with("pid 4242@"),
            "{}",
            checks[0].process
        );
        let xml = junit(&checks);
        assert!(xml.contains("name=\"python train.py [#1]\""), "{xml}");
        assert!(xml.contains("name=\"python train.py [#2]\""), "{xml}");
        assert!(!xml.contains("name=\"pid "), "{xml}");
        let unmatched = unmatched_baseline("main/", 2, 1);
        assert!(!unmatched.passed);
        assert!(check_text(&unmatched).contains("nothing compared"));
    }

    #[test]
    fn ci_formats_escape_what_reports_hold() {
        let mut r = report(Some(0), vec![site("a<b>&\"c|d", 1, 100)]);
        r.command = vec!["evil</testcase>".into(), "|x".into()];
        let c = check_max_peak(&r, 10);
        let xml = junit(std::slice::from_ref(&c));
        assert!(!xml.contains("evil</testcase>"), "{xml}");
        assert!(xml.contains("evil&lt;/testcase&gt;"), "{xml}");
        let md = markdown(&[c]);
        assert!(md.contains("\\|x"), "{md}");
        assert!(md.contains("**Failed**: 1 of 1 check over budget."), "{md}");
    }
}
