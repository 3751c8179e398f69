//! The processes COMMAND leaves behind. `run` is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits (a daemon that
//! double-forked) becomes `run`'s child, not init's, so `run` still sees
//! it, can wait for it, and reaps it. A daemon that allocated after
//! COMMAND returned wrote its report after `run` had already passed the
//! gate ("no process made a CUDA allocation").
//!
//! After COMMAND exits, `run` waits, at most `--wait-for-descendants`
//! seconds, while a descendant still runs that made a CUDA allocation
//! call and wrote no final report yet; and for the first [`SETTLE`], while
//! one has a CUDA library mapped and may be about to make its first call
//! (a daemon that allocates as its parent returns). Any other descendant
//! (a compiler cache server, a forked helper that never calls CUDA) is
//! not waited for: it is named in one line and does not fail the gate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Makes `run` the reaper of its orphaned descendants.
pub fn become_subreaper() {
    // SAFETY: a prctl that takes an integer flag and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Reaps every child that has exited (orphans reparented to us), without
/// waiting.
pub fn reap_exited() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a local status word.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

/// While COMMAND runs: reaps, every 200 ms, the orphans that exited since
/// (their parents exited first, and the subreaper inherited them), never
/// COMMAND (`command`), whose status the main thread waits for. Without
/// it, a job that leaves short-lived helpers behind piled up zombies
/// under `run` (300 in a test), which count against its limits.
pub fn reap_orphans_while(command: i32, running: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let me = std::process::id() as i32;
    let _ = std::thread::Builder::new()
        .name("cudaleak-run-reaper".into())
        .spawn(move || {
            while running.load(std::sync::atomic::Ordering::Acquire) {
                for (&pid, &(ppid, state)) in &process_table() {
                    if ppid == me && pid != command && state == 'Z' {
                        let mut status = 0;
                        // SAFETY: waitpid on an exited child of ours, with a
                        // local status word.
                        unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
}

/// A process below `run` still alive.
#[derive(Clone, Debug)]
pub struct Descendant {
    pub pid: i32,
    /// its name (`/proc/PID/comm`)
    pub name: String,
    /// a CUDA library is mapped (libcuda, libcudart), or its mappings
    /// could not be read (another user's process): it may still allocate
    pub may_use_cuda: bool,
}

/// `(pid, parent pid, state)` of every process, from /proc.
fn process_table() -> BTreeMap<i32, (i32, char)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parens.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut f = after.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if let Some(ppid) = f.next().and_then(|p| p.parse::<i32>().ok()) {
            out.insert(pid, (ppid, state));
        }
    }
    out
}

fn maps_cuda(pid: i32) -> bool {
    match std::fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) => {
            let text = String::from_utf8_lossy(&maps);
            text.lines().any(|l| {
                let file = l.rsplit('/').next().unwrap_or("");
                file.starts_with("libcuda.so") || file.starts_with("libcudart.so")
            })
        }
        Err(_) => true,
    }
}

/// The live descendants of this process (zombies left out), in pid order.
pub fn alive() -> Vec<Descendant> {
    let table = process_table();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let mut frontier = vec![me];
    while let Some(parent) = frontier.pop() {
        for (&pid, &(ppid, state)) in &table {
            if ppid == parent && pid != me {
                frontier.push(pid);
                if state != 'Z' && state != 'X' {
                    found.push(pid);
                }
            }
        }
    }
    found.sort_unstable();
    found
        .into_iter()
        .map(|pid| Descendant {
            pid,
            name: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default(),
            may_use_cuda: maps_cuda(pid),
        })
        .collect()
}

/// How long `run` waits for a descendant that has a CUDA library mapped
/// but has made no CUDA allocation call yet.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Waits until no descendant is one `run` must wait for, at most `bound`,
/// reaping what exits meanwhile: `made_calls` says whether a descendant
/// made CUDA allocation calls and has not ended its reporting, `ignored`
/// whether it is never waited for. Returns the descendants still alive
/// at the end and how long it waited.
pub fn wait(
    bound: Duration,
    made_calls: impl Fn(&Descendant) -> bool,
    ignored: impl Fn(&Descendant) -> bool,
) -> (Vec<Descendant>, Duration) {
    let start = Instant::now();
    loop {
        reap_exited();
        let left = alive();
        let settling = start.elapsed() < SETTLE;
        let waits = |d: &Descendant| !ignored(d) && (made_calls(d) || (settling && d.may_use_cuda));
        if !left.iter().any(waits) || start.elapsed() >= bound {
            return (left, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
