//! `cudaleak run --simulated`: one's own program on the bundled simulated
//! CUDA driver and runtime, as README.md shows it, with nothing of the
//! simulator on LD_LIBRARY_PATH beforehand.

mod support;

use std::path::PathBuf;
use std::time::Duration;
use support::{cli_command, lib, reports_in, run_command, TempDir};

/// README.md's `my_script.py`, word for word.
const MY_SCRIPT: &str = "\
import ctypes

cudart = ctypes.CDLL(\"libcudart.so.12\")
block = ctypes.c_void_p()
cudart.cudaMalloc(ctypes.byref(block), 1 << 20)  # never freed: a leak
";

/// Where the process found libcudart.so.12, from its own mappings.
const PRINT_RUNTIME_PATH: &str = "\
print(next(l.split()[-1] for l in open('/proc/self/maps') if l.rstrip().endswith('/libcudart.so.12')))
";

fn run_script(dir: &TempDir, simulated: bool) -> (Option<i32>, String, String) {
    std::fs::write(
        dir.path().join("my_script.py"),
        format!("{MY_SCRIPT}{PRINT_RUNTIME_PATH}"),
    )
    .unwrap();
    let reports = dir.path().join("reports");
    let mut args = vec!["run", "--fail-on-leak", "--dir", reports.to_str().unwrap()];
    if simulated {
        args.push("--simulated");
    }
    args.extend(["--", "python3", "my_script.py"]);
    let mut cmd = cli_command(&args, dir.path());
    cmd.env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMCUDA_RUNTIME")
        .env("CUDALEAK_LIBRARY", lib());
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
    (status.code(), stdout, stderr)
}

#[test]
fn the_readme_shows_the_script_this_test_runs() {
    let readme = std::fs::read_to_string(support::repo().join("README.md")).unwrap();
    assert!(
        readme.contains(MY_SCRIPT),
        "README.md no longer shows:\n{MY_SCRIPT}"
    );
    assert!(readme.contains("cudaleak run --simulated -- python my_script.py"));
}

#[test]
fn run_simulated_runs_a_program_of_ones_own_on_the_bundled_driver() {
    let d = TempDir::new("simulated");
    let (code, stdout, stderr) = run_script(&d, true);
    assert_eq!(code, Some(23), "{stdout}\n{stderr}");
    // The one line that says so, naming the private directory ...
    let note = stderr
        .lines()
        .find(|l| l.starts_with("cudaleak: on the simulated CUDA driver"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let sim = PathBuf::from(
        note.split(" from ")
            .nth(1)
            .and_then(|rest| rest.split(", first on").next())
            .unwrap(),
    );
    // ... where the program found the runtime, and which is gone afterwards.
    assert_eq!(
        PathBuf::from(stdout.trim()),
        sim.join("libcudart.so.12"),
        "{stdout}"
    );
    assert!(!sim.exists(), "{} left behind", sim.display());
    let r = reports_in(&d.path().join("reports"));
    assert_eq!(r.len(), 1, "{stderr}");
    assert_eq!((r[0].leaked_bytes(), r[0].leaked_blocks()), (1 << 20, 1));
    let line = MY_SCRIPT
        .lines()
        .position(|l| l.contains("# never freed"))
        .unwrap() as i64
        + 1;
    assert!(
        r[0].leaks[0]
            .python_stack
            .iter()
            .any(|f| f.file.ends_with("my_script.py") && f.line == Some(line)),
        "my_script.py:{line} not in {:?}",
        r[0].leaks[0].python_stack
    );
}

/// A test that leaks on the simulated runtime, found by its usual name.
const TEST_LEAKY_PY: &str = "\
import ctypes

cudart = ctypes.CDLL(\"libcudart.so.12\")
KEPT = []


def test_leaks():
    block = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(block), 4096) == 0  # LEAK
    KEPT.append(block)
";

/// README.md, "From a checkout, without installing": `cudaleak run` puts
/// the checkout's python/ on PYTHONPATH and the plugin is named with -p.
#[test]
fn from_a_checkout_the_readme_pytest_command_fails_the_leaking_test() {
    let readme = std::fs::read_to_string(support::repo().join("README.md")).unwrap();
    assert!(readme.contains("target/release/cudaleak run -- pytest -p cudaleak.pytest_plugin --cuda-leaks"));
    let d = TempDir::new("checkout-pytest");
    std::fs::write(d.path().join("test_leaky.py"), TEST_LEAKY_PY).unwrap();
    let reports = d.path().join("reports");
    let mut cmd = cli_command(
        &[
            "run",
            "--simulated",
            "--dir",
            reports.to_str().unwrap(),
            "--",
            "pytest",
            "-p",
            "cudaleak.pytest_plugin",
            "--cuda-leaks",
            "-p",
            "no:cacheprovider",
            "-q",
            "test_leaky.py",
        ],
        d.path(),
    );
    cmd.env_remove("LD_LIBRARY_PATH")
        .env_remove("PYTHONPATH")
        .env_remove("PYTEST_ADDOPTS")
        .env("CUDALEAK_LIBRARY", lib());
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(120));
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    let line = TEST_LEAKY_PY.lines().position(|l| l.contains("# LEAK")).unwrap() + 1;
    assert!(
        stdout.contains("test_leaky.py::test_leaks leaked 4.0 KiB (4096 bytes) of CUDA memory in 1 block"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("test_leaky.py:{line}")), "{stdout}");
}
