//! Every way a process ends, at every moment it can end in, in the shapes
//! of job it ends in: the report must be complete and the gate's verdict
//! true, and the process must end as it would without the library.
//!
//! The ways out (tests/c/endings.c's WAY), the moments (its MOMENT: idle,
//! inside a hook, during a live dump, during an out-of-memory snapshot)
//! and the shapes (tests/python/endings_agent.py's SHAPE: a plain child,
//! Python's default `close_fds=True`, another user, a torchrun-like agent)
//! meet in cells. Each cell runs as `cudaleak run --fail-on-leak -- python3
//! endings_agent.py ... -- endings WAY MOMENT ...` and, once, without the
//! library. For each cell:
//! 1. each worker's status, as the agent (its parent) sees it, is the one
//!    it has without the library;
//! 2. either every process's final report is complete (`incomplete_shards`
//!    0, each planted leak found exactly: blocks, bytes, function and line)
//!    and the gate says 23 (the agent exits 0), or, where a process cannot
//!    write one (SIGKILL, a crash) or a report could not be finished, the
//!    gate says 24 with a line that says so (never "no process made a CUDA
//!    allocation", never an untrue SIGKILL);
//! 3. the cell ends within 15 s (past that it is killed and counted a hang).
//!
//! The racy cells run 60 times each; the message of a failure counts the
//! runs that failed, by how:
//! - inside a hook of the only allocating thread: SIGTERM, `exit(0)` in a
//!   SIGTERM handler, `_exit` in a SIGALRM handler (half the runs with a
//!   driver that sleeps 100 µs inside each allocation, half without);
//! - while three threads are inside hooks: `exit(0)`, SIGTERM;
//! - during a live dump of 100,000 blocks from distinct stacks: `exit(0)`
//!   (SIGTERM: 15 runs, each run of this moment takes seconds);
//! - during an out-of-memory snapshot: `exit(0)`, SIGTERM;
//! - a torchrun-like agent stopping its workers inside hooks (15 runs of
//!   each of two cases) and an allocating SIGALRM handler interrupting
//!   hooks (30 runs).
//!
//! The whole suite took 158 s on the 2-core development machine
//! (2026-11-28, beside other builds); it is part of `cargo test`, and its
//! two tests that act as another user run as root in `scripts/test.sh`.
//!
//! By hand, `CUDALEAK_ENDINGS_SOAK=N` runs each racy cell N times, with
//! 1,000,000 live blocks in the dump cells instead of 100,000
//! (`CUDALEAK_ENDINGS_RUNS=N` changes the number of runs alone).

mod support;

use cudaleak_core::report::Report;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::*;

const SRC: &str = "tests/c/endings.c";
const CELL_DEADLINE: Duration = Duration::from_secs(15);
const MIB: u64 = 1 << 20;

/// `CUDALEAK_ENDINGS_SOAK=N`: runs of each racy cell (else 60).
fn soak() -> Option<usize> {
    std::env::var("CUDALEAK_ENDINGS_SOAK").ok()?.parse().ok()
}

/// Runs of each racy cell: `CUDALEAK_ENDINGS_RUNS=N` (a quick look,
/// blocks unchanged), else the soak's N, else 60.
fn racy_runs() -> usize {
    std::env::var("CUDALEAK_ENDINGS_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .or_else(soak)
        .unwrap_or(60)
}

/// Live blocks, each from its own stack, in the dump cells.
fn dump_blocks() -> u64 {
    if soak().is_some() {
        1_000_000
    } else {
        100_000
    }
}

fn endings() -> PathBuf {
    program("endings")
}

/// The Python interpreter itself (CUDALEAK_TEST_PYTHON, else python3's
/// `sys.executable`): a launcher script in front of it (pyenv's shim is a
/// bash script) would double the cost of every cell.
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let python = std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
            let out = Command::new(&python)
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("run python3");
            let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if exe.is_empty() {
                python
            } else {
                exe
            }
        })
        .clone()
}

fn agent() -> String {
    repo().join("tests/python/endings_agent.py").display().to_string()
}

/// Signals a test suite started in the background inherits ignored
/// (SIGINT, SIGQUIT), and the others a cell sends, back to their default
/// actions in the process the cell starts.
fn default_signals(cmd: &mut Command) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGHUP,
                libc::SIGALRM,
            ] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

// ---------------------------------------------------------------------
// Cells

#[derive(Clone, Debug)]
struct Cell {
    way: &'static str,
    moment: &'static str,
    threads: u32,
    blocks: u64,
    delay_ms: u64,
    shape: String,
    /// Sent by the agent to the first worker, after "ready" and the delay.
    signal: &'static str,
    env: Vec<(String, String)>,
}

impl Cell {
    fn new(way: &'static str, moment: &'static str) -> Cell {
        let mut c = Cell {
            way,
            moment,
            threads: 0,
            blocks: 0,
            delay_ms: 100,
            shape: "plain".into(),
            signal: "none",
            env: Vec::new(),
        };
        match moment {
            // Each allocation sleeps inside the driver: most of the time
            // the thread is inside a hook, in the real call.
            "hook" => c = c.env("SIMCUDA_ALLOC_SLEEP_US", "100"),
            // The live dump has 100,000 distinct stacks to group; the
            // report keeps 100 groups, so that reading it stays cheap.
            "dump" => {
                c.blocks = dump_blocks();
                c.delay_ms = 200;
                c = c.env("CUDALEAK_MAX_GROUPS", "100");
            }
            // Requests of 2 GiB fail past a 1 GiB limit; 10,000 live blocks
            // make each snapshot a copy worth the name.
            "oom" => {
                c.blocks = 10_000;
                c.threads = 2;
                c = c.env("SIMCUDA_MAX_ALLOC", "1073741824");
            }
            _ => {}
        }
        if way == "term_exit" {
            c.signal = "TERM";
        }
        c
    }

    /// `wait`, ended by SIG from outside.
    fn killed(moment: &'static str, sig: &'static str) -> Cell {
        Cell::new("wait", moment).signal(sig)
    }

    fn signal(mut self, sig: &'static str) -> Cell {
        self.signal = sig;
        self
    }

    fn threads(mut self, n: u32) -> Cell {
        self.threads = n;
        self
    }

    fn delay(mut self, ms: u64) -> Cell {
        self.delay_ms = ms;
        self
    }

    fn shape(mut self, shape: &str) -> Cell {
        self.shape = shape.into();
        self
    }

    fn env(mut self, k: &str, v: &str) -> Cell {
        self.env.retain(|(name, _)| name != k);
        self.env.push((k.into(), v.into()));
        self
    }

    fn name(&self) -> String {
        let way = match (self.way, self.signal) {
            ("wait", "none") => "wait".to_string(),
            ("wait", sig) => format!("SIG{sig}"),
            (w, "none") | (w @ "term_exit", _) => w.to_string(),
            (w, sig) => format!("{w}+SIG{sig}"),
        };
        let threads = match self.moment {
            "hook" | "oom" if self.threads > 0 => format!(" ({} threads)", self.threads),
            "hook" => " (the allocating thread itself)".into(),
            _ => String::new(),
        };
        let shape = if self.shape == "plain" {
            String::new()
        } else {
            format!(" [{}]", self.shape)
        };
        format!("{way} at {}{threads}{shape}", self.moment)
    }

    /// What the untraced run's statuses depend on.
    fn key(&self) -> String {
        format!(
            "{} {} {} {} {} {:?}",
            self.way, self.moment, self.threads, self.shape, self.signal, self.env
        )
    }

    /// The agent's command line.
    fn agent_args(&self) -> Vec<String> {
        vec![
            python(),
            agent(),
            self.shape.clone(),
            self.signal.into(),
            self.delay_ms.to_string(),
            "--".into(),
            endings().display().to_string(),
            self.way.into(),
            self.moment.into(),
            self.threads.to_string(),
            self.blocks.to_string(),
            self.delay_ms.to_string(),
        ]
    }

    fn workers(&self) -> usize {
        self.shape
            .strip_prefix("torchrun:")
            .and_then(|s| s.split(':').next()?.parse().ok())
            .unwrap_or(1)
    }

    /// The way out of the first worker of a torchrun shape, when it is not
    /// the others'.
    fn first_way(&self) -> &str {
        self.shape
            .strip_prefix("torchrun:")
            .and_then(|s| s.split(':').nth(1))
            .unwrap_or(self.way)
    }
}

/// A leak the program plants: at `function`, the line holding `marker`.
#[derive(Clone, Debug)]
struct Plant {
    function: &'static str,
    marker: &'static str,
    bytes: u64,
    /// Process images whose final report must hold it (1 block each).
    images: usize,
}

fn plant(function: &'static str, marker: &'static str, bytes: u64, images: usize) -> Plant {
    Plant {
        function,
        marker,
        bytes,
        images,
    }
}

/// Groups a final report may hold besides the planted leaks: the blocks
/// in flight of threads that churn, the dump's distinct stacks, the blocks
/// an out-of-memory snapshot holds, an allocating handler's blocks.
const BACKGROUND: [&str; 4] = ["churn", "distinct_leaf", "hold", "alloc_in_handler"];

/// Whether a worker ended by `way` (and `signal`) can write a final report.
fn can_report(way: &str, signal: &str) -> bool {
    !matches!(signal, "KILL" | "SEGV")
        && !matches!(way, "abort" | "segv" | "exec_kill" | "exec_segv" | "exec_abort")
}

/// What a cell's gate run must show.
struct Expect {
    plants: Vec<Plant>,
    /// Processes that can write no final report (the gate must say 24).
    missing: usize,
}

fn expect(cell: &Cell) -> Expect {
    let workers = cell.workers();
    let mut reporting = 0;
    let mut missing = 0;
    for i in 0..workers {
        let (way, signal) = if i == 0 {
            (cell.first_way(), cell.signal)
        } else if workers > 1 {
            // The agent stops the others with SIGTERM.
            (cell.way, "TERM")
        } else {
            (cell.way, cell.signal)
        };
        if can_report(way, signal) {
            reporting += 1;
        } else {
            missing += 1;
        }
    }
    let mut plants = Vec::new();
    // The ways whose leak is made elsewhere plant none in main.
    if !(matches!(cell.way, "clean" | "linger" | "daemon") || cell.way.starts_with("exec_")) {
        plants.push(plant("plant_leak", "/* LEAK planted */", MIB, reporting));
    }
    if missing == 0 {
        match cell.way {
            "exec_exit" => plants.push(plant("plant_after_exec", "/* LEAK after exec */", 5 * MIB, 1)),
            "fork" => plants.push(plant("plant_in_child", "/* LEAK in child */", 2 * MIB, 1)),
            "daemon" => plants.push(plant("plant_in_daemon", "/* LEAK in daemon */", 2 * MIB, 1)),
            _ => {}
        }
    }
    Expect { plants, missing }
}

// ---------------------------------------------------------------------
// Running a cell

struct GateRun {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    dir: TempDir,
}

/// Runs `cmd` (its output into files of `dir`) in a process group of its
/// own; past the deadline the group is killed and the run is a hang.
fn run_bounded(
    mut cmd: Command,
    dir: &Path,
    deadline: Duration,
) -> Result<(ExitStatus, String, String), String> {
    let out = dir.join(".stdout");
    let err = dir.join(".stderr");
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0);
    default_signals(&mut cmd);
    let mut child = spawn_when_not_busy(&mut cmd);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > deadline {
            // SAFETY: the process group of the command we started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    match status {
        Some(st) => Ok((st, read(&out), read(&err))),
        None => Err(format!(
            "did not end within {deadline:?} (a hang)\nstderr:\n{}",
            tail(&read(&err))
        )),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn with_env(cmd: &mut Command, cell: &Cell) {
    for (k, v) in &cell.env {
        cmd.env(k, v);
    }
}

/// The cell under `cudaleak run --fail-on-leak`.
fn gate_run(cell: &Cell) -> Result<GateRun, String> {
    let dir = TempDir::new("endings");
    let reports = dir.path().join("reports").display().to_string();
    let mut args = vec![
        "run".to_string(),
        "--fail-on-leak".into(),
        "--dir".into(),
        reports,
        "--".into(),
    ];
    args.extend(cell.agent_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = cli_command(&args, dir.path());
    with_env(&mut cmd, cell);
    let (status, stdout, stderr) = run_bounded(cmd, dir.path(), CELL_DEADLINE)?;
    Ok(GateRun {
        status,
        stdout,
        stderr,
        dir,
    })
}

/// The agent's lines that say how its workers ended (and what they said),
/// without pids.
fn statuses(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("worker ") && !l.contains(" pid ") && !l.contains(" said linger "))
        .map(String::from)
        .collect()
}

/// The cell without the library: the statuses to compare with, once per
/// cell.
fn untraced_statuses(cell: &Cell) -> Vec<String> {
    static CACHE: Mutex<Option<HashMap<String, Vec<String>>>> = Mutex::new(None);
    if let Some(s) = CACHE
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .get(&cell.key())
    {
        return s.clone();
    }
    let dir = TempDir::new("endings-plain");
    let args = cell.agent_args();
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..])
        .current_dir(dir.path())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("CUDALEAK_DIR");
    with_env(&mut cmd, cell);
    let (status, stdout, stderr) = run_bounded(cmd, dir.path(), CELL_DEADLINE)
        .unwrap_or_else(|e| panic!("{} without the library: {e}", cell.name()));
    assert!(status.success(), "the agent failed without the library: {stderr}");
    let s = statuses(&stdout);
    assert!(
        !s.is_empty(),
        "{}: no status without the library:\n{stdout}\n{stderr}",
        cell.name()
    );
    CACHE
        .lock()
        .unwrap()
        .as_mut()
        .unwrap()
        .insert(cell.key(), s.clone());
    s
}

/// The final reports in `dir` (exit and fatal-signal triggers), parsed and
/// validated, with their file names.
fn final_reports(dir: &Path) -> Result<Vec<(String, Report)>, String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("cudaleak.")
            && (name.ends_with(".exit.json") || name.ends_with(".fatal-signal.json")))
        {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).map_err(|err| format!("{name}: {err}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|err| format!("{name}: {err}"))?;
        std::panic::catch_unwind(|| validate(&v)).map_err(|_| format!("{name} does not validate"))?;
        let report = Report::parse(&text).map_err(|err| format!("{name}: {err}"))?;
        out.push((name, report));
    }
    Ok(out)
}

/// The gate lines that say a process's report is missing or incomplete.
fn missing_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.starts_with("cudaleak: process ")
                && (l.contains("leaks are unknown") || l.contains("incomplete") || l.contains("could not"))
        })
        .collect()
}

/// How one run of a cell went: Ok(None) as it must, Ok(Some(note)) by an
/// accepted fallback (the gate said 24 because a final report was
/// incomplete, and said so), Err(what failed: the first line names the
/// kind of failure, the rest shows it).
fn check(cell: &Cell) -> Result<Option<String>, String> {
    let want_status = untraced_statuses(cell);
    let run = gate_run(cell)?;
    let got_status = statuses(&run.stdout);
    let context = || {
        format!(
            "\ngate status {:?}; agent output:\n{}\ngate stderr:\n{}",
            run.status,
            run.stdout.trim_end(),
            tail(&run.stderr)
        )
    };
    if got_status != want_status {
        return Err(format!(
            "the workers ended otherwise than without the library: {got_status:?}, not {want_status:?}{}",
            context()
        ));
    }
    if !run.status.success() && run.status.code().is_none() {
        return Err(format!(
            "the gate itself died of signal {:?}{}",
            run.status.signal(),
            context()
        ));
    }
    let gate = run.status.code().unwrap();
    if run.stderr.contains("no process made a CUDA allocation") {
        return Err(format!(
            "the gate said \"no process made a CUDA allocation\"{}",
            context()
        ));
    }
    let want = expect(cell);
    let reports_dir = run.dir.path().join("reports");
    let reports =
        final_reports(&reports_dir).map_err(|e| format!("a report could not be read: {e}{}", context()))?;
    if want.missing > 0 {
        if gate != 24 {
            return Err(format!(
                "gate {gate}, not 24: {} process(es) could write no final report{}",
                want.missing,
                context()
            ));
        }
        if missing_lines(&run.stderr).is_empty() {
            return Err(format!(
                "gate 24 without a line that names the process and why{}",
                context()
            ));
        }
        // The processes that could report did, completely.
        find_plants(&reports, &want.plants).map_err(|e| format!("{e}{}", context()))?;
        return Ok(None);
    }
    if gate == 24 {
        let lines = missing_lines(&run.stderr);
        if let Some(l) = lines.iter().find(|l| l.contains("incomplete")) {
            return Ok(Some(format!("gate 24: {l}")));
        }
        if lines.iter().any(|l| l.contains("SIGKILL")) && cell.signal != "KILL" {
            return Err(format!("gate 24 blaming a SIGKILL that no one sent{}", context()));
        }
        return Err(format!(
            "gate 24 where every process could report: {}{}",
            lines.first().copied().unwrap_or("no reason given"),
            context()
        ));
    }
    find_plants(&reports, &want.plants).map_err(|e| format!("{e}{}", context()))?;
    let want_gate = if want.plants.is_empty() { 0 } else { 23 };
    if gate != want_gate {
        return Err(format!("gate {gate}, not {want_gate}{}", context()));
    }
    Ok(None)
}

/// Checks the last final report of each process image: complete, holding
/// the planted leaks exactly and nothing but background groups.
fn find_plants(reports: &[(String, Report)], plants: &[Plant]) -> Result<(), String> {
    // The last final report of each image (an exec report is followed by
    // an exit report when the exec failed).
    let mut last: BTreeMap<(i64, String), &(String, Report)> = BTreeMap::new();
    for r in reports {
        let id = (r.1.pid, r.1.instance.clone().unwrap_or_default());
        if last.get(&id).is_none_or(|old| old.1.sequence < r.1.sequence) {
            last.insert(id, r);
        }
    }
    let lines: Vec<(Plant, i64)> = plants
        .iter()
        .map(|p| (p.clone(), line_of(SRC, p.marker)))
        .collect();
    let mut counts = vec![0usize; plants.len()];
    for (name, r) in last.values() {
        if r.incomplete_shards != 0 {
            return Err(format!(
                "incomplete final report: incomplete_shards {} in {name} ({} blocks)",
                r.incomplete_shards,
                r.leaked_blocks()
            ));
        }
        for g in &r.leaks {
            let top = g.native_stack.first();
            let function = top.and_then(|f| f.function.as_deref()).unwrap_or("");
            let line = top.and_then(|f| f.line).unwrap_or(-1);
            if let Some(i) = lines
                .iter()
                .position(|(p, l)| p.function == function && *l == line)
            {
                if (g.blocks, g.bytes) != (1, plants[i].bytes) {
                    return Err(format!(
                        "{function}: {} blocks, {} bytes in {name}, not 1 block of {}",
                        g.blocks, g.bytes, plants[i].bytes
                    ));
                }
                counts[i] += 1;
            } else if !BACKGROUND.contains(&function) {
                return Err(format!(
                    "an unexpected group in {name}: {} blocks, {} bytes at {function}:{line}",
                    g.blocks, g.bytes
                ));
            }
        }
    }
    for (i, p) in plants.iter().enumerate() {
        if counts[i] != p.images {
            let seen: Vec<String> = last
                .values()
                .map(|(n, r)| format!("{n}: {} blocks, {} bytes", r.leaked_blocks(), r.leaked_bytes()))
                .collect();
            return Err(format!(
                "the planted leak at {} (endings.c:{}) is in {} final report(s), not {}; final reports: {seen:?}",
                p.function, lines[i].1, counts[i], p.images
            ));
        }
    }
    Ok(())
}

/// Runs each cell once; fails with every cell that failed, one paragraph
/// each.
fn every(cells: &[Cell]) {
    let mut failed = Vec::new();
    let mut notes = Vec::new();
    for c in cells {
        match check(c) {
            Ok(None) => {}
            Ok(Some(note)) => notes.push(format!("{}: {note}", c.name())),
            Err(e) => failed.push(format!("{}: {e}", c.name())),
        }
    }
    for n in &notes {
        eprintln!("accepted: {n}");
    }
    assert!(
        failed.is_empty(),
        "{} of {} cells failed:\n\n{}",
        failed.len(),
        cells.len(),
        failed.join("\n\n")
    );
}

/// Runs a racy cell `runs` times (`vary` makes run i's cell) and fails
/// with the number of failed runs, by kind of failure, and the first
/// failure of each kind in full.
fn racy(name: &str, runs: usize, vary: impl Fn(usize) -> Cell) {
    if let Err(e) = racy_result(name, runs, vary) {
        panic!("{e}");
    }
}

fn racy_result(name: &str, runs: usize, vary: impl Fn(usize) -> Cell) -> Result<(), String> {
    let mut by_kind: BTreeMap<String, (Vec<usize>, String)> = BTreeMap::new();
    let mut accepted = 0;
    for i in 0..runs {
        match check(&vary(i)) {
            Ok(None) => {}
            Ok(Some(note)) => {
                accepted += 1;
                eprintln!("{name}, run {i}: accepted: {note}");
            }
            Err(e) => {
                let kind = generalize(e.lines().next().unwrap_or(""));
                by_kind
                    .entry(kind)
                    .or_insert_with(|| (Vec::new(), e.clone()))
                    .0
                    .push(i);
            }
        }
    }
    if accepted > 0 {
        eprintln!("{name}: {accepted} of {runs} runs ended by the accepted fallback");
    }
    let failed: usize = by_kind.values().map(|(r, _)| r.len()).sum();
    if failed == 0 {
        return Ok(());
    }
    Err(format!(
        "{name}: {failed} of {runs} runs failed:\n{}",
        by_kind
            .iter()
            .map(|(kind, (runs, first))| format!(
                "- {} runs ({:?}): {kind}\n  first of them in full: {first}",
                runs.len(),
                runs
            ))
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// A failure's first line with its file names and long numbers (pids,
/// times) taken out, so that runs failing the same way count together.
fn generalize(s: &str) -> String {
    s.split(' ')
        .map(|w| {
            if w.contains("cudaleak.") && w.contains(".json") {
                "REPORT".to_string()
            } else if w.chars().filter(char::is_ascii_digit).count() > 3 {
                w.chars().filter(|c| !c.is_ascii_digit()).collect::<String>() + "N"
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Hook cells alternate between a driver that sleeps 100 µs inside each
/// allocation (the signal lands in the real call) and one that does not
/// (it lands in the hook's own work before and after the call).
fn hook_run(c: Cell, i: usize) -> Cell {
    let c = c.delay(20 + (i as u64 * 37) % 200);
    if i.is_multiple_of(2) {
        c.env("SIMCUDA_ALLOC_SLEEP_US", "0")
    } else {
        c
    }
}

// ---------------------------------------------------------------------
// The matrix: ways out, once each, per moment and shape

#[test]
fn every_way_out_of_an_idle_process() {
    let ways = [
        "return",
        "exit",
        "_exit",
        "fail",
        "alarm",
        "term_exit",
        "abort",
        "segv",
        "exec",
        "exec_exit",
        "exec_kill",
        "exec_segv",
        "exec_abort",
        "cancel",
        "fork",
        "daemon",
    ];
    let mut cells: Vec<Cell> = ways.iter().map(|w| Cell::new(w, "idle")).collect();
    for sig in ["TERM", "INT", "KILL", "SEGV"] {
        cells.push(Cell::killed("idle", sig));
    }
    every(&cells);
}

#[test]
fn every_way_out_while_other_threads_are_inside_hooks() {
    let ways = [
        "return",
        "exit",
        "_exit",
        "fail",
        "alarm",
        "term_exit",
        "abort",
        "segv",
        "exec",
        "exec_exit",
        "cancel",
    ];
    let mut cells: Vec<Cell> = ways.iter().map(|w| Cell::new(w, "hook").threads(3)).collect();
    for sig in ["TERM", "INT", "KILL", "SEGV"] {
        cells.push(Cell::killed("hook", sig).threads(3));
    }
    every(&cells);
}

#[test]
fn every_way_out_of_the_only_allocating_thread_inside_a_hook() {
    // The main thread itself churns: the signals and the alarm interrupt
    // it inside a hook; the other ways come right after one.
    let ways = ["return", "exit", "_exit", "alarm", "term_exit", "abort", "segv"];
    let mut cells: Vec<Cell> = ways.iter().map(|w| Cell::new(w, "hook")).collect();
    for sig in ["TERM", "INT", "KILL", "SEGV"] {
        cells.push(Cell::killed("hook", sig));
    }
    every(&cells);
}

#[test]
fn every_way_out_during_a_live_dump() {
    let ways = ["return", "exit", "_exit", "abort"];
    let mut cells: Vec<Cell> = ways.iter().map(|w| Cell::new(w, "dump")).collect();
    for sig in ["TERM", "INT", "KILL"] {
        cells.push(Cell::killed("dump", sig));
    }
    every(&cells);
}

#[test]
fn every_way_out_during_an_out_of_memory_snapshot() {
    let ways = ["return", "exit", "_exit", "alarm", "abort"];
    let mut cells: Vec<Cell> = ways.iter().map(|w| Cell::new(w, "oom").delay(5)).collect();
    for sig in ["TERM", "INT", "KILL"] {
        cells.push(Cell::killed("oom", sig).delay(5));
    }
    every(&cells);
}

#[test]
fn a_child_started_with_close_fds_is_accounted_for() {
    // Python's subprocess closes every inherited descriptor by default:
    // the run's channel with it.
    every(&[
        Cell::new("exit", "idle").shape("close_fds"),
        Cell::new("_exit", "idle").shape("close_fds"),
        Cell::killed("idle", "KILL").shape("close_fds"),
        Cell::killed("hook", "TERM").shape("close_fds"),
        Cell::new("exec_kill", "idle").shape("close_fds"),
        Cell::new("daemon", "idle").shape("close_fds"),
    ]);
}

#[test]
#[ignore = "needs root (the worker runs as uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn a_worker_of_another_user_is_accounted_for() {
    assert!(is_root(), "this test needs root");
    // The worker cannot write into the run's report directory (root's,
    // 0755): the gate must say 24 and name the user, or have its report
    // some other way; never pass it by.
    for cell in [
        Cell::new("exit", "idle").shape("nobody"),
        Cell::killed("hook", "TERM").shape("nobody"),
    ] {
        let run = gate_run(&cell).unwrap_or_else(|e| panic!("{}: {e}", cell.name()));
        assert_eq!(statuses(&run.stdout), untraced_statuses(&cell), "{}", run.stderr);
        let gate = run.status.code();
        let named = run
            .stderr
            .lines()
            .any(|l| l.contains("65534") || l.contains("nobody"));
        assert!(
            gate == Some(24) && named || gate == Some(23),
            "{}: gate {gate:?}, not 24 naming the user (or 23 with its report)\n{}",
            cell.name(),
            run.stderr
        );
        if gate == Some(23) {
            check(&cell).unwrap_or_else(|e| panic!("{}: {e}", cell.name()));
        }
    }
}

#[test]
fn a_torchrun_like_agent_that_stops_its_workers() {
    // Three workers churn; the first one fails (exit 1) or is killed by
    // the OOM killer (SIGKILL); the agent then SIGTERMs the other two
    // inside their hooks, and would SIGKILL them after 5 s.
    let runs = racy_runs() / 4;
    let failed: Vec<String> = [
        (
            "a worker fails",
            Cell::new("wait", "hook").shape("torchrun:3:fail"),
        ),
        (
            "a worker is killed",
            Cell::killed("hook", "KILL").shape("torchrun:3"),
        ),
    ]
    .into_iter()
    .filter_map(|(name, cell)| {
        let name = format!("{name}: {}", cell.name());
        racy_result(&name, runs, |i| hook_run(cell.clone(), i)).err()
    })
    .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

// ---------------------------------------------------------------------
// The racy cells, 60 runs each

/// A SIGTERM (SLURM's, Kubernetes', torchrun's) while the only thread that
/// allocates is inside a hook: its exit report skipped every shard.
#[test]
fn sigterm_inside_a_hook_of_the_only_allocating_thread_reports_the_planted_leak() {
    racy("SIGTERM inside a hook", racy_runs(), |i| {
        hook_run(Cell::killed("hook", "TERM"), i)
    });
}

/// `exit(0)` in a SIGTERM handler that interrupted a hook: the exit report,
/// written inside the handler, also hung on a lock the interrupted call
/// held.
#[test]
fn exit_in_a_sigterm_handler_inside_a_hook_reports_the_planted_leak() {
    racy("exit(0) in a SIGTERM handler inside a hook", racy_runs(), |i| {
        hook_run(Cell::new("term_exit", "hook"), i)
    });
}

#[test]
fn _exit_in_a_sigalrm_handler_inside_a_hook_reports_the_planted_leak() {
    racy("_exit in a SIGALRM handler inside a hook", racy_runs(), |i| {
        hook_run(Cell::new("alarm", "hook"), i)
    });
}

#[test]
fn exit_while_three_threads_are_inside_hooks_reports_the_planted_leak() {
    racy("exit(0) while three threads are inside hooks", racy_runs(), |i| {
        hook_run(Cell::new("exit", "hook").threads(3), i)
    });
}

#[test]
fn sigterm_while_three_threads_are_inside_hooks_reports_the_planted_leak() {
    racy("SIGTERM while three threads are inside hooks", racy_runs(), |i| {
        hook_run(Cell::killed("hook", "TERM").threads(3), i)
    });
}

/// A quarter as many runs as the other racy cells: each run allocates
/// 100,000 blocks from distinct stacks and writes two large reports.
#[test]
fn sigterm_during_a_live_dump_keeps_the_final_report() {
    racy("SIGTERM during a live dump", racy_runs() / 4, |i| {
        Cell::killed("dump", "TERM").delay((i as u64 * 53) % 600)
    });
}

/// The way out within 20 ms of the first out-of-memory failure, whose
/// snapshot (and report, written within the second after it) is then in
/// progress.
#[test]
fn exit_during_an_out_of_memory_snapshot_reports_the_planted_leak() {
    racy("exit(0) during an out-of-memory snapshot", racy_runs(), |i| {
        Cell::new("exit", "oom").delay(i as u64 % 20)
    });
}

#[test]
fn sigterm_during_an_out_of_memory_snapshot_reports_the_planted_leak() {
    racy("SIGTERM during an out-of-memory snapshot", racy_runs(), |i| {
        Cell::killed("oom", "TERM").delay(i as u64 % 20)
    });
}

// ---------------------------------------------------------------------
// The items the matrix grew from, each where it fits the harness

const DEADLINE: Duration = Duration::from_secs(60);

/// Collects failures, to fail once with all of them.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn done(self) {
        assert!(
            self.0.is_empty(),
            "{} failed:\n\n{}",
            self.0.len(),
            self.0.join("\n\n")
        );
    }
}

/// A program frees cleanly, an exec fails, it leaks 5 MiB and crashes:
/// the exec report (no leaks) stood as final and the gate said "no
/// leaks", 0 under a launcher that exits 0.
#[test]
fn a_leak_after_a_failed_exec_then_a_crash_is_never_called_no_leaks() {
    let d = TempDir::new("endings-exec");
    let endings = endings().display().to_string();
    let mut f = Failures::default();
    for (way, code) in [
        ("exec_kill", 137),
        ("exec_segv", 139),
        ("exec_abort", 134),
        ("exec_exit", 23),
    ] {
        let reports = d.path().join(way);
        let r = reports.display().to_string();
        let (status, _, stderr) = run_command(
            cli_command(
                &["run", "--fail-on-leak", "--dir", &r, "--", &endings, way, "idle"],
                d.path(),
            ),
            DEADLINE,
        );
        f.check(status.code() == Some(code), || {
            format!("{way}: gate {:?}, not {code}\n{stderr}", status.code())
        });
        if way == "exec_exit" {
            let finals = final_reports(&reports).unwrap();
            let planted = [plant("plant_after_exec", "/* LEAK after exec */", 5 * MIB, 1)];
            let found = find_plants(&finals, &planted);
            f.check(found.is_ok(), || {
                format!("{way}: {}\n{stderr}", found.unwrap_err())
            });
        } else {
            f.check(!stderr.contains("no leaks"), || {
                format!("{way}: the gate called it clean\n{stderr}")
            });
            f.check(!missing_lines(&stderr).is_empty(), || {
                format!("{way}: no line says its final report is missing\n{stderr}")
            });
        }
    }
    f.done();
}

/// Python's subprocess closes inherited descriptors by default; when the
/// report directory then fills up, neither the channel nor a marker nor a
/// report reaches `run`, which said "no process made a CUDA allocation"
/// and exited 0. With the descriptors kept it said 24.
#[test]
fn a_worker_whose_reports_cannot_be_written_fails_the_gate_whatever_descriptors_it_kept() {
    let mut f = Failures::default();
    for shape in ["full", "full_keep_fds"] {
        let cell = Cell::new("exit", "idle").shape(shape);
        let run = match gate_run(&cell) {
            Ok(r) => r,
            Err(e) => {
                f.0.push(format!("{}: {e}", cell.name()));
                continue;
            }
        };
        f.check(statuses(&run.stdout) == untraced_statuses(&cell), || {
            format!("{}: statuses {}", cell.name(), run.stdout)
        });
        f.check(run.status.code() == Some(24), || {
            format!(
                "{}: gate {:?}, not 24\n{}",
                cell.name(),
                run.status.code(),
                run.stderr
            )
        });
        f.check(!run.stderr.contains("no process made a CUDA allocation"), || {
            format!(
                "{}: \"no process made a CUDA allocation\"\n{}",
                cell.name(),
                run.stderr
            )
        });
    }
    f.done();
}

/// 100,000 live blocks from distinct stacks, SIGUSR1, then `exit(0)` 0.2 s
/// later (every third run; the others from 0 to 0.6 s later): on a loaded
/// machine neither the live dump nor the exit report was written, and the
/// gate blamed a SIGKILL. The exit report must take over from the live
/// dump or wait for it, never vanish.
#[test]
fn exit_0_2_s_after_a_live_dump_of_many_blocks_keeps_the_exit_report() {
    racy("exit(0) during a live dump", racy_runs(), |i| {
        Cell::new("exit", "dump").delay(if i % 3 == 0 { 200 } else { (i as u64 * 53) % 600 })
    });
}

/// A cancellation pending on the thread that makes the first allocation
/// call: the library's own writes (the run marker and channel under the
/// gate, a warning under LD_PRELOAD alone) are cancellation points, and
/// the forced unwind through the hook aborted the program (status 134).
#[test]
fn a_pending_cancellation_at_the_first_allocation_call_does_not_end_the_program() {
    let mut f = Failures::default();
    let under_the_gate = check(&Cell::new("cancel", "idle"));
    f.check(under_the_gate.is_ok(), || {
        format!("under the gate: {}", under_the_gate.unwrap_err())
    });
    let env = [("CUDALEAK_SIGNAL", "bogus")];
    let plain = run_untraced(&endings(), &["cancel", "idle"], &env);
    let traced = run_traced(&endings(), &["cancel", "idle"], &env);
    f.check(
        (traced.status.code(), &traced.stdout) == (plain.status.code(), &plain.stdout),
        || {
            format!(
                "with a warning to write: {:?} {:?}, not {:?} {:?}\n{}",
                traced.status, traced.stdout, plain.status, plain.stdout, traced.stderr
            )
        },
    );
    f.done();
}

/// The same cancellation acting inside the real call (the simulated
/// driver calls pthread_testcancel in the middle of each allocation): the
/// thread unwinds through the hook as it would without it.
#[test]
fn a_cancellation_inside_the_real_call_passes_through_the_hook() {
    let cell = Cell::new("cancel", "hook")
        .threads(2)
        .env("SIMCUDA_ALLOC_SLEEP_US", "0")
        .env("SIMCUDA_ALLOC_TESTCANCEL", "1");
    every(&[cell]);
    let env = [("SIMCUDA_ALLOC_TESTCANCEL", "1")];
    let (traced, plain) = run_traced_and_untraced(&endings(), &["cancel", "hook", "2"], &env);
    assert_eq!(traced.stdout, plain.stdout, "{}", traced.stderr);
    assert!(traced.stdout.contains("cancelled 2 of 2"), "{}", traced.stdout);
}

/// A double-forked daemon that leaks 0.5 s after COMMAND returned: `run`
/// had already said "no leaks" and exited 0.
#[test]
fn a_daemon_that_allocates_after_the_command_ended_is_waited_for() {
    every(&[
        Cell::new("daemon", "idle"),
        Cell::new("daemon", "idle").shape("close_fds"),
    ]);
}

/// A descendant that never touched CUDA and outlives COMMAND (a compiler
/// cache server): named in one line, and the gate neither waits for it nor
/// fails.
#[test]
fn a_lingering_descendant_that_never_used_cuda_is_named_and_passes() {
    let cell = Cell::new("linger", "idle");
    let run = gate_run(&cell);
    let stdout = run.as_ref().map(|r| r.stdout.clone()).unwrap_or_default();
    let pid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("worker 0 said linger "))
        .and_then(|p| p.trim().parse::<i32>().ok());
    if let Some(pid) = pid {
        // SAFETY: the lingering process this test's program started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let run = run.unwrap_or_else(|e| panic!("{}: {e}", cell.name()));
    let pid = pid.unwrap_or_else(|| panic!("no pid: {stdout}"));
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    let naming: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| {
            l.split(|c: char| !c.is_ascii_digit())
                .any(|w| w == pid.to_string())
        })
        .collect();
    assert_eq!(naming.len(), 1, "one line names process {pid}:\n{}", run.stderr);
}

/// `touch D/.cudaleak-dump-request.PID` by another user made the process
/// dump: eight touches, eight reports.
#[test]
#[ignore = "needs root (it plants a request file of uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn a_dump_request_file_of_another_user_is_ignored() {
    assert!(is_root(), "this test needs root");
    let p = spawn_traced(&program("live"), &["wait"], &[]);
    assert_eq!(p.wait_line(DEADLINE), "ready");
    let request = p.dir.path().join(format!(".cudaleak-dump-request.{}", p.pid()));
    std::fs::write(&request, b"").unwrap();
    std::os::unix::fs::chown(&request, Some(65534), Some(65534)).unwrap();
    // The dumper thread looks every 200 ms.
    std::thread::sleep(Duration::from_millis(1500));
    let foreign = reports_in(p.dir.path()).len();
    let _ = std::fs::remove_file(&request);
    // The process's own user's request is honoured: the test can see one.
    std::fs::write(&request, b"").unwrap();
    let own = p.wait_reports(1, DEADLINE).len();
    let mut child = p.child;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(foreign, 0, "a request of uid 65534 made the process dump");
    assert_eq!(own, 1);
}

/// A bad CUDALEAK_SUPPRESSIONS was warned about at load, by every process
/// (three times for `bash -c 'ls; true'`): the contract says at the first
/// CUDA allocation call.
#[test]
fn a_bad_suppressions_path_is_warned_about_once_at_the_first_allocation_call() {
    let d = TempDir::new("endings-supp");
    let bad = "/nonexistent/cudaleak.supp";
    let mut f = Failures::default();
    let out = Command::new("bash")
        .args(["-c", "ls; true"])
        .current_dir(d.path())
        .env("LD_PRELOAD", lib())
        .env("CUDALEAK_DIR", d.path())
        .env("CUDALEAK_SUPPRESSIONS", bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    f.check(out.status.success() && !stderr.contains("cudaleak"), || {
        format!("bash -c 'ls; true' said:\n{stderr}")
    });
    // A CUDA program: once, after what it printed before its first call.
    let script = "import ctypes, os, sys\n\
        sys.stderr.write('before the first allocation call\\n'); sys.stderr.flush()\n\
        rt = ctypes.CDLL(os.environ['SIMCUDA_RUNTIME'])\n\
        p = ctypes.c_void_p()\n\
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(256)) == 0\n\
        assert rt.cudaFree(p) == 0\n";
    let runtime = sim_dir().join("libcudart.so.12").display().to_string();
    let out = run_traced(
        Path::new(&python()),
        &["-c", script],
        &[("CUDALEAK_SUPPRESSIONS", bad), ("SIMCUDA_RUNTIME", &runtime)],
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    let before = lines
        .iter()
        .position(|l| l.contains("before the first allocation call"));
    let warned: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("CUDALEAK_SUPPRESSIONS"))
        .collect();
    f.check(
        out.status.success() && warned.len() == 1 && before.is_some_and(|b| warned[0] > b),
        || {
            format!(
                "a CUDA program's warnings, once and after its first line:\n{}",
                out.stderr
            )
        },
    );
    // A relative path is the program's starting directory's, whatever
    // directory it allocates in.
    std::fs::write(d.path().join("rel.supp"), "leak:^leaky$\n").unwrap();
    let script = "import ctypes, os\n\
        rt = ctypes.CDLL(os.environ['SIMCUDA_RUNTIME'])\n\
        os.chdir('/')\n\
        def leaky():\n    p = ctypes.c_void_p(); assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(512)) == 0\n\
        leaky()\n";
    let mut cmd = Command::new(python());
    cmd.args(["-c", script])
        .current_dir(d.path())
        .env("LD_PRELOAD", lib())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("CUDALEAK_DIR", d.path())
        .env("CUDALEAK_SUPPRESSIONS", "rel.supp")
        .env("SIMCUDA_RUNTIME", &runtime);
    let (status, _, stderr) = run_command(cmd, DEADLINE);
    let reports = reports_in(d.path());
    f.check(
        status.success()
            && !stderr.contains("CUDALEAK_SUPPRESSIONS")
            && reports.len() == 1
            && reports[0].leaks.is_empty()
            && reports[0].suppressed.len() == 1,
        || format!("rel.supp, read after a chdir:\n{stderr}"),
    );
    f.done();
}

/// The dump handler was installed at load: Python and bash survived a
/// SIGUSR1 that ends them without the library (status 138 became 0).
#[test]
fn sigusr1_ends_a_process_that_never_called_cuda_as_it_would_without_the_library() {
    let d = TempDir::new("endings-usr1");
    let mut f = Failures::default();
    let programs: [(&str, &[&str]); 2] = [
        (
            "python3",
            &[
                "-c",
                "import os, signal; os.kill(os.getpid(), signal.SIGUSR1); import time; time.sleep(1)",
            ],
        ),
        ("bash", &["-c", "kill -USR1 $$; sleep 1"]),
    ];
    for (prog, args) in programs {
        for preload in [false, true] {
            let mut cmd = Command::new(prog);
            cmd.args(args).current_dir(d.path()).env("CUDALEAK_DIR", d.path());
            if preload {
                cmd.env("LD_PRELOAD", lib());
            } else {
                cmd.env_remove("LD_PRELOAD");
            }
            default_signals(&mut cmd);
            let (status, _, stderr) = run_command(cmd, DEADLINE);
            f.check(status.signal() == Some(libc::SIGUSR1), || {
                format!("{prog} (LD_PRELOAD: {preload}): {status:?}, not killed by SIGUSR1\n{stderr}")
            });
        }
        // Under `run` too: every process of the tree has the library.
        let reports = d.path().join("reports").display().to_string();
        let mut run_args = vec!["run", "--dir", &reports, "--", prog];
        run_args.extend_from_slice(args);
        let mut cmd = cli_command(&run_args, d.path());
        default_signals(&mut cmd);
        let (status, _, stderr) = run_command(cmd, DEADLINE);
        f.check(status.code() == Some(128 + libc::SIGUSR1), || {
            format!("cudaleak run -- {prog}: {status:?}, not 138\n{stderr}")
        });
    }
    f.done();
}

/// Once it made an allocation call, a CUDA program survives SIGUSR1 and
/// writes a live dump.
#[test]
fn a_cuda_program_survives_sigusr1_after_its_first_allocation_call_and_dumps() {
    let p = spawn_traced(&program("live"), &["wait"], &[]);
    assert_eq!(p.wait_line(DEADLINE), "ready");
    p.signal(libc::SIGUSR1);
    let r = p.wait_reports(1, DEADLINE);
    assert_eq!(r[0].trigger, cudaleak_core::report::Trigger::Signal);
    assert_eq!(r[0].leaked_bytes(), 1000);
    p.signal(libc::SIGTERM);
    let (status, _, _) = p.wait(DEADLINE);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "it lived on until SIGTERM");
}

/// The quota shim as libcuda.so.1, in a directory of its own, first on
/// LD_LIBRARY_PATH: the environment that runs programs on it.
fn quota_driver() -> Vec<(String, String)> {
    let built = build(
        "libquota-driver.so",
        &["tests/c/quota_shim.c"],
        &[
            "-shared",
            "-fPIC",
            "-DQUOTA_DRIVER",
            "-Wl,-soname,libcuda.so.1",
            "-ldl",
            "-lpthread",
        ],
    );
    let dir = target_dir().join("cudaleak-tests").join("quota-driver");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!(".libcuda.so.1.{}", std::process::id()));
    std::fs::copy(&built, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("libcuda.so.1")).unwrap();
    vec![
        (
            "LD_LIBRARY_PATH".into(),
            format!("{}:{}", dir.display(), sim_dir().display()),
        ),
        (
            "SIMCUDA_WRAPPED_DRIVER".into(),
            sim_dir().join("libcuda.so.1").display().to_string(),
        ),
        ("QUOTA_SHIM_MAX".into(), "1000".into()),
    ]
}

/// `leak_n N 0` (one clean allocation, then N leaked blocks of 100 bytes)
/// with `env`, with and without the library: status, the shim's count
/// line, and the leaked blocks the report holds.
fn quota_case(
    f: &mut Failures,
    what: &str,
    n: &str,
    env: &[(String, String)],
    traced_preload: Option<String>,
) {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let plain = run_untraced(&program("leak_n"), &[n, "0"], &pairs);
    let mut traced_env = pairs.clone();
    if let Some(p) = &traced_preload {
        traced_env.retain(|(k, _)| *k != "LD_PRELOAD");
        traced_env.push(("LD_PRELOAD", p));
    }
    let traced = run_traced(&program("leak_n"), &[n, "0"], &traced_env);
    let count = |s: &str| {
        s.lines()
            .filter(|l| l.starts_with("quota "))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    f.check(
        traced.status.code() == plain.status.code() && count(&traced.stderr) == count(&plain.stderr),
        || {
            format!(
                "{what}, leak_n {n}: status {:?} and {:?} under the library, {:?} and {:?} without\n{}",
                traced.status.code(),
                count(&traced.stderr),
                plain.status.code(),
                count(&plain.stderr),
                traced.stderr
            )
        },
    );
    // Every call the shim let through is recorded: 999 blocks of site A
    // either way (one call is the clean allocation; the 1001st is refused).
    let reports = traced.reports();
    let blocks: u64 = reports.last().map(|r| r.leaked_blocks()).unwrap_or(0);
    f.check(blocks == 999.min(n.parse::<u64>().unwrap()), || {
        format!("{what}, leak_n {n}: {blocks} leaked blocks reported")
    });
}

/// A quota shim installed as libcuda.so.1 that loads the driver
/// RTLD_GLOBAL and hands out its own cuMemAlloc_v2 through
/// cuGetProcAddress: the hooks called the driver's exported function, the
/// shim's was never called (1,001 calls without the library, 0 with it),
/// and an over-quota program that exits 3 alone exited 0.
#[test]
fn a_quota_shim_driver_sees_every_allocation_and_its_quota_holds() {
    let env = quota_driver();
    let mut f = Failures::default();
    quota_case(&mut f, "within the quota", "999", &env, None);
    quota_case(&mut f, "past the quota", "1001", &env, None);
    f.done();
}

/// Two interposers preloaded together: a quota shim on cudaMalloc before
/// cudaleak in LD_PRELOAD, and after it. Both see every call.
#[test]
fn a_quota_shim_preloaded_before_or_after_us_sees_every_allocation() {
    let shim = build(
        "libquota-preload.so",
        &["tests/c/quota_shim.c"],
        &["-shared", "-fPIC", "-DQUOTA_PRELOAD", "-ldl"],
    )
    .display()
    .to_string();
    let lib = lib().display().to_string();
    let mut f = Failures::default();
    let env = vec![
        ("LD_PRELOAD".to_string(), shim.clone()),
        ("QUOTA_SHIM_MAX".into(), "1000".into()),
        ("QUOTA_SHIM_NAME".into(), "preload".into()),
    ];
    for (what, order) in [
        ("the shim before us", format!("{shim}:{lib}")),
        ("the shim after us", format!("{lib}:{shim}")),
    ] {
        quota_case(&mut f, what, "1001", &env, Some(order.clone()));
        quota_case(&mut f, what, "999", &env, Some(order));
    }
    f.done();
}

/// A SIGALRM handler that calls cudaMalloc while the main thread loops on
/// cudaMalloc/cudaFree, so that it often interrupts a driver hook (the
/// runtime's calls are recorded at the driver), capturing the main
/// thread's stack or inside the real call: a nested hook on one thread,
/// which must record the handler's call, not pass it through as a driver
/// function calling another. The
/// process must not crash, must exit with its own status (9), and the
/// handler's 200 blocks must be recorded (with a stack or without).
#[test]
fn a_signal_handler_that_allocates_while_a_hook_captures_changes_nothing() {
    let env = [("SIMCUDA_SIGNAL_SAFE", "1")];
    let plain = run_untraced(&endings(), &["nested", "idle", "0", "200"], &env);
    assert_eq!(plain.status.code(), Some(9), "{}", plain.stderr);
    let mut f = Failures::default();
    let runs = racy_runs() / 2;
    for i in 0..runs {
        let out = run_traced(&endings(), &["nested", "idle", "0", "200"], &env);
        if out.status.code() != Some(9) {
            f.0.push(format!(
                "run {i}: status {:?}, not 9\n{}",
                out.status,
                tail(&out.stderr)
            ));
            continue;
        }
        let r = out.report();
        let handler: u64 = r
            .leaks
            .iter()
            .filter(|g| g.bytes == g.blocks * 8192)
            .map(|g| g.blocks)
            .sum();
        let planted = r.leaks.iter().filter(|g| g.bytes == MIB).count();
        f.check(handler == 200 && planted == 1, || {
            format!("run {i}: {handler} of the handler's 200 blocks, {planted} planted leak(s) reported")
        });
    }
    f.done();
}
