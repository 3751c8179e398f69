//! `cudaleak dump PID`: a live dump of a running process, whatever it did
//! with its signals. The trigger is a request file in the process's report
//! directory, `.cudaleak-dump-request.<pid>`: the library's dumper thread
//! looks for it every 200 ms, deletes it and writes a report (trigger
//! "api", reason "cudaleak dump"). This command waits for that report.

use super::CliResult;
use cudaleak_core::render::{self, TextOptions};
use cudaleak_core::report::Report;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn environ_var(pid: i32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

/// The report directory of `pid`: its CUDALEAK_DIR, relative ones taken
/// from its working directory (as the library does at start).
fn process_report_dir(pid: i32) -> Result<PathBuf, String> {
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .map_err(|e| format!("cannot read the working directory of process {pid}: {e} (pass --dir)"))?;
    Ok(match environ_var(pid, "CUDALEAK_DIR").filter(|d| !d.is_empty()) {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => cwd.join(d),
        None => cwd,
    })
}

fn reports_of(dir: &Path, pid: i32, skip: &HashSet<PathBuf>) -> Vec<(PathBuf, Report)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if skip.contains(&p)
                || !name.starts_with("cudaleak.")
                || !name.ends_with(".json")
                || !name.contains(&format!(".{pid}."))
            {
                continue;
            }
            if let Ok(r) = Report::read(&p) {
                if r.pid == pid as i64 {
                    out.push((p, r));
                }
            }
        }
    }
    out
}

pub fn dump(pid: i32, dir: Option<PathBuf>, timeout: f64) -> CliResult {
    let maps =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| format!("no process {pid}: {e}"))?;
    if !maps.contains("libcudaleak.so") {
        return Err(format!(
            "process {pid} is not running under cudaleak (libcudaleak.so is not loaded in it)"
        ));
    }
    let dir = match dir {
        Some(d) => d,
        None => process_report_dir(pid)?,
    };
    let before: HashSet<PathBuf> = reports_of(&dir, pid, &HashSet::new())
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let request = dir.join(format!(".cudaleak-dump-request.{pid}"));
    std::fs::write(&request, b"").map_err(|e| format!("cannot create {}: {e}", request.display()))?;
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.1));
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        if request.exists() {
            continue;
        }
        if let Some((path, report)) = reports_of(&dir, pid, &before)
            .into_iter()
            .max_by_key(|(_, r)| r.sequence)
        {
            print!(
                "{}",
                render::text(
                    &report,
                    Some(&path.display().to_string()),
                    &TextOptions::default()
                )
            );
            println!("cudaleak: report written to {}", path.display());
            return Ok(0);
        }
    }
    let _ = std::fs::remove_file(&request);
    Err(format!(
        "no dump from process {pid} within {timeout} s (it answers once it has made a CUDA allocation; its report directory is {})",
        dir.display()
    ))
}
