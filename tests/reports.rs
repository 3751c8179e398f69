//! Reports a person understands at a glance, that a tool can symbolize
//! later: what `--top` leaves out, runs sharing a directory,
//! timelines, warnings only where CUDA is used, wording, frames with
//! module offsets and build-ids symbolized after the fact, and `--help`.

mod support;

use cudaleak_core::report::{MergedFrame, Report};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn cudaleak(args: &[&str], cwd: &Path) -> Out {
    let (status, stdout, stderr) = run_command(cli_command(args, cwd), Duration::from_secs(120));
    Out {
        code: status.code(),
        stdout,
        stderr,
    }
}

/// `cudaleak run --dir DIR -- leak_n a b`, checked to succeed.
fn run_leak_n(cwd: &Path, dir: &Path, a: &str, b: &str) {
    let exe = program("leak_n").display().to_string();
    let out = cudaleak(&["run", "--dir", dir.to_str().unwrap(), "--", &exe, a, b], cwd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn top_keeps_totals_and_counts_what_it_left_out() {
    let d = TempDir::new("rep-top");
    let dir = d.path().join("r");
    run_leak_n(d.path(), &dir, "3", "1"); // site A 300 bytes in 3, site B 200 in 1
    let dir = dir.to_str().unwrap();
    let text = cudaleak(&["report", "--top", "1", dir], d.path());
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout
            .contains("... and 1 more group, 200 bytes in 1 block\n"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .trim_end()
            .ends_with("cudaleak: 500 bytes leaked in 4 blocks"),
        "{}",
        text.stdout
    );

    let folded = cudaleak(&["report", "--top", "1", "--format", "folded", dir], d.path());
    let lines: Vec<&str> = folded.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", folded.stdout);
    assert!(lines[0].ends_with(";site_a;cudaMalloc 300"), "{}", lines[0]);
    assert_eq!(lines[1], "[1 other group] 200");

    let json = cudaleak(&["report", "--top", "1", "--format", "json", dir], d.path());
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    validate(&v);
    assert_eq!(v["leaks"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["omitted"]["leaks"],
        serde_json::json!({"groups": 1, "blocks": 1, "bytes": 200})
    );
    assert_eq!(v["totals"]["live_bytes"], 500);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn runs_sharing_a_directory_are_kept_apart() {
    let d = TempDir::new("rep-runs");
    let dir = d.path().join("shared");
    run_leak_n(d.path(), &dir, "1", "0"); // 100 bytes
                                          // The second run must be stamped later: wait for the clock to pass
                                          // the first report's millisecond (never a guessed sleep).
    let first = reports_in(&dir)[0].timestamp_ms;
    while now_ms() <= first {
        std::thread::yield_now();
    }
    run_leak_n(d.path(), &dir, "0", "2"); // 400 bytes
    let runs: Vec<Report> = reports_in(&dir);
    assert_eq!(runs.len(), 2);
    let latest = runs.iter().max_by_key(|r| r.timestamp_ms).unwrap();
    let dir_s = dir.to_str().unwrap();

    let text = cudaleak(&["report", dir_s], d.path());
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stderr.contains("hold 2 runs; showing the latest, run ")
            && text.stderr.contains("--all-runs merges them all"),
        "{}",
        text.stderr
    );
    assert!(
        text.stdout
            .contains(&format!("cudaleak report: pid {}, exit dump #1", latest.pid)),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .trim_end()
            .ends_with("cudaleak: 400 bytes leaked in 2 blocks"),
        "{}",
        text.stdout
    );

    let all = cudaleak(&["report", "--all-runs", "--format", "json", dir_s], d.path());
    assert!(
        all.stderr.contains("merging them all (--all-runs)"),
        "{}",
        all.stderr
    );
    let merged = Report::parse(&all.stdout).unwrap();
    assert_eq!(merged.leaked_bytes(), 500);
    let peak = runs.iter().map(|r| r.totals.peak_bytes).max().unwrap();
    assert_eq!(
        merged.totals.peak_bytes, peak,
        "runs one after another: no sum of peaks"
    );
    let text = cudaleak(&["report", "--all-runs", dir_s], d.path());
    assert!(
        text.stdout
            .contains("cudaleak report: 2 processes merged (exit dumps)"),
        "{}",
        text.stdout
    );
}

#[test]
fn timelines_are_rendered_by_report() {
    let out = run_traced(&program("live"), &["trickle"], &[("CUDALEAK_INTERVAL", "0.2")]);
    out.assert_success();
    let timeline = std::fs::read_dir(out.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".timeline.json"))
        .expect("a timeline file");
    let t = cudaleak(&["report", timeline.to_str().unwrap()], out.dir.path());
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    assert!(t.stdout.contains("cudaleak timeline: "), "{}", t.stdout);
    assert!(t.stdout.contains("\nlive: "), "{}", t.stdout);
    assert!(t.stdout.contains("  <- highest"), "{}", t.stdout);
    assert!(t.stdout.contains("highest live: "), "{}", t.stdout);
    let j = cudaleak(
        &["report", "--format", "json", timeline.to_str().unwrap()],
        out.dir.path(),
    );
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    assert_eq!(v["format"], "cudaleak-timeline");
}

#[test]
fn bad_values_warn_only_in_processes_that_use_cuda() {
    let bad = [("CUDALEAK_SIGNAL", "bogus")];
    // A shell and two programs that never touch CUDA: not a word.
    let quiet = run_traced(Path::new("/bin/sh"), &["-c", "/bin/true; /bin/true"], &bad);
    quiet.assert_success();
    assert_eq!(quiet.stderr, "", "warned without a CUDA call");
    // The same through a wrapper script, around a CUDA program: once.
    let exe = program("leak_n").display().to_string();
    let script = format!("/bin/true; {exe} 0 0");
    let loud = run_traced(Path::new("/bin/sh"), &["-c", &script], &bad);
    loud.assert_success();
    let warnings: Vec<&str> = loud
        .stderr
        .lines()
        .filter(|l| l.contains("CUDALEAK_SIGNAL"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", loud.stderr);
    assert!(warnings[0].starts_with("cudaleak: "), "{}", loud.stderr);
}

#[test]
fn text_says_sizes_and_counts_as_people_do() {
    let out = run_traced(&program("leak_n"), &["3", "1"], &[]);
    assert!(
        out.stderr
            .contains("Leaked 300 bytes in 3 blocks, allocated by cudaMalloc (device memory):"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("Leaked 200 bytes in 1 block, allocated by cudaMalloc (device memory):"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("SUMMARY: cudaleak: 500 bytes leaked in 4 blocks (device 500 bytes in 4 blocks)."),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("(s)"), "{}", out.stderr);
    let demo = cudaleak(
        &["demo", "--dir", out.dir.path().join("demo").to_str().unwrap()],
        out.dir.path(),
    );
    assert!(
        demo.stderr
            .contains("Leaked 64.0 MiB (67108864 bytes) in 1 block, allocated by cudaMalloc"),
        "{}",
        demo.stderr
    );
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// libstripped.so without its symbols and debug information, its debug
/// file in a build-id tree under `root`, and a program calling it.
fn stripped_program(d: &Path) -> (PathBuf, PathBuf, String) {
    let lib_dir = d.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let full = d.join("libstripped.full.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    sh(Command::new(&cc)
        .args([
            "-O1",
            "-g",
            "-shared",
            "-fPIC",
            "-Wl,--build-id",
            "-Wl,-soname,libstripped.so",
        ])
        .arg(format!("-I{}", repo().join("sim/include").display()))
        .arg(format!("-I{}", repo().join("tests/c").display()))
        .arg(repo().join("tests/c/stripped_lib.c"))
        .arg(sim_dir().join("libcudart.so.12"))
        .arg("-o")
        .arg(&full));
    let notes = sh(Command::new("readelf").arg("-n").arg(&full));
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build-id note")
        .trim()
        .to_string();
    let root = d.join("debug");
    let id_dir = root.join(".build-id").join(&build_id[..2]);
    std::fs::create_dir_all(&id_dir).unwrap();
    let debug = id_dir.join(format!("{}.debug", &build_id[2..]));
    sh(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    sh(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(lib_dir.join("libstripped.so"))
        .arg(&full));
    let exe = d.join("stripped_main");
    sh(Command::new(&cc)
        .arg(repo().join("tests/c/stripped_main.c"))
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-lstripped")
        .arg(format!(
            "-Wl,-rpath,{}:{}",
            lib_dir.display(),
            sim_dir().display()
        ))
        .arg("-o")
        .arg(&exe));
    (exe, root, build_id)
}

#[test]
fn frames_carry_module_offsets_and_build_ids_and_symbolize_later() {
    let d = TempDir::new("rep-symbolize");
    let (exe, root, build_id) = stripped_program(d.path());
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    let r = out.report();
    let g = &r.leaks[0];
    let frame = g
        .native_stack
        .iter()
        .find(|f| {
            f.module
                .as_deref()
                .is_some_and(|m| m.ends_with("/libstripped.so"))
        })
        .expect("a frame in libstripped.so");
    assert_eq!(frame.build_id.as_deref(), Some(build_id.as_str()));
    let offset = frame.offset.clone().expect("an offset");
    assert_ne!(Some(&offset), Some(&frame.address), "an offset, not the address");
    assert!(
        frame.function.as_deref() != Some("hidden_leak"),
        "stripped: nothing names it at dump time"
    );
    // Every native frame carries its module, offset and build-id (the
    // program and the libraries are all built with build-ids here).
    for f in &g.native_stack {
        assert!(f.module.is_some() && f.offset.is_some(), "{f:?}");
    }

    let dir = out.dir.path().to_str().unwrap();
    let raw = cudaleak(&["report", "--no-symbolize", dir], out.dir.path());
    assert!(
        raw.stdout.contains(&format!("libstripped.so+{offset})")),
        "unsymbolized frames as (module+0xOFFSET): {}",
        raw.stdout
    );
    let folded = cudaleak(
        &["report", "--no-symbolize", "--format", "folded", dir],
        out.dir.path(),
    );
    assert!(!folded.stdout.contains(&frame.address), "{}", folded.stdout);

    let line = line_of("tests/c/stripped_lib.c", "/* LEAK hidden */");
    let root_s = root.to_str().unwrap();
    let text = cudaleak(&["report", "--debug-root", root_s, dir], out.dir.path());
    assert!(
        text.stdout.contains(&format!(
            "in hidden_leak {}:{line}",
            repo().join("tests/c/stripped_lib.c").display()
        )),
        "symbolized from the debug file found by build-id: {}",
        text.stdout
    );
    let json = cudaleak(
        &[
            "report",
            "--symbolize",
            "--debug-root",
            root_s,
            "--format",
            "json",
            dir,
        ],
        out.dir.path(),
    );
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    validate(&v);
    let symbolized = Report::parse(&json.stdout).unwrap();
    assert!(symbolized.leaks[0]
        .native_stack
        .iter()
        .any(|f| f.function.as_deref() == Some("hidden_leak") && f.line == Some(line)));

    // A debug file of another build is never used: wrong names are worse
    // than none.
    let other = d.path().join("other");
    let id_dir = other.join(".build-id").join(&build_id[..2]);
    std::fs::create_dir_all(&id_dir).unwrap();
    let mut wrong = build_id.clone();
    wrong.replace_range(2..3, if &build_id[2..3] == "0" { "1" } else { "0" });
    let found = root
        .join(".build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    std::fs::copy(&found, id_dir.join(format!("{}.debug", &build_id[2..]))).unwrap();
    // Every stack of the report says the other build-id (the leaks', the
    // peak's, the timeline's: `report` symbolizes them all).
    let doctored = serde_json::to_string(&r).unwrap().replace(&build_id, &wrong);
    let path = d.path().join("cudaleak.doctored.json");
    std::fs::write(&path, doctored).unwrap();
    let text = cudaleak(
        &[
            "report",
            "--debug-root",
            other.to_str().unwrap(),
            path.to_str().unwrap(),
        ],
        d.path(),
    );
    assert!(!text.stdout.contains("hidden_leak"), "{}", text.stdout);
}

#[test]
fn reports_without_offsets_still_read() {
    // A version-1 report from before offsets and build-ids.
    let d = TempDir::new("rep-old");
    let old = r#"{"format":"cudaleak","version":1,"trigger":"exit","sequence":1,"pid":7,"command":["a"],
        "timestamp_ms":0,"totals":{"live_blocks":1,"live_bytes":64,"peak_bytes":64,"allocations":1,
        "frees":0,"failed_allocations":0,"invalid_frees":0},"growth":[],
        "leaks":[{"blocks":1,"bytes":64,"api":"cudaMalloc","memory":"device","python_stack":[],
        "native_stack":[{"address":"0x7f0000001234","function":null,"file":null,"line":null,"module":"/lib/libx.so"}]}]}"#;
    let path = d.path().join("cudaleak.old.json");
    std::fs::write(&path, old).unwrap();
    let p = path.to_str().unwrap();
    let text = cudaleak(&["report", p], d.path());
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout.contains("#0 0x7f0000001234 (/lib/libx.so)"),
        "{}",
        text.stdout
    );
    let folded = cudaleak(&["report", "--format", "folded", p], d.path());
    assert_eq!(
        folded.stdout, "[libx.so];cudaMalloc 64\n",
        "no address written as an offset"
    );
}

/// Every positional argument and option of every command has a
/// description, and each command's help lists its exit statuses.
#[test]
fn help_describes_every_argument_and_exit_status() {
    let d = TempDir::new("rep-help");
    for cmd in ["run", "report", "diff", "merge", "dump", "demo", "env"] {
        let out = cudaleak(&["help", cmd], d.path());
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert!(out.stdout.contains("Exit status:"), "{cmd}: {}", out.stdout);
        let mut section = "";
        let lines: Vec<&str> = out.stdout.lines().collect();
        for (i, line) in lines.iter().copied().enumerate() {
            if line.ends_with(':') && !line.starts_with(' ') {
                section = line;
                continue;
            }
            if !(section == "Arguments:" || section == "Options:") {
                continue;
            }
            let t = line.trim_start();
            if !(t.starts_with('-') || t.starts_with('<') || t.starts_with('['))
                || line.starts_with("          ")
            {
                continue;
            }
            // "  --name <V>  what it does", or the description on the
            // next line, indented further (long help).
            let inline = t
                .split_once("  ")
                .is_some_and(|(_, desc)| !desc.trim().is_empty());
            let below = lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("          ") && !next.trim().is_empty());
            let described = inline || below;
            assert!(described, "{cmd}: undescribed {line:?}\n{}", out.stdout);
        }
    }
}

/// `diff` offers only the formats it renders: its help listed the four
/// exports, which it then refused.
#[test]
fn diff_offers_only_the_formats_it_renders() {
    let d = TempDir::new("rep-diff-formats");
    let help = cudaleak(&["diff", "--help"], d.path());
    assert_eq!(help.code, Some(0), "{}", help.stderr);
    let values: Vec<&str> = help
        .stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- "))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(
        values,
        ["text", "json", "folded", "html", "svg"],
        "{}",
        help.stdout
    );
    assert!(
        help.stdout.contains("go tool pprof -diff_base"),
        "{}",
        help.stdout
    );
    let fixture = repo().join("tests/snapshots/python_report.json");
    let f = fixture.to_str().unwrap();
    for export in ["pprof", "trace", "torch-snapshot", "speedscope"] {
        let out = cudaleak(&["diff", "--format", export, f, f], d.path());
        assert_eq!(out.code, Some(2), "{export}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("possible values: text, json, folded, html, svg"),
            "{}",
            out.stderr
        );
    }
    let out = cudaleak(&["diff", "--format", "folded", f, f], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// The merged stack of a Python group reads as a traceback in text, with
/// the interpreter's and ctypes' machinery hidden; `--full-stacks` and
/// JSON keep every frame.
#[test]
fn python_groups_read_as_tracebacks_without_machinery() {
    let fixture = repo().join("tests/snapshots/python_report.json");
    let d = TempDir::new("rep-python");
    let p = fixture.to_str().unwrap();
    let text = cudaleak(&["report", p], d.path());
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let t = &text.stdout;
    for noise in [
        "ffi_call",
        "_ctypes_callproc",
        "_PyEval_EvalFrameDefault",
        "PyObject_Call",
        "_start",
        "__libc_start_main",
        "slot_tp_init",
        "type_call",
    ] {
        assert!(!t.contains(noise), "{noise} shown: {t}");
    }
    let step = t.find("in step train.py:9 [python]").expect(t);
    let native = t.find("called into native code: ").expect(t);
    assert!(step < native, "Python frames first: {t}");
    assert!(
        t.contains("called into native code: #2 0x7f0000002000 in cuda_malloc kernels.c:12"),
        "{t}"
    );
    let full = cudaleak(&["report", "--full-stacks", p], d.path());
    for noise in ["ffi_call", "_ctypes_callproc", "_start", "__libc_start_main"] {
        assert!(
            full.stdout.contains(noise),
            "{noise} hidden with --full-stacks: {}",
            full.stdout
        );
    }
    let json = cudaleak(&["report", "--format", "json", p], d.path());
    let r = Report::parse(&json.stdout).unwrap();
    assert!(r.leaks[0]
        .merged_stack
        .iter()
        .any(|f| matches!(f, MergedFrame::Native(n) if n.function.as_deref() == Some("ffi_call"))));
}

/// Two leaks at the same line reached from different callers get labels
/// that tell them apart in diff (both read "cudaMalloc at
/// cuda_malloc train.py:9").
#[test]
fn group_labels_tell_groups_apart() {
    let fixture = repo().join("tests/snapshots/python_report.json");
    let d = TempDir::new("rep-labels");
    let empty = d.path().join("cudaleak.empty.json");
    let mut r = Report::parse(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    r.leaks.clear();
    std::fs::write(&empty, serde_json::to_string(&r).unwrap()).unwrap();
    let out = cudaleak(
        &["diff", empty.to_str().unwrap(), fixture.to_str().unwrap()],
        d.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let labels: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" new ")).collect();
    assert_eq!(labels.len(), 3, "{}", out.stdout);
    let mut unique = labels
        .iter()
        .map(|l| l.split(" new ").nth(1).unwrap().trim())
        .collect::<Vec<_>>();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3, "labels tell groups apart: {}", out.stdout);
    assert!(
        out.stdout.contains("at step train.py:9 < train train.py:20"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("at step train.py:9 < evaluate train.py:30"),
        "{}",
        out.stdout
    );
}

/// A worker that sets RANK itself after start is reported under it: the
/// library reads the rank again on the program's own thread at its first
/// allocation call and before the exit report, not only at load (and
/// never on the dumper thread, where getenv could race the program's
/// setenv).
#[test]
fn a_rank_set_after_start_names_the_report() {
    let out = run_traced(&program("late_rank"), &["5"], &[]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.rank, Some(5), "{}", out.stderr);
    let names: Vec<String> = std::fs::read_dir(out.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert!(names.iter().all(|n| n.contains(".r5.")), "{names:?}");
}

/// libc's separate debug file (Debian's libc6-dbg), found by libc's
/// build-id as the library looks for it.
fn libc_debug_file() -> Option<PathBuf> {
    let notes = Command::new("readelf")
        .args(["-n", "/lib/x86_64-linux-gnu/libc.so.6"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&notes.stdout);
    let id = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))?
        .trim()
        .to_string();
    let p = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    p.is_file().then_some(p)
}

#[test]
#[ignore = "needs libc6-dbg (libc's debug file); scripts/test.sh runs it (cargo test --test reports -- --ignored)"]
fn start_up_frames_are_named_from_symbols_and_folded_away() {
    // Naming `__libc_start_call_main` from libc's DWARF cost a
    // one-leak exit 60 ms. It is named from the debug file's symbol table
    // instead (no line), so the text report still folds it away by name.
    required(libc_debug_file(), "libc6-dbg (apt-get install libc6-dbg)");
    let out = run_traced(&program("leak_n"), &["3", "2"], &[]);
    out.assert_success();
    assert!(
        !out.stderr.contains("libc.so.6+0x"),
        "an unnamed libc frame:\n{}",
        out.stderr
    );
    let r = out.report();
    let start = r.leaks[0]
        .native_stack
        .iter()
        .find(|f| f.function.as_deref() == Some("__libc_start_call_main"))
        .unwrap_or_else(|| panic!("no __libc_start_call_main: {:#?}", r.leaks[0].native_stack));
    assert_eq!((start.file.as_deref(), start.line), (None, None), "{start:?}");
}

/// C functions named `f`, `i`, `v`, `St`, `Dn`, `a` and `b` keep their
/// names in JSON and in text, whether named from line tables or from the
/// symbol table alone: a C++ demangler reads such names as types (`float`,
/// `int`, `void`, `std`, `std::nullptr_t`, `signed char`, `bool`), and
/// reports said so, which also changed groups and what suppressions match.
#[test]
fn plain_c_names_are_not_demangled_as_types() {
    let sim = sim_dir();
    let link = [
        sim.join("libcudart.so.12").display().to_string(),
        sim.join("libcuda.so.1").display().to_string(),
    ];
    let with_lines = program("short_names");
    let symbols_only = build(
        "short_names_g0",
        &["tests/c/short_names.c"],
        &[&link[0], &link[1], "-g0"],
    );
    let want = [
        ("f", 101),
        ("i", 102),
        ("v", 103),
        ("St", 104),
        ("Dn", 105),
        ("a", 106),
        ("b", 107),
    ];
    for exe in [with_lines, symbols_only] {
        let out = run_traced(&exe, &[], &[]);
        out.assert_success();
        let r = out.report();
        let got: Vec<(String, u64)> = want
            .iter()
            .map(|(_, bytes)| {
                let g = r
                    .leaks
                    .iter()
                    .find(|g| g.bytes == *bytes)
                    .unwrap_or_else(|| panic!("{}: no group of {bytes} bytes", exe.display()));
                let name = g.native_stack.first().and_then(|f| f.function.clone());
                (name.unwrap_or_default(), *bytes)
            })
            .collect();
        let want: Vec<(String, u64)> = want.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        assert_eq!(got, want, "{}", exe.display());
        let text = cudaleak(&["report", out.dir.path().to_str().unwrap()], out.dir.path());
        assert_eq!(text.code, Some(0), "{}", text.stderr);
        let text = text.stdout;
        for wrong in ["float", "nullptr", "signed char", "bool", "std"] {
            assert!(!text.contains(wrong), "{wrong:?} in the text report:\n{text}");
        }
        assert!(text.contains("in St "), "{text}");
    }
}
