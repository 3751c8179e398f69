//! `cudaleak dump PID`: a live dump of a running process, whatever it did
//! with its signals. The trigger is a request file in the process's report
//! directory, `.cudaleak-dump-request.<pid>`: the library's dumper thread
//! looks for it every 200 ms, deletes it and writes a report (trigger
//! "api", reason "cudaleak dump"). This command waits for that report.

use super::CliResult;
use cudaleak_core::config::var;
use cudaleak_core::report::render::{self, escape, TextOptions};
use cudaleak_core::report::Report;
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `name` in the environment `pid` started with (a value to parse, never
/// a directory to trust).
pub fn environ_var(pid: i32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

/// The report directory of `pid`: its CUDALEAK_DIR, relative ones taken
/// from its working directory (as the library does at start).
pub fn process_report_dir(pid: i32) -> Result<PathBuf, String> {
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .map_err(|e| format!("cannot read the working directory of process {pid}: {e} (pass --dir)"))?;
    let dir = environ_var(pid, var::CUDALEAK_DIR).filter(|d| !d.is_empty());
    Ok(match dir {
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
/// `inf` and `1e30` panicked in `Duration::from_secs_f64`.
const MAX_TIMEOUT_S: f64 = 365.0 * 24.0 * 3600.0;

fn wait_for(timeout: f64) -> Result<Duration, String> {
    if timeout.is_nan() || timeout < 0.0 {
        return Err(format!("--timeout: expected seconds (0 or more), not {timeout}"));
    }
    Ok(Duration::from_secs_f64(timeout.clamp(0.1, MAX_TIMEOUT_S)))
}

/// The uid that owns process `pid`; a clear error when there is no such
/// process.
pub fn process_owner(pid: i32) -> Result<u32, String> {
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
/// Permission denied".
pub fn check_runs_library(pid: i32, owner: u32) -> Result<(), String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        format!(
            "cannot read process {pid}: /proc/{pid}/maps: {e} (it runs as uid {owner}, this command as uid {me}; run cudaleak as the same user or as root)"
        )
    })?;
    if maps.contains("libcudaleak.so") || runs_our_build(&maps) {
        return Ok(());
    }
    if is_cudaleak_itself(pid) {
        let children = children_of(pid);
        let named = match children.as_slice() {
            [] => "it runs no process now".to_string(),
            [one] => format!("dump the command it runs: cudaleak dump {one}"),
            many => format!(
                "dump the command it runs: one of {}",
                many.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        return Err(format!(
            "process {pid} is `cudaleak` itself, not the program it runs; {named}"
        ));
    }
    Err(format!(
        "process {pid} is not running under cudaleak (libcudaleak.so, or a copy of it under another name, is not loaded in it)"
    ))
}

/// The GNU build-id of the ELF file at `path`, from its `PT_NOTE`
/// segments; only the headers and the notes are read.
fn file_build_id(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut h = [0u8; 64];
    f.read_exact(&mut h).ok()?;
    // 64-bit little-endian ELF only (what the library is built as).
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u64;
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36), u16_at(&h, 0x38));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut ph).ok()?;
    for e in ph.chunks(phentsize as usize) {
        if u32_at(e, 0) != 4 {
            continue; // PT_NOTE
        }
        let (offset, size) = (u64_at(e, 8), u64_at(e, 32));
        if size > 1 << 16 {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        f.seek(SeekFrom::Start(offset)).ok()?;
        f.read_exact(&mut notes).ok()?;
        if let Some(id) = cudaleak_core::symbolize::module_location::build_id_in_notes(&notes) {
            return Some(id);
        }
    }
    None
}

/// Whether a file mapped in the process (as /proc/PID/maps lists them) is
/// the library this command uses, under whatever name: same build-id
/// (`LD_PRELOAD=./lib.so`, a renamed copy, was "not running
/// under cudaleak").
fn runs_our_build(maps: &str) -> bool {
    let Some(ours) = super::find_library().ok().and_then(|p| file_build_id(&p)) else {
        return false;
    };
    let mut seen = HashSet::new();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .filter(|p| seen.insert(p.to_string()))
        .take(4096)
        .any(|p| file_build_id(Path::new(p)).as_deref() == Some(ours.as_str()))
}

/// Whether `pid` runs this very program (`cudaleak run`'s own pid).
fn is_cudaleak_itself(pid: i32) -> bool {
    let (Ok(theirs), Ok(mine)) = (
        std::fs::metadata(format!("/proc/{pid}/exe")),
        std::fs::metadata("/proc/self/exe"),
    ) else {
        return false;
    };
    theirs.dev() == mine.dev() && theirs.ino() == mine.ino()
}

/// The children of `pid`, from every one of its threads.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// State letter and start time (clock ticks since boot) of `pid`, from
/// /proc/PID/stat; None once it is gone.
fn process_state(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 (starttime) is the 20th after the state.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// How the process is while `dump` waits (a process that died
/// was waited for to the end of `--timeout`, a year with `inf`).
#[derive(Debug, PartialEq, Eq)]
enum Liveness {
    Running,
    Stopped,
    Gone,
}

fn liveness(pid: i32, started_at: Option<u64>) -> Liveness {
    match process_state(pid) {
        None => Liveness::Gone,
        Some((_, start)) if started_at.is_some_and(|s| s != start) => Liveness::Gone,
        Some(('Z' | 'X' | 'x', _)) => Liveness::Gone,
        Some(('T' | 't', _)) => Liveness::Stopped,
        Some(_) => Liveness::Running,
    }
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
/// file, which aims at root when root runs `dump` on a user's process.
pub fn request_dump(dir: &Path, pid: i32, owner: u32) -> Result<Requested, String> {
    request_file(dir, &cudaleak_core::report::dump_request_name(pid), owner)
}

/// Creates the request file `name` in the report directory `dir` of a
/// process of uid `owner` (a dump's, a live view's), after checking the
/// directory: ours or the process's user's, not writable by anyone without
/// the sticky bit; never through a link.
pub fn request_file(dir: &Path, name: &str, owner: u32) -> Result<Requested, String> {
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
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
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
    let request = dir.join(name);
    let name = CString::new(name).map_err(|e| e.to_string())?;
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
    let request = dir.join(cudaleak_core::report::dump_request_name(pid));
    let started_at = process_state(pid).map(|(_, start)| start);
    request_dump(&dir, pid, owner)?;
    let started = Instant::now();
    while started.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(50));
        if request.exists() {
            if liveness(pid, started_at) == Liveness::Gone {
                let _ = std::fs::remove_file(&request);
                return Err(format!("process {pid} ended before it wrote the dump"));
            }
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
    let shown = escape(&dir.display().to_string()).into_owned();
    Err(match liveness(pid, started_at) {
        Liveness::Stopped => format!(
            "no dump from process {pid} within {timeout} s: it is stopped (SIGSTOP, a debugger, or Ctrl-Z); it answers once it runs again"
        ),
        Liveness::Gone => format!("process {pid} ended before it wrote the dump"),
        Liveness::Running => format!(
            "no dump from process {pid} within {timeout} s (it answers once it has made a CUDA allocation; its report directory is {shown})"
        ),
    })
}
