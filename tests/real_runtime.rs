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

/// Nothing is recorded: the runtime fails these calls by itself (no
/// driver, or one too old for it), so no allocation reaches the driver,
/// where every allocation is recorded; nothing is live. A process that
/// reached no allocation hook has nothing to report, and may write none.
fn nothing_recorded(outcomes: &[Outcome]) {
    for out in outcomes {
        assert!(out.stdout.lines().all(|l| !l.ends_with("=0")), "{}", out.stdout);
        let reports = out.reports();
        assert!(reports.len() <= 1, "{} reports", reports.len());
        for r in reports {
            assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
            assert_eq!(
                (r.totals.allocations, r.totals.frees, r.totals.failed_allocations),
                (0, 0, 0)
            );
        }
    }
}

/// tests/c/real_runtime.c linked with the wheel's libcudart.so.12 in `lib`.
fn linked_with_the_wheel(lib: &Path) -> PathBuf {
    build(
        "real_runtime",
        &["tests/c/real_runtime.c"],
        &[
            &lib.join("libcudart.so.12").display().to_string(),
            &format!("-Wl,-rpath,{}", lib.display()),
        ],
    )
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn a_program_linked_with_nvidias_runtime_gets_its_codes_unchanged() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    let exe = linked_with_the_wheel(&lib);
    nothing_recorded(&same_codes(&exe, &[]));
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
    // The runtime fails these calls by itself; they never reach a driver
    // here, so nothing is recorded and no report is written.
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
    nothing_recorded(&outcomes);
}

/// The names in sim/traces/cudart-12.9-exports.txt: every function
/// NVIDIA's libcudart.so.12 exports.
fn nvidia_exports() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("sim/traces/cudart-12.9-exports.txt")).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect()
}

/// The functions `lib` defines and exports, without their versions.
fn defined_functions(lib: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm");
    assert!(out.status.success());
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "T" | "W").then(|| name.split('@').next().unwrap_or(name).to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_simulated_runtime_exports_every_function_nvidias_does() {
    // A program built against NVIDIA's runtime and run with `cudaleak run
    // --simulated` finds this runtime first: a function missing here
    // killed it with "undefined symbol" (status 127).
    let ours = defined_functions(&sim_dir().join("libcudart.so.12"));
    let missing: Vec<String> = nvidia_exports()
        .into_iter()
        .filter(|n| ours.binary_search(n).is_err())
        .collect();
    assert!(
        missing.is_empty(),
        "not exported by the simulated runtime: {missing:?}"
    );
    assert!(ours.len() >= 435, "{}", ours.len());
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn the_list_of_nvidias_exports_is_the_wheel_s() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    assert_eq!(
        defined_functions(&lib.join("libcudart.so.12")),
        nvidia_exports(),
        "sim/traces/cudart-12.9-exports.txt differs from the wheel's exports"
    );
}

#[test]
#[ignore = "needs the nvidia-cuda-runtime-cu12 wheel; scripts/test.sh runs it (--ignored)"]
fn a_program_built_against_nvidias_runtime_runs_on_the_simulated_one() {
    let lib = required(
        wheel_lib(),
        "the nvidia-cuda-runtime-cu12 wheel (pip install -r requirements-dev.txt)",
    );
    let exe = linked_with_the_wheel(&lib);
    let dir = TempDir::new("simulated-over-nvidia");
    let mut cmd = Command::new(cli());
    cmd.args(["run", "--simulated", "--fail-on-leak", "--dir"])
        .arg(dir.path())
        .arg("--")
        .arg(&exe)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH");
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
    // cudaDeviceSynchronize, which the simulated runtime did not have,
    // is called after cudaMallocAsync.
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "cudaGetDeviceCount=0",
            "cudaMalloc=0",
            "cudaMallocAsync=0",
            "cudaMallocHost=0"
        ],
        "{stderr}"
    );
    let reports = reports_in(dir.path());
    assert_eq!(reports.len(), 1, "{stderr}");
    assert_eq!((reports[0].totals.allocations, reports[0].totals.frees), (3, 3));
}
