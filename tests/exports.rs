//! Exports to the viewers people already use, each read back
//! by its real reader where one can be installed:
//!
//! - pprof: `go tool pprof` (Debian's golang-go) prints our groups with
//!   our bytes and blocks, the peak, and the rank/host/pid labels;
//! - Chrome trace / Perfetto JSON: checked against the Trace Event
//!   Format's documented fields (no Perfetto or chrome://tracing viewer
//!   runs offline from the distribution's packages, so no viewer loads it
//!   here);
//! - PyTorch memory snapshot: read with Python's `pickle` and checked
//!   field by field; with PyTorch installed, `python -m
//!   torch.cuda._memory_viz stats` reads it (that test is `#[ignore]`d
//!   with its reason: PyTorch is not a test dependency);
//! - speedscope: validated against speedscope's own file format schema
//!   (vendored from its npm package in tests/data), and opened by
//!   speedscope itself (npm, from tests/speedscope's lock file) in
//!   headless Chromium, whose sandwich table lists our functions with
//!   their bytes.
//!
//! The tests that need a reader (go, Chromium, speedscope, script) are
//! `#[ignore]`d with the reason: `cargo test` reports them as ignored,
//! never as passed. scripts/test.sh runs them (`--ignored`), and there a
//! missing reader fails them; scripts/install-test-deps.sh
//! installs them.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::{
    cli, cli_command, line_of, lines_of, program, repo, required, run_command, run_traced, sim_dir, TempDir,
};

const SECS: Duration = Duration::from_secs(120);

fn find_in_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// `go`, for `go tool pprof`.
fn go() -> Option<PathBuf> {
    find_in_path(&["go"]).or_else(|| {
        ["/usr/lib/go/bin/go", "/usr/local/go/bin/go"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
}

/// The Python of the test venv (scripts/test.sh puts it first in PATH).
fn python() -> PathBuf {
    find_in_path(&["python3", "python"]).expect("python3 in PATH")
}

fn export(args: &[&str], cwd: &Path) -> Vec<u8> {
    let out = cli_command(args, cwd).output().expect("run cudaleak");
    assert!(
        out.status.success(),
        "cudaleak {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn leak_n() -> PathBuf {
    program("leak_n")
}

/// leak_n: 3 blocks of 100 bytes at site_a, 2 of 200 at site_b.
fn planted() -> support::Outcome {
    let out = run_traced(&leak_n(), &["3", "2"], &[("CUDALEAK_TIMELINE", "10ms")]);
    out.assert_success();
    out
}

/// Four ranks of one job in one directory, each its own `cudaleak run`;
/// rank 2 also leaks 300 bytes at site_c.
fn ranks(d: &TempDir) -> PathBuf {
    let reports = d.path().join("ranks");
    for rank in 0..4 {
        let mut cmd = Command::new(cli());
        cmd.args(["run", "--dir", reports.to_str().unwrap(), "--"])
            .arg(leak_n())
            .args(["1", "0"])
            .env("RANK", rank.to_string())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env_remove("LD_PRELOAD")
            .current_dir(d.path());
        if rank == 2 {
            cmd.env("LEAK_EXTRA", "1");
        }
        let (st, _, err) = run_command(cmd, SECS);
        assert!(st.success(), "{err}");
    }
    reports
}

fn pprof_top(go: &Path, file: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new(go);
    cmd.args(["tool", "pprof", "-top"]).args(extra).arg(file);
    let (st, out, err) = run_command(cmd, SECS);
    assert!(st.success(), "go tool pprof: {err}");
    out
}

/// The `-top` row of `function`: (flat, cum).
fn top_row<'a>(top: &'a str, function: &str) -> (&'a str, &'a str) {
    let line = top
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .unwrap_or_else(|| panic!("no row for {function} in:\n{top}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    (cols[0], cols[3])
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn pprof_is_read_by_go_tool_pprof_with_our_bytes_blocks_and_peak() {
    let go = required(go(), "go (apt-get install golang-go)");
    let out = planted();
    let file = out.dir.path().join("leaks.pb.gz");
    let bytes = export(&["report", "--format", "pprof", "."], out.dir.path());
    assert_eq!(bytes[..2], [0x1f, 0x8b], "gzip-compressed");
    std::fs::write(&file, bytes).unwrap();

    let top = pprof_top(&go, &file, &[]);
    assert!(
        top.contains("Type: leaked_bytes"),
        "leaked bytes by default:\n{top}"
    );
    assert!(top.contains("of 700B total"), "{top}");
    assert_eq!(top_row(&top, "site_b"), ("400B", "400B"), "{top}");
    assert_eq!(top_row(&top, "site_a"), ("300B", "300B"), "{top}");
    assert_eq!(top_row(&top, "main").1, "700B", "{top}");

    let blocks = pprof_top(&go, &file, &["-sample_index=leaked_blocks"]);
    assert!(blocks.contains("of 5 total"), "{blocks}");
    assert_eq!(top_row(&blocks, "site_a").0, "3", "{blocks}");
    assert_eq!(top_row(&blocks, "site_b").0, "2", "{blocks}");

    // Everything was live at the end: the peak holds the same groups.
    let peak = pprof_top(&go, &file, &["-sample_index=peak_bytes"]);
    assert!(peak.contains("of 700B total"), "{peak}");
    assert_eq!(top_row(&peak, "site_b").0, "400B", "{peak}");

    // Lines: site_a's sample is at its line of leak_n.c.
    let lines = pprof_top(&go, &file, &["-lines"]);
    let site_a = format!(
        "site_a {}:{}",
        repo().join("tests/c/leak_n.c").display(),
        line_of("tests/c/leak_n.c", "LEAK site A")
    );
    assert!(
        lines
            .lines()
            .any(|l| l.contains(&site_a) && l.trim_start().starts_with("300B")),
        "{site_a} in:\n{lines}"
    );

    let mut cmd = Command::new(&go);
    cmd.args(["tool", "pprof", "-tags"]).arg(&file);
    let (st, tags, err) = run_command(cmd, SECS);
    assert!(st.success(), "{err}");
    let pid = out.report().pid.to_string();
    for want in [
        "memory: Total 700",
        ": device",
        "api: Total 700",
        ": cudaMalloc",
        "pid: Total 700",
        &pid,
    ] {
        assert!(tags.contains(want), "{want} in:\n{tags}");
    }
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn pprof_of_a_directory_of_ranks_labels_each_sample_with_its_rank() {
    let go = required(go(), "go (apt-get install golang-go)");
    let d = TempDir::new("export-ranks");
    let reports = ranks(&d);
    let file = d.path().join("job.pb.gz");
    std::fs::write(&file, export(&["report", "--format", "pprof", "ranks"], d.path())).unwrap();
    let top = pprof_top(&go, &file, &[]);
    assert!(top.contains("of 700B total"), "4 x 100 + 300:\n{top}");
    assert_eq!(top_row(&top, "site_a").0, "400B", "{top}");
    assert_eq!(top_row(&top, "site_c").0, "300B", "{top}");
    let rank2 = pprof_top(&go, &file, &["-tagfocus=rank=2"]);
    assert!(rank2.contains("accounting for 400B,"), "rank 2 alone:\n{rank2}");
    assert_eq!(top_row(&rank2, "site_c").0, "300B", "{rank2}");
    let rank1 = pprof_top(&go, &file, &["-tagfocus=rank=1"]);
    assert!(
        rank1.contains("accounting for 100B,") && !rank1.contains("site_c"),
        "{rank1}"
    );
    // `merge DIR --format pprof` is the same export.
    let merged = d.path().join("merged.pb.gz");
    std::fs::write(
        &merged,
        export(
            &["merge", "--format", "pprof", reports.to_str().unwrap()],
            d.path(),
        ),
    )
    .unwrap();
    let rank2 = pprof_top(&go, &merged, &["-tagfocus=rank=2"]);
    assert_eq!(top_row(&rank2, "site_c").0, "300B", "{rank2}");
}

/// Checks one Trace Event Format event against the format's documented
/// fields (the "Trace Event Format" document: name, ph, ts in
/// microseconds, pid, tid, args; "s" for instant events; metadata
/// events' names), and returns its phase.
fn check_event(e: &Value) -> String {
    let ph = e["ph"].as_str().unwrap_or_else(|| panic!("ph: {e}"));
    assert!(e["name"].is_string(), "name: {e}");
    assert!(e["pid"].is_i64(), "pid: {e}");
    assert!(e["tid"].is_i64(), "tid: {e}");
    match ph {
        "M" => {
            let name = e["name"].as_str().unwrap();
            assert!(
                [
                    "process_name",
                    "process_sort_index",
                    "thread_name",
                    "process_labels"
                ]
                .contains(&name),
                "metadata event name: {e}"
            );
            assert!(e["args"].is_object(), "{e}");
        }
        "C" => {
            assert!(e["ts"].is_i64() || e["ts"].is_f64(), "ts: {e}");
            let args = e["args"].as_object().expect("counter args");
            assert!(
                !args.is_empty() && args.values().all(Value::is_number),
                "counter values are numbers: {e}"
            );
        }
        "i" | "I" => {
            assert!(e["ts"].is_number(), "ts: {e}");
            assert!(
                ["g", "p", "t"].contains(&e["s"].as_str().unwrap_or("t")),
                "scope: {e}"
            );
        }
        other => panic!("unexpected phase {other}: {e}"),
    }
    ph.to_string()
}

fn trace_of(args: &[&str], cwd: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&export(args, cwd)).expect("trace is JSON");
    assert_eq!(v["displayTimeUnit"], "ms");
    let events = v["traceEvents"].as_array().expect("traceEvents").clone();
    for e in &events {
        check_event(e);
    }
    events
}

#[test]
fn trace_has_a_counter_track_per_call_site_and_instants_for_dumps() {
    let out = planted();
    let r = out.report();
    let events = trace_of(&["report", "--format", "trace", "."], out.dir.path());
    let last_value = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .max_by_key(|e| e["ts"].as_i64())
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("no counter {name}"))
    };
    let a = line_of("tests/c/leak_n.c", "LEAK site A");
    let b = line_of("tests/c/leak_n.c", "LEAK site B");
    // Each site's track is named by its group label, and has an id.
    assert_eq!(
        last_value(&format!("cudaMalloc (device memory) at site_a leak_n.c:{a}")),
        300
    );
    assert_eq!(
        last_value(&format!("cudaMalloc (device memory) at site_b leak_n.c:{b}")),
        400
    );
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"].as_str().unwrap().contains(" at site_"))
        .all(|e| e["id"].is_string()));
    let samples = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "live bytes")
        .count();
    // One point per timeline sample (how many there are depends on how
    // long the program ran: the count, not a minimum, is what is exact).
    let taken = r.timeline.as_ref().expect("a timeline").samples.len();
    assert!(taken >= 1);
    assert_eq!(samples, taken, "one point per timeline sample");
    let dump = events
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == "dump: exit")
        .expect("the exit dump");
    assert_eq!(dump["ts"], r.timestamp_ms * 1000);
    assert_eq!(dump["args"]["leaked_bytes"], 700);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [format!("cudaleak: {}, pid {}", r.hostname.unwrap(), r.pid)]
    );
}

#[test]
fn trace_of_ranks_has_one_process_track_per_rank() {
    let d = TempDir::new("export-trace-ranks");
    ranks(&d);
    let events = trace_of(&["report", "--format", "trace", "ranks"], d.path());
    let mut tracks: Vec<(i64, String)> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| {
            (
                e["pid"].as_i64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    tracks.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(tracks.len(), 4);
    for (k, (_, name)) in tracks.iter().enumerate() {
        assert!(name.starts_with(&format!("cudaleak: rank {k} (")), "{name}");
    }
    let rank2 = tracks[2].0;
    assert!(
        events.iter().any(|e| e["pid"] == rank2
            && e["ph"] == "C"
            && e["name"].as_str().unwrap().contains(" at site_c ")),
        "rank 2's extra leak is on its own track"
    );
    let sort: Vec<i64> = events
        .iter()
        .filter(|e| e["name"] == "process_sort_index")
        .map(|e| e["args"]["sort_index"].as_i64().unwrap())
        .collect();
    assert_eq!(sort.len(), 4);
}

#[test]
fn trace_marks_out_of_memory_episodes() {
    let out = run_traced(&program("oom"), &[], &[("SIMCUDA_DEVICE_BYTES", "67108864")]);
    let exit = out
        .reports()
        .into_iter()
        .find(|r| r.trigger.name() == "exit")
        .expect("exit report");
    assert_eq!(exit.oom_events.len(), 1, "{}", out.stderr);
    let events = trace_of(&["report", "--format", "trace", "."], out.dir.path());
    let oom: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("out of memory"))
        .collect();
    assert_eq!(oom.len(), 1, "{oom:?}");
    assert_eq!(oom[0]["name"], "out of memory: cudaMalloc of 41943040 bytes");
    assert_eq!(oom[0]["ts"], exit.oom_events[0].timestamp_ms * 1000);
    assert_eq!(oom[0]["args"]["failed_calls"], 2);
}

/// Python reads the snapshot with `pickle` and prints what the tests
/// check, as JSON.
const READ_SNAPSHOT: &str = r#"
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
assert isinstance(s, dict) and set(s) == {"segments", "device_traces"}, s.keys()
seg_keys = {"device", "address", "total_size", "allocated_size", "active_size",
            "requested_size", "stream", "segment_type", "blocks"}
out = {"segments": [], "traces": s["device_traces"]}
for seg in s["segments"]:
    assert seg_keys <= set(seg), seg.keys()
    assert isinstance(seg["address"], int) and seg["segment_type"] in ("small", "large")
    assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
    for b in seg["blocks"]:
        assert b["state"] == "active_allocated"
        assert seg["address"] <= b["address"] < seg["address"] + seg["total_size"]
        for f in b["frames"]:
            assert set(f) == {"filename", "line", "name"} and isinstance(f["line"], int), f
    out["segments"].append({"device": seg["device"], "size": seg["total_size"],
                            "frames": [f["name"] for f in seg["blocks"][0]["frames"]],
                            "file_line": [[f["filename"], f["line"]] for f in seg["blocks"][0]["frames"][:1]]})
print(json.dumps(out))
"#;

fn read_snapshot(file: &Path) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg("-c").arg(READ_SNAPSHOT).arg(file);
    let (st, out, err) = run_command(cmd, SECS);
    assert!(st.success(), "pickle.load: {err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn torch_snapshot_is_a_pickle_with_pytorchs_fields_and_our_blocks() {
    let out = planted();
    let file = out.dir.path().join("snapshot.pickle");
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], out.dir.path()),
    )
    .unwrap();
    let s = read_snapshot(&file);
    let segs = s["segments"].as_array().unwrap();
    let by = |f: &str| -> Vec<u64> {
        let mut v: Vec<u64> = segs
            .iter()
            .filter(|x| x["frames"][0] == f)
            .map(|x| x["size"].as_u64().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(by("site_a"), [100, 100, 100]);
    assert_eq!(by("site_b"), [200, 200]);
    assert_eq!(segs.len(), 5);
    let seg_a = segs.iter().find(|x| x["frames"][0] == "site_a").unwrap();
    assert_eq!(seg_a["frames"][1], "main");
    assert_eq!(
        seg_a["file_line"][0],
        serde_json::json!([
            repo().join("tests/c/leak_n.c").display().to_string(),
            line_of("tests/c/leak_n.c", "LEAK site A")
        ])
    );
    assert_eq!(s["traces"], serde_json::json!([[]]), "one device, no events");
}

#[test]
fn torch_snapshot_counts_blocks_past_the_examples_and_records_oom() {
    // 8 blocks at site_a: the report keeps 5 addresses, the other 3
    // blocks are one more segment, so the sizes add up.
    let out = run_traced(&leak_n(), &["8", "0"], &[]);
    out.assert_success();
    let file = out.dir.path().join("snapshot.pickle");
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], out.dir.path()),
    )
    .unwrap();
    let s = read_snapshot(&file);
    let mut sizes: Vec<u64> = s["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["size"].as_u64().unwrap())
        .collect();
    sizes.sort();
    assert_eq!(sizes, [100, 100, 100, 100, 100, 300]);

    let oom = run_traced(&program("oom"), &[], &[("SIMCUDA_DEVICE_BYTES", "67108864")]);
    let file = oom.dir.path().join("snapshot.pickle");
    let exit = oom
        .reports()
        .into_iter()
        .find(|r| r.trigger.name() == "exit")
        .unwrap();
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], oom.dir.path()),
    )
    .unwrap();
    let s = read_snapshot(&file);
    let traces = s["traces"][0].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{traces:?}");
    assert_eq!(traces[0]["action"], "oom");
    assert_eq!(traces[0]["size"], 41943040);
    assert_eq!(traces[0]["time_us"], exit.oom_events[0].timestamp_ms * 1000);
    // what the driver said right after the failure, as the oom report
    // and the exit report's episode give it (it read 0: "0.0B free")
    let free = oom_report_free(&oom.reports());
    assert_eq!(exit.oom_events[0].device_free_bytes, Some(free));
    assert_eq!(traces[0]["device_free"], free);
    let kept: u64 = s["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["size"].as_u64().unwrap())
        .sum();
    assert_eq!(kept, exit.leaked_bytes());
}

#[test]
#[ignore = "needs PyTorch (pip install torch): `python -m torch.cuda._memory_viz stats` reads the snapshot; run with --ignored where it is installed"]
fn torch_snapshot_is_read_by_pytorchs_memory_viz() {
    let mut probe = Command::new(python());
    probe.args(["-c", "import torch.cuda._memory_viz"]);
    let (st, _, err) = run_command(probe, SECS);
    assert!(st.success(), "PyTorch is not importable: {err}");
    let out = run_traced(&leak_n(), &["3", "2"], &[("CUDALEAK_TRACE", "64")]);
    out.assert_success();
    let file = out.dir.path().join("snapshot.pickle");
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], out.dir.path()),
    )
    .unwrap();
    let viz = |action: &str| {
        let mut cmd = Command::new(python());
        cmd.args(["-m", "torch.cuda._memory_viz", action]).arg(&file);
        let (st, text, err) = run_command(cmd, SECS);
        assert!(st.success(), "{err}");
        text
    };
    let stats = viz("stats");
    for want in ["segments: 5", "total_reserved: 700.0B", "total_allocated: 700.0B"] {
        assert!(stats.contains(want), "{want} in:\n{stats}");
    }
    let trace = viz("trace");
    assert!(trace.contains("7 entries"), "{trace}");
    assert_eq!(trace.matches(":200.0B]").count(), 2, "{trace}");
}

#[test]
fn speedscope_validates_against_its_schema_and_weighs_stacks_in_bytes() {
    let out = planted();
    let v: Value = serde_json::from_slice(&export(
        &["report", "--format", "speedscope", "."],
        out.dir.path(),
    ))
    .unwrap();
    let schema_path = repo().join("tests/data/speedscope-file-format-schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    let validator = jsonschema::draft7::new(&schema).expect("speedscope's schema");
    let errors: Vec<String> = validator
        .iter_errors(&v)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));

    let frames: Vec<&str> = v["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let p = &v["profiles"][0];
    assert_eq!(p["type"], "sampled");
    assert_eq!(p["unit"], "bytes");
    assert_eq!(p["startValue"], 0);
    assert_eq!(p["endValue"], 700);
    let stacks: Vec<(Vec<&str>, u64)> = p["samples"]
        .as_array()
        .unwrap()
        .iter()
        .zip(p["weights"].as_array().unwrap())
        .map(|(s, w)| {
            let names = s
                .as_array()
                .unwrap()
                .iter()
                .map(|i| frames[i.as_u64().unwrap() as usize])
                .collect();
            (names, w.as_u64().unwrap())
        })
        .collect();
    // Root first, the allocating API as the leaf.
    let tail = |s: &Vec<&str>| -> Vec<String> { s[s.len() - 3..].iter().map(|x| x.to_string()).collect() };
    assert_eq!(stacks.len(), 2);
    assert_eq!(
        (tail(&stacks[0].0), stacks[0].1),
        (
            vec!["main".to_string(), "site_b".into(), "cudaMalloc".into()],
            400
        )
    );
    assert_eq!(
        (tail(&stacks[1].0), stacks[1].1),
        (
            vec!["main".to_string(), "site_a".into(), "cudaMalloc".into()],
            300
        )
    );
    // Program start is folded away, as the text folds it; --full-stacks
    // keeps it.
    assert_eq!(stacks[0].0, ["main", "site_b", "cudaMalloc"]);
    let full: Value = serde_json::from_slice(&export(
        &["report", "--format", "speedscope", "--full-stacks", "."],
        out.dir.path(),
    ))
    .unwrap();
    let frames = full["shared"]["frames"].as_array().unwrap();
    let root = full["profiles"][0]["samples"][0][0].as_u64().unwrap() as usize;
    assert_eq!(frames[root]["name"], "_start");
}

#[test]
fn diff_refuses_export_formats_with_a_clear_line() {
    let out = planted();
    let r = cli_command(&["diff", "--format", "pprof", ".", "."], out.dir.path())
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2));
    // refused as a value diff does not offer, naming those it does
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("invalid value 'pprof' for '--format <FORMAT>'"),
        "{err}"
    );
    assert!(
        err.contains("[possible values: text, json, folded, html, svg]"),
        "{err}"
    );
}

/// leak_n 3 2's events in order: a clean 1-byte allocation and its free,
/// 3 x 100 bytes at site_a, 2 x 200 at site_b.
#[test]
fn allocation_trace_keeps_the_last_events_and_the_snapshot_replays_them() {
    let off = planted();
    assert!(off.report().allocation_trace.is_none(), "off by default");

    let out = run_traced(&leak_n(), &["3", "2"], &[("CUDALEAK_TRACE", "64")]);
    out.assert_success();
    let t = out.report().allocation_trace.expect("allocation_trace");
    assert_eq!((t.capacity, t.recorded), (64, 7));
    let seen: Vec<(&str, u64)> = t.events.iter().map(|e| (e.action.as_str(), e.size)).collect();
    assert_eq!(
        seen,
        [
            ("alloc", 1),
            ("free", 1),
            ("alloc", 100),
            ("alloc", 100),
            ("alloc", 100),
            ("alloc", 200),
            ("alloc", 200)
        ]
    );
    assert_eq!(
        t.events[0].address, t.events[1].address,
        "the free names the block"
    );
    let site_fn = |i: usize| {
        let g = &t.sites[t.events[i].site.unwrap() as usize];
        g.native_stack[0].function.clone().unwrap()
    };
    assert_eq!(
        (site_fn(2), site_fn(5)),
        ("site_a".to_string(), "site_b".to_string())
    );
    assert!(t
        .events
        .windows(2)
        .all(|w| w[0].timestamp_us <= w[1].timestamp_us));

    let file = out.dir.path().join("snapshot.pickle");
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], out.dir.path()),
    )
    .unwrap();
    let mut cmd = Command::new(python());
    cmd.arg("-c")
        .arg(
            "import json, pickle, sys\n\
             s = pickle.load(open(sys.argv[1], 'rb'))\n\
             print(json.dumps([[e['action'], e['size'], e['addr'], e['frames'][0]['name'] if e['frames'] else None] for e in s['device_traces'][0]]))",
        )
        .arg(&file);
    let (st, text, err) = run_command(cmd, SECS);
    assert!(st.success(), "{err}");
    let trace: Vec<(String, u64, u64, Option<String>)> = serde_json::from_str(&text).unwrap();
    let actions: Vec<(&str, u64)> = trace.iter().map(|e| (e.0.as_str(), e.1)).collect();
    assert_eq!(
        actions,
        [
            ("alloc", 1),
            ("free_completed", 1),
            ("alloc", 100),
            ("alloc", 100),
            ("alloc", 100),
            ("alloc", 200),
            ("alloc", 200)
        ]
    );
    assert_eq!(trace[2].3.as_deref(), Some("site_a"));
    assert_eq!(trace[6].3.as_deref(), Some("site_b"));
    assert_eq!(format!("{:#x}", trace[6].2), t.events[6].address);

    // A ring of 4 keeps the last 4 of the 7.
    let short = run_traced(&leak_n(), &["3", "2"], &[("CUDALEAK_TRACE", "4")]);
    let t = short.report().allocation_trace.expect("allocation_trace");
    assert_eq!((t.capacity, t.recorded), (4, 7));
    let sizes: Vec<u64> = t.events.iter().map(|e| e.size).collect();
    assert_eq!(sizes, [100, 100, 200, 200]);

    // A bad value: one warning, and the default (off).
    let bad = run_traced(&leak_n(), &["1", "0"], &[("CUDALEAK_TRACE", "lots")]);
    bad.assert_success();
    assert_eq!(bad.stderr_lines_with("CUDALEAK_TRACE").len(), 1, "{}", bad.stderr);
    assert!(bad.report().allocation_trace.is_none());
}

#[test]
fn allocation_trace_records_each_failed_call_as_an_oom_event() {
    let out = run_traced(
        &program("oom"),
        &[],
        &[("SIMCUDA_DEVICE_BYTES", "67108864"), ("CUDALEAK_TRACE", "256")],
    );
    let exit = out
        .reports()
        .into_iter()
        .find(|r| r.trigger.name() == "exit")
        .expect("exit report");
    let t = exit.allocation_trace.expect("allocation_trace");
    let ooms: Vec<u64> = t
        .events
        .iter()
        .filter(|e| e.action == "oom")
        .map(|e| e.size)
        .collect();
    assert_eq!(ooms, [41943040, 41943040], "the request failed twice");
    let oom = t.events.iter().find(|e| e.action == "oom").unwrap();
    assert_eq!(oom.address, "0x0");
    assert!(oom.site.is_some(), "with its stack");

    let file = out.dir.path().join("snapshot.pickle");
    std::fs::write(
        &file,
        export(&["report", "--format", "torch-snapshot", "."], out.dir.path()),
    )
    .unwrap();
    let s = read_snapshot(&file);
    let free = oom_report_free(&out.reports());
    let frees: Vec<&Value> = s["traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "oom")
        .map(|e| &e["device_free"])
        .collect();
    assert_eq!(frees, [free, free], "each failure of the episode");
    let actions: Vec<&str> = s["traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions.iter().filter(|a| **a == "oom").count(), 2, "{actions:?}");
    assert!(
        actions.contains(&"free_completed"),
        "the cache freed before the retry: {actions:?}"
    );
}

/// The driver's free memory in the run's one `oom` report, checked to be
/// known and above zero (the simulated device has room left for smaller
/// requests than the one that failed).
fn oom_report_free(reports: &[cudaleak_core::report::Report]) -> u64 {
    let oom: Vec<&cudaleak_core::report::Report> =
        reports.iter().filter(|r| r.trigger.name() == "oom").collect();
    assert_eq!(oom.len(), 1, "one oom report");
    let free = oom[0]
        .oom
        .as_ref()
        .and_then(|o| o.device_free_bytes)
        .expect("the oom report knows the free memory");
    assert!(free > 0, "free memory after the failure: {free}");
    free
}

/// Headless Chromium, as tests/html.rs finds it.
fn chromium() -> Option<PathBuf> {
    std::env::var_os("CUDALEAK_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            find_in_path(&[
                "chromium",
                "chromium-browser",
                "chromium-headless-shell",
                "google-chrome",
            ])
        })
}

/// speedscope's release build from tests/speedscope (npm ci, from its
/// lock file, in scripts/install-test-deps.sh).
fn speedscope_release() -> Option<PathBuf> {
    let dir = repo().join("tests/speedscope/node_modules/speedscope/dist/release");
    if dir.join("index.html").is_file() {
        return Some(dir);
    }
    None
}

/// A static file server on 127.0.0.1 for one test: speedscope loads the
/// profile named by `#profileURL=` with fetch(), which file:// pages may
/// not do. `files` maps a URL path to a file.
fn serve(files: Vec<(String, PathBuf)>) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).map_or(true, |n| n == 0) || header == "\r\n" {
                    break;
                }
            }
            let path = request
                .split_whitespace()
                .nth(1)
                .unwrap_or("/")
                .split(['?', '#'])
                .next()
                .unwrap_or("/")
                .to_string();
            let mut stream = &stream;
            match files
                .iter()
                .find(|(p, _)| *p == path)
                .and_then(|(_, f)| std::fs::read(f).ok())
            {
                Some(body) => {
                    let kind = match path.rsplit('.').next() {
                        Some("html") => "text/html",
                        Some("js") => "text/javascript",
                        Some("css") => "text/css",
                        Some("json") => "application/json",
                        Some("wasm") => "application/wasm",
                        Some("png") => "image/png",
                        _ => "application/octet-stream",
                    };
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(&body);
                }
                None => {
                    let _ = stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            }
        }
    });
    port
}

#[test]
#[ignore = "needs Chromium and speedscope (npm ci --prefix tests/speedscope); scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn speedscope_itself_opens_the_export_and_shows_our_bytes() {
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let release = required(
        speedscope_release(),
        "speedscope (npm ci --prefix tests/speedscope)",
    );
    let out = planted();
    let profile = out.dir.path().join("leaks.speedscope.json");
    std::fs::write(
        &profile,
        export(&["report", "--format", "speedscope", "."], out.dir.path()),
    )
    .unwrap();
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&release)
        .unwrap()
        .flatten()
        .map(|e| (format!("/{}", e.file_name().to_string_lossy()), e.path()))
        .collect();
    files.push(("/leaks.json".into(), profile));
    let port = serve(files);
    let wanted = [
        "400 B (57%) 0 B (&lt;0.01%) site_b",
        "300 B (43%) 0 B (&lt;0.01%) site_a",
        "700 B (100%) 700 B (100%) cudaMalloc",
    ];
    // speedscope fills the sandwich table after the profile's fetch and
    // a layout pass. In one CI run of a loaded 2-CPU machine the dump at
    // the end of the virtual-time budget came before the rows (the
    // table's header alone), and the test passed alone at once: up to
    // three tries, each with a profile of its own, the last one asserted.
    let mut dom = String::new();
    for _ in 0..3 {
        let profile_dir = TempDir::new("speedscope-chrome");
        let mut cmd = Command::new(&chrome);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.path().display()))
        // The sandwich view lists every function with its total and self
        // weight as text; the flame graphs are canvases.
        .arg(format!(
            "http://127.0.0.1:{port}/index.html#profileURL=http://127.0.0.1:{port}/leaks.json&view=sandwich"
        ));
        let (st, out_dom, err) = run_command(cmd, SECS);
        assert!(st.success(), "chromium: {err}");
        dom = out_dom;
        if wanted.iter().all(|w| visible_text(&dom).contains(w)) {
            break;
        }
    }
    let r = out.report();
    let text = visible_text(&dom);
    assert!(
        text.contains(&format!(
            "cudaleak: {}, pid {} - speedscope",
            r.hostname.as_deref().unwrap(),
            r.pid
        )),
        "speedscope named the file as its title: {text}"
    );
    for want in wanted {
        assert!(text.contains(want), "{want:?} in speedscope's table: {text}");
    }
}

/// A dumped DOM's text: the tags left out, white space made one space.
fn visible_text(dom: &str) -> String {
    let text = dom
        .split('<')
        .map(|piece| piece.split_once('>').map_or(piece, |(_, t)| t))
        .collect::<Vec<_>>()
        .join(" ");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn allocation_trace_of_a_fork_child_holds_its_own_events_only() {
    let out = run_traced(&program("fork_trace"), &[], &[("CUDALEAK_TRACE", "16")]);
    out.assert_success();
    let reports = out.reports();
    assert_eq!(reports.len(), 2, "{}", out.stderr);
    for r in reports {
        let want: &[u64] = if r.leaked_bytes() == 111 { &[111] } else { &[222] };
        let t = r.allocation_trace.expect("allocation_trace");
        let sizes: Vec<u64> = t.events.iter().map(|e| e.size).collect();
        assert_eq!(sizes, want, "pid {}", r.pid);
        assert_eq!(t.recorded, 1);
    }
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn pprof_of_a_python_program_has_its_python_lines_in_the_stacks() {
    let go = required(go(), "go (apt-get install golang-go)");
    let script = repo().join("tests/python/export_leaks.py");
    let runtime = sim_dir().join("libcudart.so.12");
    let out = run_traced(
        &python(),
        &[script.to_str().unwrap()],
        &[
            ("SIMCUDA_RUNTIME", runtime.to_str().unwrap()),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ],
    );
    out.assert_success();
    let file = out.dir.path().join("py.pb.gz");
    std::fs::write(
        &file,
        export(&["report", "--format", "pprof", "."], out.dir.path()),
    )
    .unwrap();
    let top = pprof_top(&go, &file, &["-cum", "-lines", "-unit=B"]);
    assert!(top.contains("of 13000B total"), "{top}");
    let py = "tests/python/export_leaks.py";
    for (function, marker, bytes) in [
        ("load_weights", "# LEAK weights", "10000B"),
        ("train_step", "# LEAK step", "3000B"),
    ] {
        let at = format!("{function} {}:{}", script.display(), line_of(py, marker));
        let line = top
            .lines()
            .find(|l| l.ends_with(&at))
            .unwrap_or_else(|| panic!("{at} in:\n{top}"));
        assert_eq!(line.split_whitespace().nth(3), Some(bytes), "{line}");
    }
    // The main binary pprof names is the interpreter, not a library.
    let python_name = python().file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        top.lines().next().is_some_and(|l| l.starts_with("File: python")),
        "{python_name}:\n{top}"
    );
}

#[test]
fn trace_marks_every_dump_of_a_process() {
    // live phases: a cudaleak_dump() after each of four phases, then the
    // exit dump. The export holds the newest (exit) report; the trace
    // marks all five dumps.
    let out = run_traced(&program("live"), &["phases"], &[]);
    out.assert_success();
    let reports = out.reports();
    assert_eq!(reports.len(), 5, "{}", out.stderr);
    let events = trace_of(&["report", "--format", "trace", "."], out.dir.path());
    let mut marks: Vec<(i64, &str)> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("dump: "))
        .map(|e| (e["ts"].as_i64().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    marks.sort();
    let names: Vec<&str> = marks.iter().map(|m| m.1).collect();
    assert_eq!(
        names,
        ["dump: api", "dump: api", "dump: api", "dump: api", "dump: exit"]
    );
    let mut want: Vec<i64> = reports.iter().map(|r| r.timestamp_ms * 1000).collect();
    want.sort();
    assert_eq!(marks.iter().map(|m| m.0).collect::<Vec<_>>(), want);
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn top_keeps_the_largest_groups_and_the_rest_as_one() {
    let go = required(go(), "go (apt-get install golang-go)");
    let out = planted();
    let file = out.dir.path().join("top.pb.gz");
    std::fs::write(
        &file,
        export(
            &["report", "--format", "pprof", "--top", "1", "."],
            out.dir.path(),
        ),
    )
    .unwrap();
    let top = pprof_top(&go, &file, &[]);
    assert!(top.contains("of 700B total"), "totals stay the report's:\n{top}");
    assert_eq!(top_row(&top, "site_b").0, "400B", "{top}");
    let other = top
        .lines()
        .find(|l| l.ends_with("[1 other group]"))
        .unwrap_or_else(|| panic!("{top}"));
    assert!(other.trim_start().starts_with("300B"), "{other}");
    assert!(!top.contains("site_a"), "{top}");
}

#[test]
#[ignore = "needs script (util-linux) for a terminal; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn binary_exports_are_not_written_to_a_terminal() {
    // `script` (util-linux) gives the command a terminal as stdout.
    let script = required(find_in_path(&["script"]), "script (apt-get install bsdutils)");
    let out = planted();
    for format in ["pprof", "torch-snapshot"] {
        let line = format!("'{}' report --format {format} .", cli().display());
        let mut cmd = Command::new(&script);
        cmd.args(["-qec", &line, "/dev/null"])
            .current_dir(out.dir.path())
            .env("LD_LIBRARY_PATH", sim_dir());
        let (st, text, _) = run_command(cmd, SECS);
        assert_eq!(st.code(), Some(2), "{format}: {text}");
        assert!(
            text.contains("cudaleak: binary output not written to a terminal"),
            "{format}: {text:?}"
        );
    }
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn a_merged_report_file_exports_without_one_process_labels() {
    let go = required(go(), "go (apt-get install golang-go)");
    let d = TempDir::new("export-merged");
    ranks(&d);
    let merged = export(&["merge", "--format", "json", "ranks"], d.path());
    std::fs::write(d.path().join("merged.json"), merged).unwrap();
    let file = d.path().join("merged.pb.gz");
    std::fs::write(
        &file,
        export(&["report", "--format", "pprof", "merged.json"], d.path()),
    )
    .unwrap();
    let top = pprof_top(&go, &file, &[]);
    assert!(top.contains("of 700B total"), "{top}");
    assert!(top.contains("merged report of 4 files"), "{top}");
    let mut cmd = Command::new(&go);
    cmd.args(["tool", "pprof", "-tags"]).arg(&file);
    let (st, tags, err) = run_command(cmd, SECS);
    assert!(st.success(), "{err}");
    assert!(
        !tags.contains("pid:") && !tags.contains("rank:"),
        "a merge is no one process:\n{tags}"
    );
    assert!(tags.contains("memory: Total 700"), "{tags}");
}

/// sixty_helper (tests/python/sixty_helper.py and its C twin): site i
/// (function augment_i) leaks (i + 1) x 64 KiB through one helper, `raw`.
const SIXTY_UNIT: u64 = 64 * 1024;
/// 1830 x 64 KiB: what the sixty sites leak in all.
const SIXTY_TOTAL: u64 = 1830 * SIXTY_UNIT;

fn sixty_python(env: &[(&str, &str)]) -> support::Outcome {
    let out = support::run_test_python("sixty_helper.py", env);
    out.assert_success();
    out
}

fn sixty_c(env: &[(&str, &str)]) -> support::Outcome {
    let out = run_traced(&program("sixty_helper"), &[], env);
    out.assert_success();
    out
}

/// The line of each site of a sixty_helper source, site 0 first: in C
/// the lines starting with `SITE(`, in Python those marked `# SITE i`.
fn sixty_site_lines(file: &str) -> Vec<i64> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut sites: Vec<(u64, i64)> = text
        .lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let n = match l.strip_prefix("SITE(") {
                Some(rest) => rest.strip_suffix(')')?,
                None => l.split("# SITE ").nth(1)?,
            };
            Some((n.trim().parse().ok()?, i as i64 + 1))
        })
        .collect();
    sites.sort();
    assert_eq!(
        sites.iter().map(|s| s.0).collect::<Vec<_>>(),
        (0..60).collect::<Vec<_>>(),
        "{file}"
    );
    sites.into_iter().map(|s| s.1).collect()
}

/// The site a name is of: the N of its one `augment_N`.
fn augment_of(name: &str) -> Option<u64> {
    let mut found = name.match_indices("augment_").map(|(at, m)| {
        let digits: String = name[at + m.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<u64>().ok()
    });
    let first = found.next()??;
    assert!(found.next().is_none(), "one site in {name:?}");
    Some(first)
}

/// The trace of a sixty_helper run has one counter track per call site:
/// sixty distinct (name, id), each named by its group label (the helper
/// and the site that called it), each ending at its site's bytes.
fn check_sixty_trace(out: &support::Outcome, source: &str, file_name: &str) {
    let events = trace_of(&["report", "--format", "trace", "."], out.dir.path());
    let lines = sixty_site_lines(source);
    // Each (name, id)'s last value: events are in time order.
    let mut last: Vec<((String, Option<String>), u64)> = Vec::new();
    for e in events.iter().filter(|e| e["ph"] == "C") {
        let name = e["name"].as_str().unwrap();
        if name == "live bytes" || name == "other call sites" {
            continue;
        }
        let key = (name.to_string(), e["id"].as_str().map(str::to_string));
        let bytes = e["args"]["bytes"].as_u64().unwrap_or_else(|| panic!("{e}"));
        match last.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = bytes,
            None => last.push((key, bytes)),
        }
    }
    assert_eq!(
        last.len(),
        60,
        "one track per call site, not {}:\n{:#?}",
        last.len(),
        last.iter().map(|l| &l.0).collect::<Vec<_>>()
    );
    let mut seen = Vec::new();
    for ((name, id), bytes) in &last {
        assert!(id.is_some(), "a site's counter carries an id: {name}");
        let n = augment_of(name).unwrap_or_else(|| panic!("no augment_N in {name:?}"));
        let at = format!("augment_{n} {file_name}:{}", lines[n as usize]);
        assert!(name.contains(&at), "{at} in {name:?}");
        assert!(name.starts_with("cudaMalloc"), "{name}");
        assert_eq!(*bytes, (n + 1) * SIXTY_UNIT, "{name}");
        seen.push(n);
    }
    seen.sort();
    assert_eq!(seen, (0..60).collect::<Vec<_>>());
    let peak = events
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == "peak")
        .expect("the peak");
    let largest = peak["args"]["largest"].as_str().unwrap();
    assert_eq!(augment_of(largest), Some(59), "{peak}");
}

#[test]
fn trace_of_sixty_python_call_sites_through_one_helper_has_sixty_tracks() {
    let src = "tests/python/sixty_helper.py";
    let timed = sixty_python(&[("CUDALEAK_TIMELINE", "10ms")]);
    assert!(timed.report().timeline.is_some_and(|t| !t.samples.is_empty()));
    check_sixty_trace(&timed, src, "sixty_helper.py");
    let plain = sixty_python(&[]);
    assert!(plain.report().timeline.is_none());
    check_sixty_trace(&plain, src, "sixty_helper.py");
}

#[test]
fn trace_of_sixty_c_call_sites_through_one_helper_has_sixty_tracks() {
    let src = "tests/c/sixty_helper.c";
    let timed = sixty_c(&[("CUDALEAK_TIMELINE", "10ms")]);
    assert!(timed.report().timeline.is_some_and(|t| !t.samples.is_empty()));
    check_sixty_trace(&timed, src, "sixty_helper.c");
    let plain = sixty_c(&[]);
    assert!(plain.report().timeline.is_none());
    check_sixty_trace(&plain, src, "sixty_helper.c");
}

/// `cudaleak ARGS` run in `dir`, its output written to `dir/NAME`.
fn export_to(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, export(args, dir)).unwrap();
    file
}

/// Rows of `go tool pprof -top -unit=B -nodefraction=0`: exact bytes,
/// no row dropped.
fn pprof_top_bytes(go: &Path, file: &Path) -> String {
    pprof_top(go, file, &["-unit=B", "-nodefraction=0", "-edgefraction=0"])
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn pprof_of_a_python_program_folds_the_interpreter_and_names_its_module() {
    let go = required(go(), "go (apt-get install golang-go)");
    let out = sixty_python(&[]);
    let file = export_to(
        out.dir.path(),
        "sixty.pb.gz",
        &["report", "--format", "pprof", "."],
    );
    let top = pprof_top_bytes(&go, &file);
    let total = format!("{SIXTY_TOTAL}B");
    assert!(top.contains(&format!("of {total} total")), "{top}");
    for machinery in ["libffi", "_ctypes", "_PyEval", "PyCFuncPtr", "_start"] {
        assert!(
            !top.contains(machinery),
            "{machinery} is folded away as the text folds it:\n{top}"
        );
    }
    // The helper holds it all: the innermost frame of the program.
    assert_eq!(top_row(&top, "raw"), (total.as_str(), total.as_str()), "{top}");
    assert_eq!(top_row(&top, "augment_59"), ("0", "3932160B"), "{top}");
    assert_eq!(top_row(&top, "augment_0"), ("0", "65536B"), "{top}");
    // `<module>` would read `<unknown>`: pprof strips `<...>` as C++
    // template parameters.
    assert_eq!(top_row(&top, "sixty_helper.<module>").1, total, "{top}");
    assert!(!top.contains("<unknown>"), "{top}");
    // The module's file and line stay the frame's.
    let lines = pprof_top(&go, &file, &["-unit=B", "-nodefraction=0", "-lines"]);
    let script = repo().join("tests/python/sixty_helper.py");
    let call = lines_of("tests/python/sixty_helper.py", "globals()[")[0];
    let at = format!("sixty_helper.<module> {}:{call}", script.display());
    assert!(lines.lines().any(|l| l.ends_with(&at)), "{at} in:\n{lines}");

    // --full-stacks: every frame, for `report` and `merge` alike.
    for command in ["report", "merge"] {
        let full = export_to(
            out.dir.path(),
            &format!("{command}-full.pb.gz"),
            &[command, "--format", "pprof", "--full-stacks", "."],
        );
        let top = pprof_top_bytes(&go, &full);
        let libffi = top
            .lines()
            .find(|l| l.contains("libffi.so"))
            .unwrap_or_else(|| panic!("{command} --full-stacks keeps libffi:\n{top}"));
        assert!(libffi.trim_start().starts_with(&total), "{libffi}");
        assert!(top.contains("_ctypes_callproc"), "{top}");
        assert_eq!(top_row(&top, "augment_59"), ("0", "3932160B"), "{top}");
        assert_eq!(top_row(&top, "sixty_helper.<module>").1, total, "{top}");
    }
}

#[test]
#[ignore = "needs go (golang-go) for `go tool pprof`; scripts/test.sh runs it (cargo test --test exports -- --ignored)"]
fn pprof_of_sixty_c_call_sites_through_one_helper() {
    let go = required(go(), "go (apt-get install golang-go)");
    let out = sixty_c(&[]);
    let file = export_to(
        out.dir.path(),
        "sixty.pb.gz",
        &["report", "--format", "pprof", "."],
    );
    let top = pprof_top_bytes(&go, &file);
    let total = format!("{SIXTY_TOTAL}B");
    assert!(top.contains(&format!("of {total} total")), "{top}");
    assert_eq!(top_row(&top, "raw"), (total.as_str(), total.as_str()), "{top}");
    assert_eq!(top_row(&top, "augment_59"), ("0", "3932160B"), "{top}");
    assert_eq!(top_row(&top, "main").1, total, "{top}");
    assert!(!top.contains("_start"), "program start folded away:\n{top}");
    // The program is the profile's binary.
    assert!(top.starts_with("File: sixty_helper"), "{top}");
}

/// The names of the frames of a speedscope export's samples.
fn speedscope_frame_names(v: &Value) -> Vec<String> {
    let frames = v["shared"]["frames"].as_array().unwrap();
    let mut names: Vec<String> = v["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["samples"].as_array().unwrap())
        .flat_map(|s| s.as_array().unwrap())
        .map(|i| {
            frames[i.as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn speedscope_of_a_python_program_folds_the_interpreter_unless_full_stacks() {
    let out = sixty_python(&[]);
    let folded: Value = serde_json::from_slice(&export(
        &["report", "--format", "speedscope", "."],
        out.dir.path(),
    ))
    .unwrap();
    let names = speedscope_frame_names(&folded);
    assert!(
        !names.iter().any(|n| n.contains("libffi")
            || n.starts_with("_PyEval")
            || n == "ffi_call"
            || n.starts_with("_ctypes")
            || n == "PyCFuncPtr_call"),
        "{names:?}"
    );
    for want in ["<module>", "augment_59", "raw", "cudaMalloc"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    // Each sample: <module>, the site, the helper, the API.
    let p = &folded["profiles"][0];
    assert_eq!(p["endValue"], SIXTY_TOTAL);
    let frames = folded["shared"]["frames"].as_array().unwrap();
    let first: Vec<&str> = p["samples"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| frames[i.as_u64().unwrap() as usize]["name"].as_str().unwrap())
        .collect();
    assert_eq!(first, ["<module>", "augment_59", "raw", "cudaMalloc"]);

    for command in ["report", "merge"] {
        let full: Value = serde_json::from_slice(&export(
            &[command, "--format", "speedscope", "--full-stacks", "."],
            out.dir.path(),
        ))
        .unwrap();
        let names = speedscope_frame_names(&full);
        assert!(
            names.iter().any(|n| n.contains("libffi")) && names.iter().any(|n| n == "_ctypes_callproc"),
            "{command} --full-stacks keeps every frame: {names:?}"
        );
    }
}
