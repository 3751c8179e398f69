//! `cudaleak run -- COMMAND`: the command and everything it starts run
//! under the library (LD_PRELOAD is inherited); afterwards, one summary
//! over every report they wrote.

//!
//! 1. the listening side of the run channel: `channel`
//! 2. the processes COMMAND leaves behind: `descendants`
//! 3. the summary and the gate's verdict: `verdict`
//! 4. the final figures to a Pushgateway: `push`
//! 5. the cudaleak package for the command's Python: `python`

use super::{find_library, CliResult};
use cudaleak_core::base::safe_read;
use cudaleak_core::config::var;
use cudaleak_core::report::render::escape;
use cudaleak_core::report::suppress::Suppressions;
use cudaleak_core::report::RUN_ID_ENV;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Exit 23 (LeakSanitizer's status) when COMMAND exits 0 but a process left unsuppressed leaks at exit,
    /// and 24 when a process that made CUDA calls wrote no final report (killed, disk full)
    #[arg(long)]
    fail_on_leak: bool,
    /// Report directory (CUDALEAK_DIR); default ./cudaleak-reports
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Suppressions file in LeakSanitizer's format (CUDALEAK_SUPPRESSIONS)
    #[arg(long)]
    suppressions: Option<PathBuf>,
    /// PyTorch preset: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (merged with yours), so that each
    /// tensor is one cudaMallocAsync and its line is shown, while the driver's pool keeps allocation fast
    #[arg(long)]
    pytorch: bool,
    /// PyTorch without its cache: PYTORCH_NO_CUDA_MEMORY_CACHING=1, each tensor one cudaMalloc/cudaFree
    /// (slower training steps; for PyTorch versions without the cudaMallocAsync backend)
    #[arg(long, conflicts_with = "pytorch")]
    pytorch_no_cache: bool,
    /// JAX preset: XLA_PYTHON_CLIENT_PREALLOCATE=false and XLA_PYTHON_CLIENT_ALLOCATOR=platform, so that
    /// XLA neither grabs most of the GPU up front nor pools buffers (each buffer becomes one allocation)
    #[arg(long)]
    jax: bool,
    /// Signal for live dumps (CUDALEAK_SIGNAL): a name, a number, or none
    #[arg(long)]
    signal: Option<String>,
    /// Seconds between periodic live dumps (CUDALEAK_INTERVAL)
    #[arg(long)]
    interval: Option<f64>,
    /// Turn Python stack capture off (CUDALEAK_PYTHON=0)
    #[arg(long)]
    no_python: bool,
    /// Do not apply the built-in suppressions (CUDALEAK_DEFAULT_SUPPRESSIONS=0)
    #[arg(long)]
    no_default_suppressions: bool,
    /// After COMMAND exits, wait at most this many seconds for the processes it left running that made
    /// CUDA calls or have a CUDA library loaded (daemons, workers); one still running then fails the gate (24)
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    wait_for_descendants: f64,
    /// A process left running after COMMAND exits whose name (as `ps -o comm` shows it) is NAME is not
    /// waited for and does not fail the gate; its leaks are not checked (a known long-lived CUDA daemon)
    #[arg(long, value_name = "NAME")]
    allow_running: Vec<String>,
    /// Run COMMAND on cudaleak's bundled simulated CUDA driver and runtime (libcuda.so.1,
    /// libcudart.so.12, backed by host memory), put first on LD_LIBRARY_PATH: try it without a GPU
    #[arg(long)]
    simulated: bool,
    /// Exit 25 when COMMAND exits 0 but a process's peak (its GPU memory at its highest, blocks freed
    /// since included) is over SIZE (2GiB, 1500MB); names the call sites that held the most then
    #[arg(long, value_name = "SIZE")]
    max_peak: Option<String>,
    /// Exit 25 when COMMAND exits 0 but a process's peak grew over its peak in a stored run (a report
    /// directory or file, e.g. from the main branch) beyond --peak-tolerance; processes are matched by
    /// rank, else by command line
    #[arg(long, value_name = "PATH")]
    peak_baseline: Option<PathBuf>,
    /// How much a peak may grow over --peak-baseline: a percentage (5%) or a size (64MiB); both may be
    /// given (repeat the flag), the larger allowance wins; default 5%
    #[arg(long, value_name = "TOLERANCE", requires = "peak_baseline")]
    peak_tolerance: Vec<String>,
    /// Append the budgets' verdict in Markdown to FILE (a CI job summary such as $GITHUB_STEP_SUMMARY)
    #[arg(long, value_name = "FILE")]
    summary_md: Option<PathBuf>,
    /// Write the budgets' verdict as JUnit XML to FILE: one test case per process and budget
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write each process's figures (live and peak bytes, the call sites holding the most) as a
    /// Prometheus textfile in DIR, refreshed every CUDALEAK_METRICS_INTERVAL seconds (default 5), for
    /// node_exporter's textfile collector; each file is removed when its process ends
    #[arg(long, value_name = "DIR")]
    metrics_dir: Option<PathBuf>,
    /// After COMMAND, push each process's final figures (the metrics of --metrics-dir, with its leaked
    /// bytes) to the Prometheus Pushgateway at URL (http://HOST or http://HOST:PORT), grouped by job and rank; a push
    /// that fails gives one warning and never changes the exit status
    #[arg(long, value_name = "URL")]
    pushgateway: Option<String>,
    /// Show the live view of the run's processes (cudaleak top) in this terminal while COMMAND runs;
    /// COMMAND's output goes to cudaleak-watch.RUN.log (RUN: the run's id) in the report directory, its stdin is /dev/null
    #[arg(long)]
    watch: bool,
    /// With --watch: seconds between reads of the view (0.2 to 60)
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, requires = "watch")]
    refresh: f64,
    /// The command to run
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

static CHILD: AtomicI32 = AtomicI32::new(0);
/// Write end of the pipe through which the signal handler hands the dump
/// signal to the thread that asks for dumps (-1: none).
static DUMP_SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// Signals passed on to the command (and reset to default in it).
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Signals that ask for something rather than stop the command: sent on
/// only to a child that catches them (a bash wrapper dies of SIGUSR1, rc
/// 138, and would leave the real worker running orphaned).
fn is_request_signal(sig: libc::c_int) -> bool {
    sig == libc::SIGUSR1 || sig == libc::SIGUSR2
}

/// Passes signals sent to us (by a scheduler, `kill`) on to the command.
/// A terminal's Ctrl-C already reaches the whole process group, so only
/// signals sent by a process (SI_USER, SI_QUEUE) are forwarded. SIGUSR1
/// and SIGUSR2 go to the dump thread instead (see [`ask_for_dumps`]).
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let child = CHILD.load(Ordering::Acquire);
    // SAFETY: reading the kernel's siginfo; kill and write are
    // async-signal-safe; errno is restored for the interrupted code.
    unsafe {
        let errno = *libc::__errno_location();
        let code = if info.is_null() {
            libc::SI_USER
        } else {
            (*info).si_code
        };
        let pipe = DUMP_SIGNAL_PIPE.load(Ordering::Acquire);
        if is_request_signal(sig) {
            if pipe >= 0 {
                let byte = sig as u8;
                libc::write(pipe, (&byte as *const u8).cast(), 1);
            }
        } else if child > 0 && (code == libc::SI_USER || code == libc::SI_QUEUE || sig != libc::SIGINT) {
            libc::kill(child, sig);
        }
        *libc::__errno_location() = errno;
    }
}

fn install_forwarding() {
    for sig in FORWARDED {
        // SAFETY: installing a handler that only calls kill() and write().
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A line on stderr that never panics: `run` must live to pass on the
/// command's status even when its stderr is a closed pipe.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod channel;
mod descendants;
mod push;
mod python;
mod verdict;

/// Whether `pid` has a handler for `sig` (SigCgt in /proc/PID/status).
fn catches(pid: i32, sig: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| sig >= 1 && mask & (1u64 << (sig - 1)) != 0)
}

/// The dump signal reached `cudaleak run`: every process of the run that
/// runs the library is asked for a live dump through the same request file
/// `cudaleak dump` creates, whatever its signal dispositions; the child
/// gets the signal itself only when it catches it and was not asked.
fn ask_for_dumps(dir: &Path, run_id: &str, sig: libc::c_int, dump_signal: Option<libc::c_int>) {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let mut asked = Vec::new();
    for a in verdict::active_processes(dir, run_id) {
        if Some(sig) == dump_signal && verdict::is_alive(a.pid) {
            match super::dump::request_dump(dir, a.pid, me) {
                Ok(_) => asked.push(a.pid),
                Err(e) => note!("cudaleak: cannot ask process {} for a dump: {e}", a.pid),
            }
        }
    }
    let child = CHILD.load(Ordering::Acquire);
    if child > 0 && !asked.contains(&child) && catches(child, sig) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child, sig) };
    }
}

/// Starts the thread that turns SIGUSR1/SIGUSR2 sent to us into dump
/// requests (a signal handler may not touch files).
fn start_dump_signal_thread(dir: PathBuf, run_id: String, dump_signal: Option<libc::c_int>) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let read_end = fds[0];
    let spawned = std::thread::Builder::new()
        .name("cudaleak-run-signals".into())
        .spawn(move || loop {
            let mut byte = 0u8;
            // SAFETY: reading one byte into a local.
            let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
            if n == 1 {
                ask_for_dumps(&dir, &run_id, byte as libc::c_int, dump_signal);
            } else if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        });
    if spawned.is_ok() {
        DUMP_SIGNAL_PIPE.store(fds[1], Ordering::Release);
    }
}

/// The command's status, waited for through interruptions.
fn wait_child(child: &mut std::process::Child) -> Result<std::process::ExitStatus, String> {
    loop {
        match child.wait() {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    }
}

/// `--watch`'s log of COMMAND's output, made new in the report directory
/// (never through a link, never an existing file).
fn watch_log(dir: &Path, run_id: &str) -> Result<(std::fs::File, PathBuf), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!("cudaleak-watch.{run_id}.log"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    Ok((file, path))
}

/// `--watch`: the live view of the run's processes in this terminal while
/// COMMAND runs (its output in `log`), until the user leaves it; then the
/// command's status, waited for as without the view. A view that cannot
/// start or fails is one warning: the run and its verdict go on.
fn watch(
    mut child: std::process::Child,
    log: &Path,
    command: &[OsString],
    refresh: Duration,
) -> Result<std::process::ExitStatus, String> {
    let root = child.id() as i32;
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiter = {
        let ended = ended.clone();
        std::thread::Builder::new()
            .name("cudaleak-run-wait".into())
            .spawn(move || {
                let status = wait_child(&mut child);
                ended.store(true, Ordering::Release);
                status
            })
            .map_err(|e| format!("cannot wait for the command: {e}"))?
    };
    let shown: Vec<String> = command.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let scope = super::top::Scope::Run {
        root,
        processes: Box::new(|| descendants::alive().into_iter().map(|d| d.pid).collect()),
        ended: ended.clone(),
        note: format!("its output: {}\nCOMMAND: {}", log.display(), shown.join(" ")),
    };
    if let Err(e) = super::top::interactive(scope, refresh) {
        eprintln!("cudaleak: --watch: {}", escape(&e));
    }
    if !ended.load(Ordering::Acquire) {
        eprintln!(
            "cudaleak: the view is closed; the command still runs, its output going to {}",
            escape(&log.display().to_string())
        );
    }
    let status = waiter
        .join()
        .map_err(|_| "waiting for the command: the waiting thread failed".to_string())??;
    eprintln!(
        "cudaleak: the command's output is in {}",
        escape(&log.display().to_string())
    );
    Ok(status)
}

/// A fresh id for this run, passed to every process as CUDALEAK_RUN_ID:
/// reports and markers carry it, and the summary selects by it, never by
/// timestamp (two jobs sharing a directory read each other's reports, so
/// a clean job exited 23 beside a leaky one; docs/decisions.md, "The
/// gate fails closed").
fn new_run_id() -> String {
    let mut r = [0u8; 8];
    // SAFETY: getrandom fills the buffer it is given.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    let random = if n == r.len() as isize {
        u64::from_ne_bytes(r)
    } else {
        now_ms() as u64 ^ ((std::process::id() as u64) << 32)
    };
    format!("{}-{}-{random:016x}", now_ms(), std::process::id())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The repository's python/ (target/release/../../python) or an installed
/// share/cudaleak/python: a directory holding only the package, for a
/// command whose library is in no package (`python::PythonPackage`).
fn python_package_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("../../python"), dir.join("../share/cudaleak/python")]
        .into_iter()
        .find(|p| p.join("cudaleak/__init__.py").is_file())
        .and_then(|p| p.canonicalize().ok())
}

fn prepend_path(var: &str, first: &Path) -> OsString {
    let mut v = OsString::from(first);
    if let Some(old) = std::env::var_os(var).filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

pub fn run(a: RunArgs) -> CliResult {
    let lib = find_library()?;
    let dir = a
        .dir
        .clone()
        .or_else(|| std::env::var_os(var::CUDALEAK_DIR).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("cudaleak-reports"));
    // Read and checked before anything is made: a bad budget leaves no
    // report directory behind.
    let budgets = super::budgets::Budgets::new(
        a.max_peak.as_deref(),
        a.peak_baseline.as_deref(),
        &a.peak_tolerance,
        a.summary_md.clone(),
        a.junit.clone(),
    )?;
    let pushgateway = a.pushgateway.as_deref().map(push::parse_url).transpose()?;
    let refresh = super::top::parse_refresh(a.refresh)?;
    if a.watch && !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        return Err("--watch needs a terminal (stdin and stdout)".into());
    }
    let made = missing_directories(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create report directory {}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let made: Vec<PathBuf> = made.iter().filter_map(|d| d.canonicalize().ok()).collect();
    if let Err(e) = check_writable(&dir) {
        for d in &made {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
        return Err(e);
    }

    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    cmd.env("LD_PRELOAD", prepend_path("LD_PRELOAD", &lib));
    cmd.env(var::CUDALEAK_DIR, &dir);
    let _simulated = a
        .simulated
        .then(|| super::demo::SimulatedDriver::for_command(&mut cmd))
        .transpose()?;
    if let Some(s) = &a.suppressions {
        let text = safe_read::read_regular_text(s, cudaleak_core::report::MAX_REPORT_BYTES)
            .map_err(|e| format!("cannot read suppressions file {}: {e}", s.display()))?;
        Suppressions::parse(&text, &s.display().to_string())?;
        cmd.env(
            var::CUDALEAK_SUPPRESSIONS,
            s.canonicalize().unwrap_or_else(|_| s.clone()),
        );
    }
    if a.pytorch {
        let mine = std::env::var("PYTORCH_CUDA_ALLOC_CONF").unwrap_or_default();
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", with_async_backend(&mine));
    }
    if a.pytorch_no_cache {
        cmd.env("PYTORCH_NO_CUDA_MEMORY_CACHING", "1");
    }
    if a.jax {
        cmd.env("XLA_PYTHON_CLIENT_PREALLOCATE", "false");
        cmd.env("XLA_PYTHON_CLIENT_ALLOCATOR", "platform");
    }
    // The library's dump signal (its default when CUDALEAK_SIGNAL is bad).
    let mut dump_signal = std::env::var(var::CUDALEAK_SIGNAL)
        .ok()
        .and_then(|v| cudaleak_core::config::parse_signal(&v).ok())
        .unwrap_or(cudaleak_core::config::Config::default().signal);
    if let Some(s) = &a.signal {
        dump_signal = cudaleak_core::config::parse_signal(s).map_err(|e| format!("--signal: {e}"))?;
        cmd.env(var::CUDALEAK_SIGNAL, s);
    }
    if let Some(i) = a.interval {
        if !(i.is_finite() && i >= 0.01) {
            return Err("--interval: expected seconds, at least 0.01".into());
        }
        cmd.env(var::CUDALEAK_INTERVAL, i.to_string());
    }
    // The sampled timeline is on by default under `run`; the
    // user's own CUDALEAK_TIMELINE (0 to turn it off, or a period) wins.
    if std::env::var_os(var::CUDALEAK_TIMELINE).is_none() {
        cmd.env(var::CUDALEAK_TIMELINE, "1");
    }
    if let Some(d) = &a.metrics_dir {
        let d = std::path::absolute(d).map_err(|e| format!("--metrics-dir {}: {e}", d.display()))?;
        cmd.env(var::CUDALEAK_METRICS_DIR, d);
    }
    if a.no_python {
        cmd.env(var::CUDALEAK_PYTHON, "0");
    }
    if a.no_default_suppressions {
        cmd.env(var::CUDALEAK_DEFAULT_SUPPRESSIONS, "0");
    }
    let _python = python::PythonPackage::for_command(&mut cmd, &lib, python_package_dir());
    // SAFETY: the child only resets signal dispositions before exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }

    if !(a.wait_for_descendants.is_finite() && a.wait_for_descendants >= 0.0) {
        return Err("--wait-for-descendants: expected seconds, 0 or more".into());
    }
    let run_id = new_run_id();
    cmd.env(RUN_ID_ENV, &run_id);
    let log = if a.watch {
        let (file, path) = watch_log(&dir, &run_id)?;
        let out = file.try_clone().map_err(|e| format!("{}: {e}", path.display()))?;
        cmd.stdin(std::process::Stdio::null()).stdout(out).stderr(file);
        Some(path)
    } else {
        None
    };
    let mut channel = channel::RunChannel::open();
    match channel.as_ref().map(channel::RunChannel::env) {
        Some((var, value)) => {
            cmd.env(var, value);
        }
        None => {
            cmd.env_remove(cudaleak_core::run_channel::RUN_CHANNEL_ENV);
        }
    }
    descendants::become_subreaper();
    let spawned = cmd.spawn();
    if let Some(c) = channel.as_mut() {
        c.listen();
    }
    let mut child = spawned.map_err(|e| format!("cannot run {}: {e}", a.command[0].to_string_lossy()))?;
    CHILD.store(child.id() as i32, Ordering::Release);
    let command_runs = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    descendants::reap_orphans_while(child.id() as i32, command_runs.clone());
    start_dump_signal_thread(dir.clone(), run_id.clone(), dump_signal);
    install_forwarding();
    let command_pid = child.id() as i32;
    let status = match &log {
        Some(log) => watch(child, log, &a.command, refresh)?,
        None => wait_child(&mut child)?,
    };
    command_runs.store(false, Ordering::Release);
    let code: u8 = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        _ => 1,
    };

    let allowed_name = |d: &descendants::Descendant| a.allow_running.contains(&d.name);
    let (left, waited) = descendants::wait(
        Duration::from_secs_f64(a.wait_for_descendants),
        |d| channel.as_ref().is_some_and(|c| c.told_now().pending(d.pid)),
        allowed_name,
    );
    let told = channel.map(channel::RunChannel::finish).unwrap_or_default();
    let mut allowed = BTreeSet::new();
    for d in &left {
        if allowed_name(d) {
            allowed.insert(d.pid);
        } else if !told.pending(d.pid) {
            note!(
                "cudaleak: process {} ({}) is still running after COMMAND exited; it made no CUDA allocation call, and is not waited for",
                d.pid,
                escape(&d.name)
            );
        }
    }
    let ended = verdict::Ended {
        pid: command_pid,
        signal: status.signal(),
    };
    let outcome = verdict::summarize(
        &dir,
        &verdict::Seen {
            run_id: &run_id,
            told: &told,
            ended: &ended,
            allowed: &allowed,
            waited,
        },
    );
    // Nothing reported: the directories this run made for its reports are
    // not left behind. Only empty ones go (remove_dir fails on
    // any other), innermost first.
    for d in &made {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
    }
    if let Some(t) = &pushgateway {
        let top = cudaleak_core::config::Config::from_env(|n| std::env::var(n).ok(), |_| {}).metrics_top;
        push::push(t, &outcome.finals, top);
    }
    let mut budget_failed = false;
    if budgets.any() {
        let finals: Vec<&cudaleak_core::report::Report> = outcome.finals.iter().collect();
        let checks = budgets.check(&finals);
        budget_failed = super::budgets::print_checks(&checks);
        super::budgets::write_files(&budgets, &checks);
    }
    Ok(verdict::gate_status(
        &verdict::Gate {
            fail_on_leak: a.fail_on_leak,
            budgets: budgets.any(),
            budget_failed,
        },
        code,
        &outcome,
    ))
}

/// `dir` and those of its ancestors that do not exist yet, innermost first:
/// what `create_dir_all` will make.
fn missing_directories(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d.filter(|p| !p.as_os_str().is_empty()) {
        if std::fs::symlink_metadata(p).is_ok() {
            break;
        }
        out.push(p.to_path_buf());
        d = p.parent();
    }
    out
}

/// `PYTORCH_CUDA_ALLOC_CONF` (`key:value,key:value`) with
/// `backend:cudaMallocAsync`: the user's other settings kept, in order,
/// any other backend replaced.
fn with_async_backend(conf: &str) -> String {
    let mut parts: Vec<&str> = conf
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|p| p.split(':').next().map(str::trim) != Some("backend"))
        .collect();
    parts.push("backend:cudaMallocAsync");
    parts.join(",")
}

/// Checks, before the command starts, that files can be created in the
/// report directory (a read-only, full or foreign directory
/// passed a leaking job, its reports and markers all refused). A probe
/// file with a line in it, synced, then removed.
fn check_writable(dir: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(format!(".cudaleak-probe.{}.{}", std::process::id(), now_ms()));
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&probe)
        .and_then(|mut f| {
            let written = f.write_all(b"cudaleak\n").and_then(|_| f.sync_all());
            let _ = std::fs::remove_file(&probe);
            written
        });
    result.map_err(|e| {
        format!(
            "cannot create files in the report directory {}: {e} (choose a writable one with --dir)",
            escape(&dir.display().to_string())
        )
    })
}
