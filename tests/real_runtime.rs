//! NVIDIA's own runtime under the library: the
//! `nvidia-cuda-runtime-cu12` wheel, which scripts/test.sh installs into the
//! test environment (requirements-dev.txt), ships libcudart.so.12 and
//! libcudart_static.a. It cannot start on the simulated driver (it needs
//! NVIDIA's private export tables), so on a machine without a GPU its first
//! calls fail; they must fail with the same codes under the library as
//! without it, with no crash and no output of ours, whether the program
//! links it, links it statically, or loads it with ctypes; and whether no
//! libcuda is found at all or the simulated one is.
//!
//! These tests are `#[ignore]`d, with the reason: `cargo test` reports
//! them as ignored, never as passed; scripts/test.sh runs them
//! (`--ignored`), and there a missing wheel fails them.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

fn python3() -> PathBuf {
    PathBuf::from(std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
}

/// The wheel's lib directory, or None (after saying so) when the wheel is
/// not installed where the tests' Python looks.
fn wheel_lib() -> Option<PathBuf> {
    let out = Command::new(python3())
        .args([
            "-c",
            "import nvidia.cuda_runtime as m; print(list(m.__path__)[0])",
        ])
        .output()
        .expect("python3");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib");
    if out.status.success() && dir.join("libcudart.so.12").is_file() {
        return Some(dir);
    }
    None
}

/// The environments a program meets: no libcuda anywhere (this machine),
/// and the simulated libcuda.so.1 alone on the library path.
fn environments() -> Vec<(&'static str, String)> {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = target_dir().join("cudaleak-tests").join("only-simulated-driver");
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(format!(".libcuda.so.1.{}", std::process::id()));
        std::fs::copy(sim_dir().join("libcuda.so.1"), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("libcuda.so.1")).unwrap();
        dir
    });
    vec![
        ("no driver", String::new()),
        ("simulated driver", dir.display().to_string()),
    ]
}

/// `program args` without and under the library, in each environment: the
/// same status and output, nothing on stderr. Returns the traced outcomes.
fn same_codes(program: &Path, args: &[&str]) -> Vec<Outcome> {
    let mut traced = Vec::new();
    for (what, ld_path) in environments() {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("LD_LIBRARY_PATH", &ld_path)
            .env_remove("LD_PRELOAD");
        let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
        assert!(status.success(), "{what}: {program:?} {args:?}: {stderr}");
        let codes: Vec<&str> = stdout.lines().collect();
        assert_eq!(codes.len(), 4, "{what}: {stdout}");
        let out = run_traced(program, args, &[("LD_LIBRARY_PATH", &ld_path)]);
        assert_eq!(
            (out.status.code(), out.stdout.as_str()),
            (status.code(), stdout.as_str()),
            "{what}: {program:?} {args:?} under the library:\n{}",
            out.stderr
        );
        assert!(out.stderr.is_empty(), "{what}: {}", out.stderr);
        eprintln!("{what}: {}", codes.join(" "));
        traced.push(out);
    }
    traced
}

/// A failed allocation call is one, counted; nothing is live.
fn counted_failures(outcomes: &[Outcome]) {
    for out in outcomes {
        let failed = out.stdout.lines().skip(1).filter(|l| !l.ends_with("=0")).count() as u64;
        let r = out.report();
        assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
        assert_eq!(r.totals.failed_allocations, failed, "{}", out.stdout);
        assert_eq!(r.totals.allocations, r.totals.frees);
    }
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn a_program_linked_with_nvidias_runtime_gets_its_codes_unchanged() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    let exe = build(
        "real_runtime",
        &["tests/c/real_runtime.c"],
        &[
            &lib.join("libcudart.so.12").display().to_string(),
            &format!("-Wl,-rpath,{}", lib.display()),
        ],
    );
    counted_failures(&same_codes(&exe, &[]));
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn a_program_with_nvidias_static_runtime_gets_its_codes_unchanged() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    // Built here, not by `support::build`, whose run path names the
    // simulated driver's directory: the static runtime's dlopen of
    // libcuda.so.1 would find it there, and "no driver" would not be.
    let exe = target_dir().join("cudaleak-tests").join("real_runtime_static");
    let tmp = exe.with_extension(format!("{}", std::process::id()));
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O0", "-g", "-Wall", "-o"])
        .arg(&tmp)
        .arg(repo().join("tests/c/real_runtime.c"))
        .arg(lib.join("libcudart_static.a"))
        .args(["-ldl", "-lpthread", "-lrt"])
        .status()
        .expect("run the C compiler");
    assert!(st.success());
    std::fs::rename(&tmp, &exe).unwrap();
    // No runtime hook sees a static runtime's calls; they never reach a
    // driver here, so nothing is recorded and no report is written.
    for out in same_codes(&exe, &[]) {
        let no_gpu = out.stdout.lines().all(|l| !l.ends_with("=0"));
        if no_gpu {
            assert!(out.reports().is_empty(), "{}", out.stderr);
        }
    }
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn python_loading_nvidias_runtime_with_ctypes_gets_its_codes_unchanged() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    let script = repo().join("tests/python/real_runtime.py");
    let so = lib.join("libcudart.so.12");
    let outcomes = same_codes(&python3(), &[script.to_str().unwrap(), so.to_str().unwrap()]);
    counted_failures(&outcomes);
}
