//! Shared helpers for the integration tests: building the planted-leak C
//! programs against the simulated CUDA driver, running them the way users
//! do (LD_PRELOAD=libcudaleak.so), and reading and checking reports.
#![allow(dead_code)]

use cudaleak_core::report::{Group, Report};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo put this test binary's parent directory.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// libcudaleak.so from `cargo build` of the same profile (cargo test does
/// not build cdylibs: the README's test command builds it first), or the
/// one CUDALEAK_TEST_LIBRARY names: scripts/test.sh runs the suites again
/// on the wheel's zig-linked library, the one users get.
pub fn lib() -> PathBuf {
    let p = std::env::var_os("CUDALEAK_TEST_LIBRARY")
        .map(|p| repo().join(p))
        .unwrap_or_else(|| target_dir().join("libcudaleak.so"));
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --release` before `cargo test --release` (scripts/test.sh does both)",
        p.display()
    );
    p
}

pub fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cudaleak"))
}

/// The simulated driver and runtime that build.rs made for this test
/// binary, or the ones CUDALEAK_TEST_SIM_DIR names (another target's, for
/// [`emulator`] runs).
pub fn sim_dir() -> PathBuf {
    std::env::var_os("CUDALEAK_TEST_SIM_DIR")
        .map(|p| repo().join(p))
        .unwrap_or_else(|| PathBuf::from(env!("CUDALEAK_SIM_DIR")))
}

/// The simulated runtime and driver, as arguments that link a test
/// program against them.
pub fn sim_link_args() -> [String; 2] {
    let sim = sim_dir();
    [
        sim.join("libcudart.so.12").display().to_string(),
        sim.join("libcuda.so.1").display().to_string(),
    ]
}

/// The command that runs the traced programs, when they are built for
/// another architecture: CUDALEAK_TEST_EMULATOR, split at spaces (as
/// cargo's runners are), e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`.
/// With it, CUDALEAK_TEST_CC builds the programs, CUDALEAK_TEST_LIBRARY and
/// CUDALEAK_TEST_SIM_DIR are that architecture's, and the loader's
/// variables go to the emulated program only (scripts/aarch64-check.sh).
pub fn emulator() -> Option<Vec<String>> {
    let words: Vec<String> = std::env::var("CUDALEAK_TEST_EMULATOR")
        .ok()?
        .split_whitespace()
        .map(String::from)
        .collect();
    (!words.is_empty()).then_some(words)
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

fn newer(out: &Path, inputs: &[PathBuf]) -> bool {
    let Ok(built) = std::fs::metadata(out).and_then(|m| m.modified()) else {
        return false;
    };
    inputs.iter().all(|i| {
        std::fs::metadata(i)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t <= built)
    })
}

/// Compiles `sources` (paths relative to the repository) into
/// target/<profile>/cudaleak-tests/<name>, once.
pub fn build(name: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    let _g = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Programs for an emulated architecture in a folder of their own.
    let dir = match emulator() {
        Some(e) => target_dir().join(format!(
            "cudaleak-tests-{}",
            e[0].rsplit('/').next().unwrap_or("emulated")
        )),
        None => target_dir().join("cudaleak-tests"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let mut inputs: Vec<PathBuf> = sources.iter().map(|s| repo().join(s)).collect();
    // Every header the programs share: a change to one rebuilds them.
    inputs.extend(
        std::fs::read_dir(repo().join("tests/c"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "h")),
    );
    inputs.push(sim_dir().join("libcudart.so.12"));
    if newer(&out, &inputs) {
        return out;
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    // CUDALEAK_TEST_CC: a compiler for the programs alone (a cross
    // compiler for [`emulator`] runs), where CC would also reach the
    // build scripts of the test binary's own dependencies.
    let compiler = ["CUDALEAK_TEST_CC", "CC"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|c| !c.is_empty()))
        .unwrap_or_else(|| "cc".into());
    let mut cmd = Command::new(compiler);
    cmd.args(["-O0", "-g", "-Wall"])
        .arg(format!("-I{}", repo().join("sim/include").display()))
        .arg(format!("-I{}", repo().join("tests/c").display()))
        .arg("-o")
        .arg(&tmp);
    for s in sources {
        cmd.arg(repo().join(s));
    }
    cmd.args(flags);
    cmd.arg(format!("-Wl,-rpath,{}:{}", sim_dir().display(), dir.display()));
    let st = cmd.status().expect("run the C compiler");
    assert!(st.success(), "building {name} failed");
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// A test program linked against the simulated libcudart.so.12 and
/// libcuda.so.1 (direct binding), as most CUDA programs are.
pub fn program(name: &str) -> PathBuf {
    program_variant(name, name, &[])
}

/// tests/c/SOURCE.c built as [`program`] builds it, with `defines`
/// (`-DPLANTED`), under the name `name`: a second build of one program.
pub fn program_variant(name: &str, source: &str, defines: &[&str]) -> PathBuf {
    let src = format!("tests/c/{source}.c");
    let sim = sim_dir();
    let (runtime, driver) = (
        sim.join("libcudart.so.12").display().to_string(),
        sim.join("libcuda.so.1").display().to_string(),
    );
    let mut flags: Vec<&str> = defines.to_vec();
    flags.extend([runtime.as_str(), driver.as_str(), "-lpthread", "-ldl"]);
    build(name, &[&src], &flags)
}

/// tests/c/versioned.c linked with the simulated runtime's static object
/// (as nvcc links cudart by default) and the driver: the CUDA 2.0, 4.0 and
/// 7.0 entry points a static runtime reaches.
pub fn versioned_program() -> PathBuf {
    let sim = sim_dir();
    build(
        "versioned",
        &["tests/c/versioned.c"],
        &[
            &sim.join("cudart_static.o").display().to_string(),
            &sim.join("libcuda.so.1").display().to_string(),
            "-ldl",
            "-lpthread",
        ],
    )
}

/// tests/c/torch_cache.cc: allocations through functions named as
/// PyTorch's caching allocator's, on the simulated runtime.
pub fn torch_cache_program() -> PathBuf {
    let sim = sim_dir();
    build(
        "torch_cache",
        &["tests/c/torch_cache.cc"],
        &[
            "-fno-exceptions",
            "-fno-rtti",
            &sim.join("libcudart.so.12").display().to_string(),
            &sim.join("libcuda.so.1").display().to_string(),
        ],
    )
}

/// tests/c/py_helper.c as a shared library the Python test scripts load
/// (CUDALEAK_PY_HELPER), linked against the simulated runtime.
pub fn py_helper() -> PathBuf {
    let runtime = sim_dir().join("libcudart.so.12");
    build(
        "libpy_helper.so",
        &["tests/c/py_helper.c"],
        &["-shared", "-fPIC", &runtime.display().to_string(), "-lpthread"],
    )
}

/// A directory removed when dropped (kept with CUDALEAK_KEEP_TEST_DIRS=1).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("cudaleak-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("CUDALEAK_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub dir: TempDir,
}

impl Outcome {
    /// Every report in the directory, parsed, validated against the
    /// schemas, ordered by (pid, sequence).
    pub fn reports(&self) -> Vec<Report> {
        reports_in(self.dir.path())
    }

    /// The one report of the run (panics unless there is exactly one).
    pub fn report(&self) -> Report {
        let mut r = self.reports();
        assert_eq!(r.len(), 1, "expected one report; stderr:\n{}", self.stderr);
        r.pop().unwrap()
    }

    /// The stderr lines that mention `word` (a setting's name).
    pub fn stderr_lines_with(&self, word: &str) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.contains(word)).collect()
    }

    pub fn assert_success(&self) {
        assert!(
            self.status.success(),
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

pub fn reports_in(dir: &Path) -> Vec<Report> {
    let mut out: Vec<Report> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("cudaleak.") && n.ends_with(".json") && !n.ends_with(".timeline.json")
        })
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            validate(&v);
            Report::parse(&text).unwrap()
        })
        .collect();
    out.sort_by_key(|r| (r.pid, r.sequence));
    out
}

/// Spawns `cmd`. A program a test has just copied or built can be "text
/// file busy" for a moment: another test thread's fork inherited the
/// writing descriptor until its exec closed it (a known race of every
/// threaded test harness, rust-lang/rust#114554). Retried, briefly.
pub fn spawn_when_not_busy(cmd: &mut Command) -> std::process::Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r.expect("spawn"),
        }
    }
}

/// Runs `cmd` with a deadline; kills it and fails the test past it.
pub fn run_command(mut cmd: Command, deadline: Duration) -> (ExitStatus, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = spawn_when_not_busy(&mut cmd);
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {deadline:?} (hang?)\nstderr:\n{}",
                t_err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (status, t_out.join().unwrap(), t_err.join().unwrap())
}

/// `program` under the library (without it when `preload` is false), its
/// reports (and working directory) in a fresh directory.
pub fn traced_command(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    preload: bool,
) -> (Command, TempDir) {
    let dir = TempDir::new(program.file_name().unwrap().to_str().unwrap());
    let emulator = emulator();
    let mut cmd = match &emulator {
        Some(e) => {
            let mut cmd = Command::new(&e[0]);
            cmd.args(&e[1..]);
            cmd
        }
        None => Command::new(program),
    };
    // Start as from a terminal: a test suite run in the background (`cmd &`
    // in a non-interactive shell, nohup) passes SIGINT and SIGQUIT ignored
    // to its children, and the library rightly leaves an ignored SIGINT
    // alone, so the SIGINT tests then timed out.
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            for sig in [
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGHUP,
            ] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let mut loader_env = vec![("LD_LIBRARY_PATH".to_string(), sim_dir().display().to_string())];
    if preload {
        loader_env.push(("LD_PRELOAD".to_string(), lib().display().to_string()));
    }
    for (k, v) in env.iter().filter(|(k, _)| k.starts_with("LD_")) {
        loader_env.retain(|(name, _)| name != k);
        loader_env.push((k.to_string(), v.to_string()));
    }
    if emulator.is_some() {
        // The emulator is a program of this machine: the loader's
        // variables are set for the emulated program only (`-E`).
        for (k, v) in &loader_env {
            cmd.arg("-E").arg(format!("{k}={v}"));
        }
        cmd.arg(program)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH");
    } else {
        cmd.env_remove("LD_PRELOAD")
            .envs(loader_env.iter().map(|(k, v)| (k, v)));
    }
    cmd.args(args)
        .env("CUDALEAK_DIR", dir.path())
        .env_remove("CUDALEAK_SUPPRESSIONS")
        .env_remove("CUDALEAK_EXITCODE")
        .current_dir(dir.path());
    for (k, v) in env.iter().filter(|(k, _)| !k.starts_with("LD_")) {
        cmd.env(k, v);
    }
    (cmd, dir)
}

/// Runs a program under the library with a fresh report directory.
/// `cudaleak run --fail-on-leak --dir REPORTS` of a shell that starts
/// tests/c/live.c (`wait`), waits until it is ready and sends it `signal`
/// (`-TERM`, `-9`): how a job killed mid-run meets the gate. Its status and
/// stderr.
pub fn gate_of_a_killed_program(reports: &Path, signal: &str, cwd: &Path) -> (ExitStatus, String) {
    let live = program("live").display().to_string();
    let script = format!(
        r#""$0" wait > out & p=$!
        until grep -q ready out; do sleep 0.05; done
        kill {signal} $p; wait $p; exit 0"#
    );
    let reports = reports.display().to_string();
    let args = [
        "run",
        "--fail-on-leak",
        "--dir",
        &reports,
        "--",
        "sh",
        "-c",
        &script,
        &live,
    ];
    let (status, _, stderr) = run_command(cli_command(&args, cwd), Duration::from_secs(120));
    (status, stderr)
}

/// Runs `tests/python/SCRIPT` under the library, its CUDA calls going to
/// the simulated runtime through ctypes (and tests/c/py_helper.c), with
/// `extra` added to the environment.
pub fn run_test_python(script: &str, extra: &[(&str, &str)]) -> Outcome {
    let runtime = sim_dir().join("libcudart.so.12");
    let helper = py_helper();
    let python = std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let path = repo().join("tests/python").join(script);
    let (runtime, helper) = (runtime.display().to_string(), helper.display().to_string());
    let pythonpath = repo().join("tests/python").display().to_string();
    let mut env = vec![
        ("SIMCUDA_RUNTIME", runtime.as_str()),
        ("CUDALEAK_PY_HELPER", helper.as_str()),
        ("PYTHONPATH", pythonpath.as_str()),
        ("PYTHONDONTWRITEBYTECODE", "1"),
    ];
    env.extend_from_slice(extra);
    run_traced(Path::new(&python), &[path.to_str().unwrap()], &env)
}

pub fn run_traced(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    run_in_fresh_dir(program, args, env, true)
}

/// `program` as [`run_traced`] runs it, but without the library: the
/// reference for what the program itself shows.
pub fn run_untraced(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    run_in_fresh_dir(program, args, env, false)
}

/// Runs `program` under the library and without it, and checks that the
/// library left the program's exit status alone: (traced, untraced). The
/// callers whose programs print no addresses compare stdout too.
pub fn run_traced_and_untraced(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (Outcome, Outcome) {
    let traced = run_traced(program, args, env);
    let plain = run_untraced(program, args, env);
    assert_eq!(
        traced.status.code(),
        plain.status.code(),
        "{program:?} {args:?}: status under the library, then without it\nstderr under the library:\n{}\nstderr without it:\n{}",
        traced.stderr,
        plain.stderr
    );
    (traced, plain)
}

fn run_in_fresh_dir(program: &Path, args: &[&str], env: &[(&str, &str)], preload: bool) -> Outcome {
    let (cmd, dir) = traced_command(program, args, env, preload);
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(120));
    Outcome {
        status,
        stdout,
        stderr,
        dir,
    }
}

/// Line numbers of `marker` in a repository file, in order.
pub fn lines_of(file: &str, marker: &str) -> Vec<i64> {
    std::fs::read_to_string(repo().join(file))
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i as i64 + 1)
        .collect()
}

/// The single line holding `marker`.
pub fn line_of(file: &str, marker: &str) -> i64 {
    let l = lines_of(file, marker);
    assert_eq!(l.len(), 1, "marker {marker:?} in {file}: {l:?}");
    l[0]
}

/// The group whose innermost frame is `function` at `file`:`line`.
pub fn group_at<'a>(r: &'a Report, function: &str, file: &str, line: i64) -> &'a Group {
    r.leaks
        .iter()
        .find(|g| {
            g.native_stack.first().is_some_and(|f| {
                f.function.as_deref() == Some(function)
                    && f.line == Some(line)
                    && f.file.as_deref().is_some_and(|p| p.ends_with(file))
            })
        })
        .unwrap_or_else(|| {
            panic!(
                "no group at {function} {file}:{line}; groups:\n{}",
                r.leaks
                    .iter()
                    .map(|g| format!("  {} {} {:?}", g.api, g.bytes, g.native_stack.first()))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
}

fn read_schema(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn schema_validator(schema: &Value, path: &Path) -> jsonschema::Validator {
    jsonschema::draft202012::new(schema).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shared contract lets the project add triggers to the schema's list
/// ("wherever else the project adds triggers (see the schema's list)"):
/// the shared schema is checked with its list of triggers extended by the
/// project's ("oom"), every other field as it is.
fn with_project_triggers(mut shared: Value, ours: &Value) -> Value {
    let ours = ours["properties"]["trigger"]["enum"].as_array().unwrap();
    let list = shared["properties"]["trigger"]["enum"].as_array_mut().unwrap();
    for t in ours {
        if !list.contains(t) {
            list.push(t.clone());
        }
    }
    shared
}

/// Validates against the project's schema and, where the checkout has it,
/// the shared contract schema beside it.
pub fn validate(v: &Value) {
    let ours_path = repo().join("schema/report.schema.json");
    let ours = read_schema(&ours_path);
    let mut schemas = vec![(ours.clone(), ours_path)];
    let shared = repo().join("../shared/report.schema.json");
    if shared.is_file() {
        schemas.push((with_project_triggers(read_schema(&shared), &ours), shared));
    }
    for (schema, p) in schemas {
        let validator = schema_validator(&schema, &p);
        let errors: Vec<String> = validator
            .iter_errors(v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "report does not validate against {}:\n{}",
            p.display(),
            errors.join("\n")
        );
    }
}

/// A traced program still running, for tests that signal it.
pub struct Running {
    pub child: std::process::Child,
    pub dir: TempDir,
    lines: std::sync::mpsc::Receiver<String>,
    pub stderr: std::sync::Arc<Mutex<String>>,
}

/// Starts a program under the library with a fresh report directory (also
/// its working directory); stdout lines arrive through `wait_line`.
pub fn spawn_traced(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
    let (mut cmd, dir) = traced_command(program, args, env, true);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::sync::Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        *sink.lock().unwrap() = s;
    });
    Running {
        child,
        dir,
        lines: rx,
        stderr,
    }
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn wait_line(&self, timeout: Duration) -> String {
        self.lines.recv_timeout(timeout).unwrap_or_else(|e| {
            panic!(
                "no output line within {timeout:?}: {e}; stderr: {}",
                self.stderr.lock().unwrap()
            )
        })
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Waits until the directory holds at least `n` reports.
    pub fn wait_reports(&self, n: usize, timeout: Duration) -> Vec<Report> {
        let start = Instant::now();
        loop {
            let r = reports_in(self.dir.path());
            if r.len() >= n {
                return r;
            }
            assert!(
                start.elapsed() < timeout,
                "only {} of {n} reports after {timeout:?}",
                r.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn wait(mut self, timeout: Duration) -> (ExitStatus, TempDir, Vec<String>) {
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "did not exit within {timeout:?} (hang?); stderr: {}",
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let rest: Vec<String> = self.lines.iter().collect();
        (status, self.dir, rest)
    }
}

/// `sleep SECONDS` under the library, reporting to `dir`, once the library
/// is loaded: a process that makes no CUDA call, so it never answers a
/// dump request or consumes a planted file.
pub fn idle_traced(dir: &Path, seconds: &str) -> std::process::Child {
    let child = Command::new("sleep")
        .arg(seconds)
        .env("LD_PRELOAD", lib())
        .env("CUDALEAK_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let maps = format!("/proc/{}/maps", child.id());
    let start = Instant::now();
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libcudaleak.so")) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the library is not loaded"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// `cudaleak ARGS` run from `cwd`, outside any traced environment.
pub fn cli_command(args: &[&str], cwd: &Path) -> Command {
    let mut cmd = Command::new(cli());
    cmd.args(args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("CUDALEAK_DIR")
        .env_remove("CUDALEAK_SIGNAL")
        .env_remove("LD_PRELOAD");
    cmd
}

/// Tests that need a tool this machine may lack (Chromium, NVIDIA's
/// runtime wheel, CPython 3.13, root, ../shared) are
/// `#[ignore = "needs TOOL: ..."]`: `cargo test` reports them as ignored,
/// with the reason, never as passed. scripts/test.sh (CI) runs them with
/// `--ignored`, where a missing tool fails them: this is that failure.
pub fn required<T>(found: Option<T>, what: &str) -> T {
    found.unwrap_or_else(|| panic!("this test needs {what}, which is missing here"))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// A test program under the library with its stdin and stdout piped, for
/// programs that wait on stdin (tests/c/metrics.c's `pause` and `wait`):
/// the test reads its lines and lets it go on when it has seen what it
/// waits for, so that nothing depends on timing. Killed when dropped.
pub struct PipedProgram {
    pub child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    pub dir: TempDir,
}

impl PipedProgram {
    pub fn start(program: &Path, args: &[&str], env: &[(&str, &str)]) -> PipedProgram {
        let (mut cmd, dir) = traced_command(program, args, env, true);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        PipedProgram { child, out, dir }
    }

    /// Reads lines until one is `want`.
    pub fn wait_line(&mut self, want: &str) {
        use std::io::BufRead;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "no '{want}' line");
            if line.trim() == want {
                return;
            }
        }
    }

    /// One line on its stdin: the program goes on.
    pub fn go_on(&mut self) {
        use std::io::Write;
        self.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }

    /// Lets it go on a last time and waits for its exit.
    pub fn finish(mut self) -> ExitStatus {
        self.go_on();
        self.child.wait().unwrap()
    }
}

impl Drop for PipedProgram {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
