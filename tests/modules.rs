//! Modules and libraries on the simulated driver: each loaded one is a
//! block of kind `module` with its image's device globals as bytes, until
//! it is unloaded; reported, but never a leak for the gate, the summary or
//! the in-process checks.

mod support;

use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::{Group, Report, Trend};
use std::time::Duration;
use support::*;

const FILE: &str = "tests/c/modules.c";
/// .nv.global (1 MiB) and .nv.global.init (4 KiB) of the program's cubin.
const GLOBALS: u64 = (1 << 20) + 4096;

fn run(args: &[&str]) -> (Report, Outcome) {
    let (out, plain) = run_traced_and_untraced(&program("modules"), args, &[]);
    plain.assert_success();
    out.assert_success();
    assert_eq!(out.stdout, plain.stdout);
    (out.report(), out)
}

fn module_at<'a>(r: &'a Report, function: &str, marker: &str) -> &'a Group {
    group_at(r, function, "modules.c", line_of(FILE, marker))
}

#[test]
fn a_module_loaded_and_kept_is_reported_with_its_globals_and_is_no_leak() {
    let (r, out) = run(&["once"]);
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = module_at(&r, "load_once", "/* LOAD once */");
    assert_eq!(
        (g.blocks, g.bytes, g.api.as_str(), g.kind(), g.memory),
        (
            1,
            GLOBALS,
            "cuModuleLoadData",
            MemoryKind::Module,
            MemoryKind::Device
        )
    );
    // An estimate from the image: not in the live bytes or the peak.
    assert_eq!(
        (r.totals.live_blocks, r.totals.live_bytes, r.totals.peak_bytes),
        (1, 0, 0)
    );
    assert_eq!(r.totals.by_memory[&MemoryKind::Module].bytes, GLOBALS);
    assert_eq!((r.leaked_blocks(), r.leaked_bytes()), (0, 0));
    assert!(!r.has_leaks());
    // No "detected CUDA memory leaks" at exit.
    assert!(
        !out.stderr.contains("detected CUDA memory leaks"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_module_unloaded_leaves_nothing() {
    let (r, _) = run(&["unloaded"]);
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn a_module_loaded_in_a_loop_shows_every_load_and_grows() {
    let (out, plain) = run_traced_and_untraced(&program("modules"), &["loop"], &[]);
    plain.assert_success();
    out.assert_success();
    let reports = out.reports();
    // Five live dumps, one after each load, then the exit report.
    assert_eq!(reports.len(), 6, "{}", out.stderr);
    let line = line_of(FILE, "/* LOAD loop */");
    for (i, r) in reports.iter().enumerate() {
        let g = group_at(r, "load_in_loop", "modules.c", line);
        let loads = (i as u64 + 1).min(5);
        assert_eq!((g.blocks, g.bytes), (loads, loads * GLOBALS), "report {i}");
        if (1..5).contains(&i) {
            // The live dumps name the growth; the module is still no leak.
            assert!(
                r.growth.iter().any(|x| x.kind() == MemoryKind::Module),
                "report {i}"
            );
        }
        if i == 4 {
            // Grown in every dump since the first (growth.rs's trend).
            assert_eq!(g.trend, Some(Trend::Growing), "report {i}");
        }
        assert!(!r.has_leaks());
    }
}

#[test]
fn a_fatbin_s_cubin_gives_the_globals_directly_or_through_the_runtime_s_wrapper() {
    let (r, _) = run(&["fatbin"]);
    let g = module_at(&r, "load_fatbin", "/* LOAD fatbin */");
    assert_eq!(
        (g.blocks, g.bytes, g.api.as_str()),
        (1, GLOBALS, "cuModuleLoadFatBinary")
    );
    let g = module_at(&r, "load_wrapper", "/* LOAD wrapper */");
    assert_eq!(
        (g.blocks, g.bytes, g.api.as_str()),
        (1, GLOBALS, "cuModuleLoadData")
    );
}

#[test]
fn a_module_file_is_read_for_its_globals() {
    let dir = TempDir::new("module-file");
    let path = dir.path().join("kernel.cubin");
    let (r, _) = run(&["file", path.to_str().unwrap()]);
    let g = module_at(&r, "load_file", "/* LOAD file */");
    assert_eq!((g.blocks, g.bytes, g.api.as_str()), (1, GLOBALS, "cuModuleLoad"));
}

#[test]
fn libraries_are_modules_too_until_unloaded() {
    let dir = TempDir::new("library-file");
    let path = dir.path().join("library.cubin");
    let (r, _) = run(&["library", path.to_str().unwrap()]);
    assert_eq!(r.leaks.len(), 1, "the unloaded one is gone: {:#?}", r.leaks);
    let g = module_at(&r, "load_library", "/* LOAD library */");
    assert_eq!(
        (g.blocks, g.bytes, g.api.as_str()),
        (1, GLOBALS, "cuLibraryLoadData")
    );
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn a_reset_takes_a_module_with_its_context_but_not_a_library() {
    let (r, _) = run(&["reset"]);
    let module = module_at(&r, "load_once", "/* LOAD once */");
    assert_eq!((module.blocks, module.torn_down_blocks), (1, 1));
    let library = module_at(&r, "load_library", "/* LOAD library */");
    assert_eq!((library.blocks, library.torn_down_blocks), (1, 0));
    // Neither is a leak: no torn-down leak in the totals.
    assert_eq!(r.totals.torn_down_blocks, 0);
    assert!(!r.has_leaks());
}

#[test]
fn ptx_s_globals_are_not_known() {
    let (r, _) = run(&["ptx"]);
    let g = module_at(&r, "load_ptx", "/* LOAD ptx */");
    assert_eq!((g.blocks, g.bytes, g.kind()), (1, 0, MemoryKind::Module));
}

#[test]
fn the_gate_and_the_summary_count_the_leak_and_not_the_module() {
    let (r, out) = run(&["with_leak"]);
    assert_eq!(r.leaks.len(), 2);
    assert_eq!((r.leaked_blocks(), r.leaked_bytes()), (1, 4096));
    assert!(
        out.stderr
            .contains("Not leaks: 1 module loaded and never unloaded"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("cudaleak: 4096 bytes leaked in 1 block")),
        "{}",
        out.stderr
    );
    // The gate: the module alone passes, the leak fails.
    let exe = program("modules");
    for (mode, want) in [("once", 0), ("with_leak", 23)] {
        let dir = TempDir::new("module-gate");
        let mut cmd = cli_command(
            &[
                "run",
                "--fail-on-leak",
                "--dir",
                dir.path().to_str().unwrap(),
                "--",
                exe.to_str().unwrap(),
                mode,
            ],
            dir.path(),
        );
        cmd.env_remove("LD_PRELOAD");
        let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
        assert_eq!(status.code(), Some(want), "{mode}: {stdout}\n{stderr}");
    }
}

#[test]
fn a_region_check_does_not_count_a_module_loaded_in_it() {
    // The in-process API exists only under the library.
    let out = run_traced(&program("modules"), &["region"], &[]);
    out.assert_success();
    assert_eq!(out.stdout.trim(), "since the checkpoint: 0 blocks, 0 bytes");
}
