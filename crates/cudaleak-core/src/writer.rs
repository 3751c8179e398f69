//! Report files: names unique per process and per dump, written completely
//! or not at all, never through an existing file or symbolic link
//! (CONTRACT.md, "Reports").
//!
//! A report is written to a fresh temporary file (`O_CREAT|O_EXCL|
//! O_NOFOLLOW`, so an attacker's symlink or an existing file is never
//! followed), then hard-linked to its final name, which fails rather than
//! replace an existing file, then the temporary name is removed.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What makes a report's file name unique and lets tools group files by
/// host, rank and process without opening them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportName {
    pub hostname: String,
    pub rank: Option<i64>,
    pub pid: i64,
    /// distinguishes processes that reuse a pid (exec keeps it, pids wrap):
    /// process start time in ms and 32 random bits
    pub instance: String,
    pub sequence: u64,
    pub trigger: &'static str,
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ReportName {
    /// `cudaleak.<host>[.r<rank>].<pid>.<instance>.<sequence>.<trigger>.json`
    pub fn file_name(&self) -> String {
        let rank = self.rank.map(|r| format!(".r{r}")).unwrap_or_default();
        format!(
            "cudaleak.{}{rank}.{}.{}.{}.{}.json",
            sanitize(&self.hostname),
            self.pid,
            sanitize(&self.instance),
            self.sequence,
            self.trigger
        )
    }

    /// The timeline of a process with `CUDALEAK_INTERVAL` (one per process).
    pub fn timeline_name(&self) -> String {
        let rank = self.rank.map(|r| format!(".r{r}")).unwrap_or_default();
        format!(
            "cudaleak.{}{rank}.{}.{}.timeline.json",
            sanitize(&self.hostname),
            self.pid,
            sanitize(&self.instance)
        )
    }
}

/// Creates `dir` if needed and checks that files can be created in it.
pub fn prepare_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Permission bits of the files [`write_report_file`] and
/// [`replace_file`] create: the owner's only unless the process asked for
/// more (`CUDALEAK_REPORT_MODE`): a report names the program's files and
/// functions, which other users need not read.
static FILE_MODE: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(crate::config::DEFAULT_REPORT_MODE);

pub fn set_file_mode(mode: u32) {
    FILE_MODE.store(mode & 0o666, std::sync::atomic::Ordering::Relaxed);
}

fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom fills the 4 bytes of v.
    let n = unsafe { libc::getrandom((&mut v as *mut u32).cast(), 4, libc::GRND_NONBLOCK) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        v = t ^ (std::process::id() << 16);
    }
    v
}

pub fn instance_token(start_ms: i64) -> String {
    format!("{start_ms}-{:08x}", random_u32())
}

/// Writes a fresh temporary file beside `dir/name` (`O_CREAT|O_EXCL|
/// O_NOFOLLOW`) with `fill`, flushed and `fsync`ed so that the name it is
/// linked to never holds a partial report after a crash; returns its path,
/// and removes it on error. `shared` (the metrics file): its bits are set
/// to `mode` on the open file whatever the umask, and it is not synced.
fn write_temp(
    dir: &Path,
    name: &str,
    mode: u32,
    shared: bool,
    fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let tmp = dir.join(format!(".{name}.{:08x}.tmp", random_u32()));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(&tmp)?;
    let chmod = if shared {
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
    } else {
        Ok(())
    };
    let mut out = io::BufWriter::with_capacity(1 << 16, f);
    let result = chmod
        .and_then(|_| fill(&mut out))
        .and_then(|_| out.flush())
        .and_then(|_| if shared { Ok(()) } else { out.get_ref().sync_all() });
    drop(out);
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// How many other names a report tries when its own is taken.
const OTHER_NAMES: usize = 8;

/// Streams `fill` into `dir/name` for a report: atomically and without
/// replacing anything; when the name is taken
/// (a file, or a symbolic link someone planted there) the report goes to
/// `<name without .json>.<8 hex digits>.json` instead of being lost.
/// Returns the final path.
pub fn write_report_file(
    dir: &Path,
    name: &str,
    fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let tmp = write_temp(
        dir,
        name,
        FILE_MODE.load(std::sync::atomic::Ordering::Relaxed),
        false,
        fill,
    )?;
    let stem = name.strip_suffix(".json").unwrap_or(name);
    let mut final_path = dir.join(name);
    let mut linked = std::fs::hard_link(&tmp, &final_path);
    for _ in 0..OTHER_NAMES {
        match &linked {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                final_path = dir.join(format!("{stem}.{:08x}.json", random_u32()));
                linked = std::fs::hard_link(&tmp, &final_path);
            }
            _ => break,
        }
    }
    let _ = std::fs::remove_file(&tmp);
    linked.map(|_| final_path)
}

/// Removes the temporary files that processes of this host killed in the
/// middle of a write left in `dir` (SIGKILL during a dump left a
/// 77 MB hidden file nobody removed). Only names of our own pattern
/// (`.cudaleak.<host>[.r<rank>].<pid>.….tmp`) with this host's name, only
/// regular files owned by us, only when no process has that pid any more
/// and the file was last written [`STALE_TEMPORARY_AGE`] ago or earlier.
/// Returns how many were removed.
///
/// Why the age: a process in another pid namespace (containers sharing a
/// volume, same hostname) is invisible to `kill(pid, 0)`, which answers
/// ESRCH for it, and its report being written was deleted under it.
pub fn remove_stale_temporaries(dir: &Path, hostname: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let host = sanitize(hostname);
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| temporary_of_pid(n, &host)) else {
            continue;
        };
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        if !meta.file_type().is_file() || meta.uid() != uid || process_exists(pid) {
            continue;
        }
        let age = meta.modified().ok().and_then(|m| m.elapsed().ok());
        if age.is_none_or(|a| a < STALE_TEMPORARY_AGE) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// How long a temporary file of a process that seems gone must have been
/// left unwritten before it is removed (CONTRACT.md, "Reports").
pub const STALE_TEMPORARY_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The pid in a temporary file name of ours written on host `host`.
fn temporary_of_pid(name: &str, host: &str) -> Option<i32> {
    let rest = name.strip_prefix(".cudaleak.")?.strip_suffix(".tmp")?;
    let mut fields = rest.split('.');
    if fields.next()? != host {
        return None;
    }
    let mut field = fields.next()?;
    if field.starts_with('r') && field[1..].parse::<i64>().is_ok() {
        field = fields.next()?;
    }
    let pid: i32 = field.parse().ok()?;
    (pid > 0).then_some(pid)
}

fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() != libc::ESRCH }
}

/// Replaces `dir/name` atomically (temporary file, then rename): for the
/// timeline, which is one growing file per process.
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    replace(
        dir,
        name,
        bytes,
        FILE_MODE.load(std::sync::atomic::Ordering::Relaxed),
        false,
    )
}

/// [`replace_file`] for the metrics file, which a collector running as
/// another user reads: its bits are `mode` whatever the umask (0644 under
/// an HPC site's umask 077 would be 0600), and it is not synced to disk:
/// it is rewritten every few seconds and removed at exit, and a sync would
/// cost the library's thread a disk flush each time.
pub fn replace_file_with_mode(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> io::Result<PathBuf> {
    replace(dir, name, bytes, mode, true)
}

fn replace(dir: &Path, name: &str, bytes: &[u8], mode: u32, shared: bool) -> io::Result<PathBuf> {
    let final_path = dir.join(name);
    let tmp = write_temp(dir, name, mode, shared, &mut |w| w.write_all(bytes))?;
    std::fs::rename(&tmp, &final_path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(final_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cudaleak-writer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_identify_host_rank_pid_and_dump() {
        let n = ReportName {
            hostname: "node/7".into(),
            rank: Some(3),
            pid: 99,
            instance: "1700000000000-beef".into(),
            sequence: 2,
            trigger: "signal",
        };
        assert_eq!(
            n.file_name(),
            "cudaleak.node_7.r3.99.1700000000000-beef.2.signal.json"
        );
        assert_eq!(
            ReportName {
                rank: None,
                ..n.clone()
            }
            .file_name(),
            "cudaleak.node_7.99.1700000000000-beef.2.signal.json"
        );
        assert!(n.timeline_name().ends_with(".timeline.json"));
    }

    #[test]
    fn never_replaces_and_never_follows_links() {
        let d = tmpdir("nolink");
        let p = write_report_file(&d, "a.json", &mut |w| w.write_all(b"{}")).unwrap();
        assert_eq!(p, d.join("a.json"));
        let q = write_report_file(&d, "a.json", &mut |w| w.write_all(b"[]")).unwrap();
        assert_ne!(p, q);
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        // A dangling symlink at the final name is not written through.
        std::os::unix::fs::symlink(d.join("target"), d.join("b.json")).unwrap();
        write_report_file(&d, "b.json", &mut |w| w.write_all(b"x")).unwrap();
        assert!(!d.join("target").exists());
        // No temporary files are left behind.
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_taken_name_gets_another_name() {
        let d = tmpdir("taken");
        std::os::unix::fs::symlink(d.join("victim"), d.join("r.json")).unwrap();
        let p = write_report_file(&d, "r.json", &mut |w| w.write_all(b"{}")).unwrap();
        let n = p.file_name().unwrap().to_str().unwrap();
        assert!(
            n.starts_with("r.") && n.ends_with(".json") && n.len() == "r.01234567.json".len(),
            "{n}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        assert!(!d.join("victim").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stale_temporaries_of_dead_processes_of_this_host_only() {
        let d = tmpdir("stale");
        // A pid that cannot exist (above pid_max's ceiling of 2^22).
        let dead = ".cudaleak.h1.99999999.17-ab.1.exit.json.0badf00d.tmp";
        let dead_rank = ".cudaleak.h1.r3.99999999.17-ab.1.exit.json.0badf00d.tmp";
        let alive = format!(
            ".cudaleak.h1.{}.17-ab.1.exit.json.0badf00d.tmp",
            std::process::id()
        );
        let other_host = ".cudaleak.h2.99999999.17-ab.1.exit.json.0badf00d.tmp";
        let not_ours = ".other.h1.99999999.tmp";
        // Written a moment ago: perhaps by a process of another pid
        // namespace, to which our kill(pid, 0) answers ESRCH.
        let fresh = ".cudaleak.h1.99999997.17-ab.1.exit.json.0badf00d.tmp";
        let long_ago =
            std::time::SystemTime::now() - STALE_TEMPORARY_AGE - std::time::Duration::from_secs(60);
        for n in [dead, dead_rank, &alive, other_host, not_ours, fresh] {
            let f = std::fs::File::create(d.join(n)).unwrap();
            (&f).write_all(b"x").unwrap();
            if n != fresh {
                f.set_modified(long_ago).unwrap();
            }
        }
        let link = ".cudaleak.h1.99999998.17-ab.1.exit.json.0badf00d.tmp";
        std::os::unix::fs::symlink(d.join("victim"), d.join(link)).unwrap();
        assert_eq!(remove_stale_temporaries(&d, "h1"), 2);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            alive.clone(),
            other_host.into(),
            not_ours.into(),
            link.into(),
            fresh.into(),
        ];
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn prepare_dir_creates_and_checks() {
        let d = tmpdir("prep").join("a/b");
        prepare_dir(&d).unwrap();
        assert!(d.is_dir());
        assert!(prepare_dir(Path::new("/proc/1/nonexistent")).is_err());
    }

    #[test]
    fn instance_tokens_differ() {
        assert_ne!(instance_token(1), instance_token(1));
    }
}
