//! Python: stacks read without the GIL from ctypes calls over the simulated
//! runtime (the machine's python3), the `cudaleak` module and the pytest
//! plugin. Exact functions, files, lines and block counts.

mod support;

use cudaleak_core::report::{Group, MergedFrame, Report, Trigger};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

const STACKS: &str = "tests/python/stacks.py";

fn python3() -> PathBuf {
    PathBuf::from(std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
}

fn py_env() -> Vec<(String, String)> {
    vec![
        (
            "SIMCUDA_RUNTIME".into(),
            sim_dir().join("libcudart.so.12").display().to_string(),
        ),
        ("CUDALEAK_PY_HELPER".into(), py_helper().display().to_string()),
        ("PYTHONPATH".into(), repo().join("python").display().to_string()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
    ]
}

fn run_python(args: &[&str], extra: &[(&str, &str)]) -> Outcome {
    let env = py_env();
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(extra);
    let script = repo().join(args[0]);
    let mut full = vec![script.to_str().unwrap()];
    full.extend_from_slice(&args[1..]);
    run_traced(&python3(), &full, &all)
}

/// (function, file basename, line) of a group's Python frames.
fn py_frames(g: &Group) -> Vec<(String, String, i64)> {
    g.python_stack
        .iter()
        .map(|f| {
            (
                f.function.clone(),
                f.file.rsplit('/').next().unwrap().to_string(),
                f.line.unwrap_or(-1),
            )
        })
        .collect()
}

fn group_with_py_line<'a>(r: &'a Report, file: &str, line: i64) -> &'a Group {
    r.leaks
        .iter()
        .find(|g| {
            g.python_stack
                .iter()
                .any(|f| f.file.ends_with(file) && f.line == Some(line))
        })
        .unwrap_or_else(|| {
            panic!(
                "no group through {file}:{line}; groups: {:#?}",
                r.leaks.iter().map(py_frames).collect::<Vec<_>>()
            )
        })
}

fn s(x: &str) -> String {
    x.to_string()
}

/// A function's name as the report gives it: the qualified name from
/// CPython 3.11 (`co_qualname`), the plain name before (code objects had
/// no qualified name, and tracebacks show the plain one too).
fn q(qualified: &str) -> String {
    static HAS_QUALNAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let has = *HAS_QUALNAME.get_or_init(|| {
        let out = Command::new(python3())
            .args(["-c", "import sys; print(sys.version_info >= (3, 11))"])
            .output()
            .expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).trim() == "True"
    });
    if has {
        qualified.to_string()
    } else {
        qualified.rsplit('.').next().unwrap().to_string()
    }
}

/// Python called back from C (qsort's comparator): the native walk stops
/// at the outer of the two eval-loop frames (the interpreter's
/// start-up below it is not walked), and the merged stack still has each
/// invocation's Python frames in its place, with the C frames between
/// them: the same with libgcc's unwinder, which stops there too.
#[test]
fn a_callback_from_c_keeps_both_python_invocations_in_place() {
    const CALLBACK: &str = "tests/python/callback.py";
    let l = |m: &str| line_of(CALLBACK, m);
    let mut merged = Vec::new();
    for unwinder in ["fast", "dwarf"] {
        let out = run_python(&[CALLBACK], &[("CUDALEAK_UNWINDER", unwinder)]);
        out.assert_success();
        let r = out.report();
        let g = group_with_py_line(&r, "callback.py", l("# LEAK callback"));
        assert_eq!((g.blocks, g.bytes), (1, 1201));
        let names: Vec<String> = g
            .merged_stack
            .iter()
            .map(|f| match f {
                MergedFrame::Python(p) => format!("py:{}:{}", p.function, p.line.unwrap_or(-1)),
                MergedFrame::Native(n) => n.function.clone().unwrap_or_default(),
            })
            .collect();
        let at = |want: &str| {
            names
                .iter()
                .position(|n| n == want)
                .unwrap_or_else(|| panic!("{unwinder}: no {want} in {names:#?}"))
        };
        let inner = at(&format!("py:compare:{}", l("# LEAK callback")));
        let outer = at(&format!("py:sort_with_callback:{}", l("# CALL qsort")));
        let module = at(&format!("py:<module>:{}", l("# CALL module")));
        let qsort = names
            .iter()
            .position(|n| n.contains("qsort") || n.contains("msort"))
            .unwrap_or_else(|| panic!("{unwinder}: no qsort frame in {names:#?}"));
        assert!(
            inner < qsort && qsort < outer && outer < module,
            "{unwinder}: {names:#?}"
        );
        assert_eq!(
            module,
            names.len() - 1,
            "{unwinder}: frames below the module: {names:#?}"
        );
        // The native stack ends at the outer eval-loop frame.
        let native: Vec<&str> = g
            .native_stack
            .iter()
            .map(|f| f.function.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(
            native.last(),
            Some(&"_PyEval_EvalFrameDefault"),
            "{unwinder}: {native:?}"
        );
        // Two invocations from 3.11 (Python calls Python in one), one per
        // Python frame before.
        let invocations = if python_minor(&python3()) >= 11 {
            2
        } else {
            g.python_stack.len()
        };
        assert_eq!(
            native
                .iter()
                .filter(|n| **n == "_PyEval_EvalFrameDefault")
                .count(),
            invocations,
            "{unwinder}: {native:?}"
        );
        merged.push(names);
    }
    assert_eq!(merged[0], merged[1], "the fast unwinder against libgcc's");
}

#[test]
fn python_stacks_name_the_exact_lines_with_and_without_the_gil() {
    let out = run_python(&[STACKS, "all"], &[]);
    out.assert_success();
    let r = out.report();
    assert!(
        r.python.as_deref().unwrap().starts_with("CPython 3."),
        "{:?}",
        r.python
    );
    // scripts/test-python-versions.sh runs every test here a second time
    // with the offsets path forced on 3.13 and later: make sure it was.
    if std::env::var("CUDALEAK_PYTHON_OFFSETS").as_deref() == Ok("1") && python_minor(&python3()) >= 13 {
        assert!(
            r.python.as_deref().unwrap().contains("_Py_DebugOffsets"),
            "{:?}",
            r.python
        );
    }
    assert_eq!(r.leaks.iter().map(|g| g.blocks).sum::<u64>(), 24);
    let malloc_line = line_of(
        "tests/python/sim.py",
        "rc = lib.cudaMalloc(ctypes.byref(p), nbytes)",
    );
    let l = |m: &str| line_of(STACKS, m);
    let at_main = l("modes[sys.argv[1]]()");
    type Frames = Vec<(String, String, i64)>;
    let cases: Vec<(&str, u64, Frames)> = vec![
        (
            "# LEAK cdll",
            1001,
            vec![
                (s("leak_gil_released"), s("stacks.py"), l("# LEAK cdll")),
                (s("all_kinds"), s("stacks.py"), l("# CALL cdll")),
            ],
        ),
        (
            "# LEAK pydll",
            1002,
            vec![(s("leak_gil_held"), s("stacks.py"), l("# LEAK pydll"))],
        ),
        (
            "# LEAK thread",
            1003,
            vec![(s("thread_body"), s("stacks.py"), l("# LEAK thread"))],
        ),
        (
            "# LEAK inner",
            1005,
            vec![
                (s("inner_helper"), s("stacks.py"), l("# LEAK inner")),
                (s("outer_helper"), s("stacks.py"), l("# LEAK outer")),
            ],
        ),
        (
            "# LEAK method",
            1006,
            vec![(q("Model.step"), s("stacks.py"), l("# LEAK method"))],
        ),
        (
            "# LEAK classmethod",
            1007,
            vec![(q("Model.build"), s("stacks.py"), l("# LEAK classmethod"))],
        ),
    ];
    for (marker, bytes, want) in cases {
        let g = group_with_py_line(&r, "stacks.py", l(marker));
        assert_eq!((g.blocks, g.bytes), (1, bytes), "{marker}");
        let frames = py_frames(g);
        // Innermost: sim.malloc's ctypes call.
        assert_eq!(frames[0], (s("malloc"), s("sim.py"), malloc_line), "{marker}");
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&frames[1 + i], w, "{marker}");
        }
        // Outermost: the module, at the dispatch line (a thread: its bootstrap).
        let outermost = frames.last().unwrap();
        if marker == "# LEAK thread" {
            assert_eq!(outermost.0, q("Thread._bootstrap"));
        } else {
            assert_eq!(outermost, &(s("<module>"), s("stacks.py"), at_main), "{marker}");
        }
    }
    // The generator leaked twice from one line (the first resumption comes
    // through another C call site, hence possibly two native stacks).
    let gen_line = l("# LEAK generator");
    let gen: Vec<&Group> = r
        .leaks
        .iter()
        .filter(|g| py_frames(g).get(1) == Some(&(s("generator"), s("stacks.py"), gen_line)))
        .collect();
    assert_eq!(
        gen.iter()
            .map(|g| (g.blocks, g.bytes))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        (2, 2008)
    );
    // Ten objects whose __init__ allocates. The first calls enter __init__
    // from C (type.__call__), later ones, once specialized, directly; either
    // way the Python stack is the same three lines (3.13's __init__ shim
    // frame, `_Py_InitCleanup`, is not a line of the program).
    let init: Vec<&Group> = r
        .leaks
        .iter()
        .filter(|g| py_frames(g).get(1).is_some_and(|f| f.2 == l("# LEAK init")))
        .collect();
    for g in &init {
        assert_eq!(
            py_frames(g)[1..5],
            [
                (q("Buffer.__init__"), s("stacks.py"), l("# LEAK init")),
                (s("make_buffers"), s("stacks.py"), l("# CALL init")),
                (s("all_kinds"), s("stacks.py"), l("# CALL make_buffers")),
                (s("<module>"), s("stacks.py"), at_main),
            ]
        );
        assert_eq!(g.bytes, g.blocks * 1009);
    }
    assert_eq!(init.iter().map(|g| g.blocks).sum::<u64>(), 10);
    // Alternating lines of one function, three times each.
    for (marker, size) in [("# LEAK line_a", 1010), ("# LEAK line_b", 1011)] {
        let at: Vec<&Group> = r
            .leaks
            .iter()
            .filter(|g| py_frames(g).get(1).is_some_and(|f| f.2 == l(marker)))
            .collect();
        assert_eq!(
            at.iter()
                .map(|g| (g.blocks, g.bytes))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            (3, 3 * size),
            "{marker}"
        );
    }
    // The thread's stack is its own: Thread.run, not all_kinds.
    let g = group_with_py_line(&r, "stacks.py", l("# LEAK thread"));
    let names: Vec<String> = py_frames(g).into_iter().map(|f| f.0).collect();
    assert!(names.contains(&q("Thread.run")), "{names:?}");
    assert!(!names.contains(&s("all_kinds")), "{names:?}");
}

fn python_minor(python: &std::path::Path) -> u32 {
    let out = Command::new(python)
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .expect("python runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a minor version")
}

/// An interpreter that publishes `_Py_DebugOffsets` (3.13+): the one under
/// test if it does, else pyenv's 3.13 where installed.
fn python_with_debug_offsets() -> Option<PathBuf> {
    if python_minor(&python3()) >= 13 {
        return Some(python3());
    }
    let home = std::env::var("HOME").ok()?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(format!("{home}/.pyenv/versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("3.13"))
        .map(|e| e.path().join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

/// What a report says about its leaks, without addresses (ASLR).
fn leaks_without_addresses(r: &Report) -> Vec<String> {
    let mut out: Vec<String> = r
        .leaks
        .iter()
        .map(|g| {
            let merged: Vec<String> = g
                .merged_stack
                .iter()
                .map(|f| match f {
                    MergedFrame::Native(n) => format!("{:?} {:?} {:?}", n.function, n.file, n.line),
                    MergedFrame::Python(p) => format!("{p:?}"),
                })
                .collect();
            format!(
                "{} {} {} {:?} {merged:?}",
                g.api, g.blocks, g.bytes, g.python_stack
            )
        })
        .collect();
    out.sort();
    out
}

/// On 3.13 the frame model built from the interpreter's `_Py_DebugOffsets`
/// (CUDALEAK_PYTHON_OFFSETS=1, the only path on 3.14+) gives exactly what
/// the 3.13 table gives: same groups, lines and merged stacks.
#[test]
#[ignore = "needs CPython 3.13 or later; scripts/test.sh runs it (--ignored)"]
fn the_debug_offsets_model_gives_what_the_table_gives() {
    let python = required(python_with_debug_offsets(), "CPython 3.13 or later");
    let run = |offsets: &str| {
        let env = py_env();
        let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        all.push(("CUDALEAK_PYTHON_OFFSETS", offsets));
        let script = repo().join(STACKS);
        let out = run_traced(&python, &[script.to_str().unwrap(), "all"], &all);
        out.assert_success();
        out.report()
    };
    let (table, offsets) = (run("0"), run("1"));
    let status = |r: &Report| r.python.clone().unwrap_or_default();
    assert!(!status(&table).contains("_Py_DebugOffsets"), "{}", status(&table));
    assert!(
        status(&offsets).contains("_Py_DebugOffsets"),
        "{}",
        status(&offsets)
    );
    assert_eq!(table.leaks.iter().map(|g| g.blocks).sum::<u64>(), 24);
    assert_eq!(leaks_without_addresses(&table), leaks_without_addresses(&offsets));
}

/// One Python line is one group, however the interpreter reached it: on
/// CPython 3.13 a loop long enough for the call to be specialized made two
/// groups (299 blocks and 1), whose native stacks differed only inside
/// `_PyEval_EvalFrameDefault`. Run under the Python being tested and, where
/// installed, under 3.13, where it split.
#[test]
fn one_python_line_is_one_group_after_specialization() {
    let mut pythons = vec![python3()];
    pythons.extend(python_with_debug_offsets().filter(|p| *p != python3()));
    for python in pythons {
        let env = py_env();
        let all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let script = repo().join(STACKS);
        let out = run_traced(&python, &[script.to_str().unwrap(), "one_line"], &all);
        out.assert_success();
        let r = out.report();
        let l = |m: &str| line_of(STACKS, m);
        let groups: Vec<&Group> = r
            .leaks
            .iter()
            .filter(|g| {
                g.python_stack
                    .iter()
                    .any(|f| f.line == Some(l("# LEAK one_line")))
            })
            .collect();
        assert_eq!(
            groups.len(),
            1,
            "{}: {:#?}",
            python.display(),
            r.leaks
                .iter()
                .map(|g| (g.blocks, py_frames(g)))
                .collect::<Vec<_>>()
        );
        let g = groups[0];
        assert_eq!((g.blocks, g.bytes), (300, 300 * 1012), "{}", python.display());
        assert_eq!(
            py_frames(g)[1..],
            [
                (q("allocate"), s("stacks.py"), l("# LEAK one_line")),
                (q("train_step"), s("stacks.py"), l("# CALL one_line")),
                (q("one_line"), s("stacks.py"), l("# CALL train_step")),
                (s("<module>"), s("stacks.py"), l("modes[sys.argv[1]]()")),
            ]
        );
        // Every raw stack is kept; together they are the group.
        if !g.raw_stacks.is_empty() {
            assert_eq!(g.raw_stacks.iter().map(|s| s.blocks).sum::<u64>(), 300);
        }
    }
}

#[test]
fn python_frames_take_the_place_of_the_eval_loop_in_the_merged_stack() {
    let out = run_python(&[STACKS, "all"], &[]);
    out.assert_success();
    let r = out.report();
    let g = group_with_py_line(&r, "stacks.py", line_of(STACKS, "# LEAK inner"));
    let merged: Vec<String> = g
        .merged_stack
        .iter()
        .map(|f| match f {
            MergedFrame::Native(n) => n.function.clone().unwrap_or_default(),
            MergedFrame::Python(p) => format!("py:{}", p.function),
        })
        .collect();
    // ctypes' C frames, then the Python frames where the eval loop was.
    let first_py = merged.iter().position(|f| f.starts_with("py:")).unwrap();
    assert!(
        merged[..first_py].iter().any(|f| f.contains("ctypes")),
        "{merged:?}"
    );
    let want = [
        "py:malloc",
        "py:inner_helper",
        "py:outer_helper",
        "py:all_kinds",
        "py:<module>",
    ];
    if q("a.b") == "a.b" {
        // 3.11+: one eval loop runs Python-to-Python calls, so the frames
        // sit together.
        assert_eq!(merged[first_py..first_py + 5], want, "{merged:?}");
    } else {
        // 3.8-3.10: every Python call goes through C (function_code_fastcall
        // & co.) into an eval loop of its own; each Python frame takes its
        // own loop's place, the C between them stays.
        let python: Vec<&String> = merged.iter().filter(|f| f.starts_with("py:")).collect();
        assert_eq!(python, want, "{merged:?}");
        for pair in python.windows(2) {
            let (a, b) = (
                merged.iter().position(|f| f == pair[0]),
                merged.iter().position(|f| f == pair[1]),
            );
            assert!(
                b.unwrap() - a.unwrap() > 1,
                "C frames between {pair:?}: {merged:?}"
            );
        }
    }
    assert!(
        !merged.iter().any(|f| f == "_PyEval_EvalFrameDefault"),
        "{merged:?}"
    );
    // And the native stack alone still shows the interpreter.
    assert!(g
        .native_stack
        .iter()
        .any(|f| f.function.as_deref() == Some("_PyEval_EvalFrameDefault")));
}

#[test]
fn a_python_program_that_frees_everything_has_no_false_leak() {
    let out = run_python(&[STACKS, "clean"], &[]);
    out.assert_success();
    let r = out.report();
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!(r.totals.allocations, 400 + 400);
    assert_eq!(r.totals.frees, r.totals.allocations);
}

#[test]
fn no_deadlock_when_the_gil_holder_waits_for_the_allocating_thread() {
    let out = run_python(&[STACKS, "deadlock"], &[]);
    out.assert_success();
    let r = out.report();
    let g = group_with_py_line(&r, "stacks.py", line_of(STACKS, "# LEAK deadlock"));
    assert_eq!(g.bytes, 1008);
    assert_eq!(py_frames(g)[0].0, q("deadlock.<locals>.thread_a"));
    assert_eq!(g.native_stack[0].function.as_deref(), Some("locked_alloc"));
}

#[test]
fn os_exit_in_python_still_writes_the_report_and_keeps_the_status() {
    let out = run_python(&[STACKS, "exit_now"], &[]);
    assert_eq!(out.status.code(), Some(3));
    let r = out.report();
    assert_eq!((r.trigger, r.exit_status), (Trigger::Exit, Some(3)));
    group_with_py_line(&r, "stacks.py", line_of(STACKS, "# LEAK cdll"));
}

/// Once the interpreter finalizes, its thread states and frames are torn
/// down, so a capture takes no Python frames: a `__del__` run as the
/// interpreter clears `__main__` at exit allocates with native frames
/// alone, where the same `__del__` run earlier has its Python frame.
#[test]
fn an_allocation_while_the_interpreter_finalizes_has_no_python_stack() {
    let out = run_python(&[STACKS, "finalizing"], &[]);
    out.assert_success();
    let r = out.report();
    let by_size = |bytes: u64| {
        let groups: Vec<&Group> = r.leaks.iter().filter(|g| g.bytes == bytes).collect();
        assert_eq!(groups.len(), 1, "{bytes} bytes: {:#?}", r.leaks);
        assert_eq!(groups[0].blocks, 1);
        groups[0]
    };
    let line = line_of(STACKS, "# LEAK collected");
    assert_eq!(
        py_frames(by_size(6006))[..2],
        [
            (q("AllocatesWhenCollected.__del__"), s("stacks.py"), line),
            (q("finalizing"), s("stacks.py"), line_of(STACKS, "del early")),
        ]
    );
    let at_exit = by_size(7007);
    assert_eq!(py_frames(at_exit), []);
    assert!(!at_exit.native_stack.is_empty());
}

#[test]
fn cudaleak_python_zero_turns_capture_off() {
    let out = run_python(&[STACKS, "all"], &[("CUDALEAK_PYTHON", "0")]);
    out.assert_success();
    let r = out.report();
    assert!(r
        .leaks
        .iter()
        .all(|g| g.python_stack.is_empty() && g.merged_stack.is_empty()));
    assert_eq!(r.python.as_deref(), Some("off (CUDALEAK_PYTHON=0)"));
    assert_eq!(r.leaks.iter().map(|g| g.blocks).sum::<u64>(), 24);
}

// ---- the cudaleak module ----

#[test]
fn no_leaks_raises_with_python_lines_and_checkpoints_count() {
    let out = run_python(&["tests/python/api_checks.py", "preloaded"], &[]);
    out.assert_success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "clean block: ok");
    assert_eq!(lines[1], "live_since: 2 300");
    assert_eq!(lines[2], "leak error: 4096 bytes");
    let leak_line = line_of("tests/python/api_checks.py", "# LEAK no_leaks");
    assert!(
        out.stdout
            .contains(&format!("api_checks.py:{leak_line} in leaky_block")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("body error propagates: ValueError"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("dump written: True"), "{}", out.stdout);
    let reports = out.reports();
    assert!(reports
        .iter()
        .any(|r| r.trigger == Trigger::Api && r.reason.as_deref() == Some("from python")));
}

#[test]
fn without_the_library_the_module_is_a_no_op_with_one_warning() {
    let env = py_env();
    let mut cmd = Command::new(python3());
    cmd.arg(repo().join("tests/python/api_checks.py")).arg("bare");
    for (k, v) in &env {
        cmd.env(k, v);
    }
    cmd.env_remove("LD_PRELOAD").env("LD_LIBRARY_PATH", sim_dir());
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "available: False\nno error");
    assert_eq!(
        stderr.matches("libcudaleak.so is not preloaded").count(),
        1,
        "{stderr}"
    );
}

// ---- the pytest plugin ----

struct Pytest {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    /// where the library wrote its reports (`CUDALEAK_DIR`)
    dir: TempDir,
}

fn pytest(args: &[&str], preload: bool) -> Pytest {
    pytest_suite("tests/python/plugin_suite", args, preload)
}

fn pytest_suite(suite: &str, args: &[&str], preload: bool) -> Pytest {
    let dir = TempDir::new("pytest");
    let mut cmd = Command::new(python3());
    cmd.args([
        "-m",
        "pytest",
        "-p",
        "cudaleak.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "-rf",
        "-q",
    ])
    .args(args)
    .arg(repo().join(suite))
    .current_dir(dir.path())
    .env("CUDALEAK_DIR", dir.path())
    .env("LD_LIBRARY_PATH", sim_dir())
    .env_remove("PYTEST_ADDOPTS");
    for (k, v) in py_env() {
        cmd.env(k, v);
    }
    if preload {
        cmd.env("LD_PRELOAD", lib());
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(180));
    Pytest {
        status,
        stdout,
        stderr,
        dir,
    }
}

fn summary(p: &Pytest) -> String {
    p.stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed") || l.contains(" failed"))
        .unwrap_or("")
        .trim()
        .trim_matches('=')
        .trim()
        .to_string()
}

fn failed_tests(p: &Pytest) -> Vec<String> {
    let mut v: Vec<String> = p
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("FAILED "))
        .map(|l| {
            l.split(" - ")
                .next()
                .unwrap()
                .rsplit("::")
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn pytest_plugin_fails_exactly_the_leaking_test_with_its_python_line() {
    let p = pytest(&["--cuda-leaks", "--cuda-leaks-warmup"], true);
    assert_eq!(p.status.code(), Some(1), "{}\n{}", p.stdout, p.stderr);
    assert!(summary(&p).starts_with("2 failed, 4 passed"), "{}", p.stdout);
    assert_eq!(failed_tests(&p), ["test_leaks", "test_marked_leak"]);
    let leak_line = line_of("tests/python/plugin_suite/test_sample.py", "# LEAK test_leaks");
    assert!(
        p.stdout
            .contains("test_leaks leaked 4.0 KiB (4096 bytes) of CUDA memory in 1 block at "),
        "{}",
        p.stdout
    );
    assert!(
        p.stdout
            .contains(&format!("test_sample.py:{leak_line} in test_leaks")),
        "{}",
        p.stdout
    );
}

#[test]
fn pytest_plugin_without_warmup_also_reports_one_time_initialization() {
    let p = pytest(&["--cuda-leaks"], true);
    assert!(summary(&p).starts_with("3 failed, 3 passed"), "{}", p.stdout);
    assert_eq!(
        failed_tests(&p),
        ["test_leaks", "test_marked_leak", "test_one_time_workspace"]
    );
}

#[test]
fn pytest_plugin_marker_checks_chosen_tests_without_the_flag() {
    let p = pytest(&[], true);
    assert!(summary(&p).starts_with("1 failed, 5 passed"), "{}", p.stdout);
    assert_eq!(failed_tests(&p), ["test_marked_leak"]);
}

#[test]
fn pytest_plugin_works_under_xdist() {
    let p = pytest(&["-n", "2", "--cuda-leaks", "--cuda-leaks-warmup"], true);
    assert!(
        summary(&p).starts_with("2 failed, 4 passed"),
        "{}\n{}",
        p.stdout,
        p.stderr
    );
    assert_eq!(failed_tests(&p), ["test_leaks", "test_marked_leak"]);
}

#[test]
fn pytest_plugin_without_the_library_checks_nothing_and_says_so() {
    // Asked to check every test: no library fails the run, with one line
    // that says how to run it (it passed silently).
    let p = pytest(&["--cuda-leaks"], false);
    assert_ne!(p.status.code(), Some(0), "{}", p.stdout);
    let lines: Vec<&str> = p.stderr.lines().filter(|l| l.contains("cudaleak")).collect();
    assert_eq!(lines.len(), 1, "{}", p.stderr);
    assert!(
        lines[0].contains("needs libcudaleak.so preloaded"),
        "{}",
        p.stderr
    );
    assert!(lines[0].contains("cudaleak run --"), "{}", p.stderr);
    // A marker alone: the marked tests run unchecked, with a warning.
    let p = pytest(&[], false);
    assert_eq!(p.status.code(), Some(0), "{}", p.stdout);
    assert!(summary(&p).starts_with("6 passed"), "{}", p.stdout);
    assert!(
        p.stdout.contains("libcudaleak.so is not preloaded"),
        "{}",
        p.stdout
    );
}

/// `cuda_no_leaks(limit=, warmups=, filter=, framework=)` as pytest-memray's
/// `limit_leaks`; the failure shows the user's lines first, no frames of
/// the plugin, pytest or pluggy, and a short summary line with the size
/// and the test's line.
#[test]
fn pytest_plugin_limits_warmups_filters_and_framework_caches() {
    // -vvv (the helper passes -q): the short summary line in full, as on CI (else pytest trims
    // it to the terminal's width).
    let p = pytest_suite("tests/python/plugin_limits", &["-vvv"], true);
    assert_eq!(p.status.code(), Some(1), "{}\n{}", p.stdout, p.stderr);
    assert!(summary(&p).starts_with("2 failed, 6 passed"), "{}", p.stdout);
    assert_eq!(
        failed_tests(&p),
        [
            "test_over_the_limit",
            "test_torch_cache_without_the_option_looks_like_a_leak"
        ]
    );
    let file = repo().join("tests/python/plugin_limits/test_limits.py");
    let line = line_of(
        "tests/python/plugin_limits/test_limits.py",
        "# LEAK over the limit",
    );
    let short = p
        .stdout
        .lines()
        .find(|l| l.starts_with("FAILED ") && l.contains("test_over_the_limit"))
        .unwrap();
    assert!(
        short.contains(&format!(
            "leaked 4.0 KiB (4096 bytes) of CUDA memory in 1 block at {}:{line} in test_over_the_limit",
            file.display()
        )),
        "{short}"
    );
    // The user's line comes before the helper's (sim.py) in the message.
    let body = &p.stdout[p.stdout.find("test_over_the_limit ___").unwrap()..];
    let user = body
        .find(&format!("test_limits.py:{line} in test_over_the_limit"))
        .unwrap();
    let helper = body.find("sim.py:").unwrap();
    assert!(user < helper, "{body}");
    for hidden in [
        "pytest_plugin.py",
        "/_pytest/",
        "/pluggy/",
        "ffi_call",
        "_PyObject_",
    ] {
        assert!(!p.stdout.contains(hidden), "{hidden} shown:\n{}", p.stdout);
    }
    // The plugin option does what the marker does.
    let p = pytest_suite(
        "tests/python/plugin_limits",
        &["--cuda-leaks-framework=torch", "-k", "without_the_option"],
        true,
    );
    assert!(summary(&p).starts_with("1 passed"), "{}", p.stdout);
}

#[test]
fn no_leaks_takes_the_same_options() {
    let out = run_python(&["tests/python/no_leaks_options.py"], &[]);
    out.assert_success();
    let line = line_of("tests/python/no_leaks_options.py", "# LEAK options");
    let want = format!(
        "under limit: ok\n\
         over limit: cudaleak: the with-block leaked 4.0 KiB (4096 bytes) of CUDA memory in 1 block at {}:{line} in leak\n\
         filtered: ok\n\
         warmups: ok\n\
         torch imported by the check: False\n\
         torch synchronized, collected, emptied: True\n",
        repo().join("tests/python/no_leaks_options.py").display()
    );
    assert_eq!(out.stdout, want, "{}", out.stderr);
}

// ---- the tables the module shares with the command ----

/// python/cudaleak/_tables.py as the Rust tables make it: the units of
/// `parse_size` and `format_size` and the noise frames, which the module
/// once wrote out again by hand.
fn python_tables() -> String {
    use cudaleak_core::base::units::{BINARY_UNITS, SIZE_UNITS};
    use cudaleak_core::report::render::{NOISE_MODULES, NOISE_PREFIXES, RUNNER_FILE_PARTS};
    // A Rust string literal of these tables is a Python one: plain ASCII,
    // no quote, no backslash.
    let quote = |s: &str| {
        assert!(
            s.chars().all(|c| c.is_ascii_graphic() || c == ' ') && !s.contains(['"', '\\']),
            "{s:?} needs escaping in Python"
        );
        format!("\"{s}\"")
    };
    let tuple = |items: &[&str]| {
        let mut t = String::from("(\n");
        for i in items {
            t += &format!("    {},\n", quote(i));
        }
        t + ")\n"
    };
    let mut out = String::from(
        "# Generated by scripts/gen-python-tables.sh from the Rust tables: do not edit.\n\
         # tests/python.rs fails when this file and the tables differ.\n\
         \"\"\"The tables the cudaleak module shares with the command, so that\n\
         parse_size, format_size and the frames left out of a failure's text\n\
         agree with cudaleak's own.\"\"\"\n\n",
    );
    out += "# cudaleak_core::base::units::BINARY_UNITS: format_size's units above 1 KiB.\n";
    out += &format!("BINARY_UNITS = {}", tuple(&BINARY_UNITS));
    out += "\n# cudaleak_core::base::units::SIZE_UNITS: the units parse_size takes (lower\n\
            # case) and the bytes of each.\nSIZE_UNITS = {\n";
    for (unit, bytes) in SIZE_UNITS {
        out += &format!("    {}: {bytes},\n", quote(unit));
    }
    out += "}\n";
    out += "\n# cudaleak_core::report::render::NOISE_PREFIXES: functions that are machinery,\n\
            # not the program (program start, the interpreter, foreign calls).\n";
    out += &format!("NOISE_PREFIXES = {}", tuple(NOISE_PREFIXES));
    out += "\n# cudaleak_core::report::render::NOISE_MODULES: module files that are\n\
            # foreign-call machinery as a whole.\n";
    out += &format!("NOISE_MODULES = {}", tuple(NOISE_MODULES));
    out += "\n# cudaleak_core::report::render::RUNNER_FILE_PARTS: parts of the paths of\n\
            # the test runner's Python files (pytest, pluggy, runpy, the plugin).\n";
    out += &format!("RUNNER_FILE_PARTS = {}", tuple(RUNNER_FILE_PARTS));
    out
}

/// The module's copy of the tables is the one the Rust tables make;
/// scripts/gen-python-tables.sh writes it ([`write_the_python_tables`]).
#[test]
fn the_python_tables_are_generated_from_the_rust_ones() {
    let path = repo().join("python/cudaleak/_tables.py");
    let want = python_tables();
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date: run scripts/gen-python-tables.sh",
        path.display()
    );
}

/// Writes the module's copy of the tables: not a test, the generator
/// (scripts/gen-python-tables.sh), kept here beside the check above.
#[test]
#[ignore = "writes python/cudaleak/_tables.py; scripts/gen-python-tables.sh runs it"]
fn write_the_python_tables() {
    std::fs::write(repo().join("python/cudaleak/_tables.py"), python_tables()).unwrap();
}

/// The module's `parse_size`, `format_size` and noise test give the
/// command's answers (units::parse_size, units::size_exact,
/// render::is_noise): one table is not enough if the code around it drifts.
#[test]
fn the_module_sizes_and_noise_agree_with_the_command() {
    use cudaleak_core::base::units::{parse_size, size_exact};
    use cudaleak_core::report::render::is_noise;
    use cudaleak_core::report::NativeFrame;
    let texts = [
        "4096",
        "1 MiB",
        "512KiB",
        "10 MB",
        "1.5GiB",
        "2 tb",
        "7 k",
        "3 G",
        "100 bytes",
        "1 byte",
        "3b",
        "0.5 kb",
        "lots",
        "-1",
        "5 XB",
        "",
        "1 MiBs",
    ];
    let sizes: [u64; 11] = [
        0,
        1,
        600,
        1023,
        1024,
        4096,
        1048524,
        1048575,
        73400320,
        1 << 40,
        u64::MAX,
    ];
    let frames = [
        ("_PyEval_EvalFrameDefault", "python3.12"),
        ("main", "demo"),
        ("ffi_call_unix64", "libffi.so.8"),
        ("cudaMalloc", "libcudart.so.12"),
        ("helper", "/usr/lib/x86_64-linux-gnu/libffi.so.8"),
        (
            "call",
            "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so",
        ),
        ("PyObject_Call", "python3.12"),
        ("train_step", "libtrain.so"),
    ];
    let script = format!(
        "import cudaleak\n\
         for t in {texts:?}:\n\
         \x20   try:\n\
         \x20       print(cudaleak.parse_size(t))\n\
         \x20   except ValueError:\n\
         \x20       print(None)\n\
         for n in {sizes:?}:\n\
         \x20   print(cudaleak.format_size(n))\n\
         for f, m in {frames:?}:\n\
         \x20   print(cudaleak._is_noise({{'function': f, 'module': m}}))\n"
    );
    let out = Command::new(python3())
        .args(["-c", &script])
        .env("PYTHONPATH", repo().join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut want: Vec<String> = texts
        .iter()
        .map(|t| parse_size(t).map_or("None".into(), |n| n.to_string()))
        .collect();
    want.extend(sizes.iter().map(|&n| size_exact(n)));
    want.extend(frames.iter().map(|(f, m)| {
        let frame = NativeFrame {
            function: Some(f.to_string()),
            module: Some(m.to_string()),
            ..Default::default()
        };
        if is_noise(&frame) { "True" } else { "False" }.to_string()
    }));
    let have: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(have, want);
}

/// The exit report of `pytest --cuda-leaks` reads from the test's own line
/// down: pytest's, pluggy's, runpy's and the plugin's frames (some thirty,
/// above every test's line) are folded as the interpreter's are, in the
/// text and in the labels; `cudaleak report --full-stacks` shows them.
#[test]
fn pytest_runner_frames_are_folded_out_of_the_exit_report() {
    let p = pytest(&["--cuda-leaks", "--cuda-leaks-warmup"], true);
    assert_eq!(p.status.code(), Some(1), "{}\n{}", p.stdout, p.stderr);
    let leak_line = line_of("tests/python/plugin_suite/test_sample.py", "# LEAK test_leaks");
    let sample = repo().join("tests/python/plugin_suite/test_sample.py");
    let runner = [
        "/_pytest/",
        "/pluggy/",
        "runpy",
        "pytest/__main__.py",
        "pytest_plugin.py",
    ];
    // Each group: its "Leaked" line, then its frames.
    let text = &p.stderr;
    let groups: Vec<&str> = text.split("\nLeaked ").skip(1).collect();
    assert!(!groups.is_empty(), "{text}");
    for g in &groups {
        let frames: Vec<&str> = g.lines().skip(1).take_while(|l| l.starts_with("    ")).collect();
        assert!(frames[0].contains(" in test_"), "not the test's line first:\n{g}");
        for f in &frames {
            assert!(!runner.iter().any(|r| f.contains(r)), "a runner frame: {f}\n{g}");
        }
    }
    assert!(
        groups.iter().any(|g| g.contains(&format!(
            "in test_leaks {}:{leak_line} [python]",
            sample.display()
        ))),
        "{text}"
    );
    // The report keeps them, and --full-stacks shows them.
    let out = cli_command(&["report", "--full-stacks", "."], p.dir.path())
        .output()
        .unwrap();
    let full = String::from_utf8_lossy(&out.stdout);
    assert!(full.contains("/pluggy/") && full.contains("/_pytest/"), "{full}");
}

/// `@pytest.mark.cuda_peak_limit` fails a test whose peak, from its setup
/// (a fixture's 2 MiB) through its body (a 4 MiB burst), is over the
/// limit, and passes one within it; `--cuda-peak-limit` sets the limit of
/// the tests without a marker.
#[test]
fn pytest_peak_limits_fail_the_tests_over_them() {
    let p = pytest_suite("tests/python/peak_suite", &[], true);
    assert_eq!(p.status.code(), Some(1), "{}\n{}", p.stdout, p.stderr);
    // Over only in teardown: its teardown errs; an xfail keeps its outcome.
    assert!(
        summary(&p).starts_with("1 failed, 3 passed, 1 xfailed, 1 error"),
        "{}",
        p.stdout
    );
    assert_eq!(failed_tests(&p), ["test_over_its_limit"]);
    assert!(
        p.stdout
            .contains("ERROR at teardown of test_over_only_in_its_teardown"),
        "{}",
        p.stdout
    );
    assert!(
        p.stdout.contains(
            "CUDA memory peak 6.0 MiB (6291456 bytes) over what was live when it began, over its limit of 5.0 MiB (5242880 bytes)"
        ),
        "{}",
        p.stdout
    );
    let p = pytest_suite("tests/python/peak_suite", &["--cuda-peak-limit=2MiB"], true);
    assert!(
        summary(&p).starts_with("2 failed, 2 passed, 1 xfailed, 1 error"),
        "{}",
        p.stdout
    );
    assert_eq!(failed_tests(&p), ["test_over_its_limit", "test_without_a_marker"]);
    // Without the library: asked for every test, a usage error.
    let p = pytest_suite("tests/python/peak_suite", &["--cuda-peak-limit=2MiB"], false);
    assert_ne!(p.status.code(), Some(0), "{}", p.stdout);
    assert!(
        p.stderr
            .contains("cudaleak: --cuda-peak-limit needs libcudaleak.so preloaded"),
        "{}",
        p.stderr
    );
}

/// 40 call paths taken in turn by two threads at once, each path a route
/// through two functions that call each other, 40-odd frames deep: more
/// paths than a thread keeps logs of, and frames that differ in a run of
/// one function (which a patch of the last walk cannot take). Every kept
/// block is attributed to its own path: each group's route frames name one
/// path, and its blocks and bytes are that path's, on that thread.
#[test]
fn python_call_paths_in_turn_on_two_threads_keep_their_own_stacks() {
    routes_keep_their_own_stacks(40, 4, false);
}

/// The same with 12 paths, fewer than the logs a thread keeps, taken in
/// the same order round after round: a capture replays the log that
/// followed the last one (the guess, unit-tested in
/// `capture/python/logs_tests.rs`), except where an odd round leaves a
/// path out: the guess after the path before it is wrong then, and the
/// left-out path's own guess the round after.
#[test]
fn python_call_paths_in_a_cycle_keep_their_own_stacks() {
    routes_keep_their_own_stacks(12, 6, true);
}

/// `routes.py PATHS ROUNDS [skip]`: every kept block is attributed to its
/// own path, on its own thread.
fn routes_keep_their_own_stacks(paths: u64, rounds: u64, skip: bool) {
    let (p, r) = (paths.to_string(), rounds.to_string());
    let mut args = vec!["tests/python/routes.py", &p, &r];
    if skip {
        args.push("skip");
    }
    let out = run_python(&args, &[]);
    // The rounds a path is left out of (odd rounds r leave out r % paths).
    let left_out = |path: u64| {
        (0..rounds)
            .filter(|&r| skip && r % 2 == 1 && r % paths == path)
            .count() as u64
    };
    let held: u64 = (0..paths).map(|p| rounds - left_out(p)).sum();
    assert_eq!(out.stdout, format!("held {}\n", 2 * held), "{}", out.stderr);
    let r = out.report();
    // (and the one before the threads start, freed)
    assert_eq!(r.totals.allocations, 2 * 2 * held + 1);
    let script = std::fs::read_to_string(repo().join("tests/python/routes.py")).unwrap();
    let alloc_line = script.lines().position(|l| l.ends_with("# ALLOC")).unwrap() as i64 + 1;
    let mut seen = std::collections::BTreeSet::new();
    for g in &r.leaks {
        let frames = py_frames(g);
        assert_eq!(frames[0].0, "malloc", "{frames:?}");
        assert_eq!(frames[1], (q("leaf"), s("routes.py"), alloc_line), "{frames:?}");
        // Innermost first: the route frames from level 6 down to 0.
        let routes: Vec<&str> = frames
            .iter()
            .filter(|f| f.0.starts_with("route_"))
            .map(|f| f.0.as_str())
            .collect();
        assert_eq!(routes.len(), 7, "{frames:?}");
        assert_eq!(routes[6], "route_a", "{frames:?}");
        // Level k (1..=6) runs route_b when bit k - 1 of the path is set.
        let path: u64 = (1..=6)
            .filter(|&k| routes[6 - k] == "route_b")
            .map(|k| 1 << (k - 1))
            .sum();
        let worker = frames.iter().any(|f| f.0.ends_with("_bootstrap_inner"));
        let size = (path + 1) * 1024 + if worker { 512 } else { 0 };
        assert!(path < paths, "{frames:?}");
        let kept = rounds - left_out(path);
        assert_eq!(
            (g.blocks, g.bytes),
            (kept, kept * size),
            "path {path} (worker: {worker}): {frames:?}"
        );
        assert!(seen.insert((path, worker)), "path {path} twice: {frames:?}");
    }
    assert_eq!(seen.len() as u64, 2 * paths);
}
