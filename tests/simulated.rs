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

/// What a test in the next one writes about its own Python: PYTHONPATH's
/// first entry and what it holds, where `cudaleak` was imported from, the
/// rest of PYTHONPATH, PYTEST_PLUGINS, and whether a module beside the
/// package in its environment is importable too.
const TEST_ENV_PY: &str = "\
import importlib.util, json, os

import cudaleak
import users_own


def test_env():
    first, *rest = os.environ['PYTHONPATH'].split(os.pathsep)
    with open(os.environ['ENV_OUT'], 'w') as f:
        json.dump({
            'first': first,
            'holds': sorted(os.listdir(first)),
            'link': os.readlink(os.path.join(first, 'cudaleak')),
            'module': os.path.realpath(cudaleak.__file__),
            'library': cudaleak.library_path(),
            'rest': rest,
            'plugins': os.environ['PYTEST_PLUGINS'],
            'beside': importlib.util.find_spec('beside_the_package') is not None,
        }, f)
";

/// A pytest plugin of the user's own, named in their PYTEST_PLUGINS.
const USERS_PLUGIN_PY: &str = "\
def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line('the users own plugin')
";

/// The wheel's layout seen from elsewhere (pipx's venv): the command finds
/// the library inside a package in another environment. `run` puts only
/// that package on PYTHONPATH, through a private directory that is gone
/// afterwards, before the user's own entries, and adds the plugin to the
/// user's PYTEST_PLUGINS: the command's pytest checks leaks without `-p`.
#[test]
fn run_gives_the_commands_python_only_the_package_beside_the_library_and_its_plugin() {
    let d = TempDir::new("package-for-python");
    let site = d.path().join("other-env/site-packages");
    let package = site.join("cudaleak");
    std::fs::create_dir_all(package.join("_lib")).unwrap();
    for entry in std::fs::read_dir(support::repo().join("python/cudaleak"))
        .unwrap()
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "py") {
            std::fs::copy(entry.path(), package.join(entry.file_name())).unwrap();
        }
    }
    std::fs::copy(lib(), package.join("_lib/libcudaleak.so")).unwrap();
    std::fs::write(site.join("beside_the_package.py"), "").unwrap();
    let mine = d.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("users_own.py"), "").unwrap();
    std::fs::write(mine.join("users_plugin.py"), USERS_PLUGIN_PY).unwrap();
    std::fs::write(d.path().join("test_leaky.py"), TEST_LEAKY_PY).unwrap();
    std::fs::write(d.path().join("test_env.py"), TEST_ENV_PY).unwrap();
    let out = d.path().join("env.json");
    let reports = d.path().join("reports");
    let mut cmd = cli_command(
        &[
            "run",
            "--simulated",
            "--fail-on-leak",
            "--dir",
            reports.to_str().unwrap(),
            "--",
            "pytest",
            "--cuda-leaks",
            "-p",
            "no:cacheprovider",
            "-q",
            "test_leaky.py",
            "test_env.py",
        ],
        d.path(),
    );
    cmd.env_remove("LD_LIBRARY_PATH")
        .env_remove("PYTEST_ADDOPTS")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONPATH", &mine)
        .env("PYTEST_PLUGINS", "users_plugin")
        .env("ENV_OUT", &out)
        .env("CUDALEAK_LIBRARY", package.join("_lib/libcudaleak.so"));
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(120));
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 failed, 1 passed"), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("the users own plugin").count(), 1, "{stdout}");
    let line = TEST_LEAKY_PY.lines().position(|l| l.contains("# LEAK")).unwrap() + 1;
    assert!(stdout.contains(&format!("test_leaky.py:{line}")), "{stdout}");
    let env: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let package = package.canonicalize().unwrap();
    let first = PathBuf::from(env["first"].as_str().unwrap());
    assert_eq!(env["holds"], serde_json::json!(["cudaleak"]), "{env}");
    assert_eq!(PathBuf::from(env["link"].as_str().unwrap()), package, "{env}");
    assert_eq!(
        PathBuf::from(env["module"].as_str().unwrap()),
        package.join("__init__.py")
    );
    // The module still finds its library through the link.
    assert_eq!(
        PathBuf::from(env["library"].as_str().unwrap()),
        package.join("_lib/libcudaleak.so")
    );
    assert_eq!(env["rest"], serde_json::json!([mine.to_str().unwrap()]), "{env}");
    assert_eq!(env["plugins"], "users_plugin,cudaleak.pytest_plugin", "{env}");
    assert_eq!(env["beside"], false, "the package's environment leaked in: {env}");
    assert!(!first.exists(), "{} left behind", first.display());
}
