//! `cudaleak top`: the live view of a running process, read as its user
//! reads it, on the simulated driver. The subject is tests/c/metrics.c:
//! one call site that grows, one that holds steady.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

/// tests/c/metrics.c, paced through its stdin.
fn start(args: &[&str]) -> PipedProgram {
    PipedProgram::start(&program("metrics"), args, &[])
}

/// `cudaleak top PID ARGS` of `p`, from its report directory.
fn top(p: &PipedProgram, args: &[&str]) -> std::process::Output {
    let pid = p.child.id().to_string();
    let mut all = vec!["top", pid.as_str()];
    all.extend_from_slice(args);
    cli_command(&all, p.dir.path()).output().unwrap()
}

fn site<'a>(view: &'a serde_json::Value, function: &str) -> &'a serde_json::Value {
    view["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["label"]
                .as_str()
                .unwrap()
                .contains(&format!("at {function} metrics.c:"))
        })
        .unwrap_or_else(|| panic!("no site {function} in {view}"))
}

const MIB: u64 = 1 << 20;

/// While one call site grows and another holds, one view shows the
/// growing one with a positive change over the last second and the steady
/// one with none, each labelled as reports label it.
#[test]
fn once_shows_the_growing_site_growing() {
    let mut p = start(&["grow", "100", "50", "wait"]);
    p.wait_line("step 2");
    let out = top(&p, &["--once", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["pid"], p.child.id());
    assert!(view["sequence"].as_u64().unwrap() >= 2);
    assert_eq!(view["exited"], false);
    let growing = site(&view, "growing_site");
    assert!(growing["change_bytes"].as_i64().unwrap() > 0, "{view}");
    let steady = site(&view, "steady_site");
    assert_eq!(steady["change_bytes"], 0);
    assert_eq!(steady["live_bytes"].as_u64(), Some(MIB));
    let line = line_of("tests/c/metrics.c", "SITE growing");
    assert_eq!(
        growing["label"].as_str().unwrap(),
        format!("cudaMalloc (device memory) at growing_site metrics.c:{line}")
    );
    // The text view says the same.
    let text = top(&p, &["--once"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("call site") && text.contains("at steady_site metrics.c:"),
        "{text}"
    );
    // No report was written for the view.
    assert!(reports_in(p.dir.path()).is_empty());
}

/// With the program holding still, the view's bytes equal a live
/// report's, site by site.
#[test]
fn the_view_agrees_with_a_live_report() {
    let mut p = start(&["grow", "8", "10", "pause", "wait"]);
    p.wait_line("paused");
    let out = top(&p, &["--once", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = p.child.id().to_string();
    let dump = cli_command(&["dump", &pid, "--timeout", "20"], p.dir.path())
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let r = &reports_in(p.dir.path())[0];
    assert_eq!(view["live_bytes"].as_u64(), Some(r.totals.live_bytes));
    assert_eq!(view["live_blocks"].as_u64(), Some(r.totals.live_blocks));
    for (function, marker) in [("growing_site", "SITE growing"), ("steady_site", "SITE steady")] {
        let g = group_at(r, function, "metrics.c", line_of("tests/c/metrics.c", marker));
        assert_eq!(
            site(&view, function)["live_bytes"].as_u64(),
            Some(g.bytes),
            "{function}"
        );
    }
    assert_eq!(site(&view, "growing_site")["live_bytes"].as_u64(), Some(4 * MIB));
    p.go_on();
}

/// A process that ends while viewed is shown as exited, with its last
/// state; the viewer then ends too.
#[test]
fn a_process_that_exits_while_viewed_is_shown_exited() {
    let mut p = start(&["grow", "4", "10", "pause"]);
    p.wait_line("paused");
    let pid = p.child.id().to_string();
    let viewer = cli_command(&["top", &pid], p.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let view = p
        .dir
        .path()
        .join(".cudaleak-view")
        .join(format!("view.{pid}.json"));
    let start = Instant::now();
    while !view.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "no view published");
        std::thread::sleep(Duration::from_millis(20));
    }
    p.go_on();
    let out = viewer.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("(process exited; its last state)"), "{text}");
    assert!(!view.exists(), "the viewer removes the view of an ended process");
}

/// A process without the library is refused with one line; so is a pid
/// that does not exist.
#[test]
fn a_process_without_the_library_is_refused() {
    let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let dir = TempDir::new("top-refused");
    let out = cli_command(&["top", &sleeper.id().to_string(), "--once"], dir.path())
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not running under cudaleak"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let none = cli_command(&["top", "999999999", "--once"], dir.path())
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
}
