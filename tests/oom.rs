//! Running out of memory and the peak, on the simulated driver
//! with a device of 64 MiB (SIMCUDA_DEVICE_BYTES): real processes under
//! the library, exact blocks, bytes, lines, and device memory.

mod support;

use cudaleak_core::report::{Group, Report, Trigger};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

const OOM_C: &str = "tests/c/oom.c";
const MIB: u64 = 1 << 20;
const DEVICE: &str = "67108864"; // 64 MiB
const SECS: Duration = Duration::from_secs(60);

fn device() -> (&'static str, &'static str) {
    ("SIMCUDA_DEVICE_BYTES", DEVICE)
}

fn oom_program() -> std::path::PathBuf {
    program("oom")
}

fn by_trigger(reports: &[Report], t: Trigger) -> Vec<&Report> {
    reports.iter().filter(|r| r.trigger == t).collect()
}

/// (function, file name, line) of a native frame.
fn frame(g_native: &[cudaleak_core::report::NativeFrame], i: usize) -> (String, String, i64) {
    let f = &g_native[i];
    (
        f.function.clone().unwrap_or_default(),
        f.file
            .as_deref()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap()
            .to_string(),
        f.line.unwrap_or(-1),
    )
}

fn at(function: &str, line: i64) -> (String, String, i64) {
    (function.to_string(), "oom.c".to_string(), line)
}

/// The group whose innermost frame is `function`.
fn group<'a>(groups: &'a [Group], function: &str) -> &'a Group {
    groups
        .iter()
        .find(|g| g.native_stack.first().and_then(|f| f.function.as_deref()) == Some(function))
        .unwrap_or_else(|| {
            panic!(
                "no group at {function}: {:?}",
                groups
                    .iter()
                    .map(|g| frame(&g.native_stack, 0))
                    .collect::<Vec<_>>()
            )
        })
}

/// (blocks, bytes, innermost frame) of each group, largest first.
fn shape(groups: &[Group]) -> Vec<(u64, u64, (String, String, i64))> {
    groups
        .iter()
        .map(|g| (g.blocks, g.bytes, frame(&g.native_stack, 0)))
        .collect()
}

fn file_name(dir: &Path, r: &Report) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(&format!(".{}.{}.json", r.sequence, r.trigger.name())))
        .unwrap()
}

#[test]
fn an_oom_report_holds_what_was_live_before_the_program_reacted() {
    let oom = oom_program();
    // The program's output and status are its own.
    let (out, plain) = run_traced_and_untraced(&oom, &["oom"], &[device()]);
    assert_eq!(out.stdout, plain.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        out.stdout,
        "request of 41943040 bytes: rc=2 errno=1234 out=(nil)\n".repeat(2),
        "the same status, and errno as the program set it"
    );

    let reports = out.reports();
    let ooms = by_trigger(&reports, Trigger::Oom);
    assert_eq!(ooms.len(), 1, "one report for the failure and its retry");
    let r = ooms[0];
    assert_eq!(r.sequence, 1);
    let o = r.oom.as_ref().unwrap();
    assert_eq!(o.api, "cudaMalloc", "one failure, at the runtime's level");
    assert_eq!(o.requested_bytes, 40 * MIB);
    assert_eq!(o.failed_calls, 2, "the retry within a second counts in it");
    assert_eq!(
        r.totals.failed_allocations, o.failed_calls,
        "the report's totals count the episode's failures as its `oom` does"
    );
    assert_eq!(o.device, Some(0));
    assert_eq!(
        o.device_free_bytes,
        Some(8 * MIB),
        "64 MiB less weights and cache"
    );
    assert_eq!(o.device_total_bytes, Some(64 * MIB));
    assert_eq!(
        frame(&o.native_stack, 0),
        at("request", line_of(OOM_C, "/* REQUEST */"))
    );
    assert_eq!(frame(&o.native_stack, 1).0, "main");
    assert!(o.python_stack.is_empty());
    // What was live at the failure, before the program freed its cache.
    assert_eq!(
        shape(&r.leaks),
        [
            (1, 32 * MIB, at("load_weights", line_of(OOM_C, "/* WEIGHTS */"))),
            (4, 24 * MIB, at("fill_cache", line_of(OOM_C, "/* CACHE */"))),
        ]
    );
    assert_eq!((r.totals.live_blocks, r.totals.live_bytes), (5, 56 * MIB));
    assert_eq!(r.peak.as_ref().unwrap().bytes, 56 * MIB);
    let oom_file = file_name(out.dir.path(), r);
    assert_eq!(r.oom_events.len(), 1);
    assert_eq!(r.oom_events[0].report.as_deref(), Some(oom_file.as_str()));
    assert_eq!(r.oom_events[0].timestamp_ms, o.timestamp_ms);
    assert_eq!(
        r.timestamp_ms, o.timestamp_ms,
        "the report shows the moment of the failure"
    );

    // The exit report is still the exit report.
    let exits = by_trigger(&reports, Trigger::Exit);
    assert_eq!(exits.len(), 1);
    let e = exits[0];
    assert_eq!((e.sequence, e.exit_status), (2, Some(1)));
    assert_eq!(
        shape(&e.leaks),
        [(1, 32 * MIB, at("load_weights", line_of(OOM_C, "/* WEIGHTS */")))]
    );
    let t = &e.totals;
    assert_eq!(
        (
            t.allocations,
            t.frees,
            t.failed_allocations,
            t.live_bytes,
            t.peak_bytes
        ),
        (5, 4, 2, 32 * MIB, 56 * MIB)
    );
    let ev = &e.oom_events;
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (
            ev[0].api.as_str(),
            ev[0].requested_bytes,
            ev[0].failed_calls,
            ev[0].device
        ),
        ("cudaMalloc", 40 * MIB, 2, Some(0))
    );
    assert_eq!(ev[0].report.as_deref(), Some(oom_file.as_str()));

    // One line on stderr, then the groups (two here), before the exit summary.
    let path = out.dir.path().join(&oom_file);
    let lines: Vec<&str> = out.stderr.lines().collect();
    let first = lines.iter().position(|l| l.contains("out of memory")).unwrap();
    assert_eq!(
        lines[first],
        format!(
            "cudaleak: out of memory: cudaMalloc of 40.0 MiB at request oom.c:{} failed (2 failed calls within 1 s) \
             (device 0: free 8.0 MiB of 64.0 MiB); this process holds 56.0 MiB in 5 blocks; report: {}",
            line_of(OOM_C, "/* REQUEST */"),
            path.display()
        )
    );
    assert_eq!(
        lines[first + 1..first + 3],
        [
            format!(
                "cudaleak:   32.0 MiB in 1 block: cudaMalloc (device memory) at load_weights oom.c:{}",
                line_of(OOM_C, "/* WEIGHTS */")
            ),
            format!(
                "cudaleak:   24.0 MiB in 4 blocks: cudaMalloc (device memory) at fill_cache oom.c:{}",
                line_of(OOM_C, "/* CACHE */")
            ),
        ]
    );
    assert!(lines[first + 3].starts_with("====="), "{}", out.stderr);

    // The text report: the failed request first, then what held memory.
    let text = Command::new(cli()).arg("report").arg(&path).output().unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let body: Vec<&str> = text.lines().skip_while(|l| !l.is_empty()).skip(1).collect();
    assert!(
        body[0].starts_with("Out of memory: cudaMalloc of 40.0 MiB (41943040 bytes) failed at +")
            && body[0].ends_with(" (device 0: free 8.0 MiB of 64.0 MiB); 2 failed calls within 1 s:"),
        "{text}"
    );
    assert!(
        body[1].contains(" in request ")
            && body[1].ends_with(&format!("oom.c:{}", line_of(OOM_C, "/* REQUEST */")))
    );
    assert!(text.contains("What this process held at that moment: 56.0 MiB (58720256 bytes) in 5 blocks."));
    assert!(text.contains("\nAt the peak (56.0 MiB at +"), "{text}");
}

#[test]
fn the_oom_report_is_written_while_the_process_runs() {
    let mut p = spawn_traced(&oom_program(), &["oom", "6"], &[device()]);
    // Within the second of the episode, and a little more for the dumper,
    // while the program sleeps 6 s after its failures.
    let reports = p.wait_reports(1, Duration::from_secs(30));
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "the oom report came only at exit"
    );
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].trigger, Trigger::Oom);
    assert_eq!(reports[0].oom.as_ref().unwrap().failed_calls, 2);
    let (status, dir, lines) = p.wait(SECS);
    assert_eq!(status.code(), Some(1));
    assert_eq!(lines, ["request of 41943040 bytes: rc=2 errno=1234 out=(nil)"; 2]);
    let all = reports_in(dir.path());
    assert_eq!(
        all.iter().map(|r| r.trigger).collect::<Vec<_>>(),
        [Trigger::Oom, Trigger::Exit]
    );
}

#[test]
fn an_oom_from_python_names_the_python_line() {
    let script = repo().join("tests/python/oom.py");
    let out = run_test_python("oom.py", &[device()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert_eq!(out.stdout, "request of 41943040 bytes: rc=2\n".repeat(2));
    let reports = out.reports();
    let ooms = by_trigger(&reports, Trigger::Oom);
    assert_eq!(ooms.len(), 1, "{}", out.stderr);
    let o = ooms[0].oom.as_ref().unwrap();
    assert_eq!(
        (o.api.as_str(), o.requested_bytes, o.failed_calls),
        ("cudaMalloc", 40 * MIB, 2)
    );
    assert_eq!(
        (o.device_free_bytes, o.device_total_bytes),
        (Some(8 * MIB), Some(64 * MIB))
    );
    let py: Vec<(String, String, i64)> = o
        .python_stack
        .iter()
        .map(|f| {
            (
                f.function.clone(),
                f.file.rsplit('/').next().unwrap().to_string(),
                f.line.unwrap_or(-1),
            )
        })
        .collect();
    let l = |m: &str| line_of("tests/python/oom.py", m);
    assert_eq!(
        py[0],
        ("request".to_string(), "oom.py".to_string(), l("# OOM request"))
    );
    assert_eq!(py[1].0, "step");
    assert_eq!(py[2].0, "main");
    assert_eq!(py.last().unwrap().0, "<module>");
    assert!(!o.merged_stack.is_empty());
    // The weights and the cache, by their Python lines.
    let by_line = |marker: &str| {
        ooms[0]
            .leaks
            .iter()
            .find(|g| g.python_stack.iter().any(|f| f.line == Some(l(marker))))
            .map(|g| (g.blocks, g.bytes))
    };
    assert_eq!(by_line("# OOM weights"), Some((1, 32 * MIB)));
    assert_eq!(by_line("# OOM cache"), Some((4, 24 * MIB)));
    // The stderr line names the Python line.
    assert!(
        out.stderr.contains(&format!(
            "cudaleak: out of memory: cudaMalloc of 40.0 MiB at request {}:{} failed",
            // The file's name, as group labels name it.
            script.file_name().unwrap().to_string_lossy(),
            l("# OOM request")
        )),
        "{}",
        out.stderr
    );
    let exit = by_trigger(&reports, Trigger::Exit);
    assert_eq!(exit.len(), 1);
    assert_eq!(exit[0].totals.failed_allocations, 2);
}

#[test]
fn the_peak_holds_what_was_freed_since_and_not_what_came_later() {
    let out = run_traced(&oom_program(), &["peak"], &[device()]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.trigger, Trigger::Exit);
    let peak = r.peak.as_ref().unwrap();
    assert_eq!(peak.bytes, r.totals.peak_bytes);
    assert_eq!(peak.bytes, 18 * MIB);
    assert_eq!(
        shape(&peak.groups),
        [
            (1, 10 * MIB, at("load_weights", line_of(OOM_C, "/* WEIGHTS */"))),
            (8, 8 * MIB, at("forward", line_of(OOM_C, "/* ACTIVATION */"))),
        ]
    );
    assert_eq!(
        peak.groups.iter().map(|g| g.bytes).sum::<u64>(),
        r.totals.peak_bytes
    );
    assert!(peak.groups_left_out.is_none());
    // The later block is a leak, not part of the peak.
    assert_eq!(group(&r.leaks, "later").bytes, 64 << 10);
    assert!(peak.timestamp_ms <= r.timestamp_ms && peak.timestamp_ms > r.timestamp_ms - 60_000);
    assert!(r.oom_events.is_empty());
    // The text report's short section.
    let file = out.dir.path().join(file_name(out.dir.path(), &r));
    let text = Command::new(cli()).arg("report").arg(&file).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    let start = text
        .find("At the peak (18.0 MiB at +")
        .unwrap_or_else(|| panic!("{text}"));
    let section: Vec<&str> = text[start..].lines().take(3).collect();
    assert_eq!(
        section[1..],
        [
            format!(
                "  10.0 MiB in 1 block: cudaMalloc (device memory) at load_weights oom.c:{}",
                line_of(OOM_C, "/* WEIGHTS */")
            ),
            format!(
                "  8.0 MiB in 8 blocks: cudaMalloc (device memory) at forward oom.c:{}",
                line_of(OOM_C, "/* ACTIVATION */")
            ),
        ]
    );
}

#[test]
fn an_oom_storm_from_8_threads_writes_a_bounded_set_of_reports() {
    let out = run_traced(&oom_program(), &["storm", "4.5"], &[device()]);
    out.assert_success();
    let failed: u64 = out
        .stdout
        .trim()
        .strip_prefix("failed calls: ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(failed > 8, "{failed}");
    let reports = out.reports();
    let ooms = by_trigger(&reports, Trigger::Oom);
    assert_eq!(ooms.len(), 3, "CUDALEAK_OOM_REPORTS's default");
    let exits = by_trigger(&reports, Trigger::Exit);
    assert_eq!(exits.len(), 1, "the exit report is not lost");
    assert_eq!(reports.len(), 4);
    let e = exits[0];
    assert_eq!(
        e.totals.failed_allocations, failed,
        "every failed call counted once"
    );
    let events = &e.oom_events;
    // 4.5 s of failures: an episode starts at most each second (a stall
    // of every thread may push one later).
    assert!((4..=6).contains(&events.len()), "{events:#?}");
    assert_eq!(events.iter().map(|ev| ev.failed_calls).sum::<u64>(), failed);
    for (i, ev) in events.iter().enumerate() {
        assert_eq!((ev.api.as_str(), ev.requested_bytes), ("cudaMalloc", 1024 * MIB));
        if i < 3 {
            let name = ev.report.as_deref().unwrap();
            let r = ooms
                .iter()
                .find(|r| file_name(out.dir.path(), r) == name)
                .unwrap_or_else(|| panic!("{name} is not in the directory"));
            let o = r.oom.as_ref().unwrap();
            assert_eq!(
                (o.failed_calls, o.timestamp_ms),
                (ev.failed_calls, ev.timestamp_ms)
            );
            assert_eq!(frame(&o.native_stack, 0).0, "storm_worker");
        } else {
            assert_eq!(ev.report, None, "past the cap");
        }
    }
    // A second apart at least (the window is on the monotonic clock; the
    // timestamps, Unix ms, may round 1 ms the other way).
    for w in events.windows(2) {
        assert!(w[1].timestamp_ms >= w[0].timestamp_ms + 999, "{events:#?}");
    }
    // Each stderr line per report, no more.
    assert_eq!(out.stderr_lines_with("cudaleak: out of memory:").len(), 3);
}

#[test]
fn cudaleak_oom_reports_caps_the_reports_and_0_turns_them_off() {
    let out = run_traced(
        &oom_program(),
        &["oom"],
        &[device(), ("CUDALEAK_OOM_REPORTS", "0")],
    );
    assert_eq!(out.status.code(), Some(1));
    let r = out.report();
    assert_eq!(r.trigger, Trigger::Exit);
    assert_eq!(r.oom_events.len(), 1, "the episode is still listed");
    assert_eq!(
        (r.oom_events[0].failed_calls, r.oom_events[0].report.as_deref()),
        (2, None)
    );
    assert!(
        out.stderr_lines_with("out of memory").is_empty(),
        "{}",
        out.stderr
    );

    let out = run_traced(
        &oom_program(),
        &["oom"],
        &[device(), ("CUDALEAK_OOM_REPORTS", "lots")],
    );
    assert_eq!(out.status.code(), Some(1));
    let warnings = out.stderr_lines_with("CUDALEAK_OOM_REPORTS");
    assert_eq!(
        warnings,
        ["cudaleak: ignoring CUDALEAK_OOM_REPORTS=\"lots\" (expected a count, 0 to 1000); using the default, 3"]
    );
    assert_eq!(by_trigger(&out.reports(), Trigger::Oom).len(), 1);
}

#[test]
fn driver_and_vmm_calls_that_run_out_are_reported_at_their_level() {
    let oom = oom_program();
    let (out, plain) = run_traced_and_untraced(&oom, &["driver"], &[device()]);
    out.assert_success();
    assert_eq!(out.stdout, plain.stdout);
    assert_eq!(out.stdout, "cuMemAlloc_v2: rc=2 errno=77\n");
    let reports = out.reports();
    let o = by_trigger(&reports, Trigger::Oom)[0].oom.clone().unwrap();
    assert_eq!(
        (o.api.as_str(), o.requested_bytes, o.device),
        ("cuMemAlloc_v2", 80 * MIB, Some(0))
    );
    assert_eq!(
        (o.device_free_bytes, o.device_total_bytes),
        (Some(64 * MIB), Some(64 * MIB))
    );
    assert_eq!(
        frame(&o.native_stack, 0),
        at("main", line_of(OOM_C, "/* DRIVER REQUEST */"))
    );

    let out = run_traced(&oom, &["vmm"], &[device()]);
    out.assert_success();
    assert_eq!(out.stdout, "cuMemCreate: rc=2\n");
    let reports = out.reports();
    let o = by_trigger(&reports, Trigger::Oom)[0].oom.clone().unwrap();
    assert_eq!(
        (o.api.as_str(), o.requested_bytes, o.device),
        ("cuMemCreate", 80 * MIB, Some(0))
    );
    assert_eq!(o.device_total_bytes, Some(64 * MIB));
    assert_eq!(
        frame(&o.native_stack, 0),
        at("main", line_of(OOM_C, "/* VMM REQUEST */"))
    );
}

#[test]
fn every_allocation_kind_that_runs_out_writes_its_report() {
    let exe = oom_program();
    for (kind, api, requested) in [
        ("async", "cudaMallocAsync", 80 * MIB),
        ("pool", "cudaMallocFromPoolAsync", 80 * MIB),
        ("managed", "cudaMallocManaged", 1 << 50),
        ("host", "cudaMallocHost", 1 << 50),
        ("pitch", "cudaMallocPitch", 100 * MIB),
        ("array", "cudaMallocArray", 128 * MIB),
    ] {
        let out = run_traced(&exe, &["kind", kind], &[device()]);
        out.assert_success();
        assert_eq!(out.stdout, format!("{kind}: rc=2\n"));
        let reports = out.reports();
        let ooms = by_trigger(&reports, Trigger::Oom);
        assert_eq!(ooms.len(), 1, "{kind}: {}", out.stderr);
        let o = ooms[0].oom.as_ref().unwrap();
        assert_eq!(
            (o.api.as_str(), o.requested_bytes, o.failed_calls, o.device),
            (api, requested, 1, Some(0)),
            "{kind}"
        );
        assert_eq!(
            frame(&o.native_stack, 0),
            at("main", line_of(OOM_C, &format!("/* KIND {kind} */"))),
            "{kind}"
        );
        let exit = by_trigger(&reports, Trigger::Exit);
        assert_eq!(
            exit[0].totals.failed_allocations, 1,
            "{kind}: one failure, at one level"
        );
    }
}

fn cli_in(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = cli_command(args, cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (status, stdout, stderr) = run_command(cmd, SECS);
    (status.code(), stdout, stderr)
}

#[test]
fn cudaleak_run_lists_oom_reports_and_its_gate_is_unchanged_by_them() {
    let d = TempDir::new("oom-run");
    let exe = oom_program().display().to_string();
    let reports = d.path().join("reports").display().to_string();
    // The program fails (1) and leaks: its status, not 23.
    let (code, _, stderr) = cli_in(
        &["run", "--fail-on-leak", "--dir", &reports, "--", &exe, "oom"],
        d.path(),
        &[device()],
    );
    assert_eq!(code, Some(1), "{stderr}");
    let listed: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("1 report out of memory:"))
        .collect();
    assert!(listed.len() > 1, "{stderr}");
    assert!(
        listed[1].contains("oom: cudaMalloc of 40.0 MiB failed, 2 calls (holding 56.0 MiB in 5 blocks; ")
            && listed[1].ends_with(".1.oom.json)"),
        "{stderr}"
    );
    // Recovered and freed everything: the gate passes, the report is listed.
    let (code, _, stderr) = cli_in(
        &["run", "--fail-on-leak", "--dir", &reports, "--", &exe, "recover"],
        d.path(),
        &[device()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("cudaleak: 1 report out of memory:"), "{stderr}");
    assert!(
        stderr.contains("cudaleak: 0 bytes leaked in 0 blocks"),
        "{stderr}"
    );
}

#[test]
fn pytorch_presets_merge_the_allocator_settings() {
    let d = TempDir::new("pytorch-flags");
    let show = "echo \"${PYTORCH_CUDA_ALLOC_CONF-unset}|${PYTORCH_NO_CUDA_MEMORY_CACHING-unset}\"";
    let run = |flags: &[&str], conf: Option<&str>| {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", show]);
        let mut cmd = cli_command(&args, d.path());
        match conf {
            Some(c) => cmd.env("PYTORCH_CUDA_ALLOC_CONF", c),
            None => cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF"),
        };
        cmd.env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING");
        let (status, stdout, stderr) = run_command(cmd, SECS);
        (status.code(), stdout.trim().to_string(), stderr)
    };
    assert_eq!(run(&["--pytorch"], None).1, "backend:cudaMallocAsync|unset");
    assert_eq!(
        run(
            &["--pytorch"],
            Some("expandable_segments:True, backend:native,max_split_size_mb:128")
        )
        .1,
        "expandable_segments:True,max_split_size_mb:128,backend:cudaMallocAsync|unset"
    );
    assert_eq!(run(&["--pytorch-no-cache"], None).1, "unset|1");
    assert_eq!(run(&["--pytorch-no-cache"], Some("x:1")).1, "x:1|1");
    let (code, _, stderr) = run(&["--pytorch", "--pytorch-no-cache"], None);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn pytorch_cache_segments_are_labelled_with_the_hint() {
    let exe = torch_cache_program();
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    let r = out.report();
    let segment = r.leaks.iter().find(|g| g.bytes == 20 * MIB).unwrap();
    assert!(segment.pytorch_cache_segment);
    assert_eq!(
        segment.native_stack[0].function.as_deref(),
        Some("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long)")
    );
    let plain = r.leaks.iter().find(|g| g.bytes == MIB).unwrap();
    assert!(!plain.pytorch_cache_segment);
    // The peak says it too.
    let peak = r.peak.as_ref().unwrap();
    assert!(
        peak.groups
            .iter()
            .find(|g| g.bytes == 20 * MIB)
            .unwrap()
            .pytorch_cache_segment
    );
    // Text: the exit summary and `cudaleak report` label it and give the hint, once.
    for text in [out.stderr.clone(), {
        let file = out.dir.path().join(file_name(out.dir.path(), &r));
        String::from_utf8(
            Command::new(cli())
                .arg("report")
                .arg(&file)
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
    }] {
        assert_eq!(
            text.matches("(PyTorch cache segment: memory the caching allocator reserved")
                .count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.matches("hint: groups marked \"PyTorch cache segment\"")
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("cudaleak run --pytorch"), "{text}");
    }
}

/// Threads racing at the peak: what the groups add up to is within 1 % of
/// the peak (the calls in flight, at most one per thread, may be counted
/// on the wrong side of it).
#[test]
fn the_peak_of_racing_threads_is_within_one_percent() {
    let out = run_traced(&program("threads_peak"), &[], &[]);
    out.assert_success();
    let r = out.report();
    let peak = r.peak.as_ref().unwrap();
    assert_eq!(peak.bytes, r.totals.peak_bytes);
    let sum: u64 = peak.groups.iter().map(|g| g.bytes).sum();
    let diff = sum.abs_diff(peak.bytes);
    assert!(diff * 100 <= peak.bytes, "groups {sum}, peak {}", peak.bytes);
    // 1000 to 4000 blocks of 16 KiB, by how the threads overlapped.
    assert!(
        (1000 * 16384..=4000 * 16384).contains(&peak.bytes),
        "{}",
        peak.bytes
    );
    assert!(peak
        .groups
        .iter()
        .all(|g| g.bytes % 16384 == 0 && g.bytes <= 1000 * 16384));
}

/// The first thread to allocate owns the live maps and the live-byte
/// count without locked instructions until a second thread allocates
/// (sole_thread.rs); the switch happens while three threads allocate and
/// free as fast as they can. A lost update would leave the count off by a block
/// (or wrapped below zero), so that the 1 GiB block allocated last would
/// not make the peak exactly 1 GiB, or the maps' counts off. Ten
/// processes, ten switches; the last three on the simulation's threaded
/// backing, the one the threads benchmark uses (no lock of its own, so
/// the threads' calls overlap more).
#[test]
fn the_switch_from_one_allocating_thread_to_two_loses_no_update() {
    const PAIRS: u64 = 40_000; // SOLE_PAIRS in threads_peak.c
    for round in 0..10 {
        let backing = if round < 7 { "default" } else { "threaded" };
        let out = run_traced(
            &program("threads_peak"),
            &["sole"],
            &[("SIMCUDA_BACKING", backing)],
        );
        out.assert_success();
        let r = out.report();
        assert_eq!(r.totals.peak_bytes, 1 << 30);
        assert_eq!(r.peak.as_ref().unwrap().bytes, 1 << 30);
        let pairs = PAIRS / 8 + PAIRS + 2 * (PAIRS / 2);
        assert_eq!((r.totals.allocations, r.totals.frees), (pairs + 1, pairs));
        assert_eq!(r.totals.live_bytes, 1 << 30);
    }
}

/// With two threads, each keeps its own share of the live count until it
/// could hide a new peak (live_bytes.rs); a thread that exits with a
/// share left adds it then, or the peak after it would miss those bytes.
#[test]
fn a_thread_that_exits_leaves_its_share_of_the_live_bytes() {
    let out = run_traced(&program("threads_peak"), &["exit"], &[]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.totals.peak_bytes, 1536 * MIB + MIB);
    assert_eq!(r.peak.as_ref().unwrap().bytes, 1536 * MIB + MIB);
}

/// Two threads in turn, each keeping its changes to its current call site
/// in its own delta slot (site_counters.rs): with no call in flight at the
/// peak, the peak is exact, although A's five frees and the five after the
/// peak never reached the site's shared word before the report.
#[test]
fn the_peak_of_threads_taking_turns_is_exact() {
    const THREADS_PEAK_C: &str = "tests/c/threads_peak.c";
    let out = run_traced(&program("threads_peak"), &["handover"], &[]);
    out.assert_success();
    let r = out.report();
    let peak = r.peak.as_ref().unwrap();
    assert_eq!(peak.bytes, 11 * MIB);
    assert_eq!(r.totals.peak_bytes, 11 * MIB);
    let at = |function: &str, mark: &str| {
        (
            function.to_string(),
            "threads_peak.c".to_string(),
            line_of(THREADS_PEAK_C, mark),
        )
    };
    assert_eq!(
        shape(&peak.groups),
        [
            (6, 6 * MIB, at("handover_b_site", "/* HANDOVER B */")),
            (5, 5 * MIB, at("handover_a_site", "/* HANDOVER A */")),
        ]
    );
    assert!(r.leaks.is_empty());
}
