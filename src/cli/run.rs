//! `cudaleak run -- COMMAND`: the command and everything it starts run
//! under the library (LD_PRELOAD is inherited); afterwards, one summary
//! over every report they wrote.

use super::{find_library, CliResult, LEAK_EXIT_STATUS};
use cudaleak_core::combine;
use cudaleak_core::render;
use cudaleak_core::report::{Report, Trigger};
use cudaleak_core::suppress::Suppressions;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Exit 23 (LeakSanitizer's status) when COMMAND exits 0 but a process left unsuppressed leaks at exit
    #[arg(long)]
    fail_on_leak: bool,
    /// Report directory (CUDALEAK_DIR); default ./cudaleak-reports
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Suppressions file in LeakSanitizer's format (CUDALEAK_SUPPRESSIONS)
    #[arg(long)]
    suppressions: Option<PathBuf>,
    /// PyTorch preset: PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that the caching allocator does not keep
    /// freed tensors' memory and hide tensor-level leaks (each tensor becomes one cudaMalloc)
    #[arg(long)]
    pytorch: bool,
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
    /// The command to run
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

static CHILD: AtomicI32 = AtomicI32::new(0);

/// Signals passed on to the command (and reset to default in it).
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Passes signals sent to us (by a scheduler, `kill`) on to the command.
/// A terminal's Ctrl-C already reaches the whole process group, so only
/// signals sent by a process (SI_USER, SI_QUEUE) are forwarded.
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let child = CHILD.load(Ordering::Acquire);
    // SAFETY: reading the kernel's siginfo; kill is async-signal-safe.
    unsafe {
        let code = if info.is_null() {
            libc::SI_USER
        } else {
            (*info).si_code
        };
        if child > 0 && (code == libc::SI_USER || code == libc::SI_QUEUE || sig != libc::SIGINT) {
            libc::kill(child, sig);
        }
    }
}

fn install_forwarding() {
    for sig in FORWARDED {
        // SAFETY: installing a handler that only calls kill().
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
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
        .or_else(|| std::env::var_os("CUDALEAK_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("cudaleak-reports"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create report directory {}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;

    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    cmd.env("LD_PRELOAD", prepend_path("LD_PRELOAD", &lib));
    cmd.env("CUDALEAK_DIR", &dir);
    if let Some(s) = &a.suppressions {
        let text = std::fs::read_to_string(s)
            .map_err(|e| format!("cannot read suppressions file {}: {e}", s.display()))?;
        Suppressions::parse(&text, &s.display().to_string())?;
        cmd.env(
            "CUDALEAK_SUPPRESSIONS",
            s.canonicalize().unwrap_or_else(|_| s.clone()),
        );
    }
    if a.pytorch {
        cmd.env("PYTORCH_NO_CUDA_MEMORY_CACHING", "1");
    }
    if a.jax {
        cmd.env("XLA_PYTHON_CLIENT_PREALLOCATE", "false");
        cmd.env("XLA_PYTHON_CLIENT_ALLOCATOR", "platform");
    }
    if let Some(s) = &a.signal {
        cudaleak_core::config::parse_signal(s).map_err(|e| format!("--signal: {e}"))?;
        cmd.env("CUDALEAK_SIGNAL", s);
    }
    if let Some(i) = a.interval {
        if !(i.is_finite() && i >= 0.01) {
            return Err("--interval: expected seconds, at least 0.01".into());
        }
        cmd.env("CUDALEAK_INTERVAL", i.to_string());
    }
    if a.no_python {
        cmd.env("CUDALEAK_PYTHON", "0");
    }
    if a.no_default_suppressions {
        cmd.env("CUDALEAK_DEFAULT_SUPPRESSIONS", "0");
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

    let start = now_ms();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", a.command[0].to_string_lossy()))?;
    CHILD.store(child.id() as i32, Ordering::Release);
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

    let leaked = summarize(&dir, start)?;
    Ok(if a.fail_on_leak && code == 0 && leaked {
        LEAK_EXIT_STATUS
    } else {
        code
    })
}

/// Prints one line per process that wrote reports during this run; true
/// when an exit report has unsuppressed leaks.
fn summarize(dir: &Path, since_ms: i64) -> Result<bool, String> {
    let mut reports: Vec<(PathBuf, Report)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("cudaleak.") && name.ends_with(".json")) || name.ends_with(".timeline.json")
            {
                continue;
            }
            match Report::read(&e.path()) {
                Ok(r) if r.timestamp_ms >= since_ms => reports.push((e.path(), r)),
                Ok(_) => {}
                Err(err) => eprintln!("cudaleak: skipping {}: {err}", e.path().display()),
            }
        }
    }
    let latest = combine::latest_per_process(reports);
    if latest.is_empty() {
        eprintln!(
            "cudaleak: no process made a CUDA allocation; no reports in {}",
            dir.display()
        );
        return Ok(false);
    }
    let exits: Vec<&(PathBuf, Report)> = latest
        .iter()
        .filter(|(_, r)| r.trigger == Trigger::Exit)
        .collect();
    let leaking = exits.iter().filter(|(_, r)| !r.leaks.is_empty()).count();
    eprintln!(
        "cudaleak: {} process(es) reported in {}; {} leaked at exit",
        latest.len(),
        dir.display(),
        leaking
    );
    for (p, r) in &latest {
        let what = if r.trigger == Trigger::Exit {
            if r.leaks.is_empty() {
                "no leaks".to_string()
            } else {
                format!(
                    "{} bytes leaked in {} blocks",
                    r.leaked_bytes(),
                    r.leaked_blocks()
                )
            }
        } else {
            format!(
                "last dump: {} ({} bytes live)",
                r.trigger.name(),
                r.totals.live_bytes
            )
        };
        eprintln!(
            "  {} {}: {} ({})",
            combine::rank_label(r),
            r.command.first().map(String::as_str).unwrap_or("?"),
            what,
            p.display()
        );
    }
    let (bytes, blocks) = exits.iter().fold((0, 0), |(b, n), (_, r)| {
        (b + r.leaked_bytes(), n + r.leaked_blocks())
    });
    eprintln!("{}", render::summary_line(bytes, blocks));
    Ok(leaking > 0)
}
