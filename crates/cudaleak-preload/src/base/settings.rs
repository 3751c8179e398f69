//! The process's settings and its one way to speak: the parsed
//! configuration, this process instance's token, the report directory, the
//! launcher's rank, and `warn`. Set once by the lifecycle
//! (`lifecycle::init`, and the fork child for the instance), read by every
//! floor above.
//!
//! Each value is leaked once and published through an atomic pointer: hooks
//! read them without a lock, and a value read by one thread is never freed
//! under it.

use cudaleak_core::config::Config;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, Ordering};

static CONFIG: AtomicPtr<Config> = AtomicPtr::new(std::ptr::null_mut());
static INSTANCE: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());
static REPORT_DIR: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
static REPORT_DIR_CHECKED: AtomicU32 = AtomicU32::new(0); // 0 unchecked, 1 ok, 2 unusable
/// The launcher's rank for this process; [`NO_RANK`] when it gave none.
static RANK: AtomicI64 = AtomicI64::new(NO_RANK);
const NO_RANK: i64 = i64::MIN;

/// The configuration; the defaults until the constructor installed the
/// environment's (a hook that runs before it, or a unit test).
pub fn config() -> &'static Config {
    let p = CONFIG.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: configs are leaked and never freed.
        return unsafe { &*p };
    }
    install_config(Config::default())
}

/// Installs `c` unless a configuration is installed already; returns the
/// one in force.
pub fn install_config(c: Config) -> &'static Config {
    let p = Box::into_raw(Box::new(c));
    match CONFIG.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just leaked.
        Ok(_) => unsafe { &*p },
        Err(existing) => {
            // SAFETY: p was never shared.
            drop(unsafe { Box::from_raw(p) });
            // SAFETY: configs are leaked and never freed.
            unsafe { &*existing }
        }
    }
}

/// Where the library's lines go: the descriptor of `CUDALEAK_LOG` (-1:
/// none), and fd 2 as it was when the library was loaded (its device and
/// inode; `STDERR_AT_START` false: fd 2 was not open then).
static LOG_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static STDERR_AT_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static STDERR_DEV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STDERR_INO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `(device, inode)` of what `fd` is open on.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: fstat into local storage; async-signal-safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a local `stat` that fstat writes; any `fd` is
    // allowed (a bad one fails with EBADF); async-signal-safe.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// At load, before main: what fd 2 is, and the log file of `CUDALEAK_LOG`
/// (created if missing, appended to, mode 0600, never through a link).
/// Returns the warning to give when the log cannot be opened.
pub fn open_outputs(log: Option<&Path>) -> Option<String> {
    if let Some((dev, ino)) = identity(2) {
        STDERR_DEV.store(dev, Ordering::Relaxed);
        STDERR_INO.store(ino, Ordering::Relaxed);
        STDERR_AT_START.store(true, Ordering::Release);
    }
    let path = log?;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // O_NONBLOCK: a FIFO planted at the path must not hang the program
    // before main; then only a regular file of our own is written to (a
    // file another user made there would get our lines).
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .mode(0o600)
        .open(path)
        .and_then(|f| {
            let m = f.metadata()?;
            // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
            let me = unsafe { libc::geteuid() };
            if !m.file_type().is_file() || m.uid() != me {
                return Err(std::io::Error::other("not a regular file of this user"));
            }
            Ok((f, m.dev(), m.ino()))
        });
    match opened {
        Ok((f, dev, ino)) => {
            use std::os::unix::io::IntoRawFd;
            LOG_DEV.store(dev, Ordering::Relaxed);
            LOG_INO.store(ino, Ordering::Relaxed);
            LOG_FD.store(f.into_raw_fd(), Ordering::Release);
            None
        }
        Err(e) => Some(format!(
            "cudaleak: cannot open CUDALEAK_LOG={:?}: {e}; writing to stderr",
            path.display().to_string()
        )),
    }
}

/// `(device, inode)` of the `CUDALEAK_LOG` file: its descriptor is written
/// to only while it is still that file (a program that closes every
/// descriptor and opens a data file may get its number).
static LOG_DEV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LOG_INO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The descriptor the library's lines go to now: the log file, else fd 2
/// while it is still what it was at load (a program that closed
/// fd 2 and reopened it on a data file got our summary in its data); None
/// when neither. Async-signal-safe.
fn output_fd() -> Option<i32> {
    let log = LOG_FD.load(Ordering::Acquire);
    if log >= 0 {
        let same = identity(log) == Some((LOG_DEV.load(Ordering::Relaxed), LOG_INO.load(Ordering::Relaxed)));
        return same.then_some(log);
    }
    let same = STDERR_AT_START.load(Ordering::Acquire)
        && identity(2)
            == Some((
                STDERR_DEV.load(Ordering::Relaxed),
                STDERR_INO.load(Ordering::Relaxed),
            ));
    same.then_some(2)
}

/// One line to stderr, without std's stderr lock (hooks, signals, exit).
pub fn warn(line: &str) {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    write_stderr(&buf);
}

/// Bytes to the library's output ([`output_fd`]: the `CUDALEAK_LOG` file,
/// or fd 2 while it is what it was at load), retried until written or
/// failed. Async-signal-safe. The system call itself, not libc's `write`,
/// which is a cancellation point: a pending `pthread_cancel` of the
/// program's must not act inside the library's warning.
pub fn write_stderr(mut bytes: &[u8]) {
    let Some(fd) = output_fd() else {
        return;
    };
    while !bytes.is_empty() {
        // SAFETY: writing our own buffer to our output descriptor.
        let n = unsafe {
            libc::syscall(
                libc::SYS_write,
                fd as libc::c_long,
                bytes.as_ptr() as libc::c_long,
                bytes.len() as libc::c_long,
            )
        };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// This process instance's token (report names): "0" until set.
pub fn instance() -> String {
    let p = INSTANCE.load(Ordering::Acquire);
    if p.is_null() {
        return "0".into();
    }
    // SAFETY: leaked, never freed.
    unsafe { (*p).clone() }
}

/// A new instance token (at load, and in a fork child). The previous one
/// is leaked: another thread may be reading it.
pub fn set_instance(token: String) {
    INSTANCE.store(Box::into_raw(Box::new(token)), Ordering::Release);
}

/// Where reports go, set once at load; not yet checked or created.
pub fn set_report_dir(dir: PathBuf) {
    REPORT_DIR.store(Box::into_raw(Box::new(dir)), Ordering::Release);
}

/// The report directory as configured, whether or not it can be used.
pub fn configured_report_dir() -> Option<&'static Path> {
    let p = REPORT_DIR.load(Ordering::Acquire);
    // SAFETY: leaked, never freed.
    (!p.is_null()).then(|| unsafe { (*p).as_path() })
}

/// The report directory, created on first use; None (after one clear
/// message) when it cannot be used.
pub fn report_dir() -> Option<PathBuf> {
    let dir = configured_report_dir()?;
    match REPORT_DIR_CHECKED.load(Ordering::Acquire) {
        1 => Some(dir.to_path_buf()),
        2 => None,
        _ => match cudaleak_core::writer::prepare_dir(dir) {
            Ok(()) => {
                REPORT_DIR_CHECKED.store(1, Ordering::Release);
                Some(dir.to_path_buf())
            }
            Err(e) => {
                REPORT_DIR_CHECKED.store(2, Ordering::Release);
                warn(&format!(
                    "cudaleak: cannot write reports into {}: {e}; no report will be written (set CUDALEAK_DIR to a writable directory)",
                    dir.display()
                ));
                None
            }
        },
    }
}

/// Reads the rank a distributed launcher gave this process (torchrun, MPI,
/// Slurm). Only on the program's own threads (the constructor, the first
/// allocation call, the exit reports those threads write): the dumper
/// thread must not read the environment while the program may be changing
/// it (glibc's getenv and setenv do not synchronize with each other), so
/// its dumps use the rank read last.
pub fn read_rank() {
    let rank = [
        c"RANK",
        c"OMPI_COMM_WORLD_RANK",
        c"PMI_RANK",
        c"PMIX_RANK",
        c"SLURM_PROCID",
        c"MV2_COMM_WORLD_RANK",
    ]
    .iter()
    .find_map(|v| parse_rank(env_bytes(v)?))
    .filter(|&r| r != NO_RANK);
    RANK.store(rank.unwrap_or(NO_RANK), Ordering::Release);
}

/// A variable's value, read in place: no copy, so nothing is allocated.
/// The exit report reads the rank on the thread that ends the process,
/// which may be in a signal handler that interrupted malloc (`exit(0)` in
/// a SIGTERM handler): `std::env::var` copies the value with malloc and
/// hung there under torchrun, SLURM and MPI, which set these variables.
fn env_bytes(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv reads the environment and returns a pointer into it
    // or null; the bytes are read at once (a racing setenv of the same
    // name is the program's own race, as with any getenv).
    unsafe {
        let p = libc::getenv(name.as_ptr());
        (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_bytes())
    }
}

/// A decimal integer with optional sign and surrounding blanks, as `str::
/// parse::<i64>` after `trim` took it.
fn parse_rank(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.trim().parse::<i64>().ok()
}

/// The distributed rank the launcher gave this process, if any.
pub fn rank() -> Option<i64> {
    match RANK.load(Ordering::Acquire) {
        NO_RANK => None,
        r => Some(r),
    }
}
