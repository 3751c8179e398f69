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
    private_dir_named("cudaleak-demo")
}

fn private_dir_named(prefix: &str) -> Result<PathBuf, String> {
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
        .env(
            "CUDALEAK_TIMELINE",
            std::env::var_os("CUDALEAK_TIMELINE").unwrap_or_else(|| "20ms".into()),
        )
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
    let page = report.with_extension("html");
    let loaded = super::reports::load(std::slice::from_ref(&report))?;
    create_new_file(
        &page,
        0o644,
        super::html::report_page(&loaded, &loaded[0].1).as_bytes(),
    )?;
    println!(
        "The HTML report (timeline, flame graph, leak table): {}",
        page.display()
    );
    Ok(0)
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
