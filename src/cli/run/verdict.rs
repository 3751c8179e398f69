//! After the command: what the run's processes told and wrote, one line
//! per process, and the gate's verdict (CONTRACT.md, "The gate").

use crate::cli::budgets::BUDGET_EXIT_STATUS;
use crate::cli::{LEAK_EXIT_STATUS, MISSING_REPORT_EXIT_STATUS};
use cudaleak_core::base::safe_read;
use cudaleak_core::base::units::{count, size_exact};
use cudaleak_core::combine;
use cudaleak_core::report::render::{self, escape};
use cudaleak_core::report::{saturating_sum, Report, Trigger, RUN_MARKER_PREFIX};
use cudaleak_core::run_channel::Told;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The processes of this run that have made a CUDA call and have not yet
/// written their final report: their markers in the report directory.
pub(super) struct Active {
    pub pid: i32,
    pub instance: String,
    pub marker: PathBuf,
}

pub(super) fn active_processes(dir: &Path, run_id: &str) -> Vec<Active> {
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
        // Another user's file is no marker of this run.
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

/// What the reports of one run say.
#[derive(Debug, Default)]
pub(super) struct RunOutcome {
    /// an exit report has unsuppressed leaks
    leaked: bool,
    /// processes that used CUDA and wrote no final report
    missing: usize,
    /// process images with more than one final report
    conflicting: usize,
    /// each process's final report, for the budgets
    pub finals: Vec<Report>,
}

/// What the gate is asked to check.
pub(super) struct Gate {
    /// `--fail-on-leak`
    pub fail_on_leak: bool,
    /// a budget was given (`--max-peak`, `--peak-baseline`)
    pub budgets: bool,
    /// a process's peak went over its budget
    pub budget_failed: bool,
}

/// `run`'s exit status (CONTRACT.md, "The gate"): the command's own when
/// it is not 0. Else, with --fail-on-leak or a budget, a report missing
/// fails the run ([`MISSING_REPORT_EXIT_STATUS`]) before anything else:
/// the gate cannot vouch for what it did not see; then, with
/// --fail-on-leak, leaks ([`LEAK_EXIT_STATUS`]); then a budget exceeded
/// ([`BUDGET_EXIT_STATUS`]).
pub(super) fn gate_status(gate: &Gate, code: u8, outcome: &RunOutcome) -> u8 {
    if code != 0 {
        return code;
    }
    if (gate.fail_on_leak || gate.budgets) && (outcome.missing > 0 || outcome.conflicting > 0) {
        MISSING_REPORT_EXIT_STATUS
    } else if gate.fail_on_leak && outcome.leaked {
        LEAK_EXIT_STATUS
    } else if gate.budget_failed {
        BUDGET_EXIT_STATUS
    } else {
        0
    }
}

/// The out-of-memory reports of the run, one line each. They
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

pub(super) fn is_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// How the command itself ended: a process of the run that is the command
/// and wrote no report is named with the signal that killed it.
pub(super) struct Ended {
    pub pid: i32,
    pub signal: Option<i32>,
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

/// What `summarize` is told besides the report directory.
pub(super) struct Seen<'a> {
    pub run_id: &'a str,
    /// what the processes told the run channel
    pub told: &'a Told,
    /// how COMMAND itself ended
    pub ended: &'a Ended,
    /// descendants still running that `--allow-running` named: not waited
    /// for, their leaks not checked
    pub allowed: &'a BTreeSet<i32>,
    /// how long `run` waited for descendants after COMMAND exited
    pub waited: std::time::Duration,
}

/// The user id that owns `path` (not followed).
fn owner_of(path: &Path) -> Option<u32> {
    std::fs::symlink_metadata(path).ok().map(|m| m.uid())
}

/// `user NAME (uid N)` for a process of another user than the gate's.
pub(super) fn user_label(uid: u32) -> String {
    // SAFETY: getpwuid returns null or a pointer to a static record, read
    // at once (this thread alone asks for users here).
    let name = unsafe {
        let pw = libc::getpwuid(uid);
        (!pw.is_null() && !(*pw).pw_name.is_null()).then(|| {
            std::ffi::CStr::from_ptr((*pw).pw_name)
                .to_string_lossy()
                .into_owned()
        })
    };
    match name {
        Some(n) => format!("user {} (uid {uid})", escape(&n)),
        None => format!("uid {uid}"),
    }
}

/// Prints one line per process of this run (reports carrying `run_id`),
/// and one per process whose report is missing (a marker left behind, or
/// a process that told the run channel it started and then no report).
pub(super) fn summarize(dir: &Path, seen: &Seen) -> RunOutcome {
    let (run_id, told, ended) = (seen.run_id, seen.told, seen.ended);
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let markers = active_processes(dir, run_id);
    let mut known: BTreeSet<(i32, String)> = told.images.keys().cloned().collect();
    known.extend(markers.iter().map(|a| (a.pid, a.instance.clone())));
    // Report files that a process of another user named on the channel,
    // which the kernel vouches is that user's: read when that user owns
    // them (a worker started with `subprocess.run(..., user=...)`).
    let vouched: BTreeMap<&str, (u32, &(i32, String))> = told
        .images
        .iter()
        .filter(|(_, image)| image.uid != me)
        .flat_map(|(id, image)| image.named().map(move |n| (n, (image.uid, id))))
        .collect();
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
            let owner = owner_of(&e.path());
            let vouched_for = vouched.get(name.as_str()).filter(|(uid, _)| owner == Some(*uid));
            if owner != Some(me) && vouched_for.is_none() {
                // Another user's file in a shared directory is never read
                // as ours (a planted clean report passed a
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
                // Another user's file counts only for the image that named it.
                Ok(r) if vouched_for.is_some_and(|(_, id)| process_of(&r) != **id) => {}
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
    // not a choice: one of them is forged or duplicated. An
    // exec report is followed by the exit report when the exec failed.
    let mut finals: BTreeMap<(i32, String), Vec<&PathBuf>> = BTreeMap::new();
    for (p, r) in &reports {
        if is_final(r.trigger) && r.reason.as_deref() != Some("exec") {
            finals.entry(process_of(r)).or_default().push(p);
        }
    }
    let all_final: BTreeSet<(i32, String)> = reports
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
    let read_finals = |id: &(i32, String)| -> BTreeSet<String> {
        reports
            .iter()
            .filter(|(_, r)| process_of(r) == *id && is_final(r.trigger))
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    };
    let mut lost: BTreeSet<(i32, String)> = BTreeSet::new();
    for (id, image) in &told.images {
        let read = read_finals(id);
        if let Some(name) = image.named().find(|n| !read.contains(*n)) {
            lost.insert(id.clone());
            let who = if image.uid != me {
                format!(" of {}", user_label(image.uid))
            } else {
                String::new()
            };
            note!(
                "cudaleak: process {}{who} wrote its final report {} but it could not be read; its leaks are unknown",
                id.0,
                escape(name)
            );
        }
    }
    let mut missing: BTreeSet<&(i32, String)> = BTreeSet::new();
    let mut uncertain: BTreeSet<&(i32, String)> = BTreeSet::new();
    // The last final report of an image, by sequence.
    let latest_final = |id: &(i32, String)| {
        reports
            .iter()
            .filter(|(_, r)| process_of(r) == *id && is_final(r.trigger))
            .max_by_key(|(_, r)| r.sequence)
            .map(|(_, r)| r)
    };
    for id in &known {
        let pid = id.0;
        let marker = markers.iter().find(|a| a.pid == pid && a.instance == id.1);
        let image = told.images.get(id);
        let complete = match image {
            // The channel tells the order: the newest generation's final
            // report, read. An exec report followed by a new `start` (the
            // exec failed) no longer ends the image.
            Some(img) => {
                !lost.contains(id) && img.ending_report().is_some_and(|n| read_finals(id).contains(n))
            }
            // The marker alone (the channel could not be reached): a final
            // report that is not an exec report, or an exec report with the
            // marker gone. A marker beside nothing but an exec report was
            // made again after a failed exec: the image went on and wrote
            // nothing since.
            None => finals.contains_key(id) || (all_final.contains(id) && marker.is_none()),
        };
        // A final report that could not read all of the live map
        // (CONTRACT.md, "Incomplete reports") vouches for nothing.
        let incomplete = latest_final(id).filter(|r| r.incomplete_shards > 0);
        if complete && incomplete.is_none() {
            // The process may have died between writing its final report
            // and removing its marker.
            if let Some(a) = marker {
                let _ = std::fs::remove_file(&a.marker);
            }
            continue;
        }
        if let Some(r) = incomplete.filter(|_| complete) {
            outcome.missing += 1;
            uncertain.insert(id);
            note!(
                "cudaleak: process {pid}'s final report is incomplete: {} of the live map could not be read in time; its leaks are uncertain",
                count(r.incomplete_shards, "part")
            );
            if let Some(a) = marker {
                let _ = std::fs::remove_file(&a.marker);
            }
            continue;
        }
        if seen.allowed.contains(&pid) && is_alive(pid) {
            note!(
                "cudaleak: process {pid} made CUDA calls and is still running, as --allow-running allows: its leaks are not checked"
            );
            continue;
        }
        outcome.missing += 1;
        missing.insert(id);
        let who = match image {
            Some(img) if img.uid != me => format!(" of {}", user_label(img.uid)),
            _ => String::new(),
        };
        if image.is_some_and(|img| img.failed_last()) {
            note!(
                "cudaleak: process {pid}{who} made CUDA calls but could not write its final report (see its warnings); its leaks are unknown"
            );
        } else if lost.contains(id) {
            // Said above: its report could not be read.
        } else if is_alive(pid) && pid != ended.pid {
            note!(
                "cudaleak: process {pid}{who} made CUDA calls and is still running {:.1} s after COMMAND exited (--wait-for-descendants): no exit report yet, its leaks are unknown",
                seen.waited.as_secs_f64()
            );
        } else if let Some(sig) = ended.signal.filter(|_| pid == ended.pid) {
            note!(
                "cudaleak: process {pid}{who} made CUDA calls but wrote no exit report: killed by {}; its leaks are unknown",
                signal_name(sig)
            );
        } else if all_final.contains(id) {
            note!(
                "cudaleak: process {pid}{who} made CUDA calls after an exec that failed, and wrote no report since (it was killed, e.g. by SIGKILL or a crash): its leaks are unknown"
            );
        } else {
            note!(
                "cudaleak: process {pid}{who} made CUDA calls but wrote no exit report (it was killed, e.g. by SIGKILL or a crash, or its report could not be written: see its warnings); its leaks are unknown"
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
    // fatal-signal report holds the process's leaks too.
    // An image whose last final report is an exec report, though the exec
    // failed and it went on, has no final report: its leaks are unknown,
    // not those of the exec report.
    let exits: Vec<&(PathBuf, Report)> = latest
        .iter()
        .filter(|(_, r)| is_final(r.trigger) && !missing.contains(&process_of(r)))
        .collect();
    // Loaded modules are reported, but are no leak for the gate.
    let leaking = exits.iter().filter(|(_, r)| r.has_leaks()).count();
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
            if !r.has_leaks() {
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
        let what = if missing.contains(&process_of(r)) && is_final(r.trigger) {
            // An exec report, and the exec failed: the image went on.
            "no final report since an exec that failed: its leaks are unknown".to_string()
        } else if uncertain.contains(&process_of(r)) && is_final(r.trigger) {
            format!("{what}, and maybe more: the report is incomplete")
        } else {
            what
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
    outcome.finals = exits.iter().map(|(_, r)| r.clone()).collect();
    outcome
}
