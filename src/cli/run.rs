//! `cudaleak run -- COMMAND`: the command and everything it starts run
//! under the library (LD_PRELOAD is inherited); afterwards, one summary
//! over every report they wrote.

use super::{find_library, CliResult, LEAK_EXIT_STATUS, MISSING_REPORT_EXIT_STATUS};
use cudaleak_core::base::safe_read;
use cudaleak_core::base::units::{count, size_exact};
use cudaleak_core::combine;
use cudaleak_core::config::var;
use cudaleak_core::report::render::{self, escape};
use cudaleak_core::report::suppress::Suppressions;
use cudaleak_core::report::{
    saturating_sum, Report, Trigger, RUN_CHANNEL_ENV, RUN_CHANNEL_FAILED, RUN_CHANNEL_FINAL,
    RUN_CHANNEL_START, RUN_ID_ENV, RUN_MARKER_PREFIX,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Run COMMAND on cudaleak's bundled simulated CUDA driver and runtime (libcuda.so.1,
    /// libcudart.so.12, backed by host memory), put first on LD_LIBRARY_PATH: try it without a GPU
    #[arg(long)]
    simulated: bool,
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
/// 138, and left the real worker running orphaned: issue 15).
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

/// The processes of this run that have made a CUDA call and have not yet
/// written their final report: their markers in the report directory.
struct Active {
    pid: i32,
    instance: String,
    marker: PathBuf,
}

fn active_processes(dir: &Path, run_id: &str) -> Vec<Active> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(RUN_MARKER_PREFIX) else {
            continue;
        };
        let Some((pid, instance)) = rest.split_once('.') else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        // Another user's file is no marker of this run (issue 23).
        if !owned_by_us(&e.path()) {
            continue;
        }
        // Markers are a line; anything else is not one of ours.
        let Ok(text) = safe_read::read_regular_text(&e.path(), 4096) else {
            continue;
        };
        if text.trim_end() == run_id {
            out.push(Active {
                pid,
                instance: instance.to_string(),
                marker: e.path(),
            });
        }
    }
    out
}

/// The dump signal reached `cudaleak run`: every process of the run that
/// runs the library is asked for a live dump through the same request file
/// `cudaleak dump` creates, whatever its signal dispositions; the child
/// gets the signal itself only when it catches it and was not asked.
fn ask_for_dumps(dir: &Path, run_id: &str, sig: libc::c_int, dump_signal: Option<libc::c_int>) {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let mut asked = Vec::new();
    for a in active_processes(dir, run_id) {
        if Some(sig) == dump_signal && is_alive(a.pid) {
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

/// A fresh id for this run, passed to every process as CUDALEAK_RUN_ID:
/// reports and markers carry it, and the summary selects by it, never by
/// timestamp (two jobs sharing a directory read each other's reports, so
/// a clean job exited 23 beside a leaky one: issue 15).
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
/// share/cudaleak/python, for `import cudaleak` in the command.
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
    // The sampled timeline is on by default under `run` (issue 13); the
    // user's own CUDALEAK_TIMELINE (0 to turn it off, or a period) wins.
    if std::env::var_os(var::CUDALEAK_TIMELINE).is_none() {
        cmd.env(var::CUDALEAK_TIMELINE, "1");
    }
    if a.no_python {
        cmd.env(var::CUDALEAK_PYTHON, "0");
    }
    if a.no_default_suppressions {
        cmd.env(var::CUDALEAK_DEFAULT_SUPPRESSIONS, "0");
    }
    if let Some(py) = python_package_dir() {
        cmd.env("PYTHONPATH", prepend_path("PYTHONPATH", &py));
    }
    // SAFETY: the child only resets signal dispositions before exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }

    let run_id = new_run_id();
    cmd.env(RUN_ID_ENV, &run_id);
    let mut channel = RunChannel::open();
    match channel.as_ref().and_then(RunChannel::env_value) {
        Some(v) => {
            cmd.env(RUN_CHANNEL_ENV, v);
        }
        None => {
            cmd.env_remove(RUN_CHANNEL_ENV);
        }
    }
    let spawned = cmd.spawn();
    if let Some(c) = channel.as_mut() {
        c.listen();
    }
    let mut child = spawned.map_err(|e| format!("cannot run {}: {e}", a.command[0].to_string_lossy()))?;
    CHILD.store(child.id() as i32, Ordering::Release);
    start_dump_signal_thread(dir.clone(), run_id.clone(), dump_signal);
    install_forwarding();
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    };
    let code: u8 = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        _ => 1,
    };

    let told = channel.map(RunChannel::finish).unwrap_or_default();
    let ended = Ended {
        pid: child.id() as i32,
        signal: status.signal(),
    };
    let outcome = summarize(&dir, &run_id, &told, &ended);
    // Nothing reported: the directories this run made for its reports are
    // not left behind (issue 22). Only empty ones go (remove_dir fails on
    // any other), innermost first.
    for d in &made {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
    }
    Ok(gate_status(a.fail_on_leak, code, &outcome))
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
/// any other backend replaced (issue 21).
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

/// What the reports of one run say.
#[derive(Debug, Default)]
struct RunOutcome {
    /// an exit report has unsuppressed leaks
    leaked: bool,
    /// processes that used CUDA and wrote no final report
    missing: usize,
    /// process images with more than one final report (issue 23)
    conflicting: usize,
}

/// `run`'s exit status (CONTRACT.md, "The gate"). With --fail-on-leak, a
/// report missing fails the run (the command's status when that is not 0,
/// else [`MISSING_REPORT_EXIT_STATUS`]) before leaks are considered: the
/// gate cannot vouch for what it did not see.
fn gate_status(fail_on_leak: bool, code: u8, outcome: &RunOutcome) -> u8 {
    if !fail_on_leak || code != 0 {
        return code;
    }
    if outcome.missing > 0 || outcome.conflicting > 0 {
        MISSING_REPORT_EXIT_STATUS
    } else if outcome.leaked {
        LEAK_EXIT_STATUS
    } else {
        0
    }
}

/// The out-of-memory reports of the run, one line each (issue 21). They
/// change nothing in the gate's status: running out of memory is the
/// program's own failure, which its status already says.
fn list_oom_reports(ooms: &mut [(PathBuf, Report)]) {
    if ooms.is_empty() {
        return;
    }
    ooms.sort_by_key(|(_, r)| (r.timestamp_ms, r.pid, r.sequence));
    note!("cudaleak: {} out of memory:", count(ooms.len() as u64, "report"));
    for (p, r) in ooms.iter() {
        let Some(o) = &r.oom else { continue };
        note!(
            "  {} {}: {} of {} failed{} (holding {} in {}; {})",
            escape(&combine::rank_label(r)),
            escape(r.command.first().map(String::as_str).unwrap_or("?")),
            escape(&o.api),
            cudaleak_core::base::units::size(o.requested_bytes),
            if o.failed_calls > 1 {
                format!(", {} calls", o.failed_calls)
            } else {
                String::new()
            },
            cudaleak_core::base::units::size(r.totals.live_bytes),
            count(r.totals.live_blocks, "block"),
            escape(&p.display().to_string())
        );
    }
}

/// Whether `path` (not followed) belongs to the user who runs the gate.
fn owned_by_us(path: &Path) -> bool {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == me)
}

/// Checks, before the command starts, that files can be created in the
/// report directory (issue 23: a read-only, full or foreign directory
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

/// What the processes of the run told it through the run channel
/// (`CUDALEAK_RUN_CHANNEL`): which started, and the name of each one's
/// final report, or that it could not be written (issue 23).
#[derive(Debug, Default)]
struct Told {
    started: BTreeSet<(i32, String)>,
    finals: BTreeMap<(i32, String), BTreeSet<String>>,
    failed: BTreeSet<(i32, String)>,
}

impl Told {
    fn take(&mut self, message: &str) {
        let mut f = message.split(' ');
        let (Some(kind), Some(pid), Some(instance)) = (f.next(), f.next(), f.next()) else {
            return;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            return;
        };
        let id = (pid, instance.to_string());
        match (kind, f.next()) {
            (RUN_CHANNEL_START, None) => {
                self.started.insert(id);
            }
            (RUN_CHANNEL_FINAL, Some(name)) if !name.contains('/') => {
                self.started.insert(id.clone());
                self.finals.entry(id).or_default().insert(name.to_string());
            }
            (RUN_CHANNEL_FAILED, None) => {
                self.started.insert(id.clone());
                self.failed.insert(id);
            }
            _ => {}
        }
    }
}

/// The run channel: a socket pair whose sending end the command's
/// processes inherit, and a thread that collects what they send.
struct RunChannel {
    receiver: libc::c_int,
    sender: libc::c_int,
    told: Arc<Mutex<Told>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunChannel {
    fn open() -> Option<RunChannel> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds has room for the two descriptors. The sending end is
        // inherited (no CLOEXEC); the receiving end stays ours.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: setting a flag on our own descriptor.
        unsafe { libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC) };
        Some(RunChannel {
            receiver: fds[0],
            sender: fds[1],
            told: Arc::default(),
            stop: Arc::default(),
            thread: None,
        })
    }

    /// `FD:DEVICE:INODE` of the sending end.
    fn env_value(&self) -> Option<String> {
        // SAFETY: `stat` is plain integers, all valid as zero.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of a descriptor we own into local storage, which
        // it fills and does not keep.
        (unsafe { libc::fstat(self.sender, &mut st) } == 0)
            .then(|| format!("{}:{}:{}", self.sender, st.st_dev, st.st_ino))
    }

    /// After the command started: our copy of the sending end goes, and
    /// the thread reads until [`RunChannel::finish`].
    fn listen(&mut self) {
        // SAFETY: closing our own descriptor, which the child inherited.
        unsafe { libc::close(self.sender) };
        self.sender = -1;
        let (fd, told, stop) = (self.receiver, self.told.clone(), self.stop.clone());
        self.thread = std::thread::Builder::new()
            .name("cudaleak-run-channel".into())
            .spawn(move || loop {
                let stopping = stop.load(Ordering::Acquire);
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: polling one descriptor of ours.
                unsafe { libc::poll(&mut pfd, 1, if stopping { 0 } else { 100 }) };
                let mut drained = true;
                loop {
                    let mut buf = [0u8; 4096];
                    // SAFETY: receiving into a local buffer.
                    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                    if n <= 0 {
                        break;
                    }
                    drained = false;
                    if let Ok(mut t) = told.lock() {
                        t.take(&String::from_utf8_lossy(&buf[..n as usize]));
                    }
                }
                if stopping && drained {
                    return;
                }
            })
            .ok();
    }

    /// Everything sent before now (the command has ended).
    fn finish(mut self) -> Told {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(self.receiver) };
        std::mem::take(&mut *self.told.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn is_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// How the command itself ended: a process of the run that is the command
/// and wrote no report is named with the signal that killed it (issue 23).
struct Ended {
    pid: i32,
    signal: Option<i32>,
}

/// `SIGSEGV` for 11.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// A report's process: pid and instance.
fn process_of(r: &Report) -> (i32, String) {
    (r.pid as i32, r.instance.clone().unwrap_or_default())
}

/// Whether `t` ends a process image's reporting (CONTRACT.md, "Marker").
fn is_final(t: Trigger) -> bool {
    !matches!(
        t,
        Trigger::Signal | Trigger::Api | Trigger::Interval | Trigger::ContextTeardown | Trigger::Oom
    )
}

/// Prints one line per process of this run (reports carrying `run_id`),
/// and one per process whose report is missing (a marker left behind, or
/// a process that told the run channel it started and then no report).
fn summarize(dir: &Path, run_id: &str, told: &Told, ended: &Ended) -> RunOutcome {
    let markers = active_processes(dir, run_id);
    let mut known: BTreeSet<(i32, String)> = told.started.clone();
    known.extend(markers.iter().map(|a| (a.pid, a.instance.clone())));
    let mut reports: Vec<(PathBuf, Report)> = Vec::new();
    let mut ooms: Vec<(PathBuf, Report)> = Vec::new();
    let mut unread = 0usize;
    let mut foreign = 0usize;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("cudaleak.") && name.ends_with(".json")) || name.ends_with(".timeline.json")
            {
                continue;
            }
            if !owned_by_us(&e.path()) {
                // Another user's file in a shared directory is never read
                // as ours (issue 23: a planted clean report passed a
                // leaking job); named when it poses as one of this run's,
                // counted in one line otherwise.
                if known
                    .iter()
                    .any(|(pid, inst)| name.contains(&format!(".{pid}.{inst}.")))
                {
                    note!(
                        "cudaleak: ignoring {}: it does not belong to the user who runs the gate",
                        escape(&e.path().display().to_string())
                    );
                } else {
                    foreign += 1;
                }
                continue;
            }
            match Report::read(&e.path()) {
                Ok(r) if r.run_id.as_deref() == Some(run_id) => {
                    if r.trigger == Trigger::Oom {
                        ooms.push((e.path(), r.clone()));
                    }
                    reports.push((e.path(), r))
                }
                Ok(_) => {}
                Err(err) => {
                    unread += 1;
                    note!(
                        "cudaleak: skipping {}: {err}",
                        escape(&e.path().display().to_string())
                    )
                }
            }
        }
    }
    let shown_dir = escape(&dir.display().to_string()).into_owned();
    if foreign > 0 {
        note!(
            "cudaleak: ignoring {} in {shown_dir} that other users own",
            count(foreign as u64, "report file")
        );
    }
    let mut outcome = RunOutcome::default();
    // Final reports per process image. Two for one image are a failure,
    // not a choice: one of them is forged or duplicated (issue 23). An
    // exec report is followed by the exit report when the exec failed.
    let mut finals: BTreeMap<(i32, String), Vec<&PathBuf>> = BTreeMap::new();
    for (p, r) in &reports {
        if is_final(r.trigger) && r.reason.as_deref() != Some("exec") {
            finals.entry(process_of(r)).or_default().push(p);
        }
    }
    let mut all_final: BTreeSet<(i32, String)> = reports
        .iter()
        .filter(|(_, r)| is_final(r.trigger))
        .map(|(_, r)| process_of(r))
        .collect();
    for ((pid, _), paths) in finals.iter().filter(|(_, p)| p.len() > 1) {
        outcome.conflicting += 1;
        let names: Vec<String> = paths
            .iter()
            .map(|p| escape(&p.display().to_string()).into_owned())
            .collect();
        note!(
            "cudaleak: process {pid} has {} final reports ({}): one is forged or duplicated; its leaks are uncertain",
            paths.len(),
            names.join(", ")
        );
    }
    // What the channel named must be what was read.
    for (id, names) in &told.finals {
        let read: BTreeSet<String> = reports
            .iter()
            .filter(|(_, r)| process_of(r) == *id && is_final(r.trigger))
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        if let Some(lost) = names.iter().find(|n| !read.contains(*n)) {
            all_final.remove(id);
            note!(
                "cudaleak: process {} wrote its final report {} but it could not be read; its leaks are unknown",
                id.0,
                escape(lost)
            );
        }
    }
    for id in &known {
        let marker = markers.iter().find(|a| a.pid == id.0 && a.instance == id.1);
        if all_final.contains(id) && !told.failed.contains(id) {
            // The process may have died between writing its final report
            // and removing its marker.
            if let Some(a) = marker {
                let _ = std::fs::remove_file(&a.marker);
            }
            continue;
        }
        outcome.missing += 1;
        let pid = id.0;
        if told.failed.contains(id) && !all_final.contains(id) {
            note!(
                "cudaleak: process {pid} made CUDA calls but could not write its final report (see its warnings); its leaks are unknown"
            );
        } else if told.finals.contains_key(id) {
            // Said above: its report could not be read.
        } else if is_alive(pid) && pid != ended.pid {
            note!(
                "cudaleak: process {pid} made CUDA calls and is still running: no exit report yet, its leaks are unknown"
            );
            continue;
        } else if let Some(sig) = ended.signal.filter(|_| pid == ended.pid) {
            note!(
                "cudaleak: process {pid} made CUDA calls but wrote no exit report: killed by {}; its leaks are unknown",
                signal_name(sig)
            );
        } else {
            note!(
                "cudaleak: process {pid} made CUDA calls but wrote no exit report (it was killed, e.g. by SIGKILL or a crash, or its report could not be written: see its warnings); its leaks are unknown"
            );
        }
        if let Some(a) = marker {
            let _ = std::fs::remove_file(&a.marker);
        }
    }
    let latest = combine::latest_per_process(reports);
    if latest.is_empty() {
        if outcome.missing == 0 && outcome.conflicting == 0 && unread == 0 {
            note!("cudaleak: no process made a CUDA allocation; no reports in {shown_dir}");
        }
        return outcome;
    }
    // The final report counts whatever its trigger: a SIGTERM's
    // fatal-signal report holds the process's leaks too (issue 23).
    let exits: Vec<&(PathBuf, Report)> = latest.iter().filter(|(_, r)| is_final(r.trigger)).collect();
    let leaking = exits.iter().filter(|(_, r)| !r.leaks.is_empty()).count();
    note!(
        "cudaleak: {} reported in {shown_dir}; {} leaked at exit",
        count(latest.len() as u64, "process"),
        leaking
    );
    for (p, r) in &latest {
        let what = if is_final(r.trigger) {
            let how = match r.trigger {
                Trigger::Exit => String::new(),
                t => format!(" ({})", t.name()),
            };
            if r.leaks.is_empty() {
                format!("no leaks{how}")
            } else {
                format!(
                    "{} leaked in {}{how}",
                    size_exact(r.leaked_bytes()),
                    count(r.leaked_blocks(), "block")
                )
            }
        } else {
            format!(
                "last dump: {} ({} live)",
                r.trigger.name(),
                size_exact(r.totals.live_bytes)
            )
        };
        note!(
            "  {} {}: {} ({})",
            escape(&combine::rank_label(r)),
            escape(r.command.first().map(String::as_str).unwrap_or("?")),
            what,
            escape(&p.display().to_string())
        );
    }
    list_oom_reports(&mut ooms);
    let bytes = saturating_sum(exits.iter().map(|(_, r)| r.leaked_bytes()));
    let blocks = saturating_sum(exits.iter().map(|(_, r)| r.leaked_blocks()));
    note!("{}", render::summary_line(bytes, blocks));
    outcome.leaked = leaking > 0;
    outcome
}
