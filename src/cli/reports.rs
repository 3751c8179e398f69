//! `cudaleak report`, `diff` and `merge`: reading report files and
//! directories, and rendering them.

use super::CliResult;
use crate::Format;
use cudaleak_core::combine::{self, Change};
use cudaleak_core::render::{self, escape, TextOptions};
use cudaleak_core::report::Report;
use std::path::{Path, PathBuf};

fn is_report_name(name: &str) -> bool {
    name.starts_with("cudaleak.") && name.ends_with(".json") && !name.ends_with(".timeline.json")
}

/// Searches `dir` and its subdirectories. Symbolic links to directories
/// are not followed: a directory holding `a -> .` and `b -> .` made the
/// walk visit about 2^40 paths (issue 15). `DirEntry::file_type` does not
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

/// One report for `paths`: the newest dump of each process, merged.
fn load_merged(paths: &[PathBuf]) -> Result<Report, String> {
    let reports = combine::latest_per_process(load(paths)?);
    combine::merge(&reports).ok_or_else(|| "no reports".to_string())
}

fn opts(top: Option<usize>) -> TextOptions {
    TextOptions {
        max_groups: top.unwrap_or(usize::MAX),
        ..TextOptions::default()
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> CliResult {
    let s = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    println!("{s}");
    Ok(0)
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

pub fn report(paths: &[PathBuf], format: Format, top: Option<usize>) -> CliResult {
    let all = load(paths)?;
    let mut r = combine::merge(&combine::latest_per_process(all.clone())).ok_or("no reports")?;
    if let Some(n) = top {
        r.leaks.truncate(n);
        r.growth.truncate(n);
    }
    match format {
        Format::Json => print_json(&r),
        Format::Folded => {
            print!("{}", render::folded(&r.leaks));
            Ok(0)
        }
        Format::Html => print_page(&super::html::report_page(&all, &r)),
        Format::Svg => print_page(&super::svg::flame_graph(
            &format!("cudaleak: bytes by stack, pid {}", r.pid),
            &render::folded(&r.leaks),
        )?),
        Format::Text => {
            let source = match paths {
                [one] => Some(one.display().to_string()),
                _ => None,
            };
            print!("{}", render::text(&r, source.as_deref(), &opts(top)));
            Ok(0)
        }
    }
}

pub fn diff(old: &Path, new: &Path, format: Format, top: Option<usize>) -> CliResult {
    let a = load_merged(&[old.to_path_buf()])?;
    let b = load_merged(&[new.to_path_buf()])?;
    let mut changes = combine::diff(&a, &b);
    changes.retain(|c| c.change != Change::Same);
    if let Some(n) = top {
        changes.truncate(n);
    }
    match format {
        Format::Json => print_json(&serde_json::json!({
            "old": old.display().to_string(),
            "new": new.display().to_string(),
            "bytes_delta": combine::delta(b.leaked_bytes(), a.leaked_bytes()),
            "changes": changes,
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
            if format == Format::Svg {
                return print_page(&super::svg::flame_graph(
                    "cudaleak diff: growth by stack",
                    &render::folded(&grown),
                )?);
            }
            print!("{}", render::folded(&grown));
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
            for c in &changes {
                let what = match c.change {
                    Change::New => "new",
                    Change::Grew => "grew",
                    Change::Shrank => "shrank",
                    Change::Gone => "gone",
                    Change::Same => "same",
                };
                println!(
                    "  {:>+14} bytes {:>+8} blocks  {:<6} {} ({} memory) at {}",
                    c.bytes_delta,
                    c.blocks_delta,
                    what,
                    escape(&c.group.api),
                    c.group.memory.name(),
                    c.group.top_frame_label()
                );
                for line in render::display_frames(&c.group, 6) {
                    println!("    {line}");
                }
            }
            println!(
                "cudaleak: {:+} bytes leaked ({} -> {})",
                b.leaked_bytes() as i128 - a.leaked_bytes() as i128,
                a.leaked_bytes(),
                b.leaked_bytes()
            );
            Ok(0)
        }
    }
}

pub fn merge(dir: &Path, format: Format, top: Option<usize>) -> CliResult {
    let reports = combine::latest_per_process(load(&[dir.to_path_buf()])?);
    let view = combine::rank_view(&reports);
    let merged = combine::merge(&reports).ok_or("no reports")?;
    match format {
        Format::Json => {
            print_json(&serde_json::json!({ "ranks": view.ranks, "groups": view.groups, "merged": merged }))
        }
        Format::Folded => {
            print!("{}", render::folded(&merged.leaks));
            Ok(0)
        }
        Format::Svg => print_page(&super::svg::flame_graph(
            &format!(
                "cudaleak merge: bytes by stack over {} process(es)",
                reports.len()
            ),
            &render::folded(&merged.leaks),
        )?),
        Format::Html => print_page(&super::html::merge_page(dir, reports.len(), &view, &merged)),
        Format::Text => {
            println!(
                "cudaleak merge: {} process(es) in {}",
                reports.len(),
                escape(&dir.display().to_string())
            );
            println!(
                "  {:<22} {:<16} {:>8} {:>14} {:>8} {:>7}",
                "process", "host", "pid", "leaked bytes", "blocks", "groups"
            );
            for r in &view.ranks {
                println!(
                    "  {:<22} {:<16} {:>8} {:>14} {:>8} {:>7}{}",
                    escape(&r.label),
                    escape(r.hostname.as_deref().unwrap_or("?")),
                    r.pid,
                    r.leaked_bytes,
                    r.leaked_blocks,
                    r.groups,
                    if r.outlier {
                        "  <-- leaks much more than the others"
                    } else {
                        ""
                    }
                );
            }
            let limit = top.unwrap_or(20);
            let (some, all): (Vec<_>, Vec<_>) = view.groups.iter().partition(|g| g.only_some);
            for (title, list) in [
                ("Leaked on some processes only:", some),
                ("Leaked on every process:", all),
            ] {
                if list.is_empty() {
                    continue;
                }
                println!("\n{title}");
                for g in list.iter().take(limit) {
                    println!(
                        "  {} bytes in {} blocks by {} at {} -- on {}",
                        g.group.bytes,
                        g.group.blocks,
                        escape(&g.group.api),
                        g.group.top_frame_label(),
                        escape(&g.ranks.join(", "))
                    );
                }
            }
            println!(
                "\n{} across {} process(es)",
                render::summary_line(merged.leaked_bytes(), merged.leaked_blocks()),
                reports.len()
            );
            Ok(0)
        }
    }
}
