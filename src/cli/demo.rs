//! `cudaleak demo`: a program with three planted leaks (sim/demo.c) on the
//! bundled simulated CUDA driver, so that a machine without a GPU shows a
//! real report. The driver, runtime and program are compiled into this
//! binary (build.rs), so the demo needs no compiler, also from the wheel,
//! and they are written to a temporary directory only while it runs.

use super::{create_new_file, find_library, CliResult};
use cudaleak_core::config::var;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const FILES: [(&str, &[u8]); 3] = [
    (
        "libcuda.so.1",
        include_bytes!(concat!(env!("CUDALEAK_SIM_DIR"), "/libcuda.so.1")),
    ),
    (
        "libcudart.so.12",
        include_bytes!(concat!(env!("CUDALEAK_SIM_DIR"), "/libcudart.so.12")),
    ),
    ("demo", include_bytes!(concat!(env!("CUDALEAK_SIM_DIR"), "/demo"))),
];

fn write_exe(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    create_new_file(&dir.join(name), 0o700, bytes)
}

/// A new directory only we can enter (`mkdtemp`: a fresh random name, mode
/// 0700). The demo used `/tmp/cudaleak-demo-<pid>` even when another user
/// had made it, and wrote through their symlinks: a planted
/// `libcuda.so.1 -> victim` got a root-owned file overwritten.
pub(super) fn private_dir_named(prefix: &str) -> Result<PathBuf, String> {
    let template = std::env::temp_dir().join(format!("{prefix}-XXXXXX"));
    let mut bytes = CString::new(template.as_os_str().as_bytes())
        .map_err(|_| format!("{}: NUL in the path", template.display()))?
        .into_bytes_with_nul();
    // SAFETY: a writable NUL-terminated buffer ending in XXXXXX.
    if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
        return Err(format!(
            "cannot create a directory like {}: {}",
            template.display(),
            std::io::Error::last_os_error()
        ));
    }
    bytes.pop();
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// The demo's directory, held by a descriptor: after `mkdtemp`, every file
/// in it is created and read through that descriptor (`openat`,
/// `O_NOFOLLOW`), and the program runs from it by `/proc/self/fd/N`, never
/// by the path: in a world-writable `TMPDIR` without the sticky bit,
/// another user can rename the directory and put their own in its place.
/// The descriptor is inherited by the demo program (no
/// CLOEXEC), whose loader reads its libraries through it too.
struct HeldDir {
    /// the name it was made under, for the user to see
    shown: PathBuf,
    fd: OwnedFd,
}

impl HeldDir {
    fn make(prefix: &str) -> Result<HeldDir, String> {
        let shown = private_dir_named(prefix)?;
        let c = CString::new(shown.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: valid C string; the descriptor is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW) };
        if fd < 0 {
            return Err(format!(
                "{}: {}",
                shown.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: just opened, ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let held = HeldDir { shown, fd };
        // Still the directory mkdtemp made: ours, 0700.
        // SAFETY: fstat into local storage.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes `st`, a local `stat`, about `held.fd`, a
        // descriptor `held` owns and keeps open.
        let ok = unsafe { libc::fstat(held.fd.as_raw_fd(), &mut st) } == 0
            && st.st_uid == unsafe { libc::geteuid() }
            && st.st_mode & 0o7777 == 0o700;
        if !ok {
            return Err(format!(
                "{} was replaced before it could be opened; not using it",
                held.shown.display()
            ));
        }
        Ok(held)
    }

    /// `/proc/self/fd/N`: the directory itself, in this process and in
    /// the children that inherit the descriptor.
    fn by_fd(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    fn create(&self, name: &str, mode: u32, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write;
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: valid descriptor and C string.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(format!(
                "cannot create {}: {}",
                self.shown.join(name).display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: just opened, ours.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all(bytes)
            .map_err(|e| format!("cannot write {}: {e}", self.shown.join(name).display()))
    }

    fn remove(&self, name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: valid descriptor and C string.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
}

pub fn demo(dir: Option<PathBuf>) -> CliResult {
    let lib = find_library()?;
    let work = HeldDir::make("cudaleak-demo")?;
    for (name, bytes) in FILES {
        work.create(name, 0o700, bytes)?;
    }
    // (where the library writes, where we read, what the user is shown)
    let (reports, shown_reports) = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d.clone(), d)
        }
        None => {
            let c = CString::new("reports").map_err(|e| e.to_string())?;
            // SAFETY: valid descriptor and C string.
            if unsafe { libc::mkdirat(work.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
                return Err(format!(
                    "{}: {}",
                    work.shown.join("reports").display(),
                    std::io::Error::last_os_error()
                ));
            }
            (work.by_fd().join("reports"), work.shown.join("reports"))
        }
    };
    println!("cudaleak demo: a small training loop with three planted leaks (sim/demo.c),");
    println!(
        "running on cudaleak's simulated CUDA driver under LD_PRELOAD={}\n",
        lib.display()
    );
    // The descriptor is inherited (no CLOEXEC), so /proc/self/fd/N is the
    // same directory in the demo program. What the user sees names the
    // directory by its path: the program's argv[0] (the reports'
    // `command`), and its stderr, where the library names its report
    // files under `/proc/self/fd/N` (unusable once the demo is over).
    let mut child = Command::new(work.by_fd().join("demo"))
        .arg0(work.shown.join("demo"))
        .env("LD_PRELOAD", &lib)
        .env("LD_LIBRARY_PATH", work.by_fd())
        .env(var::CUDALEAK_DIR, &reports)
        .env(
            var::CUDALEAK_TIMELINE,
            std::env::var_os(var::CUDALEAK_TIMELINE).unwrap_or_else(|| "20ms".into()),
        )
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run the demo: {e}"))?;
    let copier = child.stderr.take().map(|from| {
        let (by_fd, shown) = (work.by_fd(), work.shown.clone());
        std::thread::spawn(move || copy_naming_the_path(from, &by_fd, &shown))
    });
    let status = child.wait().map_err(|e| format!("cannot run the demo: {e}"))?;
    if let Some(c) = copier {
        let _ = c.join();
    }
    for (name, _) in FILES {
        work.remove(name);
    }
    // Empty unless the reports are in it.
    let _ = std::fs::remove_dir(&work.shown);
    if !status.success() {
        return Err(format!("the demo program failed: {status}"));
    }
    let report_name = std::fs::read_dir(&reports)
        .map_err(|e| format!("{}: {e}", shown_reports.display()))?
        .flatten()
        .map(|e| e.file_name())
        .find(|n| Path::new(n).extension().is_some_and(|x| x == "json"))
        .ok_or("the demo wrote no report")?;
    let report = reports.join(&report_name);
    let shown = shown_reports.join(&report_name);
    println!(
        "\nThe JSON report (schema/report.schema.json): {}",
        shown.display()
    );
    println!("Render it again with: cudaleak report {}", shown.display());
    let mut loaded = super::reports::load(std::slice::from_ref(&report))?;
    loaded[0].0 = shown.clone();
    let page = report.with_extension("html");
    create_new_file(
        &page,
        0o644,
        super::html::report_page(&loaded, &loaded[0].1).as_bytes(),
    )?;
    println!(
        "The HTML report (timeline, flame graph, leak table): {}",
        shown.with_extension("html").display()
    );
    Ok(0)
}

/// Copies the demo program's stderr to ours, line by line, naming the
/// demo's directory by `shown`, its path, where it says `by_fd`
/// (`/proc/self/fd/N`). Stops quietly when either side goes.
fn copy_naming_the_path(from: impl std::io::Read, by_fd: &Path, shown: &Path) {
    use std::io::{BufRead, Write};
    let by_fd = by_fd.as_os_str().as_bytes();
    let shown = shown.as_os_str().as_bytes();
    let mut out = std::io::stderr().lock();
    for line in std::io::BufReader::new(from).split(b'\n') {
        let Ok(line) = line else { return };
        let mut named = Vec::with_capacity(line.len());
        let mut rest = &line[..];
        while let Some(at) = find(rest, by_fd) {
            // only the directory itself: `/proc/self/fd/3/...`, not `/proc/self/fd/31`
            let end = at + by_fd.len();
            let whole = rest.get(end).is_none_or(|c| !c.is_ascii_digit());
            named.extend_from_slice(&rest[..at]);
            named.extend_from_slice(if whole { shown } else { by_fd });
            rest = &rest[end..];
        }
        named.extend_from_slice(rest);
        named.push(b'\n');
        if out.write_all(&named).is_err() {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `cudaleak run --simulated`: the bundled simulated CUDA driver and
/// runtime (libcuda.so.1, libcudart.so.12, backed by host memory) in a new
/// private directory put first on the command's LD_LIBRARY_PATH, so that a
/// program loading CUDA by its usual names gets them: one's own program on
/// cudaleak without a GPU, as the demo runs. The files go when this is
/// dropped, after the command and its summary.
pub struct SimulatedDriver {
    dir: PathBuf,
}

impl SimulatedDriver {
    pub fn for_command(cmd: &mut Command) -> Result<SimulatedDriver, String> {
        use std::io::Write;
        let sim = SimulatedDriver {
            dir: private_dir_named("cudaleak-sim")?,
        };
        for (name, bytes) in FILES.iter().filter(|(name, _)| name.starts_with("lib")) {
            write_exe(&sim.dir, name, bytes)?;
        }
        let mut path = OsString::from(&sim.dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", path);
        // Not eprintln!: `run` must not panic on a closed stderr.
        let _ = writeln!(
            std::io::stderr(),
            "cudaleak: on the simulated CUDA driver (libcuda.so.1 and libcudart.so.12 from {}, first on LD_LIBRARY_PATH); no GPU is used",
            sim.dir.display()
        );
        Ok(sim)
    }
}

impl Drop for SimulatedDriver {
    fn drop(&mut self) {
        for (name, _) in FILES {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another user renames the demo's directory and puts their
    /// own in its place. Files are still created in, and the program run
    /// from, the directory `mkdtemp` made.
    #[test]
    fn files_go_to_the_directory_made_even_after_it_is_replaced() {
        let held = HeldDir::make("cudaleak-demo-test").unwrap();
        let moved = held.shown.with_extension("moved");
        std::fs::rename(&held.shown, &moved).unwrap();
        std::fs::create_dir(&held.shown).unwrap();
        held.create("demo", 0o700, b"ours").unwrap();
        assert_eq!(std::fs::read(moved.join("demo")).unwrap(), b"ours");
        assert!(!held.shown.join("demo").exists());
        assert_eq!(std::fs::read(held.by_fd().join("demo")).unwrap(), b"ours");
        held.remove("demo");
        std::fs::remove_dir(&held.shown).unwrap();
        std::fs::remove_dir(&moved).unwrap();
    }
}
