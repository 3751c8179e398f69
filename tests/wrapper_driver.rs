//! A libcuda.so.1 that wraps the driver, as GPU-sharing and
//! quota shims on Kubernetes clusters and API remoting layers are: it loads
//! the driver by full path and forwards by `dlsym` on that handle, by the
//! driver's `cuGetProcAddress`, or both (sim/driver_wrapper.c). The
//! planted-leak programs run through it under the library with the same
//! status, output and report as without it; before, each lookup of the
//! wrapper got our hook back, whose real function was the wrapper: SIGSEGV.

mod support;

use cudaleak_core::report::Report;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

const MODES: [&str; 3] = ["dlsym", "getproc", "both"];

/// The wrapper, as libcuda.so.1 in a directory of its own (returned);
/// made once per test process (the tests run in parallel).
fn wrapper_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(make_wrapper_dir).clone()
}

fn make_wrapper_dir() -> PathBuf {
    let built = build(
        "libcuda-wrapper.so",
        &["sim/driver_wrapper.c"],
        &[
            "-shared",
            "-fPIC",
            "-O2",
            &format!("-I{}", repo().join("sim").display()),
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic-functions",
            "-ldl",
            "-lpthread",
        ],
    );
    let dir = target_dir().join("cudaleak-tests").join("wrapper-driver");
    std::fs::create_dir_all(&dir).unwrap();
    let dest = dir.join("libcuda.so.1");
    let tmp = dir.join(format!(".libcuda.so.1.{}", std::process::id()));
    std::fs::copy(&built, &tmp).unwrap();
    std::fs::rename(&tmp, &dest).unwrap();
    dir
}

/// The environment that puts the wrapper in front of the simulated driver.
fn wrapped_env(dir: &Path, mode: &str) -> Vec<(String, String)> {
    vec![
        (
            "LD_LIBRARY_PATH".into(),
            format!("{}:{}", dir.display(), sim_dir().display()),
        ),
        (
            "SIMCUDA_WRAPPED_DRIVER".into(),
            sim_dir().join("libcuda.so.1").display().to_string(),
        ),
        ("SIMCUDA_WRAPPER_MODE".into(), mode.into()),
    ]
}

/// What must not change with the wrapper: each group (api, kinds, blocks,
/// bytes, every frame's function, file and line) and the counts.
fn essence(r: &Report) -> String {
    let mut groups: Vec<String> = r
        .leaks
        .iter()
        .map(|g| {
            let frames: Vec<String> = g
                .native_stack
                .iter()
                .map(|f| format!("{:?}:{:?}:{:?}", f.function, f.file, f.line))
                .collect();
            format!(
                "{} {:?} {:?} {} {} [{}]",
                g.api,
                g.memory,
                g.memory_kind,
                g.blocks,
                g.bytes,
                frames.join(" < ")
            )
        })
        .collect();
    groups.sort();
    let t = &r.totals;
    format!(
        "{}\nallocations {} frees {} failed {} invalid {} live {} blocks {} by_memory {:?}",
        groups.join("\n"),
        t.allocations,
        t.frees,
        t.failed_allocations,
        t.invalid_frees,
        t.live_bytes,
        t.live_blocks,
        t.by_memory
    )
}

/// `program args` without the library, which must succeed: its status
/// and output.
fn untraced(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = run_untraced(program, args, env);
    out.assert_success();
    (out.status.code(), out.stdout)
}

/// The lines of `source` (a path in the repository) that plant a leak:
/// those marked `/* LEAK ... */`.
fn planted_lines(source: &str) -> std::collections::BTreeSet<i64> {
    std::fs::read_to_string(repo().join(source))
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("/* LEAK"))
        .map(|(i, _)| i as i64 + 1)
        .collect()
}

/// What the direct run must report, before the wrapper's runs are compared
/// with it: that both lost the planted leaks would otherwise pass.
fn assert_planted(r: &Report, source: Option<&str>, what: &str) {
    let Some(source) = source else {
        assert!(
            r.leaks.is_empty(),
            "{what}: a clean program leaked: {:?}",
            r.leaks
        );
        return;
    };
    let lines = planted_lines(source);
    let file = source.rsplit('/').next().unwrap();
    assert!(!r.leaks.is_empty(), "{what}: the planted leaks are missing");
    for g in &r.leaks {
        assert!(
            g.native_stack.iter().any(|f| {
                f.file.as_deref().is_some_and(|p| p.ends_with(file))
                    && f.line.is_some_and(|l| lines.contains(&l))
            }),
            "{what}: a group that no planted line of {source} made: {} {:?}",
            g.api,
            g.native_stack
                .iter()
                .map(|f| (&f.function, f.line))
                .collect::<Vec<_>>()
        );
    }
}

/// `program args` directly and through the wrapper in every mode, without
/// and under the library: one status, one output, one report, and in it
/// the leaks `source` plants (None: none).
fn same_through_the_wrapper(program: &Path, args: &[&str], source: Option<&str>) {
    let dir = wrapper_dir();
    let (status, stdout) = untraced(program, args, &[]);
    let direct = run_traced(program, args, &[]);
    assert_eq!((direct.status.code(), &direct.stdout), (status, &stdout));
    assert_planted(
        &direct.report(),
        source,
        &format!("{program:?} {args:?} directly"),
    );
    let want = essence(&direct.report());
    for mode in MODES {
        let env = wrapped_env(&dir, mode);
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            untraced(program, args, &pairs),
            (status, stdout.clone()),
            "{program:?} {args:?} through the wrapper ({mode}), without the library"
        );
        let out = run_traced(program, args, &pairs);
        assert_eq!(
            (out.status.code(), &out.stdout),
            (status, &stdout),
            "{program:?} {args:?} through the wrapper ({mode}):\n{}",
            out.stderr
        );
        assert_eq!(
            essence(&out.report()),
            want,
            "{program:?} {args:?} through the wrapper ({mode})"
        );
    }
}

#[test]
fn the_wrapper_is_the_driver_the_programs_load() {
    // Without the driver's path the wrapper has nothing to forward to: the
    // program fails, so the runs below do go through it.
    let dir = wrapper_dir();
    let mut env = wrapped_env(&dir, "dlsym");
    env.retain(|(k, _)| k != "SIMCUDA_WRAPPED_DRIVER");
    let mut cmd = Command::new(program("every_api"));
    cmd.env_remove("LD_PRELOAD");
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let (status, _, stderr) = run_command(cmd, Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        stderr.contains("wrapper libcuda: SIMCUDA_WRAPPED_DRIVER"),
        "{stderr}"
    );
}

#[test]
fn planted_leaks_through_a_wrapper_driver_are_reported_once_each() {
    for name in ["every_api", "entry_points", "teardown"] {
        same_through_the_wrapper(&program(name), &[], Some(&format!("tests/c/{name}.c")));
    }
    same_through_the_wrapper(&program("clean"), &[], None);
    same_through_the_wrapper(&program("imported"), &["leak"], Some("tests/c/imported.c"));
    same_through_the_wrapper(&program("imported"), &["bad"], None);
    same_through_the_wrapper(&program("arrays"), &["leak"], Some("tests/c/arrays.c"));
}

#[test]
fn versioned_entry_points_and_new_kinds_through_a_wrapper_driver() {
    let versioned = versioned_program();
    for mode in ["reset", "release", "ipc", "v1", "attach"] {
        same_through_the_wrapper(&versioned, &[mode], Some("tests/c/versioned.c"));
    }
    for kind in ["retain", "pool", "multicast", "external", "register", "green"] {
        same_through_the_wrapper(&program("kinds"), &["leak", kind], Some("tests/c/kinds.c"));
    }
}
