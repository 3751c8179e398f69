//! `--format trace`: the Trace Event Format (JSON object form) that
//! Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! Per process, one track (`process_name` metadata, sorted by rank):
//! a counter (`"ph": "C"`) per call site of the sampled timeline
//! (`CUDALEAK_TIMELINE`), in bytes: the site's own series where the
//! report kept it, else what each sample lists of it, with what the sites
//! leave out of a sample in one "other call sites" counter, and the
//! process's live and peak bytes in a "live bytes" counter; a process
//! without a timeline gets one point per leak group at its report's time.
//! A site's counter is named by its group label (`render::group_labels`:
//! the API, then the frames that tell it apart from the process's other
//! sites, not its innermost frame alone) and carries an `id` (the site's
//! index), so that no viewer folds sites into one track: counters are
//! keyed by process, name and id. Instant events (`"ph": "i"`,
//! process scope) mark the report's dump, the peak (its largest group by
//! label), and each out-of-memory episode (`oom_events`, or the `oom` of
//! an oom report).
//! Timestamps are microseconds since the Unix epoch.

use super::{process_label, Process};
use cudaleak_core::report::{render, Group, Report, SampledTimeline};
use serde_json::{json, Value};
use std::path::PathBuf;

/// One dump of a process, for its instant event.
pub struct Dump {
    path: PathBuf,
    hostname: Option<String>,
    pid: i64,
    instance: Option<String>,
    run_id: Option<String>,
    trigger: &'static str,
    timestamp_ms: i64,
    leaked_bytes: u64,
    leaked_blocks: u64,
}

impl Dump {
    pub fn of(path: PathBuf, r: &Report) -> Dump {
        Dump {
            path,
            hostname: r.hostname.clone(),
            pid: r.pid,
            instance: r.instance.clone(),
            run_id: r.run_id.clone(),
            trigger: r.trigger.name(),
            timestamp_ms: r.timestamp_ms,
            leaked_bytes: r.leaked_bytes(),
            leaked_blocks: r.leaked_blocks(),
        }
    }

    fn is_of(&self, r: &Report) -> bool {
        self.hostname == r.hostname
            && self.pid == r.pid
            && self.instance == r.instance
            && self.run_id == r.run_id
    }
}

/// Trace pids: the real pid where every process has its own, else 1, 2, ...
/// (ranks on several hosts share pids).
fn track_ids(processes: &[Process]) -> Vec<i64> {
    let mut pids: Vec<i64> = processes.iter().map(|(_, r)| r.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    if pids.len() == processes.len() {
        processes.iter().map(|(_, r)| r.pid).collect()
    } else {
        (1..=processes.len() as i64).collect()
    }
}

fn us(ms: i64) -> i64 {
    ms.saturating_mul(1000)
}

/// Each site's bytes at each sample of `t`: its own series where the
/// report kept it (every sample, the site's whole history), else what the
/// samples list of it (the largest few of each; the rest of a sample is
/// in "other call sites").
fn site_values(t: &SampledTimeline) -> Vec<Vec<u64>> {
    t.whole_series()
        .into_iter()
        .enumerate()
        .map(|(site, whole)| whole.unwrap_or_else(|| t.samples.iter().map(|s| s.listed(site)).collect()))
        .collect()
}

/// The peak's largest group, labelled among the peak's groups.
fn largest(groups: &[Group]) -> Option<String> {
    let all: Vec<&Group> = groups.iter().collect();
    render::group_labels(&all).into_iter().next()
}

pub fn trace(processes: &[Process], dumps: &[Dump]) -> Value {
    let mut events = Vec::new();
    for ((path, r), pid) in processes.iter().zip(track_ids(processes)) {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("cudaleak: {}", process_label(r))},
        }));
        if let Some(rank) = r.rank {
            events.push(json!({
                "name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                "args": {"sort_index": rank},
            }));
        }
        // A counter track is keyed by its process, name and id: each call
        // site carries its own id, so that sites alike in name (or a
        // viewer's truncation of it) stay tracks of their own.
        let counter = |name: &str, id: Option<usize>, ts: i64, args: Value| {
            let mut e = json!({"name": name, "cat": "memory", "ph": "C", "ts": us(ts), "pid": pid, "tid": 0, "args": args});
            if let Some(id) = id {
                e["id"] = json!(id.to_string());
            }
            e
        };
        match &r.timeline {
            Some(t) if !t.samples.is_empty() => {
                let sites: Vec<&Group> = t.sites.iter().collect();
                let labels = render::group_labels(&sites);
                let values = site_values(t);
                for (k, s) in t.samples.iter().enumerate() {
                    events.push(counter(
                        "live bytes",
                        None,
                        s.timestamp_ms,
                        json!({"live": s.live_bytes, "peak": s.peak_bytes}),
                    ));
                    // Every site at every sample: one a sample does not
                    // hold is at 0 there, not left at its previous value
                    // by the viewer.
                    let mut shown = 0u64;
                    for (site, label) in labels.iter().enumerate() {
                        let b = values[site][k];
                        shown = shown.saturating_add(b);
                        events.push(counter(label, Some(site), s.timestamp_ms, json!({"bytes": b})));
                    }
                    // What the sites' tracks leave out of the sample's total.
                    let listed = s
                        .sites
                        .iter()
                        .map(|&(_, b)| b)
                        .fold(s.other_bytes, u64::saturating_add);
                    events.push(counter(
                        "other call sites",
                        None,
                        s.timestamp_ms,
                        json!({"bytes": listed.saturating_sub(shown)}),
                    ));
                }
            }
            _ => {
                events.push(counter(
                    "live bytes",
                    None,
                    r.timestamp_ms,
                    json!({"live": r.totals.live_bytes, "peak": r.totals.peak_bytes}),
                ));
                let groups: Vec<&Group> = r.leaks.iter().collect();
                for (i, (g, label)) in r.leaks.iter().zip(render::group_labels(&groups)).enumerate() {
                    events.push(counter(
                        &label,
                        Some(i),
                        r.timestamp_ms,
                        json!({"bytes": g.bytes}),
                    ));
                }
            }
        }
        let instant = |name: String, ts: i64, args: Value| json!({"name": name, "cat": "cudaleak", "ph": "i", "s": "p", "ts": us(ts), "pid": pid, "tid": 0, "args": args});
        let this = Dump::of(path.clone(), r);
        let mut own: Vec<&Dump> = dumps.iter().filter(|d| d.is_of(r)).collect();
        if own.is_empty() {
            own.push(&this);
        }
        for d in own {
            events.push(instant(
                format!("dump: {}", d.trigger),
                d.timestamp_ms,
                json!({
                    "report": d.path.display().to_string(),
                    "leaked_bytes": d.leaked_bytes,
                    "leaked_blocks": d.leaked_blocks,
                }),
            ));
        }
        if let Some(peak) = &r.peak {
            events.push(instant(
                "peak".into(),
                peak.timestamp_ms,
                json!({
                    "bytes": peak.bytes,
                    "largest": largest(&peak.groups),
                }),
            ));
        }
        let mut ooms: Vec<Value> = r
            .oom_events
            .iter()
            .map(|e| {
                instant(
                    format!("out of memory: {} of {} bytes", e.api, e.requested_bytes),
                    e.timestamp_ms,
                    json!({
                        "api": e.api, "requested_bytes": e.requested_bytes,
                        "failed_calls": e.failed_calls, "device": e.device, "report": e.report,
                        "device_free_bytes": e.device_free_bytes,
                    }),
                )
            })
            .collect();
        if let Some(o) = &r.oom {
            if !r.oom_events.iter().any(|e| e.timestamp_ms == o.timestamp_ms) {
                ooms.push(instant(
                    format!("out of memory: {} of {} bytes", o.api, o.requested_bytes),
                    o.timestamp_ms,
                    json!({
                        "api": o.api, "requested_bytes": o.requested_bytes,
                        "failed_calls": o.failed_calls, "device": o.device,
                        "device_free_bytes": o.device_free_bytes,
                    }),
                ));
            }
        }
        events.extend(ooms);
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": format!("cudaleak {}", env!("CARGO_PKG_VERSION"))},
    })
}
