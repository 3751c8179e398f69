//! `cudaleak demo`: a program with three planted leaks (sim/demo.c) on the
//! bundled simulated CUDA driver, so that a machine without a GPU shows a
//! real report. The driver, runtime and program are compiled into this
//! binary (build.rs), so the demo needs no compiler, also from the wheel,
//! and they are written to a temporary directory only while it runs.

use super::{find_library, CliResult};
use std::os::unix::fs::PermissionsExt;
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
    let p = dir.join(name);
    std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", p.display()))
}

pub fn demo(dir: Option<PathBuf>) -> CliResult {
    let lib = find_library()?;
    let work = std::env::temp_dir().join(format!("cudaleak-demo-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    for (name, bytes) in FILES {
        write_exe(&work, name, bytes)?;
    }
    let reports = dir.unwrap_or_else(|| work.join("reports"));
    std::fs::create_dir_all(&reports).map_err(|e| format!("{}: {e}", reports.display()))?;
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
