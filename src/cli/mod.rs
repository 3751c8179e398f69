//! Subcommands of the `cudaleak` binary. Each returns the process exit
//! status, or an error message that main prints as one line (exit 2).

pub mod budgets;
pub mod demo;
pub mod dump;
pub mod export;
pub mod html;
pub mod reports;
pub mod run;
pub mod svg;
pub mod top;

use std::path::{Path, PathBuf};

pub type CliResult = Result<u8, String>;

/// LeakSanitizer's exit status for "leaks found".
pub const LEAK_EXIT_STATUS: u8 = 23;

/// `run --fail-on-leak` when the command exited 0 but a process that made
/// CUDA calls wrote no final report (killed by SIGKILL, a full disk): the
/// gate fails closed, with a status of its own.
pub const MISSING_REPORT_EXIT_STATUS: u8 = 24;

/// The library's place inside the installed Python package (pyproject.toml).
const PYTHON_PACKAGE_LIBRARY: &str = "cudaleak/_lib/libcudaleak.so";

/// Where `pip install cudaleak` puts the library, seen from the directory
/// of the installed command (a venv's or prefix's bin/, ~/.local/bin): the
/// wheel's package in ../lib/python3.X/site-packages (dist-packages on
/// Debian's system Python, lib64 on Fedora's), newest Python first.
fn python_package_candidates(bin_dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(bin_dir.join("..").join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort_by_key(|p| std::cmp::Reverse(python_version(p)));
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let site = python.join(packages);
                found.push(site.join(PYTHON_PACKAGE_LIBRARY));
                found.extend(editable_package_dirs(&site).map(|d| d.join(PYTHON_PACKAGE_LIBRARY)));
            }
        }
    }
    found
}

/// An editable install (`pip install -e ./cudaleak`) leaves no package in
/// site-packages, only maturin's `cudaleak.pth` naming the clone's
/// python/ directory, where the build put the library.
fn editable_package_dirs(site: &std::path::Path) -> impl Iterator<Item = PathBuf> {
    cudaleak_core::base::safe_read::read_regular_text(&site.join("cudaleak.pth"), 64 * 1024)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect::<Vec<_>>()
        .into_iter()
}

/// (3, 11) for .../python3.11, so that 3.10 sorts above 3.9.
fn python_version(dir: &std::path::Path) -> (u32, u32) {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let mut parts = name.trim_start_matches("python").split('.');
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// libcudaleak.so: where CUDALEAK_LIBRARY says, next to this binary
/// (cargo's target/release), in ../lib (an installed tree), or in the
/// Python package installed with this command (the wheel).
pub fn find_library() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("CUDALEAK_LIBRARY") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the cudaleak binary: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let fixed = [dir.join("libcudaleak.so"), dir.join("../lib/libcudaleak.so")];
    for candidate in fixed.iter().cloned().chain(python_package_candidates(&dir)) {
        if candidate.is_file() {
            return Ok(candidate.canonicalize().unwrap_or(candidate));
        }
    }
    tried.extend(fixed.iter().map(|p| p.display().to_string()));
    tried.push(format!(
        "{}/../lib/python3.*/site-packages/{PYTHON_PACKAGE_LIBRARY}",
        dir.display()
    ));
    Err(format!(
        "cannot find libcudaleak.so; looked in: {}. Set CUDALEAK_LIBRARY to its path, or install again from source, which builds the command and the library together: `pip install --force-reinstall ./cudaleak` (a clone) or `pip install --force-reinstall git+URL`; in a checkout, `cargo build --release` puts both in target/release. `cudaleak lib` prints the library found",
        tried.join(", ")
    ))
}

/// Creates `path` as a new file holding `bytes`: `O_CREAT|O_EXCL|
/// O_NOFOLLOW`, so an existing file or a planted symbolic link is never
/// written through; removed again if writing fails.
pub fn create_new_file(path: &Path, mode: u32, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(bytes).map_err(|e| {
        let _ = std::fs::remove_file(path);
        format!("cannot write {}: {e}", path.display())
    })
}

/// `cudaleak lib`: the library's path, for `LD_PRELOAD=$(cudaleak lib) ...`.
pub fn lib() -> CliResult {
    println!("{}", find_library()?.display());
    Ok(0)
}

/// `cudaleak metrics-clean DIR`: this host's metrics files whose process
/// is gone, removed, one line each.
pub fn metrics_clean(dir: &std::path::Path) -> CliResult {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let host = cudaleak_core::base::hostname();
    let stale = cudaleak_core::metrics::stale_files(dir, &host, |pid| {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) == 0 };
        alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    })
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    for p in &stale {
        match std::fs::remove_file(p) {
            Ok(()) => println!(
                "removed {}",
                cudaleak_core::report::render::escape(&p.display().to_string())
            ),
            Err(e) => eprintln!(
                "cudaleak: cannot remove {}: {e}",
                cudaleak_core::report::render::escape(&p.display().to_string())
            ),
        }
    }
    Ok(0)
}

pub fn env() -> CliResult {
    for f in cudaleak_core::config::FLAGS {
        println!("{:<30} default: {}\n    {}", f.name, f.default, f.help);
    }
    // Not the library's: the simulated driver's one setting that users
    // need, to try out-of-memory reports without a GPU.
    println!();
    println!("The simulated driver (`cudaleak run --simulated`, `cudaleak demo`) reads:");
    println!(
        "{:<30} default: unlimited\n    each simulated device's memory in bytes: allocations that do not fit \
         fail as on a full GPU, so that out-of-memory reports can be tried without one",
        "SIMCUDA_DEVICE_BYTES"
    );
    Ok(0)
}
