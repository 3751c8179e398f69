//! `cudaleak report`, `diff` and `merge`: reading report files and
//! directories, and rendering them.

use super::CliResult;
use crate::{Format, ViewArgs};
use cudaleak_core::base::units::{count, size_delta, size_exact};
use cudaleak_core::combine::{self, Change};
use cudaleak_core::report::render::{self, escape, TextOptions};
use cudaleak_core::report::{saturating_sum, Group, Report, MAX_REPORT_BYTES};
use cudaleak_core::symbolize::offline::OfflineSymbolizer;
use cudaleak_core::timeline::Timeline;
use std::path::{Path, PathBuf};

fn is_report_name(name: &str) -> bool {
    name.starts_with("cudaleak.") && name.ends_with(".json") && !name.ends_with(".timeline.json")
}

/// Searches `dir` and its subdirectories. Symbolic links to directories
/// are not followed: a directory holding `a -> .` and `b -> .` made the
/// walk visit about 2^40 paths. `DirEntry::file_type` does not
/// follow links, so a link is never taken for a directory here.
fn collect_dir(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let is_real_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_real_dir && !name.starts_with('.') {
            collect_dir(&p, out)?;
        } else if is_report_name(&name) {
            out.push(p);
        }
    }
    Ok(())
}

/// Every report named by `paths` (files, or directories searched for
/// `cudaleak.*.json`), each checked; the first bad one is an error.
pub fn load(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Report)>, String> {
    let mut files = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", escape(&p.display().to_string())))?;
        if meta.is_dir() {
            let before = files.len();
            collect_dir(p, &mut files)?;
            if files.len() == before {
                return Err(format!(
                    "no cudaleak reports (cudaleak.*.json) in {}",
                    p.display()
                ));
            }
        } else {
            files.push(p.clone());
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|f| {
            Report::read(&f)
                .map(|r| (f.clone(), r))
                .map_err(|e| format!("{}: {e}", escape(&f.display().to_string())))
        })
        .collect()
}

/// The runs among `reports`: by `run_id`; reports without one (the
/// library used without `cudaleak run`) form one set of their own.
fn split_runs(reports: Vec<(PathBuf, Report)>) -> Vec<Vec<(PathBuf, Report)>> {
    type Run = (Option<String>, Vec<(PathBuf, Report)>);
    let mut runs: Vec<Run> = Vec::new();
    for (p, r) in reports {
        match runs.iter_mut().find(|(id, _)| *id == r.run_id) {
            Some((_, list)) => list.push((p, r)),
            None => runs.push((r.run_id.clone(), vec![(p, r)])),
        }
    }
    let newest = |list: &Vec<(PathBuf, Report)>| list.iter().map(|(_, r)| r.timestamp_ms).max().unwrap_or(0);
    runs.sort_by_key(|(_, list)| newest(list));
    runs.into_iter().map(|(_, list)| list).collect()
}

/// Runs that are the ranks of one distributed job, each rank under its own
/// `cudaleak run`: every report names a rank, and no rank comes twice.
/// Runs one after another repeat their ranks (or have none).
fn ranks_of_one_job(runs: &[Vec<(PathBuf, Report)>]) -> bool {
    let mut seen = std::collections::HashSet::new();
    runs.iter()
        .flatten()
        .all(|(_, r)| r.rank.is_some_and(|k| seen.insert(k)))
}

fn run_name(list: &[(PathBuf, Report)]) -> String {
    match list.first().and_then(|(_, r)| r.run_id.as_deref()) {
        Some(id) => format!("run {}", escape(id)),
        None => "reports without a run id".to_string(),
    }
}

/// The reports `paths` name, newest dump of each process, of one run: a
/// directory shared by several `cudaleak run`s held them all, and `report`
/// added them together, peaks included, under one pid. Several
/// runs: the latest is shown and stderr says so, or with `--all-runs`
/// every run, stderr saying what was merged.
fn load_runs(paths: &[PathBuf], view: &ViewArgs) -> Result<Vec<Vec<(PathBuf, Report)>>, String> {
    let mut runs = split_runs(combine::latest_per_process(load(paths)?));
    if runs.len() > 1 && ranks_of_one_job(&runs) {
        // `srun cudaleak run -- train.py`: one run id per rank, one job.
        return Ok(vec![runs.into_iter().flatten().collect()]);
    }
    if runs.len() > 1 {
        let shown: Vec<String> = paths
            .iter()
            .map(|p| escape(&p.display().to_string()).into_owned())
            .collect();
        if view.all_runs {
            eprintln!(
                "cudaleak: {} hold {}; merging them all (--all-runs): {}; the peak shown is the largest run's",
                shown.join(" "),
                count(runs.len() as u64, "run"),
                runs.iter().map(|l| run_name(l)).collect::<Vec<_>>().join(", ")
            );
        } else {
            let latest = runs.pop().unwrap_or_default();
            eprintln!(
                "cudaleak: {} hold {}; showing the latest, {} ({}); --all-runs merges them all",
                shown.join(" "),
                count(runs.len() as u64 + 1, "run"),
                run_name(&latest),
                count(latest.len() as u64, "process")
            );
            runs = vec![latest];
        }
    }
    Ok(runs)
}

/// Symbolizes after the fact: frames without a function by default, every
/// frame with `--symbolize`, none with `--no-symbolize`.
fn symbolize(r: &mut Report, view: &ViewArgs) {
    symbolize_each(std::slice::from_mut(r), view);
}

/// [`symbolize`] for several reports, each module and debug file read once.
fn symbolize_each<'a>(reports: impl IntoIterator<Item = &'a mut Report>, view: &ViewArgs) {
    if view.no_symbolize {
        return;
    }
    let mut s = OfflineSymbolizer::new(view.debug_root.clone());
    for r in reports {
        s.symbolize_report(r, view.symbolize);
    }
}

/// One report for `paths`: the newest dump of each process of one run (or
/// of all runs, see [`load_runs`]), merged.
fn load_merged(paths: &[PathBuf], view: &ViewArgs) -> Result<Report, String> {
    load_merged_from(paths, view).map(|(r, _)| r)
}

/// The report, and the one file it comes from when it is one process's
/// (`report DIR` printed `file: DIR` instead of the file it chose).
fn load_merged_from(paths: &[PathBuf], view: &ViewArgs) -> Result<(Report, Option<PathBuf>), String> {
    let runs = load_runs(paths, view)?;
    let process = |r: &Report| (r.hostname.clone(), r.pid, r.instance.clone());
    let chosen = match runs.as_slice() {
        [one] if one.iter().all(|(_, r)| process(r) == process(&one[0].1)) => {
            one.iter().max_by_key(|(_, r)| r.sequence).map(|(p, _)| p.clone())
        }
        _ => None,
    };
    let per_run: Vec<(PathBuf, Report)> = runs
        .iter()
        .filter_map(|list| combine::merge(list).map(|r| (list[0].0.clone(), r)))
        .collect();
    let mut r = if per_run.len() == 1 {
        per_run.into_iter().next().map(|(_, r)| r)
    } else {
        // Runs happened one after another: their peaks never add up.
        let peak = per_run
            .iter()
            .map(|(_, r)| r.totals.peak_bytes)
            .max()
            .unwrap_or(0);
        let mut m = combine::merge(&per_run);
        if let Some(m) = m.as_mut() {
            m.totals.peak_bytes = peak;
            m.merged_from = runs
                .iter()
                .flatten()
                .map(|(p, _)| p.display().to_string())
                .collect();
        }
        m
    }
    .ok_or_else(|| "no reports".to_string())?;
    symbolize(&mut r, view);
    Ok((r, chosen))
}

fn opts(view: &ViewArgs) -> TextOptions {
    TextOptions {
        max_groups: view.top.unwrap_or(usize::MAX),
        full_stacks: view.full_stacks,
        // Every frame means every frame.
        max_frames: if view.full_stacks {
            usize::MAX
        } else {
            TextOptions::default().max_frames
        },
    }
}

/// A whole page (HTML, SVG) on stdout.
fn print_page(page: &str) -> CliResult {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(page.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| format!("cannot write the page: {e}"))?;
    Ok(0)
}

fn print_json<T: serde::Serialize>(v: &T) -> CliResult {
    let s = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    println!("{s}");
    Ok(0)
}

/// A report as JSON with at most `top` groups in each list, what was left
/// out counted in `omitted` (schema: an extension); totals untouched.
fn report_json(r: &Report, top: Option<usize>) -> Result<serde_json::Value, String> {
    let mut v = serde_json::to_value(r).map_err(|e| e.to_string())?;
    let Some(n) = top else { return Ok(v) };
    let mut omitted = serde_json::Map::new();
    for (name, list) in [
        ("leaks", &r.leaks),
        ("growth", &r.growth),
        ("suppressed", &r.suppressed),
    ] {
        let rest = list.get(n..).unwrap_or(&[]);
        if rest.is_empty() {
            continue;
        }
        if let Some(a) = v.get_mut(name).and_then(|a| a.as_array_mut()) {
            a.truncate(n);
        }
        omitted.insert(
            name.into(),
            serde_json::json!({
                "groups": rest.len(),
                "blocks": saturating_sum(rest.iter().map(|g| g.blocks)),
                "bytes": saturating_sum(rest.iter().map(|g| g.bytes)),
            }),
        );
    }
    if !omitted.is_empty() {
        v["omitted"] = serde_json::Value::Object(omitted);
    }
    Ok(v)
}

/// `report X.timeline.json`: timelines are files the library writes too,
/// and every such file has a command that shows it.
fn timeline(paths: &[PathBuf], view: &ViewArgs) -> Option<CliResult> {
    let is_timeline = |p: &PathBuf| p.to_string_lossy().ends_with(".timeline.json") && p.is_file();
    if !paths.iter().any(is_timeline) {
        return None;
    }
    let mut out = String::new();
    for p in paths {
        let shown = escape(&p.display().to_string()).into_owned();
        let text = match cudaleak_core::base::safe_read::read_regular_text(p, MAX_REPORT_BYTES) {
            Ok(t) => t,
            Err(e) => return Some(Err(format!("{shown}: {e}"))),
        };
        let t = match Timeline::parse(&text) {
            Ok(t) => t,
            Err(e) => return Some(Err(format!("{shown}: {e}"))),
        };
        match view.format {
            Format::Json => match serde_json::to_string_pretty(&t) {
                Ok(s) => out.push_str(&(s + "\n")),
                Err(e) => return Some(Err(e.to_string())),
            },
            Format::Text => out.push_str(&cudaleak_core::timeline::render::timeline_text(
                &t,
                Some(&p.display().to_string()),
                view.top.unwrap_or(20),
            )),
            _ => {
                return Some(Err(format!(
                    "{shown}: a timeline file has no stacks; use --format text or json (the HTML page of a report shows its sampled timeline)"
                )))
            }
        }
    }
    print!("{out}");
    Some(Ok(0))
}

pub fn report(paths: &[PathBuf], view: &ViewArgs) -> CliResult {
    if let Some(done) = timeline(paths, view) {
        return done;
    }
    if view.format.is_export() {
        return export(paths, view);
    }
    let (r, chosen) = load_merged_from(paths, view)?;
    match view.format {
        Format::Json => print_json(&report_json(&r, view.top)?),
        Format::Folded => {
            print!("{}", render::folded_top(&r.leaks, view.top.unwrap_or(usize::MAX)));
            Ok(0)
        }
        Format::Html => {
            // Every dump of the run shown (not only the newest of each
            // process): the page marks each dump on the timeline.
            let mut all: Vec<(PathBuf, Report)> = load(paths)?
                .into_iter()
                .filter(|(_, d)| r.run_id.is_none() || d.run_id == r.run_id)
                .collect();
            // As the merged report is: the page matches each timeline site
            // to its table row by its frames.
            symbolize_each(all.iter_mut().map(|(_, d)| d), view);
            print_page(&super::html::report_page_with(&all, &r, view.full_stacks))
        }
        Format::Svg => print_page(&super::svg::flame_graph(
            &match render::incomplete_line(&r) {
                Some(line) => format!("cudaleak: bytes by stack, pid {}. {line}", r.pid),
                None => format!("cudaleak: bytes by stack, pid {}", r.pid),
            },
            &render::folded_picture(&r.leaks, view.full_stacks),
        )?),
        Format::Text => {
            let source = chosen.map(|p| p.display().to_string());
            print!("{}", render::text(&r, source.as_deref(), &opts(view)));
            Ok(0)
        }
        Format::Pprof | Format::Trace | Format::TorchSnapshot | Format::Speedscope => export(paths, view),
    }
}

/// `--format pprof|trace|torch-snapshot|speedscope`: the
/// newest report of each process of the run shown, each process its own
/// in the export (ranks, hosts and pids stay apart), never a sum.
fn export(paths: &[PathBuf], view: &ViewArgs) -> CliResult {
    let mut processes: Vec<(PathBuf, Report)> = load_runs(paths, view)?.into_iter().flatten().collect();
    symbolize_each(processes.iter_mut().map(|(_, r)| r), view);
    if let Some(n) = view.top {
        super::export::keep_top(&mut processes, n);
    }
    // The trace marks every dump of the processes shown, not only the
    // newest of each (as the HTML page's timeline does).
    let dumps = if view.format == Format::Trace {
        load(paths)?
            .into_iter()
            .map(|(path, r)| super::export::trace::Dump::of(path, &r))
            .collect()
    } else {
        Vec::new()
    };
    super::export::print(view.format, &processes, &dumps, view.full_stacks)
}

pub fn diff(old: &Path, new: &Path, view: &ViewArgs) -> CliResult {
    let a = load_merged(&[old.to_path_buf()], view)?;
    let b = load_merged(&[new.to_path_buf()], view)?;
    let mut changes = combine::diff(&a, &b);
    changes.retain(|c| c.change != Change::Same);
    let shown = view.top.unwrap_or(usize::MAX).min(changes.len());
    match view.format {
        Format::Json => print_json(&serde_json::json!({
            "old": old.display().to_string(),
            "new": new.display().to_string(),
            "bytes_delta": combine::delta(b.leaked_bytes(), a.leaked_bytes()),
            "changes": &changes[..shown],
            "omitted_changes": changes.len() - shown,
        })),
        Format::Folded | Format::Svg => {
            // Only growth makes sense as a flame graph weight.
            let grown: Vec<_> = changes
                .iter()
                .filter(|c| c.bytes_delta > 0)
                .map(|c| cudaleak_core::report::Group {
                    bytes: c.bytes_delta as u64,
                    ..c.group.clone()
                })
                .collect();
            if view.format == Format::Svg {
                return print_page(&super::svg::flame_graph(
                    "cudaleak diff: growth by stack",
                    &render::folded_picture(&grown, view.full_stacks),
                )?);
            }
            print!("{}", render::folded_top(&grown, view.top.unwrap_or(usize::MAX)));
            Ok(0)
        }
        Format::Html => print_page(&super::html::diff_page(
            (&old.to_path_buf(), &a),
            (&new.to_path_buf(), &b),
            &changes,
        )),
        Format::Text => {
            println!(
                "cudaleak diff: {} -> {}",
                escape(&old.display().to_string()),
                escape(&new.display().to_string())
            );
            if changes.is_empty() {
                println!("  no change");
            }
            let groups: Vec<&Group> = changes.iter().map(|c| &c.group).collect();
            let labels = render::group_labels(&groups);
            for (c, label) in changes.iter().zip(labels).take(shown) {
                let what = match c.change {
                    Change::New => "new",
                    Change::Grew => "grew",
                    Change::Shrank => "shrank",
                    Change::Gone => "gone",
                    Change::Same => "same",
                };
                println!(
                    "  {:>14} {:>+8} {}  {:<6} {}",
                    size_delta(c.bytes_delta),
                    c.blocks_delta,
                    if c.blocks_delta.abs() == 1 {
                        "block "
                    } else {
                        "blocks"
                    },
                    what,
                    label
                );
                for line in render::display_frames_with(&c.group, 6, view.full_stacks) {
                    println!("    {line}");
                }
            }
            if shown < changes.len() {
                let rest = &changes[shown..];
                println!(
                    "  ... and {}, {} in all",
                    count(rest.len() as u64, "more change"),
                    size_delta(rest.iter().fold(0i64, |s, c| s.saturating_add(c.bytes_delta)))
                );
            }
            println!(
                "cudaleak: {:+} bytes leaked ({} -> {})",
                b.leaked_bytes() as i128 - a.leaked_bytes() as i128,
                a.leaked_bytes(),
                b.leaked_bytes()
            );
            Ok(0)
        }
        Format::Pprof | Format::Trace | Format::TorchSnapshot | Format::Speedscope => {
            Err("diff has no --format pprof, trace, torch-snapshot or speedscope: export each side with `cudaleak report` (pprof: `go tool pprof -diff_base OLD NEW`)".into())
        }
    }
}

pub fn merge(dir: &Path, view: &ViewArgs) -> CliResult {
    if view.format.is_export() {
        return export(&[dir.to_path_buf()], view);
    }
    let runs = load_runs(&[dir.to_path_buf()], view)?;
    let reports: Vec<(PathBuf, Report)> = runs.into_iter().flatten().collect();
    let view_of_ranks = combine::rank_view(&reports);
    let mut merged = combine::merge(&reports).ok_or("no reports")?;
    symbolize(&mut merged, view);
    match view.format {
        Format::Json => {
            // The merged report itself, which validates against the report
            // schema, with the per-rank view in two extension fields
            // (`{groups, merged, ranks}` validated against nothing).
            let mut v = report_json(&merged, view.top)?;
            v["ranks"] = serde_json::to_value(&view_of_ranks.ranks).map_err(|e| e.to_string())?;
            v["rank_groups"] = serde_json::to_value(&view_of_ranks.groups).map_err(|e| e.to_string())?;
            print_json(&v)
        }
        Format::Folded => {
            print!(
                "{}",
                render::folded_top(&merged.leaks, view.top.unwrap_or(usize::MAX))
            );
            Ok(0)
        }
        Format::Svg => print_page(&super::svg::flame_graph(
            &format!(
                "cudaleak merge: bytes by stack over {}",
                count(reports.len() as u64, "process")
            ),
            &render::folded_picture(&merged.leaks, view.full_stacks),
        )?),
        Format::Html => print_page(&super::html::merge_page(
            dir,
            reports.len(),
            &view_of_ranks,
            &merged,
        )),
        Format::Text => {
            println!(
                "cudaleak merge: {} in {}",
                count(reports.len() as u64, "process"),
                escape(&dir.display().to_string())
            );
            println!(
                "  {:<22} {:<16} {:>8} {:>28} {:>8} {:>7}",
                "process", "host", "pid", "leaked", "blocks", "groups"
            );
            for r in &view_of_ranks.ranks {
                println!(
                    "  {:<22} {:<16} {:>8} {:>28} {:>8} {:>7}{}",
                    escape(&r.label),
                    escape(r.hostname.as_deref().unwrap_or("?")),
                    r.pid,
                    size_exact(r.leaked_bytes),
                    r.leaked_blocks,
                    r.groups,
                    if r.outlier {
                        "  <-- leaks much more than the others"
                    } else {
                        ""
                    }
                );
            }
            let limit = view.top.unwrap_or(20);
            let all_groups: Vec<&Group> = view_of_ranks.groups.iter().map(|g| &g.group).collect();
            let labels = render::group_labels(&all_groups);
            let (some, all): (Vec<_>, Vec<_>) = view_of_ranks
                .groups
                .iter()
                .zip(labels)
                .partition(|(g, _)| g.only_some);
            for (title, list) in [
                ("Leaked on some processes only:", some),
                ("Leaked on every process:", all),
            ] {
                if list.is_empty() {
                    continue;
                }
                println!("\n{title}");
                for (g, label) in list.iter().take(limit) {
                    println!(
                        "  {} in {} by {} -- on {}",
                        size_exact(g.group.bytes),
                        count(g.group.blocks, "block"),
                        label,
                        escape(&g.ranks.join(", "))
                    );
                }
                if list.len() > limit {
                    let rest: Vec<Group> = list[limit..].iter().map(|(g, _)| g.group.clone()).collect();
                    if let Some(line) = render::left_out_line(&rest, 0) {
                        println!("  {line}");
                    }
                }
            }
            println!(
                "\n{} across {}",
                render::summary_line(merged.leaked_bytes(), merged.leaked_blocks()),
                count(reports.len() as u64, "process")
            );
            Ok(0)
        }
        Format::Pprof | Format::Trace | Format::TorchSnapshot | Format::Speedscope => {
            export(&[dir.to_path_buf()], view)
        }
    }
}
