//! Memory budgets on the command line: `run --max-peak`, `run
//! --peak-baseline`, `diff --peak`, and the files CI systems read of their
//! verdict (`--summary-md`, `--junit`). The checks themselves are the
//! core's (`cudaleak_core::budget`); here are the files and the flags.

use cudaleak_core::base::units::{count, parse_size, size};
use cudaleak_core::budget::{self, Check, Tolerance};
use cudaleak_core::combine;
use cudaleak_core::report::render::escape;
use cudaleak_core::report::Report;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `run`'s exit status when COMMAND exited 0 but a process's peak went
/// over its budget (`--max-peak`, `--peak-baseline`); after 24 and 23.
pub const BUDGET_EXIT_STATUS: u8 = 25;

/// What `run` checks after the command, read and validated before it
/// starts: a bad size or an unreadable baseline stops the run at once.
pub struct Budgets {
    pub max_peak: Option<u64>,
    pub baseline: Option<(PathBuf, Vec<Report>)>,
    pub tolerance: Tolerance,
    pub summary_md: Option<PathBuf>,
    pub junit: Option<PathBuf>,
}

impl Budgets {
    pub fn new(
        max_peak: Option<&str>,
        baseline: Option<&Path>,
        tolerance: &[String],
        summary_md: Option<PathBuf>,
        junit: Option<PathBuf>,
    ) -> Result<Budgets, String> {
        let max_peak = max_peak
            .map(|s| {
                parse_size(s)
                    .ok_or_else(|| format!("--max-peak: not a size: {} (write e.g. 2GiB, 1500MB)", escape(s)))
            })
            .transpose()?;
        let baseline = baseline
            .map(|p| load_baseline(p).map(|r| (p.to_path_buf(), r)))
            .transpose()?;
        let b = Budgets {
            max_peak,
            baseline,
            tolerance: Tolerance::parse(tolerance)?,
            summary_md,
            junit,
        };
        if !b.any() && (b.summary_md.is_some() || b.junit.is_some()) {
            return Err(
                "--summary-md and --junit write the verdict of a budget: give --max-peak or --peak-baseline"
                    .into(),
            );
        }
        Ok(b)
    }

    /// Whether there is a budget to check.
    pub fn any(&self) -> bool {
        self.max_peak.is_some() || self.baseline.is_some()
    }

    /// Every check of `finals` (each process's final report), in the
    /// order of the processes: the ceiling, then the baseline.
    pub fn check(&self, finals: &[&Report]) -> Vec<Check> {
        let mut checks = Vec::new();
        let mut compared = 0usize;
        let matched = self
            .baseline
            .as_ref()
            .map(|(_, base)| budget::match_processes(base, finals));
        for (i, r) in finals.iter().enumerate() {
            if let Some(max) = self.max_peak {
                checks.push(budget::check_max_peak(r, max));
            }
            if let Some(m) = &matched {
                match m[i] {
                    Some(old) => {
                        compared += 1;
                        checks.push(budget::check_baseline(old, r, &self.tolerance))
                    }
                    None => note(&format!(
                        "cudaleak: peak-baseline: no process of the baseline is {} (by rank, else by command line): not compared",
                        budget::process_name(r)
                    )),
                }
            }
        }
        // A baseline that matched nothing vouches for nothing: the gate
        // fails closed, as it does for a report it did not see.
        if let Some((path, base)) = &self.baseline {
            if compared == 0 && !finals.is_empty() {
                checks.push(budget::unmatched_baseline(
                    &escape(&path.display().to_string()),
                    base.len(),
                    finals.len(),
                ));
            }
        }
        checks
    }
}

fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The newest run's final reports in `path` (a report file, or a
/// directory of reports): one per process.
pub fn load_baseline(path: &Path) -> Result<Vec<Report>, String> {
    newest_run(path).map_err(|e| format!("--peak-baseline {e}"))
}

/// The newest run's latest report of each process in `path` (a report
/// file or a directory of reports).
fn newest_run(path: &Path) -> Result<Vec<Report>, String> {
    let all = super::reports::load(&[path.to_path_buf()])
        .map_err(|e| format!("{}: {e}", escape(&path.display().to_string())))?;
    let newest = all
        .iter()
        .max_by_key(|(_, r)| r.timestamp_ms)
        .map(|(_, r)| r.run_id.clone());
    let chosen: Vec<_> = all
        .into_iter()
        .filter(|(_, r)| newest.as_ref().is_none_or(|id| r.run_id == *id))
        .collect();
    let latest = combine::latest_per_process(chosen);
    if latest.is_empty() {
        return Err(format!(
            "{}: no reports there",
            escape(&path.display().to_string())
        ));
    }
    Ok(latest.into_iter().map(|(_, r)| r).collect())
}

/// Prints each check, and for several processes a line naming the worst;
/// whether any failed.
pub fn print_checks(checks: &[Check]) -> bool {
    for c in checks {
        note(&budget::check_text(c));
    }
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.passed).collect();
    if let Some(worst) = failed.iter().max_by_key(|c| c.excess()) {
        note(&format!(
            "cudaleak: {} of {} over budget; the worst: {} ({}), over by {}",
            failed.len(),
            count(checks.len() as u64, "budget check"),
            worst.process,
            worst.kind.name(),
            size(worst.excess())
        ));
    }
    !failed.is_empty()
}

/// Writes the Markdown summary (appended: a CI job's summary file exists
/// already) and the JUnit XML (replaced) where asked; a file that cannot
/// be written is one warning, never a change of the verdict.
pub fn write_files(b: &Budgets, checks: &[Check]) {
    if let Some(p) = &b.summary_md {
        if let Err(e) = append(p, budget::markdown(checks).as_bytes()) {
            note(&format!(
                "cudaleak: cannot append the summary to {}: {e}",
                escape(&p.display().to_string())
            ));
        }
    }
    if let Some(p) = &b.junit {
        if let Err(e) = replace(p, budget::junit(checks).as_bytes()) {
            note(&format!(
                "cudaleak: cannot write the JUnit XML {}: {e}",
                escape(&p.display().to_string())
            ));
        }
    }
}

/// Appends to a regular file, made (never through a link) when missing.
/// Opened without blocking, so that a FIFO with no reader or a device is
/// refused, not waited on.
fn append(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let open = |create: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
        if create {
            o.create_new(true).mode(0o644);
        }
        o.open(path)
    };
    let mut f = match open(false) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => open(true)?,
        other => other?,
    };
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    // SAFETY: fcntl on a descriptor this function owns: its flags read,
    // then written back without O_NONBLOCK.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    f.write_all(data)
}

/// Writes `data` beside `path` in a file of its own (never through a
/// link), then renames it over `path`.
fn replace(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?
        .to_string_lossy()
        .into_owned();
    let tmp = path.with_file_name(format!(".{name}.cudaleak-{}", std::process::id()));
    // A file of that name that is not ours (create_new failed) is left
    // alone; ours is removed when it cannot take its place.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(&tmp)?;
    let done = f
        .write_all(data)
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `cudaleak diff --peak OLD NEW`: each process's peak before and after,
/// and the call sites whose bytes at the peak changed most. Exit 0, or
/// [`BUDGET_EXIT_STATUS`] when `--peak-tolerance` is given and a peak grew
/// beyond it.
pub fn diff_peaks(old: &Path, new: &Path, tolerance: &[String], json: bool) -> super::CliResult {
    let tol = Tolerance::parse(tolerance)?;
    // Each side as --peak-baseline reads a baseline: its newest run.
    let before = newest_run(old)?;
    let after = newest_run(new)?;
    let refs: Vec<&Report> = after.iter().collect();
    let matched = budget::match_processes(&before, &refs);
    let checks: Vec<Check> = after
        .iter()
        .zip(matched)
        .filter_map(|(r, m)| m.map(|old| budget::check_baseline(old, r, &tol)))
        .collect();
    if checks.is_empty() {
        return Err(
            "diff --peak: no process of NEW matches one of OLD (by rank, else by command line)".into(),
        );
    }
    let failed = checks.iter().any(|c| !c.passed);
    if json {
        let v: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "process": c.process,
                    "old_peak_bytes": c.old_peak,
                    "new_peak_bytes": c.peak,
                    "limit_bytes": c.limit,
                    "passed": c.passed,
                    "sites": c.sites.iter().map(|s| serde_json::json!({
                        "label": s.label,
                        "old_bytes": s.old_bytes,
                        "new_bytes": s.new_bytes,
                        "stack": s.stack.iter().map(|l| l.trim_start()).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &serde_json::json!({ "peaks": v }));
        let _ = writeln!(out);
    } else {
        let mut out = std::io::stdout().lock();
        for c in &checks {
            let _ = writeln!(out, "{}: {}", c.process, c.verdict);
            for s in &c.sites {
                let _ = writeln!(
                    out,
                    "  {:>12}  {} -> {}  {}",
                    cudaleak_core::base::units::size_delta(s.delta()),
                    size(s.old_bytes.unwrap_or(0)),
                    size(s.new_bytes),
                    s.label
                );
                for line in s.stack.iter().take(6) {
                    let _ = writeln!(out, "      {}", line.trim_start());
                }
            }
        }
    }
    Ok(if failed && !tolerance.is_empty() {
        BUDGET_EXIT_STATUS
    } else {
        0
    })
}
