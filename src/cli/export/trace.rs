//! `--format trace`: the Trace Event Format (JSON object form) that
//! Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! Per process, one track (`process_name` metadata, sorted by rank):
//! a counter (`"ph": "C"`) per call site of the sampled timeline
//! (`CUDALEAK_TIMELINE`), in bytes, with the sites a sample does not list
//! in one "other call sites" counter and the process's live and peak bytes
//! in a "live bytes" counter; a process without a timeline gets one point
//! per leak group at its report's time. Instant events (`"ph": "i"`,
//! process scope) mark the report's dump, the peak, and each
//! out-of-memory episode (`oom_events`, or the `oom` of an oom report).
//! Timestamps are microseconds since the Unix epoch.

use super::{group_title, process_label, Process};
use cudaleak_core::report::Report;
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
        let counter = |name: &str, ts: i64, args: Value| json!({"name": name, "cat": "memory", "ph": "C", "ts": us(ts), "pid": pid, "tid": 0, "args": args});
        match &r.timeline {
            Some(t) if !t.samples.is_empty() => {
                let titles: Vec<String> = t.sites.iter().map(group_title).collect();
                for s in &t.samples {
                    events.push(counter(
                        "live bytes",
                        s.timestamp_ms,
                        json!({"live": s.live_bytes, "peak": s.peak_bytes}),
                    ));
                    // Every site at every sample: one a sample does not
                    // list is in "other call sites" there, not left at
                    // its previous value by the viewer.
                    let mut bytes = vec![0u64; titles.len()];
                    for &(site, b) in &s.sites {
                        if let Some(slot) = bytes.get_mut(site as usize) {
                            *slot = b;
                        }
                    }
                    for (title, b) in titles.iter().zip(bytes) {
                        events.push(counter(title, s.timestamp_ms, json!({"bytes": b})));
                    }
                    events.push(counter(
                        "other call sites",
                        s.timestamp_ms,
                        json!({"bytes": s.other_bytes}),
                    ));
                }
            }
            _ => {
                events.push(counter(
                    "live bytes",
                    r.timestamp_ms,
                    json!({"live": r.totals.live_bytes, "peak": r.totals.peak_bytes}),
                ));
                for g in &r.leaks {
                    events.push(counter(
                        &group_title(g),
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
                    "largest": peak.groups.first().map(group_title),
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
