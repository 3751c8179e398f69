//! The gate that no directory and no other user can open. A
//! leaking job must fail `cudaleak run --fail-on-leak` whatever happens to
//! its report directory, and another user must not be able to plant a
//! clean report for it.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(120);

fn cudaleak(args: &[&str], cwd: &Path) -> (ExitStatus, String, String) {
    run_command(cli_command(args, cwd), DEADLINE)
}

fn leak_n() -> String {
    program("leak_n").display().to_string()
}

#[test]
fn a_process_whose_marker_and_report_both_fail_fails_the_gate() {
    // A file size limit of 0 stands in for a directory that became full
    // after `run` checked it: neither the marker's line nor the report
    // fits (EFBIG, as ENOSPC would be). The gate once said "no process
    // made a CUDA allocation" and exited 0 here.
    let d = TempDir::new("gate-nothing-fits");
    let reports = d.path().join("reports");
    let r = reports.display().to_string();
    let script = r#"trap '' XFSZ; ulimit -f 0; exec "$0" 3 0"#;
    let (status, _, stderr) = cudaleak(
        &[
            "run",
            "--fail-on-leak",
            "--dir",
            &r,
            "--",
            "sh",
            "-c",
            script,
            &leak_n(),
        ],
        d.path(),
    );
    assert_eq!(status.code(), Some(24), "{stderr}");
    assert!(stderr.contains("cannot create the run marker"), "{stderr}");
    assert!(
        stderr.contains("made CUDA calls but could not write its final report"),
        "{stderr}"
    );
    assert!(!stderr.contains("no process made a CUDA allocation"), "{stderr}");
}

#[test]
#[ignore = "needs root (it runs the gate as uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn run_refuses_a_directory_it_cannot_create_files_in() {
    assert!(is_root(), "this test needs root");
    // A mode-555 directory of another user, as seen by that user's job:
    // the gate runs as nobody, the directory is root's.
    let d = TempDir::new("gate-readonly");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let marker = d.path().join("ran");
    let mut cmd = cli_command(
        &[
            "run",
            "--fail-on-leak",
            "--dir",
            &ro.display().to_string(),
            "--",
            "sh",
            "-c",
            &format!("echo > {}; exec \"$0\" 3 0", marker.display()),
            &leak_n(),
        ],
        Path::new("/"),
    );
    cmd.uid(65534).gid(65534);
    let (status, _, stderr) = run_command(cmd, DEADLINE);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot create files in the report directory"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran");
}

/// Runs a leaking job whose shell, once the leaky process wrote its exit
/// report, plants beside it a clean copy carrying the run id with a higher
/// sequence number (what another user who read the run id from a marker
/// could write), owned by `owner`.
fn run_with_planted_report(d: &Path, owner: Option<u32>) -> (ExitStatus, String) {
    let reports = d.join("reports");
    let plant = d.join("plant.py");
    std::fs::write(
        &plant,
        r#"
import glob, json, os, sys
real = [f for f in glob.glob(os.path.join(sys.argv[1], "cudaleak.*.exit.json"))]
assert len(real) == 1, real
r = json.load(open(real[0]))
r["leaks"] = []
r["sequence"] += 1
name = real[0].replace(".1.exit.json", ".9.exit.json")
with open(name, "w") as f:
    json.dump(r, f)
if sys.argv[2] != "-":
    os.chown(name, int(sys.argv[2]), int(sys.argv[2]))
    # and a report of another user's own run, named as no process of ours
    other = os.path.join(sys.argv[1], "cudaleak.elsewhere.1.1-x.1.exit.json")
    with open(other, "w") as f:
        json.dump(r, f)
    os.chown(other, int(sys.argv[2]), int(sys.argv[2]))
"#,
    )
    .unwrap();
    let owner = owner.map(|u| u.to_string()).unwrap_or_else(|| "-".into());
    let script = format!(
        r#""$0" 3 0 && python3 {} "$CUDALEAK_DIR" {owner}"#,
        plant.display()
    );
    let (status, _, stderr) = cudaleak(
        &[
            "run",
            "--fail-on-leak",
            "--dir",
            &reports.display().to_string(),
            "--",
            "sh",
            "-c",
            &script,
            &leak_n(),
        ],
        d,
    );
    (status, stderr)
}

#[test]
#[ignore = "needs root (it plants a file of uid 65534); scripts/test.sh runs it as root (--ignored)"]
fn a_clean_report_planted_by_another_user_is_ignored() {
    assert!(is_root(), "this test needs root");
    let d = TempDir::new("gate-planted-foreign");
    let (status, stderr) = run_with_planted_report(d.path(), Some(65534));
    assert_eq!(status.code(), Some(23), "{stderr}");
    assert!(
        stderr.contains("does not belong to the user who runs the gate"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ignoring 1 report file in") && stderr.contains("that other users own"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cudaleak: 300 bytes leaked in 3 blocks"),
        "{stderr}"
    );
}

#[test]
fn two_final_reports_for_one_process_fail_the_gate() {
    let d = TempDir::new("gate-planted-own");
    let (status, stderr) = run_with_planted_report(d.path(), None);
    assert_eq!(status.code(), Some(24), "{stderr}");
    assert!(stderr.contains("has 2 final reports"), "{stderr}");
}

/// A final report that could not read all of the live map (a thread held
/// a shard past the exit report's wait) vouches for nothing: the gate says
/// 24 with a line, even when the part it did read has no leak; and its
/// text says so first. Made by marking a clean process's real exit report
/// incomplete after it was written, as a report of a process stopped
/// inside a hook would read.
#[test]
fn an_incomplete_final_report_fails_the_gate_and_says_so_first() {
    let d = TempDir::new("gate-incomplete");
    let reports = d.path().join("reports");
    let mark = d.path().join("mark.py");
    std::fs::write(
        &mark,
        r#"
import glob, json, os, sys
[path] = glob.glob(os.path.join(sys.argv[1], "cudaleak.*.exit.json"))
r = json.load(open(path))
r["incomplete_shards"] = 2
json.dump(r, open(path, "w"))
"#,
    )
    .unwrap();
    let script = format!(r#""$0" 0 0 && python3 {} "$CUDALEAK_DIR""#, mark.display());
    let (status, _, stderr) = cudaleak(
        &[
            "run",
            "--fail-on-leak",
            "--dir",
            &reports.display().to_string(),
            "--",
            "sh",
            "-c",
            &script,
            &leak_n(),
        ],
        d.path(),
    );
    assert_eq!(status.code(), Some(24), "{stderr}");
    assert!(
        stderr.contains("final report is incomplete: 2 parts of the live map could not be read"),
        "{stderr}"
    );
    let (status, stdout, stderr) = cudaleak(&["report", &reports.display().to_string()], d.path());
    assert_eq!(status.code(), Some(0), "{stderr}");
    let first: Vec<&str> = stdout.lines().take(3).collect();
    assert!(
        first
            .iter()
            .any(|l| l.starts_with("INCOMPLETE: 2 parts of the live map")),
        "{stdout}"
    );
}

#[test]
fn reports_and_markers_are_readable_by_their_owner_only() {
    let live = program("live");
    let mut running = spawn_traced(&live, &["wait"], &[("CUDALEAK_RUN_ID", "run-23")]);
    running.wait_line(DEADLINE);
    let d = running.dir.path().to_path_buf();
    let marker = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(".cudaleak-active."))
        .expect("a marker");
    assert_eq!(marker.metadata().unwrap().mode() & 0o777, 0o600);
    running.signal(libc::SIGUSR1);
    running.wait_reports(1, DEADLINE);
    let mut seen = 0;
    for e in std::fs::read_dir(&d).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("cudaleak.") && n.ends_with(".json") {
            seen += 1;
            assert_eq!(e.metadata().unwrap().mode() & 0o777, 0o600, "{n}");
        }
    }
    assert!(seen >= 1);
    let _ = running.child.kill();
    let _ = running.child.wait();
}

#[test]
fn a_fatal_signal_report_counts_in_the_summary() {
    // SIGTERM ends the worker: its `fatal-signal` report holds the leak;
    // the summary said "0 bytes leaked in 0 blocks".
    let d = TempDir::new("gate-sigterm");
    let (status, stderr) = gate_of_a_killed_program(&d.path().join("reports"), "-TERM", d.path());
    assert_eq!(status.code(), Some(23), "{stderr}");
    assert!(stderr.contains("(fatal-signal)"), "{stderr}");
    assert!(!stderr.contains("cudaleak: 0 bytes leaked"), "{stderr}");
}

#[test]
fn a_command_killed_by_a_crash_is_named_with_its_signal() {
    let d = TempDir::new("gate-sigsegv");
    let reports = d.path().join("reports");
    let r = reports.display().to_string();
    let live = program("live").display().to_string();
    let mut cmd = cli_command(
        &["run", "--fail-on-leak", "--dir", &r, "--", &live, "wait"],
        d.path(),
    );
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    // The command's marker names its pid once it has allocated.
    let start = std::time::Instant::now();
    let pid: i32 = loop {
        let found = std::fs::read_dir(&reports).ok().and_then(|rd| {
            rd.flatten().find_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_prefix(".cudaleak-active.")
                    .and_then(|rest| rest.split('.').next()?.parse().ok())
            })
        });
        if let Some(p) = found {
            break p;
        }
        assert!(start.elapsed() < DEADLINE, "no marker");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: signalling the command we started.
    unsafe { libc::kill(pid, libc::SIGSEGV) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGSEGV), "{stderr}");
    assert!(stderr.contains("killed by SIGSEGV"), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "{stderr}");
}

#[test]
fn a_suppressions_path_with_terminal_escapes_is_escaped_in_its_warning() {
    let out = run_traced(
        &program("leak_n"),
        &["1", "0"],
        &[(
            "CUDALEAK_SUPPRESSIONS",
            "/nonexistent/\x1b[31mred\x1b]0;title\x07",
        )],
    );
    let lines = out.stderr_lines_with("CUDALEAK_SUPPRESSIONS");
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        !out.stderr.contains('\x1b') && !out.stderr.contains('\x07'),
        "{:?}",
        out.stderr
    );
    assert!(lines[0].contains("\\u{1b}[31mred"), "{}", lines[0]);
}

#[test]
fn a_dump_signal_that_would_end_the_program_is_refused() {
    let out = run_traced(&program("leak_n"), &["1", "0"], &[("CUDALEAK_SIGNAL", "TERM")]);
    let lines = out.stderr_lines_with("CUDALEAK_SIGNAL");
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(lines[0].contains("would no longer end"), "{}", lines[0]);
}

#[test]
fn report_of_a_directory_names_the_file_it_chose() {
    let d = TempDir::new("report-dir-file");
    let reports = d.path().join("reports");
    let r = reports.display().to_string();
    let (status, _, stderr) = cudaleak(&["run", "--dir", &r, "--", &leak_n(), "1", "0"], d.path());
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("cudaleak: 100 bytes leaked in 1 block\n"),
        "{stderr}"
    );
    let (status, stdout, stderr) = cudaleak(&["report", &r], d.path());
    assert_eq!(status.code(), Some(0), "{stderr}");
    let file = stdout
        .lines()
        .find_map(|l| l.strip_prefix("file: "))
        .unwrap_or_else(|| panic!("no file line: {stdout}"));
    assert!(
        file.starts_with(&format!("{r}/cudaleak.")) && file.ends_with(".exit.json"),
        "{file}"
    );
}

#[test]
fn dump_notices_at_once_that_the_process_died() {
    let d = TempDir::new("dump-dies");
    let mut target = idle_traced(d.path(), "2");
    let pid = target.id().to_string();
    let reaper = std::thread::spawn(move || target.wait());
    let started = std::time::Instant::now();
    // With `inf` it waited a year; 60 s here is the test's own
    // limit, far from the 2 s the process lives.
    let (status, _, stderr) = run_command(
        cli_command(&["dump", &pid, "--timeout", "inf"], d.path()),
        Duration::from_secs(60),
    );
    let _ = reaper.join();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("ended before it wrote the dump"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!d.path().join(format!(".cudaleak-dump-request.{pid}")).exists());
}

#[test]
fn dump_says_a_stopped_process_is_stopped() {
    let d = TempDir::new("dump-stopped");
    let mut target = idle_traced(d.path(), "120");
    let pid = target.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let (status, _, stderr) = cudaleak(&["dump", &pid.to_string(), "--timeout", "1"], d.path());
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("it is stopped"), "{stderr}");
    assert!(!stderr.contains("once it has made a CUDA allocation"), "{stderr}");
}

#[test]
fn dump_finds_a_renamed_copy_of_the_library_and_names_run_s_child() {
    use std::io::BufRead;
    let d = TempDir::new("dump-renamed");
    let copy = d.path().join("lib.so");
    std::fs::copy(lib(), &copy).unwrap();
    let mut target = std::process::Command::new(program("live"))
        .arg("wait")
        .env("LD_PRELOAD", &copy)
        .env("CUDALEAK_DIR", d.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = target.id().to_string();
    let (status, stdout, stderr) = cudaleak(&["dump", &pid, "--timeout", "30"], d.path());
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("cudaleak: report written to"), "{stdout}");

    // `cudaleak run`'s own pid: the command it runs is named.
    let reports = d.path().join("reports").display().to_string();
    let mut run = cli_command(&["run", "--dir", &reports, "--", "sleep", "120"], d.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let children = format!("/proc/{}/task/{}/children", run.id(), run.id());
    let start = std::time::Instant::now();
    let child = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(c) = text.split_whitespace().next() {
            break c.to_string();
        }
        assert!(start.elapsed() < DEADLINE, "run started no command");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (status, _, stderr) = cudaleak(&["dump", &run.id().to_string(), "--timeout", "1"], d.path());
    let _ = run.kill();
    let _ = run.wait();
    // SAFETY: the command `run` started (orphaned by the kill above).
    unsafe { libc::kill(child.parse().unwrap(), libc::SIGKILL) };
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("cudaleak dump {child}")), "{stderr}");
}

#[test]
fn a_huge_function_name_is_capped_in_every_rendering() {
    let d = TempDir::new("huge-name");
    let name = "f".repeat(5 << 20);
    let v = serde_json::json!({
        "format": "cudaleak", "version": 1, "trigger": "exit", "sequence": 1, "pid": 7,
        "command": ["app"], "hostname": "node", "timestamp_ms": 0,
        "totals": {"live_blocks": 1, "live_bytes": 64, "peak_bytes": 64, "allocations": 1, "frees": 0,
                   "failed_allocations": 0, "invalid_frees": 0},
        "leaks": [{
            "blocks": 1, "bytes": 64, "api": "cudaMalloc", "memory": "device",
            "native_stack": [{"address": "0x1000", "function": name, "file": "a.c", "line": 3, "module": "/app"}],
            "python_stack": []
        }],
        "growth": []
    });
    validate(&v);
    let file = d.path().join("cudaleak.node.7.1-a.1.exit.json");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let f = file.display().to_string();
    for format in ["text", "folded", "svg", "html"] {
        let (status, stdout, stderr) = cudaleak(&["report", &f, "--format", format], d.path());
        assert_eq!(status.code(), Some(0), "{format}: {stderr}");
        // The page's own script and style are some 100 KB; the name is
        // at most 4 KiB wherever it appears.
        assert!(stdout.len() < 400_000, "{format}: {} bytes", stdout.len());
        assert!(stdout.contains('…'), "{format}: no ellipsis");
    }
}

#[test]
fn symbolizing_from_a_huge_file_named_by_a_report_maps_it_instead_of_reading_it() {
    let d = TempDir::new("huge-module");
    // A sparse file: no disk, and reading it all took its size in memory
    // (3 GB cost 3.1 GB of RSS).
    let module = d.path().join("huge.so");
    std::fs::File::create(&module)
        .unwrap()
        .set_len(600 << 20)
        .unwrap();
    let v = serde_json::json!({
        "format": "cudaleak", "version": 1, "trigger": "exit", "sequence": 1, "pid": 7,
        "command": ["app"], "hostname": "node", "timestamp_ms": 0,
        "totals": {"live_blocks": 1, "live_bytes": 64, "peak_bytes": 64, "allocations": 1, "frees": 0,
                   "failed_allocations": 0, "invalid_frees": 0},
        "leaks": [{
            "blocks": 1, "bytes": 64, "api": "cudaMalloc", "memory": "device",
            "native_stack": [{"address": "0x1010", "function": null, "file": null, "line": null,
                              "module": module.display().to_string(),
                              "offset": "0x10", "build_id": "ab".repeat(20)}],
            "python_stack": []
        }],
        "growth": []
    });
    validate(&v);
    let file = d.path().join("cudaleak.node.7.1-a.1.exit.json");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    // The command's peak RSS, as its parent sees it.
    let script = "import resource, subprocess, sys\n\
        r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n\
        print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(cli())
        .args(["report", "--symbolize", &file.display().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    assert_eq!(fields.next(), Some("0"), "{text}");
    let max_rss_kib: u64 = fields.next().unwrap().parse().unwrap();
    assert!(max_rss_kib < 150 * 1024, "peak RSS {max_rss_kib} KiB");
}

#[test]
fn nothing_is_written_into_a_data_file_that_took_fd_2() {
    let d = TempDir::new("stderr-reuse");
    let data = d.path().join("data.bin");
    let out = run_traced(&program("stderr_reuse"), &[data.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "DATA\n");
    assert_eq!(out.report().leaked_bytes(), 512);
    // CUDALEAK_LOG: the lines go to a file of the user's choice instead.
    let log = d.path().join("cudaleak.log");
    let out = run_traced(
        &program("stderr_reuse"),
        &[data.to_str().unwrap()],
        &[("CUDALEAK_LOG", log.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "DATA\n");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("cudaleak: 512 bytes leaked in 1 block"),
        "{logged}"
    );
    assert_eq!(std::fs::metadata(&log).unwrap().mode() & 0o777, 0o600);
}

#[test]
fn a_fifo_at_the_log_path_neither_hangs_the_program_nor_gets_the_lines() {
    // Another user (or anything) may put a FIFO where CUDALEAK_LOG points:
    // opening it for writing blocked before main, forever.
    let d = TempDir::new("log-fifo");
    let fifo = d.path().join("cudaleak.log");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = run_traced(
        &program("leak_n"),
        &["3", "2"],
        &[("CUDALEAK_LOG", fifo.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.report().leaked_bytes(), 700);
    assert!(out.stderr.contains("cannot open CUDALEAK_LOG"), "{}", out.stderr);
}
