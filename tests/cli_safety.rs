//! Reports never lost and jobs never killed, the command-line side: files the
//! CLI creates or reads that someone else can plant, the CI gate failing
//! closed and keeping concurrent runs apart, SIGUSR1 sent to `cudaleak run`,
//! sums that overflowed, control characters from reports, and EPIPE. Each
//! test reproduces a case that once went wrong.

mod support;

use serde_json::{json, Value};
use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use support::*;

const DEADLINE: Duration = Duration::from_secs(120);

fn cudaleak(args: &[&str], cwd: &Path) -> (ExitStatus, String, String) {
    run_command(cli_command(args, cwd), DEADLINE)
}

fn group(bytes: u64, api: &str, function: &str) -> Value {
    json!({
        "blocks": 1, "bytes": bytes, "api": api, "memory": "device",
        "native_stack": [{"address": "0x1000", "function": function, "file": "train.c", "line": 7, "module": "/app"}],
        "python_stack": []
    })
}

/// A schema-valid exit report with `groups` as its leaks.
fn report_json(pid: i64, command: &str, groups: Vec<Value>) -> Value {
    let v = json!({
        "format": "cudaleak", "version": 1, "trigger": "exit", "sequence": 1, "pid": pid,
        "command": [command], "hostname": "node", "timestamp_ms": 0,
        "totals": {"live_blocks": 0, "live_bytes": 0, "peak_bytes": 0, "allocations": 0, "frees": 0,
                   "failed_allocations": 0, "invalid_frees": 0},
        "leaks": groups, "growth": []
    });
    validate(&v);
    v
}

fn write_report(dir: &Path, name: &str, v: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    p.display().to_string()
}

fn one_error_line(status: ExitStatus, stderr: &str, needle: &str) {
    assert_eq!(status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn hidden_markers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".cudaleak-active."))
                .collect()
        })
        .unwrap_or_default()
}

// ---- 1. demo ----

#[test]
fn demo_uses_a_private_directory_and_never_writes_through_planted_links() {
    let d = TempDir::new("demo-planted");
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // The old demo worked in $TMPDIR/cudaleak-demo-<its pid>. The shell
    // plants that directory with links to the victim, then execs the CLI,
    // which keeps the shell's pid.
    let script = r#"planted="$TMPDIR/cudaleak-demo-$$"
        mkdir "$planted" && for f in libcuda.so.1 libcudart.so.12 demo; do ln -s "$VICTIM" "$planted/$f"; done &&
        exec "$CUDALEAK" demo"#;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .env("TMPDIR", d.path())
        .env("VICTIM", &victim)
        .env("CUDALEAK", cli())
        .env_remove("LD_PRELOAD")
        .env_remove("CUDALEAK_DIR")
        .current_dir(d.path());
    let (status, stdout, stderr) = run_command(cmd, DEADLINE);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    let mut planted = Vec::new();
    let mut private = Vec::new();
    for e in std::fs::read_dir(d.path()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cudaleak-demo-") {
            continue;
        }
        let kinds: Vec<bool> = std::fs::read_dir(e.path())
            .unwrap()
            .flatten()
            .map(|f| f.file_type().unwrap().is_symlink())
            .collect();
        if kinds == [true, true, true] {
            planted.push(e.path());
        } else {
            private.push(e.path());
        }
    }
    assert_eq!(planted.len(), 1, "the planted directory is left as it was");
    assert_eq!(private.len(), 1, "{private:?}");
    let mode = std::fs::metadata(&private[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let reports = reports_in(&private[0].join("reports"));
    assert_eq!(reports.len(), 1);
    assert!(stdout.contains(&private[0].display().to_string()), "{stdout}");
}

// ---- 2. dump ----

#[test]
fn dump_never_writes_through_a_planted_request_link() {
    let d = TempDir::new("dump-planted");
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let reports = d.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    let mut target = idle_traced(&reports, "120");
    let pid = target.id().to_string();
    std::os::unix::fs::symlink(&victim, reports.join(format!(".cudaleak-dump-request.{pid}"))).unwrap();
    let (status, _, stderr) = cudaleak(&["dump", &pid, "--timeout", "1"], d.path());
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    one_error_line(status, &stderr, "not touching it");
}

#[test]
fn dump_refuses_a_report_directory_anyone_can_write_to() {
    let d = TempDir::new("dump-world-writable");
    let open_dir = d.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut target = idle_traced(&open_dir, "120");
    let pid = target.id().to_string();
    let (status, _, stderr) = cudaleak(&["dump", &pid, "--timeout", "1"], d.path());
    let _ = target.kill();
    let _ = target.wait();
    one_error_line(
        status,
        &stderr,
        "anyone can write to it (mode 777, no sticky bit)",
    );
    assert!(!open_dir.join(format!(".cudaleak-dump-request.{pid}")).exists());
}

#[test]
#[ignore = "needs root (it gives a directory to uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn dump_refuses_a_report_directory_of_a_third_user() {
    assert!(is_root(), "this test needs root");
    let d = TempDir::new("dump-foreign-owner");
    let foreign = d.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    // The target and this test run as one user; the directory belongs to
    // neither.
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory.
    assert_ne!(unsafe { libc::geteuid() }, 65534);
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    let mut target = idle_traced(&foreign, "120");
    let pid = target.id().to_string();
    let (status, _, stderr) = cudaleak(&["dump", &pid, "--timeout", "1"], d.path());
    let _ = target.kill();
    let _ = target.wait();
    one_error_line(status, &stderr, "it belongs to uid 65534");
    assert!(!foreign.join(format!(".cudaleak-dump-request.{pid}")).exists());
}

#[test]
#[ignore = "needs root (it runs the command as uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn dump_of_an_unreadable_process_says_it_exists_and_why() {
    assert!(is_root(), "this test needs root");
    let d = TempDir::new("dump-unreadable");
    let mut cmd = cli_command(&["dump", "1"], d.path());
    cmd.uid(65534).gid(65534);
    let (status, _, stderr) = run_command(cmd, DEADLINE);
    one_error_line(
        status,
        &stderr,
        "cannot read process 1: /proc/1/maps: Permission denied",
    );
    assert!(!stderr.contains("no process"), "{stderr}");
}

#[test]
#[ignore = "needs root (the viewer runs as uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn top_of_another_users_process_is_refused_with_one_line() {
    assert!(is_root(), "this test needs root");
    let mut p = PipedProgram::start(&program("metrics"), &["grow", "100", "50", "wait"], &[]);
    p.wait_line("step 1");
    let pid = p.child.id().to_string();
    let d = TempDir::new("top-foreign");
    let mut cmd = cli_command(&["top", &pid, "--once"], d.path());
    cmd.uid(65534).gid(65534);
    let (status, stdout, stderr) = run_command(cmd, DEADLINE);
    one_error_line(
        status,
        &stderr,
        &format!("cannot read process {pid}: /proc/{pid}/maps: Permission denied (os error 13) (it runs as uid 0, this command as uid 65534; run cudaleak as the same user or as root)"),
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!p
        .dir
        .path()
        .join(format!(".cudaleak-view-request.{pid}"))
        .exists());
}

#[test]
fn dump_timeout_inf_waits_and_nan_is_refused() {
    let d = TempDir::new("dump-timeout");
    let (status, _, stderr) = cudaleak(&["dump", "1", "--timeout", "nan"], d.path());
    one_error_line(status, &stderr, "--timeout: expected seconds");
    let run = spawn_traced(&program("live"), &["busy"], &[]);
    assert_eq!(run.wait_line(DEADLINE), "ready");
    let pid = run.pid().to_string();
    for timeout in ["inf", "1e30"] {
        let (status, stdout, stderr) = cudaleak(&["dump", &pid, "--timeout", timeout], run.dir.path());
        assert_eq!(status.code(), Some(0), "--timeout {timeout}: {stderr}");
        assert!(stdout.contains("cudaleak: report written to"), "{stdout}");
    }
    std::fs::write(run.dir.path().join("stop"), "").unwrap();
    let (status, _, _) = run.wait(DEADLINE);
    assert!(status.success());
}

// ---- 3, 4. reading reports ----

#[test]
fn report_and_merge_do_not_follow_directory_links() {
    let d = TempDir::new("report-cycles");
    write_report(
        d.path(),
        "cudaleak.node.7.1-a.1.exit.json",
        &report_json(7, "train", vec![group(100, "cudaMalloc", "site")]),
    );
    std::os::unix::fs::symlink(".", d.path().join("a")).unwrap();
    std::os::unix::fs::symlink(".", d.path().join("b")).unwrap();
    let dir = d.path().display().to_string();
    let (status, stdout, stderr) = cudaleak(&["report", &dir, "--format", "json"], d.path());
    assert!(status.success(), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["leaks"][0]["bytes"], 100, "one report, read once");
    let (status, stdout, stderr) = cudaleak(&["merge", &dir], d.path());
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("cudaleak merge: 1 process "), "{stdout}");
}

#[test]
fn only_regular_files_of_bounded_size_are_read_as_reports() {
    let d = TempDir::new("report-special");
    let fifo = d.path().join("cudaleak.node.7.1-a.1.exit.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (status, _, stderr) = cudaleak(&["report", d.path().to_str().unwrap()], d.path());
    one_error_line(status, &stderr, "not a regular file (a FIFO)");

    let (status, _, stderr) = cudaleak(&["report", "/dev/zero"], d.path());
    one_error_line(
        status,
        &stderr,
        "/dev/zero: not a regular file (a character device)",
    );

    let big = d.path().join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(cudaleak_core::report::MAX_REPORT_BYTES + 1).unwrap(); // sparse
    let (status, _, stderr) = cudaleak(&["report", big.to_str().unwrap()], d.path());
    one_error_line(status, &stderr, "the limit is 268435456 bytes");
}

// ---- 5. the gate ----

fn leak_n() -> String {
    program("leak_n").display().to_string()
}

#[test]
fn concurrent_runs_sharing_a_directory_read_only_their_own_reports() {
    let d = TempDir::new("gate-concurrent");
    let reports = d.path().join("reports").display().to_string();
    let exe = leak_n();
    // The clean job waits, after its own work, until the leaky job is done,
    // so the leaky report is newer than the clean job's start.
    let clean_args: Vec<String> = [
        "run",
        "--fail-on-leak",
        "--dir",
        &reports,
        "--",
        "sh",
        "-c",
        r#""$0" 0 0 && until [ -e leaky-done ]; do sleep 0.05; done"#,
        &exe,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cwd = d.path().to_path_buf();
    let clean = std::thread::spawn(move || {
        let args: Vec<&str> = clean_args.iter().map(String::as_str).collect();
        cudaleak(&args, &cwd)
    });
    wait_until("the clean job's report", DEADLINE, || {
        Path::new(&reports).is_dir() && !reports_in(Path::new(&reports)).is_empty()
    });
    let (status, _, stderr) = cudaleak(
        &["run", "--fail-on-leak", "--dir", &reports, "--", &exe, "3", "0"],
        d.path(),
    );
    assert_eq!(status.code(), Some(23), "{stderr}");
    std::fs::write(d.path().join("leaky-done"), "").unwrap();
    let (status, _, stderr) = clean.join().unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("1 process reported"), "{stderr}");
    assert!(
        stderr.contains("cudaleak: 0 bytes leaked in 0 blocks"),
        "{stderr}"
    );
    let all = reports_in(Path::new(&reports));
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|r| r.run_id.is_some()));
    assert_ne!(all[0].run_id, all[1].run_id);
}

#[test]
fn a_report_that_could_not_be_written_fails_the_gate() {
    let d = TempDir::new("gate-full");
    let reports = d.path().join("reports");
    let r = reports.display().to_string();
    let exe = leak_n();
    // A file size limit stands in for a full disk: the marker (one line)
    // fits, the report does not (EFBIG, as ENOSPC would be).
    let script = r#"trap '' XFSZ; ulimit -f 1; exec "$0" 3 0"#;
    for (flags, expected) in [(&["--fail-on-leak"][..], 24), (&[][..], 0)] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--dir", &r, "--", "sh", "-c", script, &exe]);
        let (status, _, stderr) = cudaleak(&args, d.path());
        assert_eq!(status.code(), Some(expected), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot write the report"), "{stderr}");
        assert!(
            stderr.contains("made CUDA calls but could not write its final report"),
            "{stderr}"
        );
        assert!(!stderr.contains("no process made a CUDA allocation"), "{stderr}");
        assert!(
            hidden_markers(&reports).is_empty(),
            "run removes the markers it acted on"
        );
        // Nothing was reported: the directory run made is gone again.
        assert!(!reports.exists(), "run left {} behind", reports.display());
    }
}

#[test]
fn a_process_killed_after_allocating_fails_the_gate() {
    let d = TempDir::new("gate-sigkill");
    let (status, stderr) = gate_of_a_killed_program(&d.path().join("reports"), "-9", d.path());
    let reports = d.path().join("reports").display().to_string();
    let live = program("live").display().to_string();
    assert_eq!(status.code(), Some(24), "{stderr}");
    assert!(
        stderr.contains("made CUDA calls but wrote no exit report"),
        "{stderr}"
    );
    // A clean process of the same run does not hide the missing one. Its
    // own output file: the first run's `out` already says "ready", and the
    // shell could read that before the new child truncated it, killing the
    // child before its first allocation (seen in CI, 2 runs in 12).
    let script = r#""$1" 0 0; "$0" wait > out2 & p=$!
        until grep -q ready out2; do sleep 0.05; done
        kill -9 $p; wait $p; exit 0"#;
    let exe = leak_n();
    let (status, _, stderr) = cudaleak(
        &[
            "run",
            "--fail-on-leak",
            "--dir",
            &reports,
            "--",
            "sh",
            "-c",
            script,
            &live,
            &exe,
        ],
        d.path(),
    );
    assert_eq!(status.code(), Some(24), "{stderr}");
    assert!(stderr.contains("1 process reported"), "{stderr}");
}

// ---- 6. SIGUSR1 to `cudaleak run` ----

/// Creates the worker's "stop" file when dropped, so that a failing test
/// leaves no orphaned worker behind.
struct StopFile(PathBuf);

impl Drop for StopFile {
    fn drop(&mut self) {
        if std::fs::write(&self.0, "").is_ok() && std::thread::panicking() {
            // Give the worker time to see it before the directory goes.
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

#[test]
fn sigusr1_to_run_asks_the_worker_for_a_dump_and_spares_the_wrapper() {
    let d = TempDir::new("run-sigusr1");
    let reports = d.path().join("reports");
    let live = program("live").display().to_string();
    let stop = StopFile(d.path().join("stop"));
    let out = std::fs::File::create(d.path().join("run.out")).unwrap();
    let mut run = cli_command(
        &[
            "run",
            "--dir",
            reports.to_str().unwrap(),
            "--",
            "bash",
            "-c",
            r#""$0" busy; echo "worker-exit=$?""#,
            &live,
        ],
        d.path(),
    )
    .stdout(out.try_clone().unwrap())
    .stderr(out)
    .spawn()
    .unwrap();
    // "ready" comes after the worker's first CUDA call.
    wait_until("the worker's first CUDA call", DEADLINE, || {
        std::fs::read_to_string(d.path().join("run.out")).is_ok_and(|t| t.contains("ready"))
    });
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGUSR1) }, 0);
    let live_dumps = || {
        reports_in(&reports)
            .into_iter()
            .filter(|r| r.trigger == cudaleak_core::report::Trigger::Api)
            .count()
    };
    wait_until("a live dump from the worker", DEADLINE, || {
        if let Some(status) = run.try_wait().unwrap() {
            let text = std::fs::read_to_string(d.path().join("run.out")).unwrap();
            panic!("cudaleak run ended on SIGUSR1 ({status:?}): {text}");
        }
        live_dumps() == 1
    });
    drop(stop);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "run did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(d.path().join("run.out")).unwrap();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(text.contains("worker-exit=0"), "the wrapper lived on: {text}");
    let all = reports_in(&reports);
    assert_eq!(all.len(), 2, "the live dump and the exit report");
    assert_eq!(all[0].reason.as_deref(), Some("cudaleak dump"));
}

// ---- 7. sums ----

#[test]
fn sums_saturate_instead_of_wrapping() {
    let d = TempDir::new("sums");
    let max = u64::MAX;
    let big = write_report(
        d.path(),
        "big.json",
        &report_json(
            7,
            "train",
            vec![
                group(max, "cudaMalloc", "site_a"),
                group(max, "cudaMalloc", "site_b"),
            ],
        ),
    );
    let empty = write_report(d.path(), "empty.json", &report_json(7, "train", vec![]));
    let (status, stdout, _) = cudaleak(&["report", &big], d.path());
    assert!(status.success());
    assert_eq!(
        stdout.lines().last(),
        Some("cudaleak: 18446744073709551615 bytes leaked in 2 blocks")
    );
    let (status, stdout, _) = cudaleak(&["diff", &empty, &big], d.path());
    assert!(status.success());
    assert!(
        stdout.contains("cudaleak: +18446744073709551615 bytes leaked (0 -> 18446744073709551615)"),
        "{stdout}"
    );
    let (_, stdout, _) = cudaleak(&["diff", &empty, &big, "--format", "json"], d.path());
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["bytes_delta"], json!(i64::MAX));
    assert!(v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["bytes_delta"] == json!(i64::MAX)));
    // The same group in two processes.
    let m = TempDir::new("sums-merge");
    for pid in [1, 2] {
        write_report(
            m.path(),
            &format!("cudaleak.node.{pid}.1-a.1.exit.json"),
            &report_json(pid, "train", vec![group(max, "cudaMalloc", "site_a")]),
        );
    }
    let (_, stdout, _) = cudaleak(
        &["report", m.path().to_str().unwrap(), "--format", "json"],
        d.path(),
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["leaks"][0]["bytes"], json!(max));
}

// ---- 8. control characters ----

#[test]
fn control_characters_from_reports_are_escaped_in_text_output() {
    let d = TempDir::new("escapes");
    let forged = "cudaleak: 0 bytes leaked in 0 blocks";
    let api = format!("cudaMalloc\n\x1b[1A\x1b[2K{forged}");
    let evil = report_json(
        7,
        &format!("train\r{forged}"),
        vec![group(100, &api, "site\x1b[8m\u{202e}")],
    );
    let a = write_report(d.path(), "cudaleak.node.7.1-a.1.exit.json", &evil);
    let empty = write_report(d.path(), "empty.json", &report_json(7, "train", vec![]));
    let dir = d.path().display().to_string();
    for args in [
        vec!["report", &a],
        vec!["report", &a, "--format", "folded"],
        vec!["diff", &empty, &a],
        vec!["merge", &dir],
    ] {
        let (status, stdout, stderr) = cudaleak(&args, d.path());
        assert!(status.success(), "{args:?}: {stderr}");
        assert!(
            !stdout.contains(['\x1b', '\r', '\u{202e}']),
            "{args:?}: raw control characters in {stdout:?}"
        );
        assert!(
            !stdout.lines().any(|l| l.starts_with(forged)),
            "{args:?}: a forged line in {stdout}"
        );
        assert!(stdout.contains(r"\x1b[2K"), "{args:?}: {stdout}");
    }
}

// ---- 9. EPIPE ----

#[test]
fn output_into_a_closed_pipe_stops_quietly() {
    let d = TempDir::new("epipe");
    // Far more than a pipe holds (64 KiB), so the writer meets the closed end.
    let groups = (0..3000)
        .map(|i| group(100 + i, "cudaMalloc", &format!("site_{i}")))
        .collect();
    write_report(
        d.path(),
        "cudaleak.node.7.1-a.1.exit.json",
        &report_json(7, "train", groups),
    );
    let dir = d.path().display().to_string();
    for args in [
        vec!["report", &dir, "--format", "json"],
        vec!["merge", &dir, "--format", "json"],
        vec!["report", &dir, "--format", "folded"],
    ] {
        let mut child = cli_command(&args, d.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty());
        // The reader is gone now (`| head -1`).
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {status:?}"
        );
    }
}
