//! `cudaleak demo`: a program with three planted leaks (sim/demo.c) on the
//! bundled simulated CUDA driver, so that a machine without a GPU shows a
//! real report. The driver, runtime and program are compiled into this
//! binary (build.rs), so the demo needs no compiler, also from the wheel,
//! and they are written to a temporary directory only while it runs.

use super::{create_new_file, find_library, CliResult};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

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
/// `libcuda.so.1 -> victim` got a root-owned file overwritten (issue 15).
fn private_dir() -> Result<PathBuf, String> {
    let template = std::env::temp_dir().join("cudaleak-demo-XXXXXX");
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

pub fn demo(dir: Option<PathBuf>) -> CliResult {
    let lib = find_library()?;
    let work = private_dir()?;
    for (name, bytes) in FILES {
        write_exe(&work, name, bytes)?;
    }
    let reports = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            d
        }
        None => {
            let d = work.join("reports");
            std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            d
        }
    };
    println!("cudaleak demo: a small training loop with three planted leaks (sim/demo.c),");
    println!(
        "running on cudaleak's simulated CUDA driver under LD_PRELOAD={}\n",
        lib.display()
    );
    let status = Command::new(work.join("demo"))
        .env("LD_PRELOAD", &lib)
        .env("LD_LIBRARY_PATH", &work)
        .env("CUDALEAK_DIR", &reports)
        .status()
        .map_err(|e| format!("cannot run the demo: {e}"))?;
    for (name, _) in FILES {
        let _ = std::fs::remove_file(work.join(name));
    }
    // Empty unless the reports are in it.
    let _ = std::fs::remove_dir(&work);
    if !status.success() {
        return Err(format!("the demo program failed: {status}"));
    }
    let report = std::fs::read_dir(&reports)
        .map_err(|e| format!("{}: {e}", reports.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .ok_or("the demo wrote no report")?;
    println!(
        "\nThe JSON report (schema/report.schema.json): {}",
        report.display()
    );
    println!("Render it again with: cudaleak report {}", report.display());
    Ok(0)
}
