//! Subcommands of the `cudaleak` binary. Each returns the process exit
//! status, or an error message that main prints as one line (exit 2).

pub mod demo;
pub mod dump;
pub mod html;
pub mod reports;
pub mod run;
pub mod svg;

use std::path::{Path, PathBuf};

pub type CliResult = Result<u8, String>;

/// LeakSanitizer's exit status for "leaks found".
pub const LEAK_EXIT_STATUS: u8 = 23;

/// `run --fail-on-leak` when the command exited 0 but a process that made
/// CUDA calls wrote no final report (killed by SIGKILL, a full disk): the
/// gate fails closed, with a status of its own.
pub const MISSING_REPORT_EXIT_STATUS: u8 = 24;

/// libcudaleak.so: next to this binary (cargo's target/release), in
/// ../lib (an installed tree), or where CUDALEAK_LIBRARY says.
pub fn find_library() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("CUDALEAK_LIBRARY") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the cudaleak binary: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for candidate in [dir.join("libcudaleak.so"), dir.join("../lib/libcudaleak.so")] {
        if candidate.is_file() {
            return Ok(candidate.canonicalize().unwrap_or(candidate));
        }
        tried.push(candidate);
    }
    Err(format!(
        "cannot find libcudaleak.so; looked in: {} (build it with `cargo build --release`, or set CUDALEAK_LIBRARY)",
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
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

pub fn env() -> CliResult {
    for f in cudaleak_core::config::FLAGS {
        println!("{:<30} default: {}\n    {}", f.name, f.default, f.help);
    }
    Ok(0)
}
