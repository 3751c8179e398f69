//! The wheel, used as a person who ran `pip install cudaleak` would: each
//! test installs target/wheels/cudaleak-*.whl into a fresh virtual
//! environment, offline (pip --no-index), and runs the installed command,
//! module and pytest plugin from a directory outside the source tree, with
//! an environment that names neither the tree nor its builds (no
//! PYTHONPATH, no CUDALEAK_LIBRARY, no target/release on PATH). Only the
//! simulated driver, standing in for the GPU, comes from the build.
//!
//! Ignored by a bare `cargo test`: scripts/test.sh builds the wheel
//! (scripts/build-wheel.sh) and a wheelhouse with pytest, puts
//! requirements-dev.txt's tools (auditwheel) on PATH, then runs these with
//! `cargo test --release --test wheel -- --ignored`.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::{reports_in, run_command, sim_dir, TempDir};

/// target/wheels/cudaleak-VERSION-*.whl (scripts/build-wheel.sh leaves one).
fn wheel() -> PathBuf {
    let dir = support::repo().join("target/wheels");
    let prefix = format!("cudaleak-{}-", env!("CARGO_PKG_VERSION"));
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(&prefix) && name.ends_with(".whl")
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {prefix}*.whl in {} (scripts/build-wheel.sh builds it): {found:?}",
        dir.display()
    );
    found[0].clone()
}

/// The manylinux tag in the wheel's name, as (2, 28).
fn wheel_glibc() -> (u32, u32) {
    let name = wheel().file_name().unwrap().to_string_lossy().into_owned();
    let tag = name
        .split(['-', '.'])
        .find_map(|part| part.strip_prefix("manylinux_"))
        .unwrap_or_else(|| panic!("{name} has no manylinux_X_Y tag"));
    let mut v = tag.split('_').map(|n| n.parse::<u32>().unwrap());
    (v.next().unwrap(), v.next().unwrap())
}

fn on_path(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH (scripts/test.sh puts its venv there)"))
}

/// A virtual environment outside the source tree; commands run in its
/// work directory with its bin/ first on a minimal PATH.
struct Venv {
    root: TempDir,
}

impl Venv {
    fn new(tag: &str) -> Venv {
        let root = TempDir::new(tag);
        std::fs::create_dir_all(root.path().join("work")).unwrap();
        let venv = Venv { root };
        let mut create = Command::new(on_path("python3"));
        create.args(["-m", "venv"]).arg(venv.dir());
        venv.check(create, "python3 -m venv");
        venv
    }

    fn dir(&self) -> PathBuf {
        self.root.path().join("venv")
    }

    fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.dir().join("bin").join(name)
    }

    /// `program` from the venv (or the system), in the work directory, with
    /// nothing of the source tree in its environment.
    fn command(&self, program: &str) -> Command {
        let exe = if self.bin(program).exists() {
            self.bin(program)
        } else {
            PathBuf::from(program)
        };
        let mut cmd = Command::new(exe);
        cmd.env_clear()
            .current_dir(self.work())
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.dir().join("bin").display()),
            )
            .env("HOME", self.root.path())
            .env("VIRTUAL_ENV", self.dir())
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PIP_NO_INDEX", "1")
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("SIMCUDA_RUNTIME", sim_dir().join("libcudart.so.12"));
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) -> (Option<i32>, String, String) {
        let mut cmd = self.command(program);
        cmd.args(args);
        let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(300));
        (status.code(), stdout, stderr)
    }

    fn check(&self, cmd: Command, what: &str) -> String {
        let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(300));
        assert!(status.success(), "{what}: {status}\n{stdout}\n{stderr}");
        stdout
    }

    fn pip_install(&self, what: &[&str]) {
        let wheelhouse = support::repo().join("target/wheelhouse");
        let mut cmd = self.command("python");
        cmd.args(["-m", "pip", "install", "--quiet", "--no-index", "--find-links"])
            .arg(&wheelhouse)
            .args(what);
        self.check(cmd, "pip install --no-index");
    }

    /// Every path under the venv, relative to it.
    fn files(&self) -> BTreeSet<String> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.insert(rel);
                if e.file_type().unwrap().is_dir() {
                    walk(&p, base, out);
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(&self.dir(), &self.dir(), &mut out);
        out
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.work().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

/// One venv with the wheel and pytest, shared by the tests that only use it.
fn installed() -> &'static Venv {
    static VENV: OnceLock<Venv> = OnceLock::new();
    VENV.get_or_init(|| {
        let venv = Venv::new("wheel");
        venv.pip_install(&["pytest", wheel().to_str().unwrap()]);
        venv
    })
}

/// The one line of `text` that contains `marker`, 1-based.
fn line_in(text: &str, marker: &str) -> usize {
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{marker:?}");
    lines[0]
}

/// A Python program that leaks one block of 1 MiB on the simulated driver.
const LEAKY_PY: &str = "\
import ctypes
import os

runtime = ctypes.CDLL(os.environ[\"SIMCUDA_RUNTIME\"])
block = ctypes.c_void_p()
assert runtime.cudaMalloc(ctypes.byref(block), ctypes.c_size_t(1 << 20)) == 0  # LEAK
";

/// Two tests, one of which leaks.
const SUITE_PY: &str = "\
import ctypes
import os

runtime = ctypes.CDLL(os.environ[\"SIMCUDA_RUNTIME\"])
KEPT = []


def malloc(nbytes):
    block = ctypes.c_void_p()
    assert runtime.cudaMalloc(ctypes.byref(block), ctypes.c_size_t(nbytes)) == 0
    return block


def test_frees_what_it_allocates():
    runtime.cudaFree(malloc(100))


def test_leaks():
    KEPT.append(malloc(4096))  # LEAK
";

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn the_wheel_holds_the_command_the_library_the_module_and_the_plugin() {
    let venv = installed();
    let site = venv.run(
        "python",
        &[
            "-c",
            "import cudaleak, os; print(os.path.dirname(cudaleak.__file__))",
        ],
    );
    assert_eq!(site.0, Some(0), "{}", site.2);
    let package = PathBuf::from(site.1.trim());
    assert!(package.starts_with(venv.dir()), "{}", package.display());
    for file in [
        "__init__.py",
        "__main__.py",
        "pytest_plugin.py",
        "_tables.py",
        "_lib/libcudaleak.so",
    ] {
        assert!(
            package.join(file).is_file(),
            "{file} missing in {}",
            package.display()
        );
    }
    assert!(venv.bin("cudaleak").is_file());
    let entry_points = venv
        .files()
        .into_iter()
        .find(|f| f.ends_with(".dist-info/entry_points.txt"))
        .expect("entry_points.txt");
    let text = std::fs::read_to_string(venv.dir().join(entry_points)).unwrap();
    assert!(
        text.contains("[pytest11]\ncudaleak.pytest_plugin=cudaleak.pytest_plugin"),
        "{text}"
    );
    // Small: no DWARF beyond what a stripped release keeps.
    for binary in [package.join("_lib/libcudaleak.so"), venv.bin("cudaleak")] {
        let out = Command::new("readelf").arg("-S").arg(&binary).output().unwrap();
        let sections = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && sections.contains(".text"), "{sections}");
        assert!(
            !sections.contains(".debug_info"),
            "{} has debug info",
            binary.display()
        );
    }
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn auditwheel_agrees_with_the_manylinux_tag() {
    let (major, minor) = wheel_glibc();
    assert!((major, minor) <= (2, 28), "the baseline is glibc 2.28 or older");
    let out = Command::new(on_path("auditwheel"))
        .arg("show")
        .arg(wheel())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tag = format!("manylinux_{major}_{minor}_{}", std::env::consts::ARCH);
    assert!(
        text.contains(&format!("consistent with the following platform tag: \"{tag}\"")),
        "{text}"
    );
}

/// The newest GLIBC_x.y version `binary` needs, from `objdump -T`.
fn newest_glibc_symbol(binary: &Path) -> ((u32, u32), String) {
    let out = Command::new("objdump").arg("-T").arg(binary).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", binary.display());
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|line| {
            let start = line.find("GLIBC_")? + "GLIBC_".len();
            let version: String = line[start..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
            Some((
                (parts.next()?, parts.next().unwrap_or(0)),
                line.trim().to_string(),
            ))
        })
        .max()
        .unwrap_or_else(|| panic!("{} names no glibc symbol", binary.display()))
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn no_binary_in_the_wheel_needs_a_newer_glibc_than_its_tag() {
    let venv = installed();
    let (_, lib, _) = venv.run("cudaleak", &["lib"]);
    let tag = wheel_glibc();
    for binary in [PathBuf::from(lib.trim()), venv.bin("cudaleak")] {
        let (newest, line) = newest_glibc_symbol(&binary);
        assert!(
            newest <= tag,
            "{} needs glibc {newest:?}, the tag promises {tag:?}: {line}",
            binary.display()
        );
    }
    // dlsym, found through dlvsym by the versions each glibc gives it, must
    // not be linked by version: glibc 2.34 moved it to libc as GLIBC_2.34.
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib.trim())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains(".text") && l.ends_with(" dlsym")),
        "libcudaleak.so defines dlsym:\n{text}"
    );
    assert!(
        !text.lines().any(|l| l.contains("*UND*") && l.ends_with(" dlsym")),
        "{text}"
    );
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn cudaleak_lib_and_python_m_cudaleak_lib_name_the_library_in_the_package() {
    let venv = installed();
    let (code, lib, stderr) = venv.run("cudaleak", &["lib"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lib = PathBuf::from(lib.trim());
    assert!(lib.starts_with(venv.dir()), "{}", lib.display());
    assert!(
        lib.ends_with("site-packages/cudaleak/_lib/libcudaleak.so"),
        "{}",
        lib.display()
    );
    let (code, via_python, stderr) = venv.run("python", &["-m", "cudaleak", "lib"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(via_python.trim(), lib.to_str().unwrap());
    let (_, from_module, _) = venv.run(
        "python",
        &["-c", "import cudaleak; print(cudaleak.library_path())"],
    );
    assert_eq!(from_module.trim(), lib.to_str().unwrap());
    let (_, version, _) = venv.run("cudaleak", &["--version"]);
    let (_, via_python, _) = venv.run("python", &["-m", "cudaleak", "--version"]);
    assert_eq!(version, via_python);
    assert_eq!(version.trim(), format!("cudaleak {}", env!("CARGO_PKG_VERSION")));
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn cudaleak_demo_runs_from_the_wheel() {
    let venv = installed();
    let reports = venv.work().join("demo-reports");
    let (code, stdout, stderr) = venv.run("cudaleak", &["demo", "--dir", reports.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("cudaleak: 74448896 bytes leaked in 5 blocks; report:"),
        "{stderr}"
    );
    let r = reports_in(&reports);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].leaked_bytes(), r[0].leaked_blocks()), (74448896, 5));
}

fn leaky_run_exits_23(venv: &Venv, runner: &[&str]) {
    venv.write("leaky.py", LEAKY_PY);
    let reports = venv.work().join(format!("reports-{}", runner.len()));
    let mut args: Vec<&str> = runner[1..].to_vec();
    args.extend([
        "run",
        "--fail-on-leak",
        "--dir",
        reports.to_str().unwrap(),
        "--",
        "python",
        "leaky.py",
    ]);
    let (code, stdout, stderr) = venv.run(runner[0], &args);
    assert_eq!(code, Some(23), "{stdout}\n{stderr}");
    let r = reports_in(&reports);
    assert_eq!(r.len(), 1, "{stderr}");
    assert_eq!((r[0].leaked_bytes(), r[0].leaked_blocks()), (1 << 20, 1));
    let line = line_in(LEAKY_PY, "# LEAK") as i64;
    assert!(
        r[0].leaks[0]
            .python_stack
            .iter()
            .any(|f| f.file.ends_with("leaky.py") && f.line == Some(line)),
        "leaky.py:{line} not in {:?}",
        r[0].leaks[0].python_stack
    );
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn cudaleak_run_fail_on_leak_exits_23_on_a_leaking_python_program() {
    leaky_run_exits_23(installed(), &["cudaleak"]);
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn python_m_cudaleak_run_is_the_same_command() {
    leaky_run_exits_23(installed(), &["python", "-m", "cudaleak"]);
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn available_is_false_plain_and_true_under_cudaleak_run() {
    let venv = installed();
    let probe = ["-c", "import cudaleak; print(cudaleak.available())"];
    let (code, stdout, stderr) = venv.run("python", &probe);
    assert_eq!((code, stdout.trim()), (Some(0), "False"), "{stderr}");
    let mut args = vec!["run", "--", "python"];
    args.extend(probe);
    let (code, stdout, stderr) = venv.run("cudaleak", &args);
    assert_eq!((code, stdout.trim()), (Some(0), "True"), "{stderr}");
}

/// pytest's outcome counts and FAILED lines.
fn pytest_in(venv: &Venv, extra: &[&str]) -> (Option<i32>, String) {
    venv.write("test_two.py", SUITE_PY);
    let mut args = vec![
        "run",
        "--",
        "python",
        "-m",
        "pytest",
        "-q",
        "-rf",
        "-p",
        "no:cacheprovider",
    ];
    args.extend(extra);
    args.push("test_two.py");
    let (code, stdout, stderr) = venv.run("cudaleak", &args);
    (code, format!("{stdout}\n{stderr}"))
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn the_pytest_plugin_loads_by_itself_and_names_the_leaking_line() {
    let venv = installed();
    let line = line_in(SUITE_PY, "# LEAK");
    let (code, out) = pytest_in(venv, &["--cuda-leaks"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("1 failed, 1 passed"), "{out}");
    assert!(out.contains("FAILED test_two.py::test_leaks"), "{out}");
    assert!(
        out.contains("test_two.py::test_leaks leaked 4.0 KiB (4096 bytes) of CUDA memory in 1 block at "),
        "{out}"
    );
    assert!(
        out.contains(&format!("test_two.py:{line} in test_leaks")),
        "{out}"
    );

    // Opt-in: loaded, but checking nothing without the option.
    let (code, out) = pytest_in(venv, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("2 passed"), "{out}");

    // The way before the wheel, `-p cudaleak.pytest_plugin`, still works:
    // the entry point has the module's name, so it is not loaded twice.
    let (code, out) = pytest_in(venv, &["-p", "cudaleak.pytest_plugin", "--cuda-leaks"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("1 failed, 1 passed"), "{out}");
}

#[test]
#[ignore = "needs the wheel: scripts/test.sh builds it and runs these"]
fn uninstall_leaves_nothing_behind() {
    let venv = Venv::new("wheel-uninstall");
    let before = venv.files();
    venv.pip_install(&[wheel().to_str().unwrap()]);
    let installed = venv.files();
    assert!(installed.len() > before.len());
    // Use it, so that Python writes its byte code too.
    for args in [
        &["-c", "import cudaleak, cudaleak.__main__"][..],
        &["-m", "cudaleak", "lib"][..],
    ] {
        let (code, _, stderr) = venv.run("python", args);
        assert_eq!(code, Some(0), "{stderr}");
    }
    let mut uninstall = venv.command("python");
    uninstall.args(["-m", "pip", "uninstall", "--yes", "cudaleak"]);
    venv.check(uninstall, "pip uninstall");
    let after = venv.files();
    let left: Vec<&String> = after.difference(&before).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let removed: Vec<&String> = before.difference(&after).collect();
    assert!(removed.is_empty(), "removed: {removed:?}");
}

// ---------------------------------------------------------------------------
// Installing from source, every standard way: each route starts
// from a clean clone of HEAD, offline (pip, uv and pipx get the wheelhouse
// in place of the index, with their caches off or fresh; cargo gets
// CARGO_NET_OFFLINE and the crates `cargo build` already fetched), and
// gives a fresh environment the command, the library, the module and the
// pytest plugin.
//
// Build once, install many times: the routes that build in the clone share
// one build (cargo finds it fresh); a route that builds elsewhere (pip's
// copy of a git URL, an unpacked sdist) rebuilds only the project's three
// crates, as every route shares one cargo target directory,
// target/install-routes. That directory holds build outputs only, never
// sources: a file missing from a clone or an sdist still fails its build.

/// The routes' one build at a time: their outputs share cargo's target
/// directory, and a slow build does not starve the others' deadlines.
static ROUTE_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

const BUILD_DEADLINE: Duration = Duration::from_secs(1800);

/// The toolchain's own bin directory (cargo, rustc: not rustup's proxies,
/// which look for the user's HOME), from the cargo running these tests.
fn toolchain_bin() -> PathBuf {
    let cargo = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| on_path("cargo"));
    let dir = cargo.canonicalize().unwrap().parent().unwrap().to_path_buf();
    assert!(dir.join("rustc").is_file(), "no rustc beside {}", cargo.display());
    dir
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cargo"))
}

fn wheelhouse() -> PathBuf {
    support::repo().join("target/wheelhouse")
}

/// HEAD, cloned as a user clones it; the git URL route clones this clone.
struct CleanCopy {
    _root: TempDir,
    clone: PathBuf,
    head: String,
}

fn git(args: &[&str], dir: &Path) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn clean_copy() -> &'static CleanCopy {
    static COPY: OnceLock<CleanCopy> = OnceLock::new();
    COPY.get_or_init(|| {
        let repo = support::repo();
        let head = git(&["rev-parse", "HEAD"], &repo);
        if !git(&["status", "--porcelain", "--untracked-files=no"], &repo).is_empty() {
            eprintln!(
                "NOTE: the install routes build HEAD ({head}); this checkout's uncommitted changes are not in it"
            );
        }
        let root = TempDir::new("clean-copy");
        let clone = root.path().join("cudaleak");
        git(
            &["clone", "--quiet", "--no-checkout", repo.to_str().unwrap(), clone.to_str().unwrap()],
            root.path(),
        );
        git(&["checkout", "--quiet", &head], &clone);
        CleanCopy {
            _root: root,
            clone,
            head,
        }
    })
}

impl Venv {
    /// `program` with what a build from source needs besides the clean
    /// environment: Rust (the toolchain running these tests, offline), the
    /// wheelhouse in place of the package index, and no pip cache (a wheel
    /// an earlier run built must not stand in for this build).
    fn build_command(&self, program: &str) -> Command {
        let mut cmd = self.command(program);
        cmd.env(
            "PATH",
            format!(
                "{}:{}:/usr/bin:/bin",
                self.dir().join("bin").display(),
                toolchain_bin().display()
            ),
        )
        .env("CARGO_HOME", cargo_home())
        .env("CARGO_NET_OFFLINE", "true")
        .env("CARGO_TARGET_DIR", support::repo().join("target/install-routes"))
        .env("PIP_FIND_LINKS", wheelhouse())
        .env("PIP_NO_CACHE_DIR", "1")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMCUDA_RUNTIME");
        cmd
    }

    /// Runs a build (or an install that builds), one at a time; returns
    /// its output and prints how long it took.
    fn build(&self, what: &str, cmd: Command) -> String {
        let _one = ROUTE_BUILD.lock().unwrap_or_else(|e| e.into_inner());
        let start = std::time::Instant::now();
        let (status, stdout, stderr) = run_command(cmd, BUILD_DEADLINE);
        // Past the test harness's capture, so that the suite's log shows
        // what each route costs.
        let _ = writeln!(
            std::io::stderr(),
            "    install route: {what}: {:.0} s",
            start.elapsed().as_secs_f64()
        );
        assert!(status.success(), "{what}: {status}\n{stdout}\n{stderr}");
        stdout
    }
}

/// What every route must give, checked with the installed programs:
/// `cudaleak demo` exits 0 with the demo's summary line (README.md, "What
/// a report looks like"); `cudaleak lib` names a file of this
/// installation, under `root`; `import cudaleak` finds the same library;
/// pytest shows the plugin's options without `-p`.
fn assert_route_works(route: &str, venv: &Venv, bin: &Path, root: &Path) {
    let exe = |name: &str| bin.join(name).to_str().unwrap().to_string();
    let lib = assert_command_works(route, venv, &bin.join("cudaleak"), root);
    let (code, from_module, stderr) = venv.run(
        &exe("python"),
        &["-c", "import cudaleak; print(cudaleak.library_path())"],
    );
    assert_eq!(code, Some(0), "{route}: import cudaleak\n{stderr}");
    assert_eq!(from_module.trim(), lib.to_str().unwrap(), "{route}");
    let (code, help, stderr) = venv.run(&exe("pytest"), &["--help"]);
    assert_eq!(code, Some(0), "{route}: pytest --help\n{stderr}");
    for option in ["--cuda-leaks", "--cuda-leaks-warmup", "--cuda-leaks-framework"] {
        assert!(
            help.contains(option),
            "{route}: pytest --help lacks {option}:\n{help}"
        );
    }
}

/// The command's part of what a route must give (`cudaleak demo`, and
/// `cudaleak lib` naming a file under `root`): the library it names.
fn assert_command_works(route: &str, venv: &Venv, cudaleak: &Path, root: &Path) -> PathBuf {
    let cudaleak = cudaleak.to_str().unwrap();
    let (code, stdout, stderr) = venv.run(cudaleak, &["demo"]);
    assert_eq!(code, Some(0), "{route}: cudaleak demo\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("cudaleak: 74448896 bytes leaked in 5 blocks; report:"),
        "{route}: cudaleak demo\n{stderr}"
    );
    let (code, lib, stderr) = venv.run(cudaleak, &["lib"]);
    assert_eq!(code, Some(0), "{route}: cudaleak lib\n{stderr}");
    let lib = PathBuf::from(lib.trim());
    assert!(
        lib.is_file() && lib.starts_with(root.canonicalize().unwrap()),
        "{route}: cudaleak lib names {}, not a file under {}",
        lib.display(),
        root.display()
    );
    lib
}

/// `pip wheel ./clone`, with build isolation: the build every route in the
/// clone then finds fresh. Returns the wheel.
fn wheel_built_from_the_clone() -> &'static (TempDir, PathBuf) {
    static WHEEL: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    WHEEL.get_or_init(|| {
        let copy = clean_copy();
        let out = TempDir::new("route-pip-wheel");
        let venv = installed();
        let mut cmd = venv.build_command("python");
        cmd.args(["-m", "pip", "wheel", "--no-deps", "--wheel-dir"])
            .arg(out.path())
            .arg(&copy.clone);
        venv.build("pip wheel ./clone (the first build)", cmd);
        let wheels: Vec<PathBuf> = std::fs::read_dir(out.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(wheels.len(), 1, "{wheels:?}");
        let wheel = wheels[0].clone();
        (out, wheel)
    })
}

/// The file names in a wheel, with the version's dist-info and data names.
fn wheel_contents(wheel: &Path) -> BTreeSet<String> {
    let out = Command::new(on_path("python3"))
        .args([
            "-c",
            "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
        ])
        .arg(wheel)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_pip_wheel_then_install_gives_a_plain_platform_tag_without_zig() {
    let (_, wheel) = wheel_built_from_the_clone();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    // Isolated builds get no zig unless asked (-C zig=yes): the plain tag,
    // which promises nothing beyond this machine.
    assert_eq!(
        name,
        format!(
            "cudaleak-{}-py3-none-linux_{}.whl",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        )
    );
    // The same files as the script's manylinux wheel.
    assert_eq!(wheel_contents(wheel), wheel_contents(&self::wheel()));
    let venv = Venv::new("route-pip-wheel");
    venv.pip_install(&["pytest", wheel.to_str().unwrap()]);
    assert_route_works(
        "pip wheel + pip install",
        &venv,
        &venv.dir().join("bin"),
        &venv.dir(),
    );
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_pip_install_of_a_clone() {
    let copy = clean_copy();
    wheel_built_from_the_clone();
    let venv = Venv::new("route-pip-install");
    let mut cmd = venv.build_command("python");
    cmd.args(["-m", "pip", "install", "--quiet", "pytest"])
        .arg(&copy.clone);
    venv.build("pip install ./clone", cmd);
    assert_route_works("pip install ./clone", &venv, &venv.dir().join("bin"), &venv.dir());
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_pip_install_editable_of_a_clone() {
    let copy = clean_copy();
    wheel_built_from_the_clone();
    let venv = Venv::new("route-pip-editable");
    let mut cmd = venv.build_command("python");
    cmd.args(["-m", "pip", "install", "--quiet", "pytest", "--editable"])
        .arg(&copy.clone);
    venv.build("pip install -e ./clone", cmd);
    // The package is the clone's python/, the library built into it.
    assert_route_works(
        "pip install -e ./clone",
        &venv,
        &venv.dir().join("bin"),
        &copy.clone,
    );
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_pip_install_of_a_git_url() {
    let copy = clean_copy();
    wheel_built_from_the_clone();
    let venv = Venv::new("route-git-url");
    let url = format!("git+file://{}@{}", copy.clone.display(), copy.head);
    let mut cmd = venv.build_command("python");
    cmd.args(["-m", "pip", "install", "--quiet", "pytest", &url]);
    venv.build("pip install git+file://clone", cmd);
    assert_route_works("pip install git+URL", &venv, &venv.dir().join("bin"), &venv.dir());
}

/// Every file git tracks that a build reads: the sdist must hold each.
const SDIST_MUST_HOLD: [&str; 9] = [
    "Cargo.toml",
    "Cargo.lock",
    "build.rs",
    "pyproject.toml",
    "build_backend/",
    "src/",
    "crates/",
    "sim/",
    "python/cudaleak/",
];

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_sdist_holds_what_its_build_needs_and_installs_alone() {
    let copy = clean_copy();
    wheel_built_from_the_clone();
    let venv = Venv::new("route-sdist");
    let dist = venv.root.path().join("dist");
    let mut cmd = venv.build_command(on_path("python3").to_str().unwrap());
    cmd.args(["-m", "build", "--sdist", "--outdir"])
        .arg(&dist)
        .arg(&copy.clone);
    venv.build("python -m build --sdist ./clone", cmd);
    let sdists: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(sdists.len(), 1, "{sdists:?}");
    let sdist = &sdists[0];
    let top = format!("cudaleak-{}/", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        sdist.file_name().unwrap().to_string_lossy(),
        format!("cudaleak-{}.tar.gz", env!("CARGO_PKG_VERSION"))
    );
    let listed = Command::new("tar").arg("tzf").arg(sdist).output().unwrap();
    assert!(listed.status.success());
    let files: BTreeSet<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(&top))
        .map(str::to_string)
        .collect();
    let tracked = git(&["ls-files"], &copy.clone);
    let needed: Vec<&str> = tracked
        .lines()
        .filter(|f| {
            SDIST_MUST_HOLD
                .iter()
                .any(|p| f == p || (p.ends_with('/') && f.starts_with(p)))
                || f.starts_with("schema/")
                || f.starts_with("suppressions/")
        })
        .collect();
    assert!(needed.len() > 40, "{needed:?}");
    let missing: Vec<&&str> = needed.iter().filter(|f| !files.contains(**f)).collect();
    assert!(missing.is_empty(), "the sdist lacks {missing:?}");
    assert!(files.contains("PKG-INFO"), "{files:?}");
    let binaries: Vec<&String> = files.iter().filter(|f| f.ends_with(".so")).collect();
    assert!(binaries.is_empty(), "the sdist holds built files: {binaries:?}");
    // Its Cargo.toml is the workspace's, every member in it.
    let cargo_toml = Command::new("tar")
        .args(["xzf"])
        .arg(sdist)
        .args(["-O", &format!("{top}Cargo.toml")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&cargo_toml.stdout),
        std::fs::read_to_string(copy.clone.join("Cargo.toml")).unwrap()
    );

    // Alone: pip unpacks it into a directory of its own and builds there.
    let alone = venv.root.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    let moved = alone.join(sdist.file_name().unwrap());
    std::fs::rename(sdist, &moved).unwrap();
    let mut cmd = venv.build_command("python");
    cmd.args(["-m", "pip", "install", "--quiet", "pytest"])
        .arg(&moved);
    venv.build("pip install cudaleak-VERSION.tar.gz", cmd);
    assert_route_works("sdist + pip install", &venv, &venv.dir().join("bin"), &venv.dir());
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_uv_pip_install_of_a_clone() {
    let copy = clean_copy();
    wheel_built_from_the_clone();
    let venv = Venv::new("route-uv");
    let mut cmd = venv.build_command(on_path("uv").to_str().unwrap());
    cmd.args([
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--no-index",
        "--find-links",
    ])
    .arg(wheelhouse())
    .arg("--python")
    .arg(venv.bin("python"))
    .arg("pytest")
    .arg(&copy.clone)
    .env("UV_CACHE_DIR", venv.root.path().join("uv-cache"));
    venv.build("uv pip install ./clone", cmd);
    assert_route_works(
        "uv pip install ./clone",
        &venv,
        &venv.dir().join("bin"),
        &venv.dir(),
    );
}

/// SUITE_PY as one's own tests would load the runtime: by its name, from
/// `run --simulated`'s driver.
fn suite_loading_the_runtime_by_name() -> String {
    SUITE_PY.replace("os.environ[\"SIMCUDA_RUNTIME\"]", "\"libcudart.so.12\"")
}

/// `cudaleak run --simulated --fail-on-leak -- pytest ...`, the command
/// from elsewhere (pipx's bin/) and pytest the venv's own: its exit status
/// and output.
fn own_pytest_under(venv: &Venv, cudaleak: &Path, args: &[&str]) -> (Option<i32>, String) {
    venv.write("test_mine.py", &suite_loading_the_runtime_by_name());
    let mut cmd = venv.command(cudaleak.to_str().unwrap());
    cmd.args(["run", "--simulated", "--fail-on-leak", "--", "pytest"])
        .args(["-q", "-rf", "-p", "no:cacheprovider"])
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMCUDA_RUNTIME");
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(300));
    (status.code(), format!("{stdout}\n{stderr}"))
}

/// The leaking test of test_mine.py failed at its line, the other passed.
fn assert_leak_found(route: &str, code: Option<i32>, out: &str) {
    let line = line_in(SUITE_PY, "# LEAK");
    assert_eq!(code, Some(1), "{route}\n{out}");
    assert!(out.contains("1 failed, 1 passed"), "{route}\n{out}");
    assert!(out.contains("FAILED test_mine.py::test_leaks"), "{route}\n{out}");
    assert!(
        out.contains(&format!("test_mine.py:{line} in test_leaks")),
        "{route}\n{out}"
    );
}

/// pipx keeps the package in a venv of its own: `cudaleak run` gives the
/// command's Python that package (and nothing else of pipx's venv) and
/// loads the plugin into the user's own pytest, once, also when the user's
/// environment has cudaleak installed as well (its entry point loads it).
#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn route_pipx_install_of_a_clone() {
    let copy = clean_copy();
    let (_, wheel) = wheel_built_from_the_clone();
    let venv = Venv::new("route-pipx");
    let pipx_home = venv.root.path().join("pipx");
    let pipx_bin = venv.root.path().join("pipx-bin");
    let pipx = |args: &[&str]| {
        let mut cmd = venv.build_command(on_path("pipx").to_str().unwrap());
        // pipx's classic backend, pip: with uv beside it pipx would use
        // uv, which the uv route tests already.
        cmd.args(args)
            .env("PIPX_DEFAULT_BACKEND", "pip")
            .env("PIPX_HOME", &pipx_home)
            .env("PIPX_BIN_DIR", &pipx_bin)
            .env("PIPX_MAN_DIR", venv.root.path().join("pipx-man"));
        cmd
    };
    let mut install = pipx(&["install"]);
    install.arg(&copy.clone);
    venv.build("pipx install ./clone", install);
    // pipx links the apps into its bin directory; the library is in the
    // environment pipx made for the package.
    let cudaleak = pipx_bin.join("cudaleak");
    assert!(cudaleak.exists());
    let app_venv = pipx_home.join("venvs/cudaleak");
    let (code, _, stderr) = venv.run(cudaleak.to_str().unwrap(), &["--version"]);
    assert_eq!(code, Some(0), "{stderr}");
    let route = "pipx install ./clone";
    let lib = assert_command_works(route, &venv, &cudaleak, &app_venv);

    // The user's own environment has pytest, and no cudaleak.
    venv.pip_install(&["pytest"]);
    let (code, _, stderr) = venv.run("python", &["-c", "import cudaleak"]);
    assert_eq!(code, Some(1), "cudaleak is in the user's venv already: {stderr}");

    // Under `run`, the user's Python imports pipx's package, with the
    // library that run preloaded, and no path of pipx's venv.
    let probe = "import cudaleak, sys\n\
                 print(cudaleak.available(), cudaleak.library_path())\n\
                 print([p for p in sys.path if p.startswith(tuple(sys.argv[1:]))])";
    let app_venv_real = app_venv.canonicalize().unwrap();
    let (code, stdout, stderr) = venv.run(
        cudaleak.to_str().unwrap(),
        &[
            "run",
            "--",
            "python",
            "-c",
            probe,
            app_venv.to_str().unwrap(),
            app_venv_real.to_str().unwrap(),
        ],
    );
    assert_eq!(
        code,
        Some(0),
        "{route}: import cudaleak under run\n{stdout}\n{stderr}"
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [format!("True {}", lib.display()).as_str(), "[]"],
        "{route}: {stderr}"
    );

    // The user's own pytest, plugin loaded by `run`: a leaking test and a
    // clean one, then the clean one alone.
    let (code, out) = own_pytest_under(&venv, &cudaleak, &["--cuda-leaks", "test_mine.py"]);
    assert_leak_found(route, code, &out);
    let (code, out) = own_pytest_under(
        &venv,
        &cudaleak,
        &["--cuda-leaks", "test_mine.py::test_frees_what_it_allocates"],
    );
    assert_eq!(code, Some(0), "{route}\n{out}");
    assert!(out.contains("1 passed"), "{route}\n{out}");

    // cudaleak in the user's venv as well: its pytest11 entry point loads
    // the plugin, and run's PYTEST_PLUGINS finds it loaded under the same
    // name (pluggy would refuse a second registration, and a second copy
    // would add --cuda-leaks twice); so does an explicit -p.
    venv.pip_install(&[wheel.to_str().unwrap()]);
    for first in [&[][..], &["-p", "cudaleak.pytest_plugin"][..]] {
        let mut args = first.to_vec();
        args.extend(["--trace-config", "--cuda-leaks", "test_mine.py"]);
        let (code, out) = own_pytest_under(&venv, &cudaleak, &args);
        let route = format!("{route}, cudaleak installed in the user's venv too, {first:?}");
        assert_leak_found(&route, code, &out);
        assert_eq!(
            out.matches("PLUGIN registered: <module 'cudaleak.pytest_plugin'")
                .count(),
            1,
            "{route}\n{out}"
        );
    }
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn without_rust_the_build_stops_at_once_with_one_line() {
    let copy = clean_copy();
    let venv = Venv::new("route-no-rust");
    for (what, args) in [
        ("pip install", &["install", "--quiet"][..]),
        (
            "pip wheel",
            &["wheel", "--quiet", "--no-deps", "--wheel-dir", "wheels"][..],
        ),
    ] {
        let mut cmd = venv.build_command("python");
        // Nothing of Rust on PATH (nor in HOME, a fresh one), no CARGO.
        cmd.env("PATH", venv.dir().join("bin"))
            .env_remove("CARGO")
            .args(["-m", "pip"])
            .args(args)
            .arg(&copy.clone);
        let start = std::time::Instant::now();
        let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(300));
        let took = start.elapsed();
        assert!(!status.success(), "{what}: {stdout}\n{stderr}");
        let lines: Vec<&str> = stdout
            .lines()
            .chain(stderr.lines())
            .map(str::trim)
            .filter(|l| l.starts_with("cudaleak: "))
            .collect();
        assert_eq!(lines.len(), 1, "{what}:\n{stdout}\n{stderr}");
        assert!(
            lines[0].starts_with("cudaleak: building from source needs Rust 1.88 or newer")
                && lines[0].contains("cargo is not on PATH")
                && lines[0].contains("https://rustup.rs"),
            "{}",
            lines[0]
        );
        // At once: before anything is compiled.
        assert!(took < Duration::from_secs(120), "{what} took {took:?}");
    }
    // Never half a package: nothing installed, no wheel.
    assert!(!venv.bin("cudaleak").exists());
    let (code, _, _) = venv.run("python", &["-c", "import cudaleak"]);
    assert_ne!(code, Some(0), "cudaleak is importable");
    assert!(
        !venv.work().join("wheels").exists()
            || std::fs::read_dir(venv.work().join("wheels"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
#[ignore = "builds from a clean clone: scripts/test.sh runs these"]
fn the_backend_asks_for_zig_only_when_told() {
    // Through `build`'s frontend, as any PEP 517 frontend calls it.
    let copy = clean_copy();
    let venv = installed();
    let probe = "\
import build, json, sys
b = build.ProjectBuilder(sys.argv[1])
print(json.dumps({k: sorted(b.get_requires_for_build('wheel', s)) for k, s in
      [('default', {}), ('yes', {'zig': 'yes'}), ('no', {'zig': 'no'})]}))
print(json.dumps(sorted(b.build_system_requires)))
";
    let mut cmd = venv.build_command(on_path("python3").to_str().unwrap());
    cmd.args(["-c", probe]).arg(&copy.clone);
    let out = venv.build("get_requires_for_build_wheel", cmd);
    let mut lines = out.lines();
    let requires: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let system: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(system, serde_json::json!(["maturin>=1.9,<2"]));
    assert_eq!(requires["default"], serde_json::json!([]));
    assert_eq!(requires["no"], serde_json::json!([]));
    // The ranges requirements-wheel.txt installs for scripts/build-wheel.sh.
    let pinned = std::fs::read_to_string(support::repo().join("requirements-wheel.txt")).unwrap();
    let yes: Vec<&str> = requires["yes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(yes.len(), 2, "{yes:?}");
    for r in yes {
        assert!(
            pinned.lines().any(|l| l.trim() == r),
            "{r} is not in requirements-wheel.txt"
        );
    }
}
