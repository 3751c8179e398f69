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
    // No NVML on the simulated machine: said so, in JSON and text.
    assert!(
        view["driver_memory"]["unknown"]
            .as_str()
            .unwrap()
            .contains("NVML"),
        "{view}"
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

/// tests/python/top_grow.py under the library, paced through its stdin.
fn start_python(args: &[&str]) -> PipedProgram {
    let runtime = sim_dir().join("libcudart.so.12").display().to_string();
    let script = repo().join("tests/python/top_grow.py").display().to_string();
    let pythonpath = repo().join("tests/python").display().to_string();
    let python = std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut all = vec![script.as_str()];
    all.extend_from_slice(args);
    PipedProgram::start(
        std::path::Path::new(&python),
        &all,
        &[
            ("SIMCUDA_RUNTIME", runtime.as_str()),
            ("PYTHONPATH", pythonpath.as_str()),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ],
    )
}

/// The Python program's site whose label names `function` at its line.
fn python_site<'a>(view: &'a serde_json::Value, function: &str, marker: &str) -> &'a serde_json::Value {
    let at = format!(
        "{function} top_grow.py:{}",
        line_of("tests/python/top_grow.py", marker)
    );
    view["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"].as_str().unwrap().contains(&at))
        .unwrap_or_else(|| panic!("no site at {at} in {view}"))
}

/// A Python program: the growing line shows a positive change and the
/// steady one none, by their Python lines; held still, the view's bytes
/// are a live report's, site by site.
#[test]
fn a_python_program_by_its_lines() {
    // 80 steps of 50 ms, paused at the 40th: the view's two publishes
    // (a second apart) fall within the growth, with about two seconds
    // to spare after "step 3" (20 steps left too little on a loaded
    // machine).
    let mut p = start_python(&["80", "50", "pause", "wait"]);
    p.wait_line("step 3");
    let out = top(&p, &["--once", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let growing = python_site(&view, "growing", "SITE growing");
    assert!(growing["change_bytes"].as_i64().unwrap() > 0, "{view}");
    let steady = python_site(&view, "steady", "SITE steady");
    assert_eq!(steady["change_bytes"], 0, "{view}");
    assert_eq!(steady["live_bytes"].as_u64(), Some(MIB));
    let stack: Vec<&str> = steady["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        stack
            .iter()
            .any(|l| l.contains("in steady") && l.contains("top_grow.py")),
        "{stack:?}"
    );
    p.wait_line("paused");
    let out = top(&p, &["--once", "--format", "json"]);
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = p.child.id().to_string();
    let dump = cli_command(&["dump", &pid, "--timeout", "20"], p.dir.path())
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let r = &reports_in(p.dir.path())[0];
    assert_eq!(view["live_bytes"].as_u64(), Some(r.totals.live_bytes));
    assert_eq!(
        python_site(&view, "growing", "SITE growing")["live_bytes"].as_u64(),
        Some(40 * MIB)
    );
    assert_eq!(r.totals.live_bytes, 41 * MIB);
    p.go_on();
}

/// A tmux server of its own, for one test.
struct Tmux {
    socket: std::path::PathBuf,
    _dir: TempDir,
}

impl Tmux {
    fn start(command: &str, cwd: &std::path::Path) -> Tmux {
        let dir = TempDir::new("tmux");
        let t = Tmux {
            socket: dir.path().join("socket"),
            _dir: dir,
        };
        let cwd = cwd.display().to_string();
        t.run(&[
            "new-session",
            "-d",
            "-s",
            "v",
            "-x",
            "160",
            "-y",
            "40",
            "-c",
            &cwd,
            command,
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux: {e} (scripts/install-test-deps.sh installs it)"));
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "v"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "v"])
    }

    /// A new window running `command`, a viewer, once its view shows;
    /// the viewer's pid (the window's shell's one child).
    fn viewer_window(&self, command: &str) -> i32 {
        self.run(&["new-window", "-t", "v", command]);
        self.wait_for("the new window's view", |s| s.contains("at growing_site"));
        let shell: i32 = self
            .run(&["display-message", "-p", "-t", "v", "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap();
        let viewer = children_of(shell);
        assert_eq!(viewer.len(), 1, "{viewer:?}");
        viewer[0]
    }

    /// The screen once `ready` holds of it.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ready(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no {what} on the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// The line of `screen` that contains `what`, by number.
fn row_of(screen: &str, what: &str) -> usize {
    screen
        .lines()
        .position(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no {what} in\n{screen}"))
}

/// The processes whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Whether the terminal is back as it was: `stty -a` printed after the
/// view shows canonical input and echo again.
fn terminal_restored(screen: &str) -> bool {
    let words: Vec<&str> = screen.split_whitespace().collect();
    words.contains(&"icanon") && words.contains(&"echo") && !words.contains(&"-icanon")
}

/// tests/c/fake_nvml.c as libnvidia-ml.so.1: the directory to put first
/// on the viewer's LD_LIBRARY_PATH.
fn fake_nvml_dir() -> std::path::PathBuf {
    let lib = build(
        "libnvidia-ml.so.1",
        &["tests/c/fake_nvml.c"],
        &["-shared", "-fPIC"],
    );
    lib.parent().unwrap().to_path_buf()
}

/// The interactive view in a real terminal: header, table, sorting, a
/// site's stack, a report written on request, a process killed while
/// viewed, and the terminal restored by `q` and by Ctrl-C.
#[test]
#[ignore = "needs tmux (scripts/install-test-deps.sh); scripts/test.sh runs it (--ignored)"]
fn the_interactive_view_in_a_terminal() {
    // The process's CUDA device 0 is the machine's device 1.
    let mut p = PipedProgram::start(
        &program("metrics"),
        &["grow", "250", "100", "wait"],
        &[("CUDA_VISIBLE_DEVICES", "GPU-fake-1")],
    );
    p.wait_line("step 2");
    let pid = p.child.id().to_string();
    let cli = format!(
        "env LD_LIBRARY_PATH={} {}",
        fake_nvml_dir().display(),
        cli().display()
    );
    let shell = format!("{cli} top {pid}; echo \"top exited $?\"; stty -a; exec sleep 60");
    let t = Tmux::start(&shell, p.dir.path());
    // One view for scripts, with the driver's figures.
    let once = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cli} top {pid} --once --format json"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&once.stdout).unwrap();
    assert_eq!(
        v["driver_memory"],
        serde_json::json!([{"device": "0", "free_bytes": 60u64 << 30, "total_bytes": 80u64 << 30}]),
        "{v}"
    );
    let once = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cli} top {pid} --once"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(
        text.lines().nth(2).unwrap().contains("GPU 0: ")
            && text.contains("driver: 60.0 GiB free of 80.0 GiB"),
        "{text}"
    );
    let s = t.wait_for("the table", |s| {
        s.contains("at growing_site metrics.c:") && s.contains("at steady_site metrics.c:")
    });
    assert!(s.contains(&format!("cudaleak top: pid {pid} ")), "{s}");
    assert!(s.contains("out-of-memory events, 0 failed calls"), "{s}");
    // What the device holds, and the driver's figures of the device its
    // CUDA_VISIBLE_DEVICES names (through NVML).
    assert!(
        s.contains("GPU 0: ") && s.contains(", driver: 60.0 GiB free of 80.0 GiB"),
        "{s}"
    );
    assert!(
        s.contains("1:live ▼") && s.contains("history") && s.contains("4:since attach"),
        "{s}"
    );
    // Largest first: the growing site above the steady MiB.
    assert!(
        row_of(&s, "at growing_site") < row_of(&s, "at steady_site"),
        "{s}"
    );
    // By call site, A to Z, then Z to A.
    t.keys(&["6"]);
    let s = t.wait_for("the sort by call site", |s| s.contains("6:call site ▼"));
    assert!(
        row_of(&s, "at growing_site") < row_of(&s, "at steady_site"),
        "{s}"
    );
    t.keys(&["r"]);
    let s = t.wait_for("the reversed sort", |s| s.contains("6:call site ▲"));
    assert!(
        row_of(&s, "at steady_site") < row_of(&s, "at growing_site"),
        "{s}"
    );
    // Back to live bytes; the first row's stack, then closed.
    t.keys(&["r", "1", "Enter"]);
    let growing = line_of("tests/c/metrics.c", "SITE growing");
    let s = t.wait_for("the stack", |s| s.contains("stack of site"));
    assert!(
        s.contains("in growing_site ") && s.contains(&format!("metrics.c:{growing}")),
        "{s}"
    );
    assert!(s.contains(" in main "), "{s}");
    t.keys(&["Escape"]);
    t.wait_for("the stack closed", |s| !s.contains("stack of site"));
    // A live report on request.
    t.keys(&["d"]);
    t.wait_for("the request's status", |s| {
        s.contains(&format!("asked process {pid} for a live report"))
    });
    let start = Instant::now();
    while reports_in(p.dir.path()).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no report written on request"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second viewer, left with Ctrl-C.
    t.viewer_window(&format!(
        "{cli} top {pid}; echo \"second exited $?\"; stty -a; exec sleep 60"
    ));
    t.keys(&["C-c"]);
    let s = t.wait_for("the second viewer's end", |s| {
        s.contains("second exited 0") && s.contains("baud")
    });
    assert!(terminal_restored(&s), "{s}");
    t.run(&["kill-window", "-t", "v"]);
    // A third, ended by SIGTERM.
    let viewer = t.viewer_window(&format!(
        "{cli} top {pid}; echo \"third exited $?\"; stty -a; exec sleep 60"
    ));
    // SAFETY: kill with a pid and a signal number.
    unsafe { libc::kill(viewer, libc::SIGTERM) };
    let s = t.wait_for("the third viewer's end", |s| {
        s.contains("third exited 0") && s.contains("baud")
    });
    assert!(terminal_restored(&s), "{s}");
    t.run(&["kill-window", "-t", "v"]);
    // A fourth, whose terminal goes away: it ends, rather than wait for a
    // key that cannot come.
    let viewer = t.viewer_window(&format!("{cli} top {pid}; exec sleep 60"));
    t.run(&["kill-window", "-t", "v"]);
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{viewer}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the viewer of a closed terminal still runs"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Killed while viewed: its last state, marked; its view file removed.
    let view = p
        .dir
        .path()
        .join(".cudaleak-view")
        .join(format!("view.{pid}.json"));
    assert!(view.exists());
    // SAFETY: kill with a pid and a signal number.
    unsafe { libc::kill(p.child.id() as i32, libc::SIGKILL) };
    let _ = p.child.wait();
    let s = t.wait_for("the killed process", |s| {
        s.contains("process ended without a last view: killed?")
    });
    assert!(s.contains("at growing_site"), "its last state stays: {s}");
    assert!(!view.exists(), "the view of a killed process is removed");
    t.keys(&["q"]);
    let s = t.wait_for("the viewer's end", |s| {
        s.contains("top exited 0") && s.contains("baud")
    });
    assert!(terminal_restored(&s), "{s}");
    assert_eq!(
        t.run(&["display-message", "-p", "-t", "v", "#{alternate_on}"])
            .trim(),
        "0"
    );
}

/// `cudaleak run --watch`: the view of every process of the run in the
/// terminal, the command's output in the log it names, the summary once
/// the view is left; Ctrl-C interrupts the command as a terminal would.
#[test]
#[ignore = "needs tmux (scripts/install-test-deps.sh); scripts/test.sh runs it (--ignored)"]
fn run_watch_shows_every_process_of_the_run() {
    let dir = TempDir::new("watch");
    let reports = dir.path().join("reports");
    let metrics = program("metrics").display().to_string();
    let run = format!(
        "env LD_LIBRARY_PATH={} {} run --watch --dir {}",
        sim_dir().display(),
        cli().display(),
        reports.display()
    );
    let shell = format!(
        "{run} -- sh -c '{metrics} grow 40 100 & {metrics} grow 40 100; wait'; echo \"run exited $?\"; stty -a; exec sleep 60"
    );
    let t = Tmux::start(&shell, dir.path());
    // The processes listed: the shell and its two programs.
    let listed = |s: &str| -> usize {
        s.lines().find(|l| l.starts_with("processes: ")).map_or(0, |l| {
            l.split_whitespace()
                .filter(|w| {
                    !w.trim_matches(['[', ']']).is_empty()
                        && w.trim_matches(['[', ']']).chars().all(|c| c.is_ascii_digit())
                })
                .count()
        })
    };
    let s = t.wait_for("both programs", |s| {
        s.contains("at growing_site") && listed(s) == 3
    });
    assert!(s.lines().any(|l| l.starts_with("COMMAND: sh -c")), "{s}");
    assert!(
        s.lines()
            .any(|l| l.starts_with(&format!("its output: {}/cudaleak-watch.", reports.display()))),
        "{s}"
    );
    // The shell that started them published nothing: a program is shown.
    let current = |s: &str| -> String {
        let l = s
            .lines()
            .find(|l| l.starts_with("processes: "))
            .unwrap()
            .to_string();
        l.split('[')
            .nth(1)
            .unwrap()
            .split([']', ' '])
            .next()
            .unwrap()
            .to_string()
    };
    let first = current(&s);
    assert!(
        s.contains(&format!("cudaleak top: pid {first} ")) && s.contains("metrics grow 40 100"),
        "{s}"
    );
    t.keys(&["Tab"]);
    let s = t.wait_for("the next process", |s| current(s) != first);
    assert_ne!(current(&s), first);
    let s = t.wait_for("the command's end", |s| {
        s.contains("the command has exited: q shows the summary")
    });
    let log = std::fs::read_dir(&reports)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("cudaleak-watch.")
        })
        .expect("the command's log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("step 40\n").count(), 2, "{text}");
    assert!(
        !s.contains("step 40"),
        "the command's output stays out of the view: {s}"
    );
    t.keys(&["q"]);
    let s = t.wait_for("the run's end", |s| {
        s.contains("run exited 0") && s.contains("baud")
    });
    assert!(s.contains("2 processes reported"), "{s}");
    assert!(s.contains("the command's output is in"), "{s}");
    // The shell never allocated, so never took its request: withdrawn.
    let left: Vec<_> = std::fs::read_dir(&reports)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".cudaleak-view-request.")
        })
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "requests left behind: {left:?}");
    assert!(terminal_restored(&s), "{s}");

    // Ctrl-C: SIGINT to the command, whose end the view shows; its status
    // is the run's.
    let shell =
        format!("{run} -- {metrics} grow 200 100; echo \"second run exited $?\"; stty -a; exec sleep 60");
    t.run(&["new-window", "-t", "v", &shell]);
    t.wait_for("the program", |s| s.contains("at growing_site"));
    t.keys(&["C-c"]);
    t.wait_for("the interrupted command", |s| {
        s.contains("the command has exited")
    });
    t.keys(&["q"]);
    let s = t.wait_for("the second run's end", |s| {
        s.contains("second run exited 130") && s.contains("baud")
    });
    assert!(terminal_restored(&s), "{s}");
}
