//! `cudaleak top [PID]`: a running process's GPU memory by call site, as
//! the library publishes it while asked (`live_view.rs` of the core and of
//! the preload crate). The request is a file in the process's report
//! directory, renewed every second while viewing; the view is read from
//! the library's directory inside it. Reading never pauses the program or
//! makes it write a report.
//!
//! `--once` prints one view (the second publish after the request, whose
//! changes are over the last second) as text or JSON; without it, in a
//! terminal, the interactive view runs until `q` (`interactive`), and
//! elsewhere (a pipe) the text is printed every second. Without a PID,
//! the processes of this user that run the library are listed.
//!
//! 1. the driver's free and total memory, through NVML: `nvml`
//! 2. what the view shows and what keys do, without a terminal: `screen`
//! 3. the terminal's loop: `interactive`

mod interactive;
mod nvml;
mod screen;

pub use interactive::{interactive, Scope};

use super::dump::{check_runs_library, process_owner, process_report_dir, request_file};
use super::CliResult;
use cudaleak_core::base::safe_read;
use cudaleak_core::live_view::{view_file_name, view_request_name, LiveView, VIEW_DIR};
use cudaleak_core::report::render::escape;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The largest view file read (50 call sites are a few KiB).
const MAX_VIEW_BYTES: u64 = 1 << 20;

/// Processes of this user with the library loaded: (pid, command).
fn watched_processes() -> Vec<(i32, String)> {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if e.metadata().map_or(true, |m| m.uid() != me) || pid == std::process::id() as i32 {
            continue;
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if maps.contains("libcudaleak.so") {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd: Vec<String> = cmd
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            out.push((pid, cmd.join(" ")));
        }
    }
    out.sort();
    out
}

fn read_view(path: &Path) -> Option<LiveView> {
    let bytes = safe_read::read_regular_file(path, MAX_VIEW_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes a file the viewer of a process of uid `owner` leaves in its
/// report directory `dir`, which that process's environment named: a
/// request (`name` directly in `dir`) or a view (`name` in [`VIEW_DIR`],
/// only when that is a directory, not a link, of that user or of ours);
/// a plain file only.
fn remove_left(dir: &Path, name: &str, owner: u32) {
    let dir = if name.starts_with("view.") {
        let d = dir.join(VIEW_DIR);
        // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        if !std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir() && (m.uid() == owner || m.uid() == me)) {
            return;
        }
        d
    } else {
        dir.to_path_buf()
    };
    let path = dir.join(name);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Whether `pid` still runs (not gone, not a zombie waiting to be reaped).
fn watched_process(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// A process being viewed: where its request and view files are, and the
/// last publish read.
struct Target {
    pid: i32,
    owner: u32,
    dir: PathBuf,
    view: PathBuf,
    renewed: Option<Instant>,
    last: (u64, i64),
}

impl Target {
    /// Checks that `pid` may be viewed (this user's, or root viewing;
    /// runs the library) and asks for its view.
    fn open(pid: i32) -> Result<Target, String> {
        let owner = process_owner(pid)?;
        check_runs_library(pid, owner)?;
        let dir = process_report_dir(pid)?;
        let view = dir.join(VIEW_DIR).join(view_file_name(pid));
        let mut t = Target {
            pid,
            owner,
            dir,
            view,
            renewed: None,
            last: (0, 0),
        };
        t.renew()?;
        Ok(t)
    }

    /// Renews the request, once a second at most.
    fn renew(&mut self) -> Result<(), String> {
        if self.renewed.is_none_or(|r| r.elapsed() >= Duration::from_secs(1)) {
            request_file(&self.dir, &view_request_name(self.pid), self.owner)?;
            self.renewed = Some(Instant::now());
        }
        Ok(())
    }

    /// Removes a request of ours still pending (a process that ended, or
    /// never allocated and so never took it): a plain file only.
    fn withdraw(&self) {
        remove_left(&self.dir, &view_request_name(self.pid), self.owner);
    }

    /// Removes the view of an ended process.
    fn remove_view(&self) {
        remove_left(&self.dir, &view_file_name(self.pid), self.owner);
    }

    /// A publish newer than the last one read, if there is one; renews the
    /// request while the process runs.
    fn poll(&mut self) -> Option<LiveView> {
        if watched_process(self.pid) {
            let _ = self.renew();
        }
        let v = read_view(&self.view)?;
        let key = (v.sequence, v.timestamp_ms);
        if key == self.last && !v.exited {
            return None;
        }
        self.last = key;
        Some(v)
    }
}

/// Waits for a view published at or after `since_ms` with at least
/// `sequence` publishes, renewing the request every second; a process
/// that is gone ends the wait with its last view, if any.
fn wait_view(
    dir: &Path,
    view: &Path,
    pid: i32,
    owner: u32,
    since_ms: i64,
    sequence: u64,
    timeout: Duration,
) -> Result<LiveView, String> {
    let start = Instant::now();
    let mut renewed = Instant::now();
    // The file is read again only once it was replaced: the viewer shares
    // the machine with the job it watches.
    let mut seen: Option<(u64, i64, i64)> = None;
    loop {
        let stamp = std::fs::metadata(view)
            .ok()
            .map(|m| (m.ino(), m.mtime(), m.mtime_nsec()));
        if stamp.is_some() && stamp != seen {
            seen = stamp;
            if let Some(v) = read_view(view) {
                if v.exited || (v.timestamp_ms >= since_ms && v.sequence >= sequence) {
                    return Ok(v);
                }
            }
        }
        if std::fs::metadata(format!("/proc/{pid}")).is_err() {
            remove_left(dir, &view_request_name(pid), owner);
            return read_view(view)
                .ok_or_else(|| format!("process {pid} exited before its view was published"));
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "no view of process {pid} within {} s (has it made a CUDA allocation call yet?)",
                timeout.as_secs()
            ));
        }
        if renewed.elapsed() >= Duration::from_secs(1) {
            request_file(dir, &view_request_name(pid), owner)?;
            renewed = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--refresh`: seconds between reads of the view, 0.2 to 60.
pub fn parse_refresh(s: f64) -> Result<Duration, String> {
    if !(s.is_finite() && (0.2..=60.0).contains(&s)) {
        return Err("--refresh: expected seconds, from 0.2 to 60".into());
    }
    Ok(Duration::from_secs_f64(s))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn top(pid: Option<i32>, once: bool, json: bool, timeout: f64, refresh: f64) -> CliResult {
    let Some(pid) = pid else {
        let found = watched_processes();
        if found.is_empty() {
            println!("no process of this user runs under cudaleak");
        }
        for (pid, cmd) in found {
            println!("{pid:>8}  {}", escape(&cmd));
        }
        return Ok(0);
    };
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err("--timeout: expected seconds, more than 0".into());
    }
    let timeout = Duration::from_secs_f64(timeout.min(3600.0));
    let refresh = parse_refresh(refresh)?;
    if !once && std::io::stdout().is_terminal() && std::io::stdin().is_terminal() {
        return interactive(Scope::One(pid), refresh);
    }
    let owner = process_owner(pid)?;
    check_runs_library(pid, owner)?;
    let dir = process_report_dir(pid)?;
    let view: PathBuf = dir.join(VIEW_DIR).join(view_file_name(pid));
    let since = now_ms();
    request_file(&dir, &view_request_name(pid), owner)?;
    let first = wait_view(&dir, &view, pid, owner, since, 2, timeout)?;
    if once {
        let driver = nvml::of_process(pid, Some(&first), &nvml::Nvml::load());
        let out = if json {
            let mut v = serde_json::to_value(&first).map_err(|e| e.to_string())?;
            v["driver_memory"] = match &driver {
                Ok(known) => serde_json::Value::Array(
                    known
                        .iter()
                        .map(|(d, m)| serde_json::json!({"device": d.to_string(), "free_bytes": m.free, "total_bytes": m.total}))
                        .collect(),
                ),
                Err(why) => serde_json::json!({ "unknown": why }),
            };
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"
        } else {
            let mut text = first.text();
            if let Some(line) = screen::device_line(&first, &driver) {
                // After the header's two lines.
                let at = text.match_indices('\n').nth(1).map_or(text.len(), |(i, _)| i + 1);
                text.insert_str(at, &format!("{line}\n"));
            }
            text
        };
        let _ = std::io::stdout().write_all(out.as_bytes());
        if first.exited {
            remove_left(&dir, &view_file_name(pid), owner);
        }
        return Ok(0);
    }
    // Not a terminal: the text, each publish.
    let mut shown = first;
    loop {
        let mut out = shown.text();
        out.push('\n');
        if std::io::stdout()
            .write_all(out.as_bytes())
            .and_then(|_| std::io::stdout().flush())
            .is_err()
        {
            return Ok(0);
        }
        if shown.exited {
            remove_left(&dir, &view_file_name(pid), owner);
            return Ok(0);
        }
        shown = wait_view(
            &dir,
            &view,
            pid,
            owner,
            shown.timestamp_ms + 1,
            shown.sequence + 1,
            timeout,
        )?;
    }
}
