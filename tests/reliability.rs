//! Reports that must not be lost, signals that must not kill the job, bad
//! values and limits that must hold: real processes under the
//! library on the simulated driver.

mod support;

use cudaleak_core::report::{Report, Trigger, RUN_ID_ENV, RUN_MARKER_PREFIX};
use cudaleak_core::writer::STALE_TEMPORARY_AGE;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;
use support::*;

const SRC: &str = "tests/c/reliability.c";
const SECS: Duration = Duration::from_secs(60);

fn program() -> std::path::PathBuf {
    support::program("reliability")
}

fn functions(r: &Report) -> Vec<(String, u64, u64)> {
    let mut v: Vec<_> = r
        .leaks
        .iter()
        .map(|g| {
            (
                g.native_stack[0].function.clone().unwrap_or_default(),
                g.blocks,
                g.bytes,
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn sigterm_during_the_exit_report_still_writes_it() {
    // All 4096 groups written: a report that takes a while to write.
    let out = run_traced(
        &program(),
        &["term_at_exit"],
        &[("CUDALEAK_MAX_GROUPS", "100000")],
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "the signal's default action goes on; stderr:\n{}",
        out.stderr
    );
    let r = out.report();
    assert_eq!(r.trigger, Trigger::Exit, "the report being written is finished");
    assert_eq!(r.totals.live_blocks, 1 << 12);
    assert_eq!(r.leaks.iter().map(|g| g.blocks).sum::<u64>(), 1 << 12);
}

#[test]
fn python_stopped_by_ctrl_c_writes_its_report() {
    let sim = sim_dir().join("libcudart.so.12");
    let script = repo().join("tests/python/interrupted.py");
    let python = std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = run_traced(
        Path::new(&python),
        &[script.to_str().unwrap()],
        &[
            ("SIMCUDA_RUNTIME", sim.to_str().unwrap()),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ],
    );
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "stderr:\n{}", out.stderr);
    assert!(out.stderr.contains("KeyboardInterrupt"), "{}", out.stderr);
    let r = out.report();
    assert_eq!((r.trigger, r.signal), (Trigger::FatalSignal, Some(libc::SIGINT)));
    assert_eq!(r.leaks.len(), 1);
    let g = &r.leaks[0];
    assert_eq!((g.blocks, g.bytes), (1, 4242));
    let line = line_of("tests/python/interrupted.py", "# LEAK interrupted");
    assert!(
        g.python_stack
            .iter()
            .any(|f| f.file.ends_with("interrupted.py") && f.line == Some(line)),
        "{:?}",
        g.python_stack
    );
}

#[test]
fn exec_writes_the_old_images_report_and_the_new_image_its_own() {
    let out = run_traced(&program(), &["exec_parent"], &[]);
    out.assert_success();
    let reports = out.reports();
    assert_eq!(reports.len(), 2, "stderr:\n{}", out.stderr);
    let old = reports
        .iter()
        .find(|r| r.reason.as_deref() == Some("exec"))
        .expect("the old image's report");
    let new = reports
        .iter()
        .find(|r| r.reason.is_none())
        .expect("the new image's report");
    assert_eq!(old.pid, new.pid, "exec keeps the pid");
    assert_ne!(old.instance, new.instance, "each image is its own instance");
    assert_eq!((old.trigger, old.exit_status), (Trigger::Exit, None));
    assert_eq!((new.trigger, new.exit_status), (Trigger::Exit, Some(0)));
    assert_eq!(functions(old), [("leak_before_exec".into(), 1, 1000)]);
    assert_eq!(functions(new), [("leak_after_exec".into(), 2, 4000)]);
    group_at(
        old,
        "leak_before_exec",
        "reliability.c",
        line_of(SRC, "/* LEAK before exec */"),
    );
    group_at(
        new,
        "leak_after_exec",
        "reliability.c",
        line_of(SRC, "/* LEAK after exec */"),
    );
}

#[test]
fn a_failed_exec_goes_on_and_the_exit_report_is_written_again() {
    let out = run_traced(&program(), &["exec_fails"], &[]);
    out.assert_success();
    let reports = out.reports();
    let got: Vec<_> = reports
        .iter()
        .map(|r| (r.reason.clone(), r.exit_status, functions(r)))
        .collect();
    assert_eq!(
        got,
        [
            (
                Some("exec".into()),
                None,
                vec![("leak_before_exec".into(), 1, 1000)]
            ),
            (
                None,
                Some(0),
                vec![
                    ("leak_before_exec".into(), 1, 1000),
                    ("leak_once".into(), 1, 1000)
                ]
            ),
        ]
    );
}

/// Python's os.execvp tries execv once per PATH entry: each failed try
/// wrote another full, fsynced exec report, and the first one removed the
/// run marker for good, so the gate missed a report lost later.
#[test]
fn exec_tried_along_a_path_writes_one_report_and_keeps_the_run_marker() {
    let out = run_traced(&program(), &["execv_path"], &[(RUN_ID_ENV, "execv-path")]);
    out.assert_success();
    assert!(
        out.stdout.contains("markers after a failed exec: 1\n"),
        "the marker is made again after a failed exec; stdout:\n{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("markers in the new image: 1\n"),
        "the new image has its own marker only; stdout:\n{}",
        out.stdout
    );
    let reports = out.reports();
    let mut got: Vec<_> = reports.iter().map(|r| (r.reason.clone(), functions(r))).collect();
    got.sort();
    assert_eq!(
        got,
        [
            (None, vec![("leak_after_exec".into(), 2, 4000)]),
            (Some("exec".into()), vec![("leak_before_exec".into(), 1, 1000)]),
        ],
        "stderr:\n{}",
        out.stderr
    );
    let left: Vec<_> = std::fs::read_dir(out.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(RUN_MARKER_PREFIX))
        .collect();
    assert!(left.is_empty(), "no marker left behind: {left:?}");
}

/// The dump handler installed at load replaced SIG_IGN: the program no
/// longer ignored SIGUSR1, and a child it exec'd (where a handled signal
/// goes back to its default action, an ignored one stays ignored) died of
/// it.
#[test]
fn an_ignored_dump_signal_stays_ignored_across_exec() {
    let out = run_traced(&program(), &["usr1_ignored_exec"], &[]);
    assert!(
        out.stdout.contains("SIGUSR1 still ignored: 1\n"),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.status.signal(), None, "stderr:\n{}", out.stderr);
    out.assert_success();
    assert!(
        out.stdout.contains("the child survived SIGUSR1\n"),
        "{}",
        out.stdout
    );
}

/// kill(0, SIGTERM) ends the sender too: it wrote no report, as only a
/// signal sent to its own pid counted as one to itself.
#[test]
fn sigterm_to_our_own_process_group_writes_the_report() {
    let out = run_traced(&program(), &["term_own_group"], &[]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "stderr:\n{}",
        out.stderr
    );
    let r = out.report();
    assert_eq!((r.trigger, r.signal), (Trigger::FatalSignal, Some(libc::SIGTERM)));
    assert_eq!(functions(&r), [("leak_once".into(), 1, 1000)]);
}

#[test]
fn a_link_planted_at_the_next_report_name_does_not_lose_the_report() {
    let out = run_traced(&program(), &["planted_link"], &[]);
    out.assert_success();
    let planted = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("planted "))
        .expect("the program planted a link");
    let link = out.dir.path().join(planted);
    assert!(
        link.symlink_metadata().unwrap().file_type().is_symlink(),
        "the link is left alone"
    );
    assert!(
        !out.dir.path().join("planted-target").exists(),
        "nothing written through it"
    );
    std::fs::remove_file(&link).unwrap();
    assert!(!out.stderr.contains("cannot write"), "{}", out.stderr);
    let reports = out.reports();
    let triggers: Vec<_> = reports.iter().map(|r| r.trigger).collect();
    assert_eq!(triggers, [Trigger::Api, Trigger::Exit]);
    assert_eq!(functions(&reports[1]), [("leak_once".into(), 1, 1000)]);
}

#[test]
fn stale_temporaries_of_killed_processes_are_removed_and_no_others() {
    let dir = TempDir::new("stale");
    let host = cudaleak_core::writer::ReportName {
        hostname: hostname(),
        rank: None,
        pid: 0,
        instance: String::new(),
        sequence: 0,
        trigger: "",
    }
    .file_name();
    // "cudaleak.<host>.0..0..json": the host as the library writes it.
    let host = host
        .strip_prefix("cudaleak.")
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .to_string();
    // What a SIGKILL in the middle of a dump leaves: a pid that is gone.
    let dead = format!(".cudaleak.{host}.4999999.1-ab.1.signal.json.0123abcd.tmp");
    let alive = format!(
        ".cudaleak.{host}.{}.1-ab.1.signal.json.0123abcd.tmp",
        std::process::id()
    );
    let other_host = ".cudaleak.elsewhere.4999999.1-ab.1.signal.json.0123abcd.tmp".to_string();
    // Left long ago: a temporary written within the last hour may belong to
    // a writer in another pid namespace, and stays.
    let long_ago = std::time::SystemTime::now() - STALE_TEMPORARY_AGE - Duration::from_secs(60);
    for n in [&dead, &alive, &other_host] {
        std::fs::write(dir.path().join(n), vec![b'x'; 4096]).unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(dir.path().join(n))
            .unwrap();
        f.set_modified(long_ago).unwrap();
    }
    let out = run_traced(
        &program(),
        &["stacks", "1"],
        &[("CUDALEAK_DIR", dir.path().to_str().unwrap())],
    );
    out.assert_success();
    assert!(
        !dir.path().join(&dead).exists(),
        "the dead process's temporary is removed"
    );
    assert!(dir.path().join(&alive).exists(), "a live process's is not");
    assert!(dir.path().join(&other_host).exists(), "another host's is not");
    assert_eq!(reports_in(dir.path()).len(), 1);
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    assert_eq!(
        // SAFETY: a writable buffer of `buf.len()` bytes, which
        // gethostname does not write past.
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) },
        0
    );
    let end = buf.iter().position(|b| *b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Before its first CUDA allocation call a process has no handler of ours:
/// SIGUSR1 ends it by its default action, as it would without the library
/// (a launcher or shell that never calls CUDA keeps every default), and
/// nothing is reported.
#[test]
fn sigusr1_before_the_first_allocation_ends_the_process_as_without_the_library() {
    let out = run_traced(&program(), &["usr1_early"], &[]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGUSR1),
        "stderr:\n{}",
        out.stderr
    );
    assert!(
        out.reports().is_empty(),
        "no CUDA call was made: nothing to report"
    );
    let plain = std::process::Command::new(program())
        .arg("usr1_early")
        .env("LD_LIBRARY_PATH", sim_dir())
        .status()
        .unwrap();
    assert_eq!(
        plain.signal(),
        out.status.signal(),
        "the same status without the library"
    );
}

#[test]
fn reserved_signals_and_huge_intervals_warn_and_change_nothing_else() {
    for (name, value) in [
        ("CUDALEAK_SIGNAL", "32"),
        ("CUDALEAK_SIGNAL", "33"),
        ("CUDALEAK_SIGNAL", "99"),
        ("CUDALEAK_INTERVAL", "1e30"),
        ("CUDALEAK_INTERVAL", "9.3e18"),
    ] {
        let out = run_traced(&program(), &["leak_once"], &[(name, value)]);
        out.assert_success();
        let warnings = out.stderr_lines_with(name);
        assert_eq!(warnings.len(), 1, "{name}={value}: {}", out.stderr);
        let r = out.report();
        assert_eq!(functions(&r), [("leak_once".into(), 1, 1000)], "{name}={value}");
    }
}

#[test]
fn the_dump_thread_survives_a_huge_interval() {
    // 9.3e18 s overflowed Instant in the dump thread, which died: after
    // that no signal dump was ever written.
    let p = spawn_traced(
        &support::program("live"),
        &["busy"],
        &[("CUDALEAK_INTERVAL", "9.3e18")],
    );
    assert_eq!(p.wait_line(SECS), "ready");
    p.signal(libc::SIGUSR1);
    let r = p.wait_reports(1, SECS);
    assert_eq!(r[0].trigger, Trigger::Signal);
    std::fs::write(p.dir.path().join("stop"), b"").unwrap();
    let (status, _, _) = p.wait(SECS);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_thread_with_a_16_kib_stack_can_call_cuda_malloc() {
    for depth in ["64", "0"] {
        let out = run_traced(&program(), &["small_stack"], &[("CUDALEAK_STACK_DEPTH", depth)]);
        out.assert_success();
        let r = out.report();
        assert_eq!((r.totals.allocations, r.totals.frees), (2, 1));
        assert_eq!(
            r.leaks.iter().map(|g| (g.blocks, g.bytes)).collect::<Vec<_>>(),
            [(1, 4096)]
        );
    }
}

/// The first allocation call named the dumper thread
/// from the caller's stack (`pthread_setname_np` formats a /proc path with
/// sprintf): about 2.2 KB more than needed. And every entry-point lookup
/// (the runtime makes hundreds at its first call) copied the whole hook
/// table onto the stack, 8 bytes a hook, more with each hook added. The
/// thread first takes 5800 bytes of its 16 KiB stack (the library's first
/// call crashed from 5100 on before the first fix, from 5200 on once the
/// table had 120 hooks, and works to about 6000 now; without the library
/// the program works to about 7200).
#[test]
fn a_thread_with_a_16_kib_stack_can_call_cuda_malloc_at_its_deepest() {
    let out = run_traced(&program(), &["small_stack", "16384", "5800"], &[]);
    out.assert_success();
    assert_eq!(out.report().leaks.len(), 1);
}

#[test]
fn past_cudaleak_max_stacks_new_stacks_are_dropped_and_counted() {
    let out = run_traced(&program(), &["stacks", "6"], &[("CUDALEAK_MAX_STACKS", "10")]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.totals.stacks_dropped, 64 - 10);
    assert_eq!(r.leaks.len(), 11, "10 stacks and the unknown group");
    let unknown = r
        .leaks
        .iter()
        .find(|g| g.api == "unknown")
        .expect("the unknown group");
    assert_eq!((unknown.blocks, unknown.native_stack.len()), (54, 0));
    assert!(out.stderr.contains("stacks dropped: 54 "), "{}", out.stderr);
    let file = std::fs::read_dir(out.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .unwrap();
    let text = std::process::Command::new(cli())
        .arg("report")
        .arg(&file)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("stacks dropped: 54 "));
}

#[test]
fn past_cudaleak_max_groups_the_rest_is_counted_not_written() {
    let out = run_traced(&program(), &["stacks", "6"], &[("CUDALEAK_MAX_GROUPS", "5")]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.leaks.len(), 5);
    let left = r.totals.groups_left_out.expect("groups_left_out");
    assert_eq!((left.groups, left.blocks, left.bytes), (59, 59, 59));
    assert_eq!((r.leaked_blocks(), r.leaked_bytes()), (64, 64));
    assert!(
        out.stderr
            .contains("SUMMARY: cudaleak: 64 bytes leaked in 64 blocks"),
        "{}",
        out.stderr
    );
    assert!(out
        .stderr
        .contains("groups left out: 59 more groups, 59 bytes in 59 blocks"));
}

#[test]
fn a_suppressions_file_that_is_a_fifo_or_a_device_is_refused_with_a_warning() {
    let dir = TempDir::new("supp");
    let fifo = dir.path().join("supp.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: creating a FIFO at a path of our own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        let out = run_traced(&program(), &["leak_once"], &[("CUDALEAK_SUPPRESSIONS", path)]);
        out.assert_success();
        let warnings = out.stderr_lines_with("CUDALEAK_SUPPRESSIONS");
        assert_eq!(warnings.len(), 1, "{path}: {}", out.stderr);
        assert!(warnings[0].contains("not a regular file"), "{}", warnings[0]);
        assert_eq!(functions(&out.report()), [("leak_once".into(), 1, 1000)]);
    }
}
