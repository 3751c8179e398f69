//! The `cudaleak` command line against planted-leak programs on the
//! simulated driver: exit statuses, suppressions, report/diff/merge, and
//! bad input.

mod support;

use cudaleak_core::report::Report;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

struct Cli {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn cli_run(args: &[&str], cwd: &Path) -> Cli {
    let mut cmd = Command::new(cli());
    cmd.args(args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("CUDALEAK_DIR")
        .env_remove("LD_PRELOAD");
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(120));
    Cli {
        code: status.code(),
        stdout,
        stderr,
    }
}

fn leak_n() -> String {
    program("leak_n").display().to_string()
}

/// `cudaleak run [flags] --dir DIR -- leak_n a b status`
fn run_leak_n(dir: &TempDir, flags: &[&str], a: &str, b: &str, status: &str) -> Cli {
    let d = dir.path().join("reports");
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    let d = d.to_str().unwrap().to_string();
    let exe = leak_n();
    args.extend_from_slice(&["--dir", &d, "--", &exe, a, b, status]);
    cli_run(&args, dir.path())
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn run_exit_status_in_every_combination() {
    let d = TempDir::new("cli-status");
    let only_a = write(&d, "a.supp", "# site A is known\nleak:^site_a$\n");
    let all = write(&d, "all.supp", "leak:site_*\n");
    // (flags, a, b, program status) → expected status
    let cases: Vec<(Vec<&str>, &str, &str, &str, i32)> = vec![
        (vec![], "0", "0", "0", 0),                                         // clean
        (vec!["--fail-on-leak"], "0", "0", "0", 0),                         // clean, gated
        (vec![], "2", "1", "0", 0),                                         // leaking, not gated
        (vec!["--fail-on-leak"], "2", "1", "0", 23),                        // leaking, gated
        (vec!["--fail-on-leak", "--suppressions", &all], "2", "1", "0", 0), // all suppressed
        (
            vec!["--fail-on-leak", "--suppressions", &only_a],
            "2",
            "1",
            "0",
            23,
        ), // partly
        (
            vec!["--fail-on-leak", "--suppressions", &only_a],
            "2",
            "0",
            "0",
            0,
        ), // the rest is clean
        (vec!["--fail-on-leak"], "2", "1", "5", 5),                         // the program failed
        (vec![], "0", "0", "7", 7),
    ];
    for (flags, a, b, status, want) in cases {
        let out = run_leak_n(&d, &flags, a, b, status);
        assert_eq!(out.code, Some(want), "{flags:?} {a} {b} {status}\n{}", out.stderr);
    }
}

#[test]
fn run_summarizes_every_process_of_the_tree() {
    let d = TempDir::new("cli-tree");
    let fork = program("fork").display().to_string();
    let reports = d.path().join("r").display().to_string();
    let out = cli_run(&["run", "--dir", &reports, "--", &fork, "before"], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("cudaleak: 2 processes reported in"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("111 bytes leaked in 1 block "),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("222 bytes leaked in 1 block "),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .trim_end()
            .ends_with("cudaleak: 333 bytes leaked in 2 blocks"),
        "{}",
        out.stderr
    );
}

#[test]
fn suppressions_move_groups_and_show_hit_counts() {
    let d = TempDir::new("cli-supp");
    let supp = write(&d, "s.supp", "leak:^site_b$\nleak:never_matches\n");
    let out = run_leak_n(&d, &["--suppressions", &supp], "1", "3", "0");
    assert_eq!(out.code, Some(0));
    // The library's exit summary lists the suppression used, as LSan does.
    assert!(out.stderr.contains("Suppressions used:"), "{}", out.stderr);
    assert!(
        out.stderr.contains("      1        600 ^site_b$"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("never_matches"), "{}", out.stderr);
    let r = reports_in(&d.path().join("reports")).pop().unwrap();
    assert_eq!(r.leaks.len(), 1);
    assert_eq!(r.suppressed.len(), 1);
    assert_eq!(r.suppressed[0].suppression.as_deref(), Some("^site_b$"));
    assert_eq!(r.suppressions_used[0].blocks, 3);
}

#[test]
fn report_renders_text_json_and_folded() {
    let d = TempDir::new("cli-report");
    run_leak_n(&d, &[], "2", "1", "0");
    let dir = d.path().join("reports").display().to_string();
    let text = cli_run(&["report", &dir], d.path());
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let a_line = line_of("tests/c/leak_n.c", "/* LEAK site A */");
    assert!(
        text.stdout.contains(&format!(
            "in site_a {}:{a_line}",
            repo().join("tests/c/leak_n.c").display()
        )),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .trim_end()
            .ends_with("cudaleak: 400 bytes leaked in 3 blocks"),
        "{}",
        text.stdout
    );

    let json = cli_run(&["report", "--format", "json", &dir], d.path());
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    validate(&v);
    assert_eq!(Report::parse(&json.stdout).unwrap().leaked_bytes(), 400);

    let folded = cli_run(&["report", "--format", "folded", &dir], d.path());
    let lines: Vec<&str> = folded.stdout.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].ends_with(";main;site_a;cudaMalloc 200"), "{}", lines[0]);
    assert!(lines[1].ends_with(";main;site_b;cudaMalloc 200"), "{}", lines[1]);

    let top = cli_run(&["report", "--top", "1", "--format", "json", &dir], d.path());
    assert_eq!(Report::parse(&top.stdout).unwrap().leaks.len(), 1);
}

#[test]
fn diff_matches_stacks_across_processes_by_symbols() {
    let d1 = TempDir::new("cli-diff-old");
    let d2 = TempDir::new("cli-diff-new");
    run_leak_n(&d1, &[], "2", "1", "0");
    run_leak_n(&d2, &[], "5", "0", "0");
    let old = d1.path().join("reports").display().to_string();
    let new = d2.path().join("reports").display().to_string();
    let out = cli_run(&["diff", &old, &new, "--format", "json"], d1.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let changes = v["changes"].as_array().unwrap();
    let summary: Vec<(String, i64, i64, String)> = changes
        .iter()
        .map(|c| {
            (
                c["change"].as_str().unwrap().to_string(),
                c["bytes_delta"].as_i64().unwrap(),
                c["blocks_delta"].as_i64().unwrap(),
                c["group"]["native_stack"][0]["function"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("grew".into(), 300, 3, "site_a".into()),
            ("gone".into(), -200, -1, "site_b".into())
        ]
    );
    assert_eq!(v["bytes_delta"], 100);
    let text = cli_run(&["diff", &old, &new], d1.path());
    assert!(text.stdout.contains("+300 bytes"), "{}", text.stdout);
    assert!(
        text.stdout
            .trim_end()
            .ends_with("cudaleak: +100 bytes leaked (400 -> 500)"),
        "{}",
        text.stdout
    );
}

#[test]
fn merge_gives_per_rank_totals_and_highlights_the_odd_rank() {
    let d = TempDir::new("cli-merge");
    let reports = d.path().join("ranks");
    let exe = leak_n();
    for rank in 0..4 {
        let mut cmd = Command::new(cli());
        cmd.args(["run", "--dir", reports.to_str().unwrap(), "--", &exe, "1", "0"])
            .env("RANK", rank.to_string())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env_remove("LD_PRELOAD")
            .current_dir(d.path());
        if rank == 2 {
            cmd.env("LEAK_EXTRA", "1");
        }
        let (st, _, err) = run_command(cmd, Duration::from_secs(60));
        assert!(st.success(), "{err}");
    }
    let names: Vec<String> = std::fs::read_dir(&reports)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for rank in 0..4 {
        assert!(
            names.iter().any(|n| n.contains(&format!(".r{rank}."))),
            "{names:?}"
        );
    }
    let out = cli_run(&["merge", reports.to_str().unwrap()], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let t = &out.stdout;
    assert!(t.contains("cudaleak merge: 4 processes"), "{t}");
    let rank2 = t.lines().find(|l| l.trim_start().starts_with("rank 2")).unwrap();
    assert!(
        rank2.contains("400") && rank2.contains("<-- leaks much more than the others"),
        "{t}"
    );
    let rank0 = t.lines().find(|l| l.trim_start().starts_with("rank 0")).unwrap();
    assert!(!rank0.contains("<--"), "{t}");
    assert!(
        t.contains(
            "Leaked on some processes only:\n  300 bytes in 1 block by cudaMalloc (device memory) at site_c leak_n.c:10 -- on rank 2"
        ),
        "{t}"
    );
    assert!(
        t.contains("400 bytes in 4 blocks by cudaMalloc (device memory) at site_a leak_n.c:8 -- on rank 0, rank 1, rank 2, rank 3"),
        "{t}"
    );
    assert!(
        t.trim_end()
            .ends_with("cudaleak: 700 bytes leaked in 5 blocks across 4 processes"),
        "{t}"
    );
    let json = cli_run(
        &["merge", "--format", "json", reports.to_str().unwrap()],
        d.path(),
    );
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    validate(&v);
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4);
}

fn one_error_line(out: &Cli, needle: &str) {
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].starts_with("cudaleak: ") && lines[0].contains(needle),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"));
}

#[test]
fn bad_input_gets_one_clear_error_line() {
    let d = TempDir::new("cli-bad");
    let missing = d.path().join("missing.json").display().to_string();
    one_error_line(&cli_run(&["report", &missing], d.path()), "No such file");
    let truncated = write(
        &d,
        "cudaleak.t.json",
        r#"{"format": "cudaleak", "version": 1, "trig"#,
    );
    one_error_line(
        &cli_run(&["report", &truncated], d.path()),
        "truncated or corrupt",
    );
    let foreign = write(&d, "foreign.json", r#"{"hello": "world"}"#);
    one_error_line(&cli_run(&["report", &foreign], d.path()), "not a cudaleak report");
    let newer = write(&d, "newer.json", r#"{"format": "cudaleak", "version": 2}"#);
    one_error_line(
        &cli_run(&["report", &newer], d.path()),
        "report version 2 is newer than this cudaleak understands",
    );
    let bad_fields = write(
        &d,
        "bad.json",
        r#"{"format": "cudaleak", "version": 1, "trigger": "exit"}"#,
    );
    one_error_line(
        &cli_run(&["report", &bad_fields], d.path()),
        "malformed cudaleak report",
    );
    let empty_dir = d.path().join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    one_error_line(
        &cli_run(&["merge", empty_dir.to_str().unwrap()], d.path()),
        "no cudaleak reports",
    );
    one_error_line(&cli_run(&["diff", &missing, &foreign], d.path()), "No such file");
    let exe = leak_n();
    let unreadable = d.path().join("nope.supp").display().to_string();
    one_error_line(
        &cli_run(&["run", "--suppressions", &unreadable, "--", &exe], d.path()),
        "cannot read suppressions file",
    );
    let malformed = write(&d, "bad.supp", "leak:ok\nthread:foo\n");
    one_error_line(
        &cli_run(&["run", "--suppressions", &malformed, "--", &exe], d.path()),
        "bad.supp:2",
    );
    one_error_line(
        &cli_run(&["run", "--", "/nonexistent/program"], d.path()),
        "cannot run /nonexistent/program",
    );
}

#[test]
fn run_says_where_it_looked_for_the_library() {
    let d = TempDir::new("cli-nolib");
    let copy = d.path().join("cudaleak");
    std::fs::copy(cli(), &copy).unwrap();
    let mut cmd = Command::new(&copy);
    cmd.args(["run", "--", "/bin/true"])
        .env_remove("CUDALEAK_LIBRARY");
    let (status, _, stderr) = run_command(cmd, Duration::from_secs(30));
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains("cannot find libcudaleak.so; looked in:"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&d.path().join("libcudaleak.so").display().to_string()),
        "{stderr}"
    );
    // Ways that exist: no package of that name is published.
    for way in [
        "CUDALEAK_LIBRARY",
        "pip install --force-reinstall ./cudaleak",
        "cudaleak lib",
    ] {
        assert!(stderr.contains(way), "{way}: {stderr}");
    }
    assert!(!stderr.contains("pip install cudaleak"), "{stderr}");
}

#[test]
fn presets_set_what_they_document() {
    let d = TempDir::new("cli-presets");
    let out = cli_run(&["run", "--pytorch", "--jax", "--", "/usr/bin/env"], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for want in [
        "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync",
        "XLA_PYTHON_CLIENT_PREALLOCATE=false",
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
    ] {
        assert!(out.stdout.lines().any(|l| l == want), "{want} missing");
    }
    assert!(out
        .stdout
        .lines()
        .any(|l| l.starts_with("LD_PRELOAD=") && l.contains("libcudaleak.so")));
}

#[test]
fn default_suppressions_cover_library_one_time_allocations_and_can_be_turned_off() {
    let d = TempDir::new("cli-default-supp");
    let exe = program("default_supp").display().to_string();
    let on = d.path().join("on").display().to_string();
    let out = cli_run(&["run", "--fail-on-leak", "--dir", &on, "--", &exe], d.path());
    assert_eq!(
        out.code,
        Some(23),
        "the ordinary leak still fails: {}",
        out.stderr
    );
    let r = reports_in(Path::new(&on)).pop().unwrap();
    assert_eq!(r.leaks.len(), 1);
    assert_eq!(r.leaks[0].bytes, 320);
    assert_eq!(r.suppressed[0].suppression.as_deref(), Some("cublasCreate_v2"));
    let off = d.path().join("off").display().to_string();
    cli_run(
        &["run", "--no-default-suppressions", "--dir", &off, "--", &exe],
        d.path(),
    );
    let r = reports_in(Path::new(&off)).pop().unwrap();
    assert_eq!(r.leaks.len(), 2);
    assert!(r.suppressed.is_empty());
}

/// A run in which nothing was reported leaves no report
/// directory it made itself behind; one that existed stays, and so does
/// one that holds reports.
#[test]
fn run_leaves_no_empty_report_directory_it_made() {
    let d = TempDir::new("cli-empty-dir");
    // --dir with two levels that do not exist: both go again.
    let nested = d.path().join("made/reports");
    let out = cli_run(
        &["run", "--dir", nested.to_str().unwrap(), "--", "/bin/true"],
        d.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("no process made a CUDA allocation"),
        "{}",
        out.stderr
    );
    assert!(
        !d.path().join("made").exists(),
        "the directories run made are left"
    );
    // The default, ./cudaleak-reports, likewise.
    let out = cli_run(&["run", "--", "/bin/true"], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!d.path().join("cudaleak-reports").exists());
    // A directory that was there before is the user's: it stays.
    let mine = d.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    let out = cli_run(
        &["run", "--dir", mine.to_str().unwrap(), "--", "/bin/true"],
        d.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(mine.is_dir());
    // Reported: the directory is kept with its reports.
    let out = run_leak_n(&d, &[], "1", "0", "0");
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(reports_in(&d.path().join("reports")).len(), 1);
}

/// `cudaleak env` lists every flag of the one table, once, with
/// its default and meaning, in the table's order.
#[test]
fn env_lists_every_flag_of_the_table_with_its_default() {
    let d = TempDir::new("cli-env");
    let out = cli_run(&["env"], d.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let names: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("CUDALEAK_"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let flags = cudaleak_core::config::FLAGS;
    assert_eq!(names, flags.iter().map(|f| f.name).collect::<Vec<_>>());
    for f in flags {
        let at = out.stdout.find(&format!("{} ", f.name)).unwrap();
        let entry: Vec<&str> = out.stdout[at..].lines().take(2).collect();
        assert!(
            entry[0].ends_with(&format!(" default: {}", f.default)),
            "{entry:?}"
        );
        assert_eq!(entry[1].trim(), f.help, "{}", f.name);
    }
    // the way to try out-of-memory reports without a GPU
    assert!(
        out.stdout
            .contains("SIMCUDA_DEVICE_BYTES           default: unlimited\n"),
        "{}",
        out.stdout
    );
}
