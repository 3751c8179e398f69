//! The renderers' tests.

use super::*;
use crate::record::python::PythonFrame;
use crate::record::MemoryKind;
use crate::report::{Group, MergedFrame, NativeFrame, OomRequest, Report};
use std::borrow::Cow;

/// A picture of a Python program's group (the SVG flame graph, read as
/// the HTML page reads) shows its Python frames and the native code below
/// the innermost one, not program start, the interpreter or
/// ctypes/libffi; `full` shows them all.
#[test]
fn pictures_fold_what_the_text_report_hides() {
    let native = |f: &str| NativeFrame {
        address: "0x1".into(),
        function: Some(f.into()),
        file: None,
        line: None,
        module: Some("/usr/bin/python3".into()),
        offset: None,
        build_id: None,
    };
    let py = |f: &str| PythonFrame {
        function: f.into(),
        file: "train.py".into(),
        line: Some(3),
    };
    let mut g = Group::new(1, 8, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new());
    g.merged_stack = vec![
        MergedFrame::Native(native("at::native::empty_cuda")),
        MergedFrame::Native(native("ffi_call")),
        MergedFrame::Native(native("_ctypes_callproc")),
        MergedFrame::Python(py("alloc")),
        MergedFrame::Native(native("_PyEval_EvalFrameDefault")),
        MergedFrame::Python(py("<module>")),
        MergedFrame::Native(native("main")),
        MergedFrame::Native(native("_start")),
    ];
    let names = |v: Vec<MergedFrame>| -> Vec<String> {
        v.iter()
            .map(|f| match f {
                MergedFrame::Native(n) => n.function.clone().unwrap(),
                MergedFrame::Python(p) => p.function.clone(),
            })
            .collect()
    };
    assert_eq!(
        names(picture_frames(&g, false)),
        ["at::native::empty_cuda", "alloc", "<module>"]
    );
    assert_eq!(picture_frames(&g, true).len(), 8);
    assert_eq!(
        folded_picture(&[g], false),
        "<module> [train.py:3];alloc [train.py:3];at::native::empty_cuda;cudaMalloc [at alloc train.py:3] 8\n"
    );
}

#[test]
fn names_are_capped_with_an_ellipsis_in_every_rendering() {
    let long = "é".repeat(MAX_NAME_BYTES);
    let capped = cap_name(&long);
    assert!(
        capped.len() <= MAX_NAME_BYTES && capped.ends_with('…'),
        "{}",
        capped.len()
    );
    assert_eq!(escape(&long), capped);
    assert_eq!(cap_name("short"), "short");
    let f = NativeFrame {
        address: "0x1".into(),
        function: Some("f".repeat(50 << 20)),
        file: None,
        line: None,
        module: None,
        offset: None,
        build_id: None,
    };
    assert!(native_label(&f).len() <= MAX_NAME_BYTES);
}

#[test]
fn the_summary_line_says_1_block() {
    assert_eq!(summary_line(100, 1), "cudaleak: 100 bytes leaked in 1 block");
    assert_eq!(summary_line(0, 0), "cudaleak: 0 bytes leaked in 0 blocks");
}

#[test]
fn escape_writes_control_characters_visibly() {
    assert!(matches!(escape("plain name"), Cow::Borrowed(_)));
    assert_eq!(escape("a\\b"), "a\\b", "nothing to escape: unchanged");
    assert_eq!(
        escape("x\n\x1b[2K\r\t\u{7f}\u{9b}\u{202e}\\"),
        "x\\n\\x1b[2K\\r\\t\\x7f\\x9b\\u{202e}\\\\"
    );
}

#[test]
fn python_frames_survive_truncation() {
    let native = |i: usize| NativeFrame {
        address: format!("{i:#x}"),
        function: Some(format!("f{i}")),
        file: None,
        line: None,
        module: None,
        ..NativeFrame::default()
    };
    let step = PythonFrame {
        function: "step".into(),
        file: "train.py".into(),
        line: Some(7),
    };
    let g = Group::new(
        1,
        1,
        "cudaMalloc",
        MemoryKind::Device,
        (1..=20).map(native).collect(),
        vec![step],
    );
    let lines = display_frames_with(&g, 5, true);
    assert_eq!(lines.len(), 7, "{lines:#?}");
    assert_eq!(lines[5], "    ... 15 more frames");
    assert_eq!(lines[6], "    #20 in step train.py:7 [python]");
}

#[test]
fn labels_take_the_shortest_distinguishing_run_and_number_twins() {
    let frame = |f: &str, line: i64| NativeFrame {
        address: "0x1".into(),
        function: Some(f.into()),
        file: Some("train.c".into()),
        line: Some(line),
        ..NativeFrame::default()
    };
    let g = |callers: &[(&str, i64)]| {
        let stack = callers.iter().map(|(f, l)| frame(f, *l)).collect();
        Group::new(1, 1, "cudaMalloc", MemoryKind::Device, stack, vec![])
    };
    let a = g(&[("alloc", 9), ("train", 20), ("main", 1)]);
    let b = g(&[("alloc", 9), ("eval", 30), ("main", 1)]);
    let c = g(&[("other", 3), ("main", 1)]);
    let twin = a.clone();
    let labels = group_labels(&[&a, &b, &c, &twin]);
    assert_eq!(
        labels,
        [
            "cudaMalloc (device memory) at alloc train.c:9 < train train.c:20 [#1]",
            "cudaMalloc (device memory) at alloc train.c:9 < eval train.c:30",
            "cudaMalloc (device memory) at other train.c:3",
            "cudaMalloc (device memory) at alloc train.c:9 < train train.c:20 [#2]",
        ]
    );
}

/// A view that shows the site apart from the API (the HTML table's
/// "call site" column) takes the same label in its two parts; a Python
/// frame is named by its file's name, as a native one is.
#[test]
fn labels_come_in_two_parts_what_allocated_and_where() {
    let py = |f: &str, file: &str, line: i64| PythonFrame {
        function: f.into(),
        file: file.into(),
        line: Some(line),
    };
    let site = |caller: &str, line: i64| {
        Group::new(
            1,
            1,
            "cudaMalloc",
            MemoryKind::Device,
            vec![],
            vec![
                py("raw", "/src/pkg/sixty.py", 8),
                py(caller, "/src/pkg/sixty.py", line),
            ],
        )
    };
    let (a, b) = (site("augment_1", 285), site("augment_2", 290));
    let labels = label_groups(&[&a, &b]);
    assert_eq!(labels[0].what, "cudaMalloc (device memory)");
    assert_eq!(labels[0].site, "raw sixty.py:8 < augment_1 sixty.py:285");
    assert_eq!(labels[1].site, "raw sixty.py:8 < augment_2 sixty.py:290");
    assert_eq!(
        labels[1].to_string(),
        "cudaMalloc (device memory) at raw sixty.py:8 < augment_2 sixty.py:290"
    );
}

/// Some thirty frames of pytest, pluggy and runpy stand above every
/// test's line: the text, the labels and the pictures leave them out
/// as they leave the interpreter out, `--full-stacks` shows them, and a
/// stack with no Python frame of the program's own keeps them.
#[test]
fn the_test_runners_frames_are_folded_as_the_interpreters_are() {
    let py = |f: &str, file: &str, line: i64| PythonFrame {
        function: f.into(),
        file: file.into(),
        line: Some(line),
    };
    let runner = [
        py(
            "pytest_pyfunc_call",
            "/venv/lib/python3.11/site-packages/_pytest/python.py",
            187,
        ),
        py(
            "_multicall",
            "/venv/lib/python3.11/site-packages/pluggy/_execution.py",
            147,
        ),
        py(
            "pytest_runtest_call",
            "/venv/lib/python3.11/site-packages/cudaleak/pytest_plugin.py",
            105,
        ),
        py("_run_module_as_main", "<frozen runpy>", 198),
    ];
    let mut stack = vec![py("test_leaks", "/src/tests/test_x.py", 24)];
    stack.extend(runner.iter().cloned());
    let g = Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], stack);
    let shown = display_frames(&g, 20).join("\n");
    assert!(shown.contains("in test_leaks /src/tests/test_x.py:24"), "{shown}");
    for f in &runner {
        assert!(!shown.contains(&f.function), "{shown}");
    }
    let full = display_frames_with(&g, 20, true).join("\n");
    assert!(runner.iter().all(|f| full.contains(&f.function)), "{full}");
    assert_eq!(
        group_labels(&[&g]),
        ["cudaMalloc (device memory) at test_leaks test_x.py:24"]
    );
    assert_eq!(picture_frames(&g, false).len(), 1);
    assert_eq!(picture_frames(&g, true).len(), 5);
    // Only the runner's frames: they are all there is to show.
    let alone = Group::new(1, 1, "cudaMalloc", MemoryKind::Device, vec![], runner.to_vec());
    assert_eq!(
        display_frames(&alone, 20).len(),
        4,
        "{:?}",
        display_frames(&alone, 20)
    );
}

/// Every allocation goes through one helper: the failed request is
/// labelled as the holders beside it are, by the frames that tell it
/// apart, not by the helper's line alone.
#[test]
fn the_oom_line_labels_the_request_as_the_holders_are() {
    let py = |f: &str, line: i64| PythonFrame {
        function: f.into(),
        file: "exp.py".into(),
        line: Some(line),
    };
    let holder = |caller: &str, line: i64, bytes: u64| {
        Group::new(
            1,
            bytes,
            "cudaMalloc",
            MemoryKind::Device,
            vec![],
            vec![py("alloc", 5), py(caller, line)],
        )
    };
    let mut r = Report::parse(
        r#"{"format": "cudaleak", "version": 1, "trigger": "oom", "sequence": 1, "pid": 7,
            "command": ["p"], "instance": "1000-abcdef01", "timestamp_ms": 3500,
            "totals": {"live_blocks": 2, "live_bytes": 3, "peak_bytes": 3,
                       "allocations": 2, "frees": 0, "failed_allocations": 1, "invalid_frees": 0},
            "leaks": [], "growth": []}"#,
    )
    .unwrap();
    r.leaks = vec![holder("load_weights", 9, 2), holder("fill_cache", 12, 1)];
    r.oom = Some(OomRequest {
        api: "cudaMalloc".into(),
        requested_bytes: 1 << 20,
        native_stack: vec![],
        python_stack: vec![py("alloc", 5), py("step", 20), py("main", 30)],
        merged_stack: vec![],
        device: Some(0),
        device_free_bytes: None,
        device_total_bytes: None,
        failed_calls: 1,
        timestamp_ms: 3500,
    });
    let lines = oom_lines(&r, None);
    let first = lines.lines().next().unwrap();
    assert!(
        first.contains(" at alloc exp.py:5 < step exp.py:20 failed"),
        "{lines}"
    );
    assert!(
        lines.contains("cudaMalloc (device memory) at alloc exp.py:5 < load_weights exp.py:9"),
        "{lines}"
    );

    // Expandable segments, as seen on an H200: a reservation larger
    // than the GPU is no holder; the pages mapped for the request are.
    let mut reservation = holder("reserve", 40, 157 << 30);
    reservation.api = "cuMemAddressReserve".into();
    reservation.memory = MemoryKind::Reservation;
    let mut pages = holder("step", 20, 139 << 30);
    pages.api = "cuMemCreate".into();
    pages.memory = MemoryKind::Physical;
    r.leaks = vec![reservation, pages, holder("load_weights", 9, 2)];
    let lines = oom_lines(&r, None);
    let listed: Vec<&str> = lines.lines().skip(1).collect();
    assert_eq!(listed.len(), 2, "{lines}");
    assert!(
        listed[0].contains("139.0 GiB in 1 block: cuMemCreate (physical memory)"),
        "{lines}"
    );
    assert!(!lines.contains("cuMemAddressReserve"), "{lines}");
}

/// The out-of-memory lines and the peak section escape what comes
/// from the report (a name with an escape sequence and a newline
/// cannot forge lines), and the oom report's text starts with the
/// failed request.
#[test]
fn oom_and_peak_text_escape_what_the_report_holds() {
    let group = r#"{"blocks": 2, "bytes": 3145728, "api": "cudaMalloc", "memory": "device",
        "native_stack": [{"address": "0x10", "function": "evil\u001b[2K\nname", "file": "a.c",
                          "line": 3, "module": null}],
        "python_stack": []}"#;
    let text = format!(
        r#"{{"format": "cudaleak", "version": 1, "trigger": "oom", "sequence": 1, "pid": 7,
            "command": ["p"], "instance": "1000-abcdef01", "timestamp_ms": 3500,
            "totals": {{"live_blocks": 2, "live_bytes": 3145728, "peak_bytes": 4194304,
                        "allocations": 3, "frees": 1, "failed_allocations": 1, "invalid_frees": 0}},
            "leaks": [{group}], "growth": [],
            "oom": {{"api": "cudaMalloc", "requested_bytes": 1048576,
                     "native_stack": [], "python_stack": [{{"function": "step\u001b]0;x", "file": "t.py", "line": 9}}],
                     "device": 0, "device_free_bytes": 0, "device_total_bytes": 4194304,
                     "failed_calls": 3, "timestamp_ms": 3500}},
            "peak": {{"bytes": 4194304, "timestamp_ms": 2200, "groups": [{group}]}}}}"#
    );
    let r = Report::parse(&text).unwrap();
    let lines = oom_lines(&r, Some("/r/x\n.json"));
    assert!(!lines.contains('\u{1b}'), "{lines}");
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        [
            "cudaleak: out of memory: cudaMalloc of 1.0 MiB at step\\x1b]0;x t.py:9 failed (3 failed calls within 1 s) \
             (device 0: free 0 bytes of 4.0 MiB); this process holds 3.0 MiB in 2 blocks; report: /r/x\\n.json",
            "cudaleak:   3.0 MiB in 2 blocks: cudaMalloc (device memory) at evil\\x1b[2K\\nname a.c:3",
        ]
    );
    let full = super::text(&r, None, &TextOptions::default());
    assert!(!full.contains('\u{1b}'));
    let body: Vec<&str> = full.lines().skip_while(|l| !l.is_empty()).skip(1).collect();
    assert_eq!(
        body[0],
        "Out of memory: cudaMalloc of 1.0 MiB (1048576 bytes) failed at +2.5 s (device 0: free 0 bytes of 4.0 MiB); 3 failed calls within 1 s:"
    );
    assert!(full.contains("At the peak (4.0 MiB at +1.2 s):\n  3.0 MiB in 2 blocks: cudaMalloc (device memory) at evil\\x1b[2K\\nname a.c:3\n"), "{full}");
}
