//! The preload library on real processes: planted leaks through every
//! hooked API and every path to it, on the simulated driver. Each test
//! asserts exact blocks, bytes, API names, functions and lines.

mod support;

use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::Trigger;
use support::*;

const EVERY_API: &str = "tests/c/every_api.c";

/// (marker on the leaking line, function, api, memory kind, bytes)
const EVERY_API_LEAKS: &[(&str, &str, &str, MemoryKind, u64)] = &[
    (
        "/* LEAK cudaMalloc */",
        "runtime_malloc",
        "cudaMalloc",
        MemoryKind::Device,
        1000,
    ),
    (
        "/* LEAK cudaMallocAsync */",
        "runtime_malloc_async",
        "cudaMallocAsync",
        MemoryKind::Device,
        2000,
    ),
    (
        "/* LEAK cudaMallocAsync_ptsz */",
        "runtime_malloc_async_ptsz",
        "cudaMallocAsync_ptsz",
        MemoryKind::Device,
        2100,
    ),
    (
        "/* LEAK cudaMallocHost */",
        "runtime_malloc_host",
        "cudaMallocHost",
        MemoryKind::Host,
        3000,
    ),
    (
        "/* LEAK cudaHostAlloc */",
        "runtime_host_alloc",
        "cudaHostAlloc",
        MemoryKind::Host,
        4000,
    ),
    (
        "/* LEAK cudaMallocManaged */",
        "runtime_malloc_managed",
        "cudaMallocManaged",
        MemoryKind::Managed,
        5000,
    ),
    // pitch rounds the 100-byte rows up to 512
    (
        "/* LEAK cudaMallocPitch */",
        "runtime_malloc_pitch",
        "cudaMallocPitch",
        MemoryKind::Device,
        512 * 10,
    ),
    (
        "/* LEAK cudaMalloc3D */",
        "runtime_malloc_3d",
        "cudaMalloc3D",
        MemoryKind::Device,
        512 * 10 * 2,
    ),
    (
        "/* LEAK cuMemAlloc_v2 */",
        "driver_alloc",
        "cuMemAlloc_v2",
        MemoryKind::Device,
        6000,
    ),
    (
        "/* LEAK cuMemAllocPitch_v2 */",
        "driver_alloc_pitch",
        "cuMemAllocPitch_v2",
        MemoryKind::Device,
        512 * 3,
    ),
    (
        "/* LEAK cuMemAllocManaged */",
        "driver_alloc_managed",
        "cuMemAllocManaged",
        MemoryKind::Managed,
        7000,
    ),
    (
        "/* LEAK cuMemAllocAsync */",
        "driver_alloc_async",
        "cuMemAllocAsync",
        MemoryKind::Device,
        8000,
    ),
    (
        "/* LEAK cuMemAllocAsync_ptsz */",
        "driver_alloc_async_ptsz",
        "cuMemAllocAsync_ptsz",
        MemoryKind::Device,
        8100,
    ),
    (
        "/* LEAK cuMemAllocFromPoolAsync */",
        "driver_alloc_pool",
        "cuMemAllocFromPoolAsync",
        MemoryKind::Device,
        8200,
    ),
    (
        "/* LEAK cuMemAllocFromPoolAsync_ptsz */",
        "driver_alloc_pool_ptsz",
        "cuMemAllocFromPoolAsync_ptsz",
        MemoryKind::Device,
        8300,
    ),
    (
        "/* LEAK cuMemAllocHost_v2 */",
        "driver_alloc_host",
        "cuMemAllocHost_v2",
        MemoryKind::Host,
        9000,
    ),
    (
        "/* LEAK cuMemHostAlloc */",
        "driver_host_alloc",
        "cuMemHostAlloc",
        MemoryKind::Host,
        9100,
    ),
    (
        "/* LEAK cuMemCreate */",
        "vmm_create",
        "cuMemCreate",
        MemoryKind::Physical,
        2 << 20,
    ),
    (
        "/* LEAK cuMemAddressReserve */",
        "vmm_reserve",
        "cuMemAddressReserve",
        MemoryKind::Reservation,
        4 << 20,
    ),
    (
        "/* LEAK cuMemCreate mapped */",
        "vmm_released_but_mapped",
        "cuMemCreate",
        MemoryKind::Physical,
        4 << 20,
    ),
    (
        "/* LEAK cuMemAddressReserve mapped */",
        "vmm_released_but_mapped",
        "cuMemAddressReserve",
        MemoryKind::Reservation,
        8 << 20,
    ),
];

#[test]
fn every_hooked_api_reports_its_planted_leak_exactly() {
    let out = run_traced(&program("every_api"), &[], &[]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.leaks.len(), EVERY_API_LEAKS.len(), "{:#?}", r.leaks);
    for &(marker, func, api, memory, bytes) in EVERY_API_LEAKS {
        let g = group_at(&r, func, "every_api.c", line_of(EVERY_API, marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.blocks, g.bytes),
            (api, memory, 1, bytes),
            "{marker}"
        );
        // the caller of the function that leaked is main
        assert_eq!(g.native_stack[1].function.as_deref(), Some("main"), "{marker}");
        assert!(g.python_stack.is_empty());
    }
    let t = &r.totals;
    // Reserved address space is reported, but is not memory: byte totals
    // leave it out.
    let leaked: u64 = EVERY_API_LEAKS
        .iter()
        .filter(|l| l.3 != MemoryKind::Reservation)
        .map(|l| l.4)
        .sum();
    assert_eq!(t.live_blocks, EVERY_API_LEAKS.len() as u64);
    assert_eq!(t.live_bytes, leaked);
    assert_eq!(t.by_memory[&MemoryKind::Reservation].bytes, 12 << 20);
    // 21 leaks, 4 clean VMM allocations (handle + reservation, twice) and
    // 10 allocate/free pairs in everything_freed
    assert_eq!(t.allocations, 21 + 2 + 10);
    assert_eq!(t.frees, 2 + 10);
    assert_eq!(t.allocations - t.frees, t.live_blocks);
    assert_eq!((t.failed_allocations, t.invalid_frees), (0, 0));
    assert!(t.peak_bytes >= leaked);
    // The LeakSanitizer-style summary ends with the contract's last line.
    let last = out.stderr.lines().last().unwrap();
    assert!(
        last.starts_with(&format!("cudaleak: {leaked} bytes leaked in 21 blocks; report: ")),
        "{last}"
    );
    assert!(out.stderr.contains("ERROR: cudaleak: detected CUDA memory leaks"));
}

#[test]
fn every_path_to_a_driver_function_is_intercepted() {
    let out = run_traced(&program("entry_points"), &[], &[]);
    out.assert_success();
    let r = out.report();
    let file = "tests/c/entry_points.c";
    for (marker, func, api, memory, bytes) in [
        (
            "/* LEAK dlsym */",
            "via_dlsym",
            "cuMemAlloc_v2",
            MemoryKind::Device,
            111,
        ),
        (
            "/* LEAK cuGetProcAddress_v2 */",
            "via_getproc",
            "cuMemAlloc_v2",
            MemoryKind::Device,
            222,
        ),
        (
            "/* LEAK getproc of getproc */",
            "via_getproc_of_getproc",
            "cuMemAlloc_v2",
            MemoryKind::Device,
            333,
        ),
        (
            "/* LEAK cuGetProcAddress */",
            "via_getproc_v1",
            "cuMemAllocHost_v2",
            MemoryKind::Host,
            444,
        ),
        (
            "/* LEAK cudaGetDriverEntryPoint */",
            "via_entry_point",
            "cuMemAlloc_v2",
            MemoryKind::Device,
            555,
        ),
        (
            "/* LEAK cudaGetDriverEntryPointByVersion */",
            "via_entry_point_by_version",
            "cuMemAllocAsync_ptsz",
            MemoryKind::Device,
            666,
        ),
    ] {
        let g = group_at(&r, func, "entry_points.c", line_of(file, marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.blocks, g.bytes),
            (api, memory, 1, bytes),
            "{marker}"
        );
    }
    assert_eq!(r.leaks.len(), 6);
    assert_eq!(r.totals.allocations, 6);
}

#[test]
fn dlsym_keeps_rtld_next_semantics_for_the_caller() {
    let dir = target_dir().join("cudaleak-tests");
    let base = build(
        "librtld_next_base.so",
        &["tests/c/rtld_next_base.c"],
        &["-shared", "-fPIC"],
    );
    let top = build(
        "librtld_next_top.so",
        &["tests/c/rtld_next_top.c"],
        &["-shared", "-fPIC", "-ldl"],
    );
    let exe = build(
        "rtld_next",
        &["tests/c/rtld_next.c"],
        &[
            "-Wl,--no-as-needed",
            &top.display().to_string(),
            &base.display().to_string(),
        ],
    );
    assert!(dir.join("librtld_next_top.so").is_file());
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    assert_eq!(out.stdout.trim(), "probe=11", "stderr: {}", out.stderr);
    // No CUDA allocation call: no report.
    assert!(out.reports().is_empty());
}

#[test]
fn edge_cases_count_failures_and_bad_frees_and_pass_errors_through() {
    let out = run_traced(&program("edge_cases"), &[], &[]);
    out.assert_success();
    assert_eq!(
        out.stdout.trim(),
        "reused=1",
        "the driver should reuse the address"
    );
    // The two out-of-memory failures (1 PiB, runtime then driver) are one
    // episode, with its report; the exit report is the other.
    let reports = out.reports();
    assert_eq!(reports.len(), 2, "{}", out.stderr);
    let oom = reports[0].oom.as_ref().expect("an oom report first");
    assert_eq!((oom.api.as_str(), oom.failed_calls), ("cudaMalloc", 2));
    let r = reports[1].clone();
    assert_eq!(r.totals.failed_allocations, 3);
    assert_eq!(r.totals.invalid_frees, 5);
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_at(
        &r,
        "second_owner",
        "edge_cases.c",
        line_of("tests/c/edge_cases.c", "/* LEAK reuse */"),
    );
    assert_eq!((g.blocks, g.bytes, g.api.as_str()), (1, 4096, "cudaMalloc"));
    assert_eq!(r.totals.allocations - r.totals.frees, r.totals.live_blocks);
}

#[test]
fn blocks_of_destroyed_contexts_are_leaks_and_their_addresses_can_be_reused() {
    let out = run_traced(&program("teardown"), &[], &[]);
    out.assert_success();
    let r = out.report();
    let file = "tests/c/teardown.c";
    let ctx_lines = lines_of(file, "/* LEAK context */");
    assert_eq!(ctx_lines.len(), 2);
    for line in ctx_lines {
        let g = group_at(&r, "leak_in_context", "teardown.c", line);
        assert_eq!((g.blocks, g.bytes), (1, 300));
    }
    let g = group_at(
        &r,
        "leak_before_reset",
        "teardown.c",
        line_of(file, "/* LEAK reset */"),
    );
    assert_eq!((g.blocks, g.bytes, g.api.as_str()), (1, 500, "cudaMalloc"));
    assert_eq!(r.leaks.len(), 3);
    // Reused addresses were freed cleanly; only the stale free is invalid.
    assert_eq!(r.totals.invalid_frees, 1);
    assert_eq!(r.totals.allocations, 2 + 8 + 1 + 1);
    assert_eq!(r.totals.frees, 8 + 1);
    // All three are leaks the device no longer holds.
    assert_eq!(r.totals.live_blocks, 0);
    assert_eq!(
        (r.totals.torn_down_blocks, r.totals.torn_down_bytes),
        (3, 300 + 300 + 500)
    );
}

#[test]
fn eight_threads_freeing_each_others_blocks_give_exact_totals() {
    let out = run_traced(&program("threads"), &[], &[]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.totals.allocations, 8 * (2000 + 2000 + 1));
    assert_eq!(r.totals.frees, 8 * 4000);
    assert_eq!(r.totals.live_blocks, 8);
    assert_eq!((r.totals.failed_allocations, r.totals.invalid_frees), (0, 0));
    assert_eq!(r.leaks.len(), 1);
    let g = group_at(
        &r,
        "leak_one",
        "threads.c",
        line_of("tests/c/threads.c", "/* LEAK thread */"),
    );
    assert_eq!((g.blocks, g.bytes), (8, 8 * 4096));
    assert_eq!(g.native_stack[1].function.as_deref(), Some("worker"));
}

#[test]
fn a_child_forked_before_cuda_use_reports_only_its_own_blocks() {
    let out = run_traced(&program("fork"), &["before"], &[]);
    out.assert_success();
    let reports = out.reports();
    assert_eq!(reports.len(), 2, "{}", out.stderr);
    let file = "tests/c/fork.c";
    let child = reports
        .iter()
        .find(|r| r.leaks.iter().any(|g| g.bytes == 111))
        .expect("child report");
    let parent = reports
        .iter()
        .find(|r| r.leaks.iter().any(|g| g.bytes == 222))
        .expect("parent report");
    assert_ne!(child.pid, parent.pid);
    assert_eq!(child.ppid, Some(parent.pid));
    assert_eq!(child.leaks.len(), 1);
    group_at(child, "child_leak", "fork.c", line_of(file, "/* LEAK child */"));
    assert_eq!((child.totals.allocations, child.totals.frees), (2, 1));
    assert_eq!(parent.leaks.len(), 1);
    group_at(
        parent,
        "parent_leak",
        "fork.c",
        line_of(file, "/* LEAK parent */"),
    );
    assert_eq!((parent.totals.allocations, parent.totals.frees), (1, 0));
}

/// The parent's dumper thread reads the suppressions as it starts, at the
/// first allocation call; the program forks right after it. With a file
/// of 20,000 rules the read is still under way at the fork. The child
/// inherited the read's lock held by a thread it does not have, its own
/// dumper waited on it for good, and the child never exited (the parent
/// waits for it): the fork must wait for the read instead.
#[test]
fn a_fork_while_the_suppressions_are_read_gives_the_child_its_report() {
    let d = TempDir::new("fork-suppressions");
    let rules: String = (0..20_000)
        .map(|i| format!("leak:no_such_function_{i}\n"))
        .collect();
    let file = d.path().join("many.supp");
    std::fs::write(&file, rules).unwrap();
    let out = run_traced(
        &program("fork_trace"),
        &[],
        &[("CUDALEAK_SUPPRESSIONS", file.to_str().unwrap())],
    );
    out.assert_success();
    let mut leaked: Vec<u64> = out.reports().iter().map(|r| r.leaked_bytes()).collect();
    leaked.sort();
    assert_eq!(leaked, [111, 222], "{}", out.stderr);
}

#[test]
fn a_child_without_cuda_calls_writes_no_report_and_does_not_inherit_blocks() {
    let out = run_traced(&program("fork"), &["after"], &[]);
    out.assert_success();
    let r = out.report();
    assert_eq!(r.leaks.len(), 1);
    assert_eq!(r.leaks[0].bytes, 222);
}

#[test]
fn an_exec_d_program_gets_its_own_report() {
    let other = program("edge_cases");
    let out = run_traced(&program("fork"), &["exec", other.to_str().unwrap()], &[]);
    out.assert_success();
    let reports = out.reports();
    // The exec'd program's out-of-memory report and two exit reports.
    assert_eq!(reports.len(), 3, "{}", out.stderr);
    let exec_d = reports
        .iter()
        .find(|r| r.command[0].ends_with("edge_cases") && r.trigger == Trigger::Exit)
        .expect("exec'd report");
    assert_eq!(exec_d.leaks.len(), 1);
    assert_eq!(exec_d.leaks[0].bytes, 4096);
    let parent = reports
        .iter()
        .find(|r| r.command[0].ends_with("fork"))
        .expect("parent report");
    assert_eq!(parent.leaks[0].bytes, 222);
    assert_eq!(exec_d.ppid, Some(parent.pid));
}

#[test]
fn clean_traffic_produces_no_false_leak() {
    let out = run_traced(&program("clean"), &[], &[]);
    out.assert_success();
    let r = out.report();
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!(r.totals.live_blocks, 0);
    assert_eq!(r.totals.live_bytes, 0);
    assert_eq!(r.totals.allocations, 4 * 500 * 3);
    assert_eq!(r.totals.frees, 4 * 500 * 3);
    assert_eq!(r.totals.invalid_frees, 0);
    assert!(!out.stderr.contains("leaked"), "{}", out.stderr);
}

#[test]
fn a_statically_linked_runtime_is_seen_at_the_driver_and_attributed() {
    let sim = sim_dir();
    let exe = build(
        "static_runtime",
        &["tests/c/static_runtime.c"],
        &[
            &sim.join("cudart_static.o").display().to_string(),
            "-ldl",
            "-lpthread",
        ],
    );
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    let r = out.report();
    let file = "tests/c/static_runtime.c";
    let g = group_at(
        &r,
        "static_leak",
        "static_runtime.c",
        line_of(file, "/* LEAK static cudaMalloc */"),
    );
    assert_eq!((g.api.as_str(), g.bytes), ("cudaMalloc", 12345));
    let g = group_at(
        &r,
        "static_leak_host",
        "static_runtime.c",
        line_of(file, "/* LEAK static cudaMallocHost */"),
    );
    assert_eq!(
        (g.api.as_str(), g.memory, g.bytes),
        ("cudaMallocHost", MemoryKind::Host, 777)
    );
    assert_eq!(r.leaks.len(), 2);
}

#[test]
fn a_process_without_allocation_calls_writes_no_report() {
    let out = run_traced(std::path::Path::new("/bin/true"), &[], &[]);
    out.assert_success();
    assert!(out.reports().is_empty());
    assert!(out.stderr.is_empty(), "{}", out.stderr);
}

#[test]
fn bad_environment_values_warn_once_each_and_change_nothing() {
    let out = run_traced(
        &program("edge_cases"),
        &[],
        &[
            ("CUDALEAK_SIGNAL", "SIGBOGUS"),
            ("CUDALEAK_EXITCODE", "many"),
            ("CUDALEAK_PYTHON", "perhaps"),
        ],
    );
    out.assert_success();
    assert_eq!(out.stdout.trim(), "reused=1");
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("cudaleak: ignoring"))
        .collect();
    assert_eq!(warnings.len(), 3, "{}", out.stderr);
    let reports = out.reports();
    assert_eq!(reports.len(), 2, "an oom report and the exit report");
    assert_eq!(reports[1].leaks.len(), 1);
}

#[test]
fn an_unwritable_report_directory_gets_a_clear_message_and_the_program_is_unaffected() {
    let out = run_traced(
        &program("edge_cases"),
        &[],
        &[("CUDALEAK_DIR", "/proc/cudaleak-cannot-write-here")],
    );
    out.assert_success();
    assert_eq!(out.stdout.trim(), "reused=1");
    assert!(
        out.stderr
            .contains("cudaleak: cannot write reports into /proc/cudaleak-cannot-write-here"),
        "{}",
        out.stderr
    );
}

#[test]
fn exit_status_is_unchanged_by_default_and_gated_by_cudaleak_exitcode() {
    let exe = program("every_api");
    assert_eq!(run_traced(&exe, &[], &[]).status.code(), Some(0));
    let gated = run_traced(&exe, &[], &[("CUDALEAK_EXITCODE", "23")]);
    assert_eq!(gated.status.code(), Some(23), "{}", gated.stderr);
    // A clean program keeps its 0.
    assert_eq!(
        run_traced(&program("clean"), &[], &[("CUDALEAK_EXITCODE", "23")])
            .status
            .code(),
        Some(0)
    );
}

/// The exact stack through 20 frames of optimized code, with and without
/// frame pointers, from the fast unwinder and from libgcc's.
#[test]
fn stacks_are_exact_with_and_without_frame_pointers() {
    let link = sim_link_args();
    let file = "tests/c/deep.c";
    let leak_line = line_of(file, "/* LEAK deep */");
    let recurse_line = line_of(file, "/* RECURSE */");
    let mut stacks = Vec::new();
    for (name, fp_flag) in [
        ("deep_nofp", "-fomit-frame-pointer"),
        ("deep_fp", "-fno-omit-frame-pointer"),
    ] {
        let exe = build(name, &[file], &["-O2", fp_flag, &link[0], &link[1]]);
        for unwinder in ["fast", "dwarf"] {
            let out = run_traced(&exe, &["20"], &[("CUDALEAK_UNWINDER", unwinder)]);
            out.assert_success();
            let r = out.report();
            let g = &r.leaks[0];
            let frames = frames_of(g.native_stack.iter().take(21));
            let mut want = vec![("allocate_at_depth".to_string(), leak_line)];
            want.extend((0..19).map(|_| ("allocate_at_depth".to_string(), recurse_line)));
            want.push(("main".to_string(), frames.last().map_or(0, |f| f.1)));
            assert_eq!(frames, want, "{name} with the {unwinder} unwinder");
            stacks.push(
                g.native_stack
                    .iter()
                    .map(|f| f.function.clone())
                    .collect::<Vec<_>>(),
            );
        }
    }
    // Fast and reference unwinders agree frame for frame, to the end.
    assert_eq!(stacks[0], stacks[1]);
    assert_eq!(stacks[2], stacks[3]);
}

/// A stack as (function, line) per frame.
type Frames = Vec<(String, i64)>;

/// `stack`'s frames as (function, line).
fn frames_of<'a>(stack: impl IntoIterator<Item = &'a cudaleak_core::report::NativeFrame>) -> Frames {
    stack
        .into_iter()
        .map(|f| (f.function.clone().unwrap_or_default(), f.line.unwrap_or(0)))
        .collect()
}

/// The frames of a block of `size` bytes from `tests/c/paths.c`: the
/// allocating line first, then route and a level's function per level
/// (a path of `size / 16 - 1`), then main.
fn assert_path_frames(frames: &Frames, size: u64, leak_line: i64, what: &str) {
    assert_eq!(frames[0], ("allocate_for".to_string(), leak_line), "{what}");
    let path = (size / 16 - 1) as i64;
    let depth = if path & 32 != 0 { 13 } else { 12 };
    assert_eq!(
        frames.iter().position(|f| f.0 == "main"),
        Some(depth),
        "{what}, path {path}: {frames:?}"
    );
}

/// Stacks from many call paths in turn, each spliced by the fast unwinder
/// from the one before (its frames up to the first that changed, a walk,
/// then the rest of the last walk where the two meet), are the
/// stacks libgcc's unwinder gives: with and without frame pointers, and at
/// -O0, where every frame's rule is its frame pointer (a splice then
/// carries rbp across the place where the walks meet).
#[test]
fn spliced_stacks_are_the_reference_unwinders_along_every_path() {
    let link = sim_link_args();
    let file = "tests/c/paths.c";
    let leak_line = line_of(file, "/* LEAK path */");
    for (name, flags) in [
        ("paths_nofp", &["-O2", "-fomit-frame-pointer"][..]),
        ("paths_fp", &["-O2", "-fno-omit-frame-pointer"][..]),
        ("paths_o0", &["-O0"][..]),
    ] {
        let mut all_flags = flags.to_vec();
        all_flags.extend(link.iter().map(String::as_str));
        let exe = build(name, &[file], &all_flags);
        let mut by_path = Vec::new();
        for unwinder in ["fast", "dwarf"] {
            let out = run_traced(&exe, &[], &[("CUDALEAK_UNWINDER", unwinder)]);
            out.assert_success();
            let r = out.report();
            // A group per path (its bytes) and loop of main, with its
            // visits and frames.
            let mut groups: Vec<(u64, u64, Frames)> = r
                .leaks
                .iter()
                .map(|g| (g.bytes / g.blocks, g.blocks, frames_of(&g.native_stack)))
                .collect();
            groups.sort();
            let mut sizes: Vec<u64> = groups.iter().map(|g| g.0).collect();
            sizes.dedup();
            assert_eq!(sizes.len(), 64, "{name}, {unwinder}: every path");
            assert_eq!(
                groups.iter().map(|g| g.1).sum::<u64>(),
                428,
                "{name}, {unwinder}: every block"
            );
            for (size, _, frames) in &groups {
                assert_path_frames(frames, *size, leak_line, &format!("{name}, {unwinder}"));
            }
            by_path.push(groups);
        }
        assert_eq!(
            by_path[0], by_path[1],
            "{name}: the fast unwinder against libgcc's"
        );
    }
}

/// Sixteen call paths taken in the same order round after round, fewer
/// than the logs a thread keeps: a capture replays the log that followed
/// the last one (the guess, unit-tested in
/// `capture/unwind/made_up_stack_tests.rs`), except where an odd round
/// leaves a path out: the guess after the path before it is wrong then,
/// and the left-out path's own guess the round after. Every block is its
/// own path's, with the frames libgcc's unwinder gives.
#[test]
fn call_paths_in_a_cycle_keep_their_own_stacks() {
    let link = sim_link_args();
    let file = "tests/c/paths.c";
    let leak_line = line_of(file, "/* LEAK path */");
    let mut flags = vec!["-O2", "-fomit-frame-pointer"];
    flags.extend(link.iter().map(String::as_str));
    let exe = build("paths_nofp", &[file], &flags);
    let mut by_unwinder = Vec::new();
    for unwinder in ["fast", "dwarf"] {
        let out = run_traced(&exe, &["cycle"], &[("CUDALEAK_UNWINDER", unwinder)]);
        out.assert_success();
        // By size (a path), the blocks and the frames as (function, line):
        // a compiler that gave the loop two call sites would give a path
        // two groups with the same frames.
        let mut by_size: std::collections::BTreeMap<u64, (u64, Frames)> = Default::default();
        for g in &out.report().leaks {
            let frames = frames_of(&g.native_stack);
            let e = by_size.entry(g.bytes / g.blocks).or_insert((0, frames.clone()));
            assert_eq!(e.1, frames, "{unwinder}: one path's groups, one stack");
            e.0 += g.blocks;
        }
        let groups: Vec<(u64, u64, Frames)> = by_size.into_iter().map(|(s, (b, f))| (s, b, f)).collect();
        let paths: Vec<u64> = groups.iter().map(|g| g.0 / 16 - 1).collect();
        let want: Vec<u64> = {
            let mut w: Vec<u64> = (0..16).map(|i| (i * 37) & 63).collect();
            w.sort();
            w
        };
        assert_eq!(paths, want, "{unwinder}: a group per path");
        for (size, blocks, frames) in &groups {
            // (rounds 1, 3, 5 and 7 leave out the paths of index 1, 3, 5, 7)
            let index = (0..16).find(|i| (i * 37) & 63 == size / 16 - 1).unwrap();
            let want = if index % 2 == 1 && index < 8 { 7 } else { 8 };
            assert_eq!(*blocks, want, "{unwinder}, {size} bytes: a block per round");
            assert_path_frames(frames, *size, leak_line, unwinder);
        }
        by_unwinder.push(groups);
    }
    assert_eq!(
        by_unwinder[0], by_unwinder[1],
        "the fast unwinder against libgcc's"
    );
}

/// A failed call's capture (never interned) does not lend its stack to
/// the trace interned before it: the next call from the failed call's
/// stack is a group of its own, with its own frames.
#[test]
fn a_failed_call_does_not_move_the_next_block_to_the_previous_trace() {
    let link = sim_link_args();
    let file = "tests/c/failed_capture.c";
    // -O0: the loop stays one call site (-O2 unrolled it into two).
    let exe = build("failed_capture", &[file], &[&link[0], &link[1]]);
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    let r = out.report();
    let first = group_at(&r, "allocate_first", file, line_of(file, "/* LEAK first */"));
    assert_eq!((first.blocks, first.bytes), (1, 1000));
    let second = group_at(&r, "allocate_here", file, line_of(file, "/* LEAK second */"));
    assert_eq!((second.blocks, second.bytes), (1, 2000));
    assert_eq!(r.leaks.len(), 2);
}
