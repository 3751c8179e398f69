//! CUDA as NVIDIA's own runtime and driver ask for it: every
//! `cuGetProcAddress` request of the real libcudart 12.9, 13.2 and 13.5, the v1
//! entry points they reach (the CUDA 7.0 primary-context calls, the CUDA 4.1
//! IPC call), the 32-bit entry points of CUDA < 3.2, and the allocation
//! kinds added with them, each with exact reports.

mod support;

use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::{Group, Report};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

#[test]
fn the_runtime_lookup_table_is_generated_from_the_traces() {
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-cudart-lookups.py"))
        .arg("--check")
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "needs ../shared beside the checkout; scripts/test.sh runs it there (--ignored)"]
fn the_traces_are_the_shared_ones() {
    let shared = repo().join("../shared/data");
    assert!(shared.is_dir(), "no ../shared/data beside this checkout");
    for name in [
        "cudart-12.9-lookups.txt",
        "cudart-13.2-lookups.txt",
        "cudart-13.5-lookups.txt",
    ] {
        let ours = std::fs::read_to_string(repo().join("sim/traces").join(name)).unwrap();
        let theirs = std::fs::read_to_string(shared.join(name)).unwrap();
        assert_eq!(
            ours, theirs,
            "sim/traces/{name} differs from ../shared/data/{name}"
        );
    }
}

fn entry_versions() -> PathBuf {
    let sim = sim_dir();
    build(
        "entry_versions",
        &["tests/c/entry_versions.c"],
        &[
            &format!("-I{}", repo().join("sim").display()),
            &sim.join("libcuda.so.1").display().to_string(),
            "-ldl",
        ],
    )
}

/// What the simulated driver's cuGetProcAddress resolves each request to.
fn resolved(requests: &[(&str, i32, u64)]) -> Vec<String> {
    let mut cmd = Command::new(entry_versions());
    cmd.env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
    for (name, version, flags) in requests {
        cmd.args([name.to_string(), version.to_string(), flags.to_string()]);
    }
    let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    stdout.lines().map(str::to_string).collect()
}

#[test]
fn the_simulated_driver_resolves_names_by_version_as_nvidia_documents() {
    // (name, version, flags) -> symbol, from cudaTypedefs.h's PFN versions
    // and cuda.h's `#define cuX cuX_v2`.
    let cases: &[(&str, i32, u64, &str)] = &[
        ("cuMemAlloc", 2000, 0, "cuMemAlloc"),
        ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
        ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 13020, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 1000, 0, "-"),
        ("cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"),
        ("cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"),
        ("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"),
        (
            "cuDevicePrimaryCtxRelease",
            11000,
            0,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        ("cuIpcOpenMemHandle", 4010, 0, "cuIpcOpenMemHandle"),
        ("cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"),
        ("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"),
        ("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
        ("cuMemFree", 11020, 2, "cuMemFree_v2"),
        ("cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2"),
        ("cuMemHostRegister", 4000, 0, "cuMemHostRegister"),
        ("cuCtxDestroy", 3020, 0, "cuCtxDestroy"),
        ("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"),
        ("cuMulticastBindMem", 12010, 0, "cuMulticastBindMem"),
        ("cuMulticastBindMem", 13010, 0, "cuMulticastBindMem_v2"),
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        // NVIDIA's cuCtxCreate_v4 (12.5), which the simulation lacks: not
        // an older variant with another ABI
        ("cuCtxCreate", 12050, 0, "-"),
        ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
        ("cuMemAlloc_v2", 12000, 0, "-"),
    ];
    let requests: Vec<(&str, i32, u64)> = cases.iter().map(|c| (c.0, c.1, c.2)).collect();
    let got = resolved(&requests);
    let want: Vec<String> = cases.iter().map(|c| c.3.to_string()).collect();
    assert_eq!(got, want);
}

#[test]
fn every_request_of_the_real_runtimes_gets_the_hook_exactly_for_hooked_variants() {
    // Without the library the driver's answers are its own symbols; under
    // it, each answer is the hook of the very symbol the driver resolved
    // to, or the driver's function when that symbol is not hooked.
    for traced in [false, true] {
        let out = if traced {
            run_traced(&entry_versions(), &[], &[])
        } else {
            let mut cmd = Command::new(entry_versions());
            cmd.env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
            let (status, stdout, stderr) = run_command(cmd, Duration::from_secs(60));
            Outcome {
                status,
                stdout,
                stderr,
                dir: TempDir::new("entry-versions"),
            }
        };
        assert!(out.status.success(), "traced: {traced}\n{}", out.stdout);
        let last = out.stdout.lines().last().unwrap_or_default();
        // 418 + 473 + 480 requests of the traces, the empty name, and 4 x 2
        // per entry point
        let checked: usize = last
            .strip_prefix("checked ")
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}", out.stdout));
        assert!(checked > 418 + 473 + 480 + 1 + 8 * 80, "{last}");
        assert!(last.ends_with("mismatches 0"), "{}", out.stdout);
        assert!(out.stderr.is_empty(), "{}", out.stderr);
    }
}

fn versioned() -> PathBuf {
    versioned_program()
}

const VERSIONED: &str = "tests/c/versioned.c";

/// Runs `program ARGS` without the library and under it: the same status
/// (success) and output; the one report.
fn both(program: &std::path::Path, args: &[&str]) -> (Report, Outcome) {
    let (out, plain) = run_traced_and_untraced(program, args, &[]);
    out.assert_success();
    assert_eq!(out.stdout, plain.stdout, "{args:?}");
    (out.report(), out)
}

fn only_group<'a>(r: &'a Report, function: &str, file: &str, marker: &str) -> &'a Group {
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    group_at(r, function, file, line_of(&format!("tests/c/{file}"), marker))
}

#[test]
fn a_static_runtime_s_device_reset_reaches_the_v1_reset_and_its_blocks_are_leaks() {
    let (r, out) = both(&versioned(), &["reset"]);
    // The driver handed the freed address out again: without the v1 hook
    // that new block replaced the stale one and the leak was gone.
    assert_eq!(out.stdout.trim(), "reused");
    let g = only_group(&r, "leak_before_reset", "versioned.c", "/* LEAK before reset */");
    assert_eq!((g.api.as_str(), g.blocks, g.bytes), ("cudaMalloc", 1, 500));
    assert_eq!(r.totals.invalid_frees, 1, "only the stale cudaFree");
    assert_eq!((r.totals.allocations, r.totals.frees), (5, 4));
    let _ = VERSIONED;
}

#[test]
fn the_v1_primary_context_release_tears_the_context_down() {
    let (r, out) = both(&versioned(), &["release"]);
    assert_eq!(out.stdout.trim(), "reused");
    let g = only_group(
        &r,
        "leak_before_release",
        "versioned.c",
        "/* LEAK before release */",
    );
    assert_eq!((g.api.as_str(), g.blocks, g.bytes), ("cuMemAlloc_v2", 1, 600));
    assert_eq!(r.totals.invalid_frees, 1, "only the stale cuMemFree");
    assert_eq!((r.totals.allocations, r.totals.frees), (5, 4));
}

#[test]
fn memory_opened_through_the_v1_ipc_entry_point_is_recorded_and_closed() {
    let (r, _) = both(&versioned(), &["ipc"]);
    let g = only_group(&r, "open_peer", "versioned.c", "/* LEAK ipc open */");
    assert_eq!(
        (g.api.as_str(), g.memory, g.memory_kind, g.blocks, g.bytes),
        (
            "cudaIpcOpenMemHandle",
            MemoryKind::Device,
            Some(MemoryKind::Imported),
            1,
            3000
        )
    );
    // The close is no invalid free; the cudaFree of an opened mapping is.
    assert_eq!(r.totals.invalid_frees, 1);
    assert_eq!((r.totals.allocations, r.totals.frees), (3, 2));
    assert_eq!(r.totals.live_bytes, 0, "opened memory is not this process's");
}

#[test]
fn the_32_bit_entry_points_of_cuda_3_1_are_recorded() {
    let (r, _) = both(&versioned(), &["v1"]);
    let line = |m: &str| line_of(VERSIONED, m);
    let want = [
        ("/* LEAK v1 cuMemAlloc */", "cuMemAlloc", MemoryKind::Device, 7000),
        (
            "/* LEAK v1 cuMemAllocPitch */",
            "cuMemAllocPitch",
            MemoryKind::Device,
            512 * 3,
        ),
        (
            "/* LEAK v1 cuMemAllocHost */",
            "cuMemAllocHost",
            MemoryKind::Host,
            900,
        ),
        (
            "/* LEAK v1 cuArrayCreate */",
            "cuArrayCreate",
            MemoryKind::Array,
            10 * 10 * 4,
        ),
        (
            "/* LEAK v1 cuArray3DCreate */",
            "cuArray3DCreate",
            MemoryKind::Array,
            4 * 4 * 4 * 2,
        ),
    ];
    assert_eq!(r.leaks.len(), want.len(), "{:#?}", r.leaks);
    for (marker, api, memory, bytes) in want {
        let g = group_at(&r, "v1", "versioned.c", line(marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.blocks, g.bytes),
            (api, memory, 1, bytes),
            "{marker}"
        );
    }
    // The v1 allocation freed with the v1 cuMemFree; freed twice: invalid.
    assert_eq!((r.totals.allocations, r.totals.frees), (6, 1));
    assert_eq!(r.totals.invalid_frees, 1);
}

#[test]
fn the_last_cuda_2_detach_destroys_the_context_with_its_blocks() {
    let (r, _) = both(&versioned(), &["attach"]);
    let g = only_group(&r, "leak_in_attached", "versioned.c", "/* LEAK attached */");
    assert_eq!((g.blocks, g.bytes), (1, 800));
    assert_eq!(r.totals.invalid_frees, 0);
    assert_eq!((r.totals.allocations, r.totals.frees), (6, 5));
}

fn kinds() -> PathBuf {
    program("kinds")
}

const KINDS: &str = "tests/c/kinds.c";

/// (api, memory, memory_kind, bytes, function, marker) of each planted leak.
type Planted = (
    &'static str,
    MemoryKind,
    Option<MemoryKind>,
    u64,
    &'static str,
    &'static str,
);

/// Leaks exactly `planted` in `leak` mode, nothing and no invalid free in
/// `clean` mode, `bad_frees` invalid frees in `bad` mode.
fn kind_case(kind: &str, planted: &[Planted], bad_frees: u64) -> (Report, String) {
    let (r, out) = both(&kinds(), &["leak", kind]);
    assert_eq!(r.leaks.len(), planted.len(), "{kind}: {:#?}", r.leaks);
    for &(api, memory, memory_kind, bytes, function, marker) in planted {
        let g = group_at(&r, function, "kinds.c", line_of(KINDS, marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.memory_kind, g.blocks, g.bytes),
            (api, memory, memory_kind, 1, bytes),
            "{kind}: {marker}"
        );
    }
    assert_eq!(r.totals.invalid_frees, 0, "{kind}: a correct program");
    let (clean, _) = both(&kinds(), &["clean", kind]);
    assert!(clean.leaks.is_empty(), "{kind}: {:#?}", clean.leaks);
    assert_eq!(clean.totals.invalid_frees, 0, "{kind}");
    assert_eq!(clean.totals.allocations, clean.totals.frees, "{kind}");
    let (bad, _) = both(&kinds(), &["bad", kind]);
    assert!(bad.leaks.is_empty(), "{kind}: {:#?}", bad.leaks);
    assert_eq!(bad.totals.invalid_frees, bad_frees, "{kind}");
    (r, out.stderr)
}

#[test]
fn a_retained_handle_is_one_more_reference_and_a_pair_hides_no_leak() {
    let (r, _) = kind_case(
        "retain",
        &[(
            "cuMemCreate",
            MemoryKind::Physical,
            None,
            2 << 20,
            "create_handle",
            "/* LEAK retained */",
        )],
        1,
    );
    assert_eq!(r.totals.live_bytes, 2 << 20);
}

#[test]
fn memory_imported_from_a_pool_is_freed_with_cu_mem_free() {
    let (r, _) = kind_case(
        "pool",
        &[
            (
                "cuMemPoolImportPointer",
                MemoryKind::Device,
                Some(MemoryKind::Imported),
                4096,
                "import_from_pool",
                "/* LEAK pool import */",
            ),
            (
                "cuMemPoolImportFromShareableHandle",
                MemoryKind::Reservation,
                Some(MemoryKind::Pool),
                0,
                "import_pool",
                "/* LEAK shared pool */",
            ),
        ],
        3,
    );
    assert_eq!(r.totals.live_bytes, 0, "another process's memory");
    assert_eq!(r.totals.by_memory[&MemoryKind::Imported].bytes, 4096);
}

#[test]
fn a_multicast_object_never_released_keeps_what_is_bound_to_it() {
    let (r, _) = kind_case(
        "multicast",
        &[
            (
                "cuMulticastCreate",
                MemoryKind::Reservation,
                Some(MemoryKind::Multicast),
                4 << 20,
                "make_multicast",
                "/* LEAK multicast */",
            ),
            // released while bound: alive as long as the object
            (
                "cuMemCreate",
                MemoryKind::Physical,
                None,
                2 << 20,
                "bound_memory",
                "/* LEAK bound */",
            ),
        ],
        1,
    );
    // The object is no memory of its own: only the bound memory counts.
    assert_eq!(r.totals.live_bytes, 2 << 20);
    assert_eq!(r.totals.by_memory[&MemoryKind::Multicast].bytes, 4 << 20);
}

#[test]
fn external_memory_and_what_is_mapped_from_it_are_reported_apart() {
    let imported = Some(MemoryKind::Imported);
    let (r, _) = kind_case(
        "external",
        &[
            (
                "cuImportExternalMemory",
                MemoryKind::Device,
                imported,
                1 << 20,
                "import_external",
                "/* LEAK external */",
            ),
            (
                "cuExternalMemoryGetMappedBuffer",
                MemoryKind::Device,
                imported,
                65536,
                "map_buffer",
                "/* LEAK external buffer */",
            ),
            // 64x64 and 32x32 floats
            (
                "cuExternalMemoryGetMappedMipmappedArray",
                MemoryKind::Device,
                imported,
                (64 * 64 + 32 * 32) * 4,
                "map_mipmap",
                "/* LEAK external mipmap */",
            ),
        ],
        2,
    );
    assert_eq!(r.totals.live_bytes, 0);
}

#[test]
fn host_memory_pinned_and_never_unregistered_is_its_own_kind() {
    let registered = Some(MemoryKind::Registered);
    let (r, stderr) = kind_case(
        "register",
        &[
            (
                "cuMemHostRegister_v2",
                MemoryKind::Host,
                registered,
                3 << 12,
                "register_host",
                "/* LEAK cuMemHostRegister_v2 */",
            ),
            (
                "cudaHostRegister",
                MemoryKind::Host,
                registered,
                5 << 12,
                "register_host",
                "/* LEAK cudaHostRegister */",
            ),
        ],
        1,
    );
    // The program's own memory: outside the bytes leaked.
    assert_eq!(r.totals.live_bytes, 0);
    assert_eq!(r.leaked_bytes(), 0);
    assert_eq!(r.totals.by_memory[&MemoryKind::Registered].bytes, 8 << 12);
    assert!(
        stderr.contains("registered 32.0 KiB in 2 blocks, host memory pinned and never unregistered"),
        "{stderr}"
    );
}

#[test]
fn a_green_context_holds_the_primary_context_and_its_memory() {
    let (r, _) = kind_case(
        "green",
        &[(
            "cuMemAlloc_v2",
            MemoryKind::Device,
            None,
            1500,
            "allocate_in_green",
            "/* LEAK green */",
        )],
        1,
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (2, 1));
}
