//! The live view (`cudaleak top PID`): while a viewer's request is
//! fresh, the dumper thread publishes [`LiveView`] once a second into
//! `<report directory>/.cudaleak-view/view.<pid>.json` (a directory of
//! ours, mode 0700, its files 0600), from the same counters as the
//! metrics file: nothing is added to an allocation, the program is not
//! paused and no report is written. A request lasts [`VIEW_LEASE_MS`]; a
//! viewer renews it. At exit a view still asked for gets one last publish
//! marked `exited`, and stays for the viewer, which removes it. The view
//! of a process killed outright stays until a viewer sees it gone, or
//! until the first publish of any viewing in the same directory.

use crate::base::settings;
use crate::process::metrics;
use crate::state::tracker;
use cudaleak_core::base::lock::FutexMutex;
use cudaleak_core::live_view::{
    view_file_name, view_request_name, LiveView, VIEW_DIR, VIEW_LEASE_MS, VIEW_SITES,
};
use cudaleak_core::metrics::Labels;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_secs(1);
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

struct Viewing {
    pid: i32,
    /// publishing until then (Unix ms)
    until_ms: i64,
    next: Instant,
    previous: Option<LiveView>,
}

static VIEWING: FutexMutex<Option<Viewing>> = FutexMutex::new(None);

fn this_pid() -> i32 {
    // SAFETY: getpid takes no argument, cannot fail and touches no memory.
    unsafe { libc::getpid() }
}

/// The view directory, made if missing; None unless it is a directory of
/// this user's that no one else can enter (never through a link).
fn view_dir(report_dir: &Path) -> Option<PathBuf> {
    let dir = report_dir.join(VIEW_DIR);
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let m = std::fs::symlink_metadata(&dir).ok()?;
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    (m.is_dir() && m.uid() == me && m.mode() & 0o077 == 0).then_some(dir)
}

/// Removes the views of processes that are gone (killed before their last
/// publish, which a viewer that was not watching never saw end).
fn remove_views_of_the_dead(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| {
            n.strip_prefix("view.")?
                .strip_suffix(".json")?
                .parse::<i32>()
                .ok()
        }) else {
            continue;
        };
        // SAFETY: kill with signal 0 only asks whether the pid exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn publish(v: &mut Viewing, exited: bool) {
    let Some(dir) = settings::report_dir().and_then(|d| view_dir(&d)) else {
        return;
    };
    if v.previous.is_none() {
        remove_views_of_the_dead(&dir);
    }
    let labels = Labels {
        pid: i64::from(v.pid),
        ..Default::default()
    };
    let sample = metrics::sample(&labels, None, VIEW_SITES);
    let mut view = LiveView::of(
        &sample,
        v.previous.as_ref(),
        crate::process::dump::command_line(),
        crate::process::dump::now_ms(),
    );
    view.exited = exited;
    if let Ok(bytes) = serde_json::to_vec(&view) {
        let _ = cudaleak_core::writer::replace_file_with_mode(&dir, &view_file_name(v.pid), &bytes, 0o600);
    }
    v.previous = Some(view);
}

/// On the dumper thread, each round: takes a viewer's request
/// (`is_request` says whether the file is one this process honours), and
/// publishes when due; returns how long until the next publish.
pub fn tick(is_request: impl Fn(&Path) -> bool) -> Option<Duration> {
    let pid = this_pid();
    let request = settings::configured_report_dir().map(|d| d.join(view_request_name(pid)));
    let asked = request
        .as_deref()
        .filter(|r| is_request(r))
        .is_some_and(|r| std::fs::remove_file(r).is_ok());
    let mut guard = VIEWING.lock_for(LOCK_TIMEOUT)?;
    let now = crate::process::dump::now_ms();
    if asked {
        match guard.as_mut().filter(|v| v.pid == pid) {
            Some(v) if v.until_ms > now => v.until_ms = now + VIEW_LEASE_MS,
            // A lease that had lapsed: a new viewing, whose changes start
            // from its own first publish.
            Some(v) => {
                *v = Viewing {
                    pid,
                    until_ms: now + VIEW_LEASE_MS,
                    next: Instant::now(),
                    previous: None,
                }
            }
            None => {
                *guard = Some(Viewing {
                    pid,
                    until_ms: now + VIEW_LEASE_MS,
                    next: Instant::now(),
                    previous: None,
                })
            }
        }
    }
    let v = guard.as_mut().filter(|v| v.pid == pid && v.until_ms > now)?;
    if !tracker::saw_allocation_call() {
        return Some(EVERY);
    }
    if Instant::now() >= v.next {
        publish(v, false);
        v.next = Instant::now() + EVERY;
    }
    Some(v.next.saturating_duration_since(Instant::now()))
}

/// After the exit report: a view still asked for shows the end; one no
/// longer asked for is removed.
pub fn last_publish() {
    let Some(mut guard) = VIEWING.lock_for(LOCK_TIMEOUT) else {
        return;
    };
    let now = crate::process::dump::now_ms();
    match guard.as_mut().filter(|v| v.pid == this_pid()) {
        Some(v) if v.until_ms > now => {
            publish(v, true);
            v.until_ms = 0;
        }
        Some(v) => {
            if let Some(dir) = settings::configured_report_dir() {
                let _ = std::fs::remove_file(dir.join(VIEW_DIR).join(view_file_name(v.pid)));
            }
        }
        None => {}
    }
}

/// `pthread_atfork` prepare: a publish in progress finishes first.
pub fn lock_for_fork() {
    VIEWING.raw_lock();
}

/// `pthread_atfork` parent.
///
/// # Safety
/// The calling thread took the lock in [`lock_for_fork`].
pub unsafe fn unlock_after_fork() {
    // SAFETY: the caller's contract.
    unsafe { VIEWING.raw_unlock() };
}

/// `pthread_atfork` child: the parent's viewer is not the child's.
///
/// # Safety
/// Single-threaded child; the prepare handler took the lock.
pub unsafe fn reset_in_child_and_unlock() {
    // SAFETY: the caller's contract.
    unsafe {
        *VIEWING.get_unchecked() = None;
        VIEWING.raw_unlock();
    }
}
