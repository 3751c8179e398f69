//! `cudaleak dump PID`: a live dump of a running process, whatever it did
//! with its signals. The trigger is a request file in the process's report
//! directory, `.cudaleak-dump-request.<pid>`: the library's dumper thread
//! looks for it every 200 ms, deletes it and writes a report (trigger
//! "api", reason "cudaleak dump"). This command waits for that report.

use super::CliResult;
use cudaleak_core::render::{self, escape, TextOptions};
use cudaleak_core::report::Report;
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
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

/// The longest `--timeout` honoured (a year: "wait as long as it takes");
/// `inf` and `1e30` panicked in `Duration::from_secs_f64` (issue 15).
const MAX_TIMEOUT_S: f64 = 365.0 * 24.0 * 3600.0;

fn wait_for(timeout: f64) -> Result<Duration, String> {
    if timeout.is_nan() || timeout < 0.0 {
        return Err(format!("--timeout: expected seconds (0 or more), not {timeout}"));
    }
    Ok(Duration::from_secs_f64(timeout.clamp(0.1, MAX_TIMEOUT_S)))
}

/// The uid that owns process `pid`; a clear error when there is no such
/// process.
fn process_owner(pid: i32) -> Result<u32, String> {
    if pid <= 0 {
        return Err(format!("no process {pid}: a process id is a positive number"));
    }
    match std::fs::metadata(format!("/proc/{pid}")) {
        Ok(m) => Ok(m.uid()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("no process {pid}")),
        Err(e) => Err(format!("cannot look at process {pid}: {e}")),
    }
}

/// Whether `pid` runs the library. The process exists (checked before):
/// when its maps cannot be read, say so and why, instead of "no process 1:
/// Permission denied" (issue 12).
fn check_runs_library(pid: i32, owner: u32) -> Result<(), String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        // SAFETY: plain system call.
        let me = unsafe { libc::geteuid() };
        format!(
            "cannot read process {pid}: /proc/{pid}/maps: {e} (it runs as uid {owner}, this command as uid {me}; run cudaleak dump as the same user or as root)"
        )
    })?;
    if !maps.contains("libcudaleak.so") {
        return Err(format!(
            "process {pid} is not running under cudaleak (libcudaleak.so is not loaded in it)"
        ));
    }
    Ok(())
}

/// What [`request_dump`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Requested {
    Created,
    /// a request file of an earlier, unanswered request is still there
    AlreadyPending,
}

/// Creates `dir/.cudaleak-dump-request.<pid>`, the file the library's
/// dumper thread looks for. The directory may come from another process's
/// environment, so it must belong to `owner` (the target's user) or to us,
/// and must not be writable by others unless sticky; the file is created
/// relative to that checked directory with `O_CREAT|O_EXCL|O_NOFOLLOW`.
/// `fs::write` followed a planted symlink there and truncated the victim
/// file, which aims at root when root runs `dump` on a user's process
/// (issue 15).
pub fn request_dump(dir: &Path, pid: i32, owner: u32) -> Result<Requested, String> {
    let shown = || dir.display().to_string();
    let cdir =
        CString::new(dir.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in the path", shown()))?;
    // SAFETY: valid C string; the descriptor is closed by OwnedFd.
    let fd = unsafe {
        libc::open(
            cdir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!("{}: {}", shown(), std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a descriptor we just opened and own.
    let dir_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let meta = std::fs::File::from(dir_fd.try_clone().map_err(|e| e.to_string())?)
        .metadata()
        .map_err(|e| format!("{}: {e}", shown()))?;
    // SAFETY: plain system call.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != owner && meta.uid() != me {
        return Err(format!(
            "refusing the report directory {}: it belongs to uid {}, neither to the process's user (uid {owner}) nor to this command's (uid {me})",
            shown(),
            meta.uid()
        ));
    }
    let mode = meta.mode();
    if mode & 0o002 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "refusing the report directory {}: anyone can write to it (mode {:o}, no sticky bit)",
            shown(),
            mode & 0o7777
        ));
    }
    let name = CString::new(request_name(pid)).map_err(|e| e.to_string())?;
    // SAFETY: valid descriptor and C string.
    let fd = unsafe {
        libc::openat(
            dir_fd.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: we own the new descriptor.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        return Ok(Requested::Created);
    }
    let err = std::io::Error::last_os_error();
    let request = dir.join(request_name(pid));
    if err.raw_os_error() == Some(libc::EEXIST) {
        // Pending if it is a plain file; never anything a link points to.
        if std::fs::symlink_metadata(&request).is_ok_and(|m| m.file_type().is_file()) {
            return Ok(Requested::AlreadyPending);
        }
        return Err(format!(
            "{} exists and is not a request file (a symbolic link?); not touching it",
            request.display()
        ));
    }
    Err(format!("cannot create {}: {err}", request.display()))
}

fn request_name(pid: i32) -> String {
    format!(".cudaleak-dump-request.{pid}")
}

pub fn dump(pid: i32, dir: Option<PathBuf>, timeout: f64) -> CliResult {
    let wait = wait_for(timeout)?;
    let owner = process_owner(pid)?;
    check_runs_library(pid, owner)?;
    let dir = match dir {
        Some(d) => d,
        None => process_report_dir(pid)?,
    };
    let before: HashSet<PathBuf> = reports_of(&dir, pid, &HashSet::new())
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let request = dir.join(request_name(pid));
    request_dump(&dir, pid, owner)?;
    let started = Instant::now();
    while started.elapsed() < wait {
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
            println!(
                "cudaleak: report written to {}",
                escape(&path.display().to_string())
            );
            return Ok(0);
        }
    }
    let _ = std::fs::remove_file(&request);
    Err(format!(
        "no dump from process {pid} within {timeout} s (it answers once it has made a CUDA allocation; its report directory is {})",
        escape(&dir.display().to_string())
    ))
}
