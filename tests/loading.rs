//! Every way a program loads CUDA keeps working under the library, and is
//! seen: plugins loaded with RTLD_LOCAL (now and lazy), Python's
//! ctypes.CDLL and extension modules, two runtime copies in one process, a
//! driver without the context queries, and objects unloaded and loaded
//! again. Each program also runs without the library: same exit status.

mod support;

use cudaleak_core::report::{Group, Report};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

const PLUGIN: &str = "tests/c/plugin.c";

fn tests_dir() -> PathBuf {
    target_dir().join("cudaleak-tests")
}

/// A second copy of the simulated runtime under another soname, as a
/// plugin built for another CUDA version brings its own; it replays the
/// lookups of NVIDIA's libcudart 13.2 where the first replays 12.9's.
fn runtime_13() -> PathBuf {
    build(
        "libcudart.so.13",
        &["sim/runtime.c"],
        &[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcudart.so.13",
            // NVIDIA's libcudart 13.2's requests (sim/cudart_lookups.h)
            "-DSIMCUDART_TRACE=13",
            &format!(
                "-Wl,--version-script={}",
                repo().join("sim/libcudart.so.13.map").display()
            ),
            "-ldl",
            "-lpthread",
        ],
    )
}

/// libplugin_a.so (links libcudart.so.12, leaks 4242 bytes) or
/// libplugin_b.so (links libcudart.so.13, leaks 1313 bytes).
fn plugin(which: char) -> PathBuf {
    let (runtime, bytes) = match which {
        'a' => (sim_dir().join("libcudart.so.12"), 4242),
        _ => (runtime_13(), 1313),
    };
    let soname = runtime.file_name().unwrap().to_str().unwrap().to_string();
    build(
        &format!("libplugin_{which}.so"),
        &[PLUGIN],
        &[
            "-shared",
            "-fPIC",
            &format!("-DPLUGIN_BYTES={bytes}"),
            &format!("-DPLUGIN_RUNTIME=\"{soname}\""),
            &runtime.display().to_string(),
            "-ldl",
        ],
    )
}

/// The plugin host: without a runtime of its own, or (`with_runtime`)
/// linked against libcudart.so.12 and leaking 777 bytes itself.
fn host(with_runtime: bool) -> PathBuf {
    if with_runtime {
        let rt = sim_dir().join("libcudart.so.12").display().to_string();
        build(
            "plugin_host_rt",
            &["tests/c/plugin_host.c"],
            &["-DHOST_RUNTIME", &rt, "-ldl"],
        )
    } else {
        build("plugin_host", &["tests/c/plugin_host.c"], &["-ldl"])
    }
}

/// `program` under the library, checked against a run without it (the
/// same status), and successful.
fn run_both(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let (out, _) = run_traced_and_untraced(program, args, env);
    out.assert_success();
    assert!(!out.stderr.contains("not found"), "{}", out.stderr);
    assert!(!out.stderr.contains("no real"), "{}", out.stderr);
    out
}

fn plugin_line() -> i64 {
    line_of(PLUGIN, "/* LEAK plugin */")
}

/// The one group of `bytes` bytes per block.
fn group_of(r: &Report, bytes: u64) -> &Group {
    let g: Vec<&Group> = r.leaks.iter().filter(|g| g.bytes == bytes * g.blocks).collect();
    assert_eq!(g.len(), 1, "groups of {bytes}-byte blocks: {:#?}", r.leaks);
    g[0]
}

fn innermost_is(g: &Group, function: &str, file: &str, line: i64) {
    let f = &g.native_stack[0];
    assert_eq!(
        (f.function.as_deref(), f.line),
        (Some(function), Some(line)),
        "{:#?}",
        g.native_stack
    );
    assert!(f.file.as_deref().is_some_and(|p| p.ends_with(file)), "{f:?}");
}

#[test]
fn a_plugin_loaded_with_rtld_local_works_and_its_leak_is_named() {
    let a = plugin('a');
    for mode in ["now", "lazy"] {
        let out = run_both(&host(false), &[mode, a.to_str().unwrap()], &[]);
        let r = out.report();
        assert_eq!(r.leaks.len(), 1, "{mode}: {:#?}", r.leaks);
        let g = group_of(&r, 4242);
        assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1), "{mode}");
        innermost_is(g, "plugin_leak", "plugin.c", plugin_line());
        assert_eq!((r.totals.allocations, r.totals.frees), (2, 1), "{mode}");
    }
}

#[test]
fn two_runtime_copies_each_serve_their_own_callers_and_are_recorded_once() {
    // The host's libcudart.so.12 is global; plugin b's libcudart.so.13 is
    // private to it. plugin_leak fails (status 4) if its calls reached
    // the other copy.
    let (a, b) = (plugin('a'), plugin('b'));
    let out = run_both(
        &host(true),
        &["now", a.to_str().unwrap(), b.to_str().unwrap()],
        &[],
    );
    let r = out.report();
    assert_eq!(r.leaks.len(), 3, "{:#?}", r.leaks);
    innermost_is(
        group_of(&r, 777),
        "host_leak",
        "plugin_host.c",
        line_of("tests/c/plugin_host.c", "/* LEAK host */"),
    );
    for bytes in [4242, 1313] {
        let g = group_of(&r, bytes);
        assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1));
        innermost_is(g, "plugin_leak", "plugin.c", plugin_line());
    }
    // One record per program call: 1 + 2 + 2 allocations, 2 frees.
    assert_eq!((r.totals.allocations, r.totals.frees), (5, 2));
    assert_eq!(r.totals.live_bytes, 777 + 4242 + 1313);
}

fn python3() -> PathBuf {
    PathBuf::from(std::env::var("CUDALEAK_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
}

fn python_value(code: &str) -> String {
    let out = Command::new(python3())
        .args(["-c", code])
        .output()
        .expect("python3");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The C extension module `cuda_ext`, built for the test's Python, in a
/// directory of its own (returned).
fn cuda_ext() -> PathBuf {
    let include = python_value("import sysconfig; print(sysconfig.get_paths()['include'])");
    let suffix = python_value("import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))");
    let built = build(
        &format!("cuda_ext{suffix}"),
        &["tests/c/cuda_ext.c"],
        &[
            "-shared",
            "-fPIC",
            &format!("-I{include}"),
            &sim_dir().join("libcudart.so.12").display().to_string(),
        ],
    );
    let dir = tests_dir().join("python-ext");
    std::fs::create_dir_all(&dir).unwrap();
    let dest = dir.join(built.file_name().unwrap());
    std::fs::copy(&built, &dest).unwrap();
    dir
}

#[test]
fn python_loads_a_runtime_user_through_ctypes_and_as_an_extension_module() {
    let script = repo().join("tests/python/loading.py");
    let a = plugin('a');
    let out = run_both(
        &python3(),
        &[script.to_str().unwrap(), "ctypes", a.to_str().unwrap()],
        &[],
    );
    let r = out.report();
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_of(&r, 4242);
    assert_eq!(g.api, "cudaMalloc");
    innermost_is(g, "plugin_leak", "plugin.c", plugin_line());
    assert!(
        g.python_stack.iter().any(|f| f.function == "via_ctypes"),
        "{:#?}",
        g.python_stack
    );

    let ext = cuda_ext();
    let out = run_both(
        &python3(),
        &[script.to_str().unwrap(), "extension", ext.to_str().unwrap()],
        &[],
    );
    let r = out.report();
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_of(&r, 5151);
    assert_eq!(g.api, "cudaMalloc");
    innermost_is(
        g,
        "ext_leak",
        "cuda_ext.c",
        line_of("tests/c/cuda_ext.c", "/* LEAK extension */"),
    );
}

/// libcuda.so.1 built without cuCtxGetCurrent and cuCtxGetDevice, in a
/// directory of its own (returned), to be put first on LD_LIBRARY_PATH.
fn driver_without_context_queries() -> PathBuf {
    let built = build(
        "libcuda-no-ctx-queries.so",
        &["sim/driver.c"],
        &[
            "-shared",
            "-fPIC",
            "-O2",
            "-DSIMCUDA_NO_CTX_QUERIES",
            "-Wl,-soname,libcuda.so.1",
            "-lpthread",
        ],
    );
    let dir = tests_dir().join("driver-no-ctx-queries");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&built, dir.join("libcuda.so.1")).unwrap();
    dir
}

#[test]
fn a_driver_without_context_queries_still_gives_exact_reports() {
    let dir = driver_without_context_queries();
    let path = format!("{}:{}", dir.display(), sim_dir().display());
    let env = [("LD_LIBRARY_PATH", path.as_str())];
    let a = plugin('a');
    let program = host(true);
    // Make sure the variant is the driver that runs: it has no cuCtxGetCurrent.
    let nm = Command::new("nm")
        .arg("-D")
        .arg(dir.join("libcuda.so.1"))
        .output()
        .unwrap();
    let symbols = String::from_utf8_lossy(&nm.stdout);
    assert!(!symbols.contains("cuCtxGetCurrent") && symbols.contains("cuMemAlloc_v2"));
    let out = run_traced(&program, &["now", a.to_str().unwrap()], &env);
    out.assert_success();
    assert!(!out.stderr.contains("no real"), "{}", out.stderr);
    let r = out.report();
    assert_eq!(r.leaks.len(), 2, "{:#?}", r.leaks);
    assert_eq!(group_of(&r, 777).api, "cudaMalloc");
    innermost_is(group_of(&r, 4242), "plugin_leak", "plugin.c", plugin_line());
    assert_eq!((r.totals.allocations, r.totals.frees), (3, 1));
}

#[test]
fn a_plugin_unloaded_and_loaded_again_keeps_exact_accounting_and_its_name() {
    let a = plugin('a');
    let out = run_both(&host(false), &["reload", a.to_str().unwrap()], &[]);
    assert!(out.stdout.contains("unloaded"), "{}", out.stdout);
    let r = out.report();
    // One leak per load, from two addresses: two groups of one block.
    assert_eq!(r.leaks.len(), 2, "{:#?}", r.leaks);
    assert_eq!(r.totals.live_bytes, 2 * 4242);
    assert_eq!((r.totals.allocations, r.totals.frees), (4, 2));
    for g in &r.leaks {
        assert_eq!((g.api.as_str(), g.bytes), ("cudaMalloc", 4242));
        // The plugin was unloaded by exit: its frame is module+offset,
        // from what was known when it was loaded.
        let f = &g.native_stack[0];
        assert!(
            f.module
                .as_deref()
                .is_some_and(|m| m.ends_with("/libplugin_a.so"))
                && f.function
                    .as_deref()
                    .is_some_and(|n| n.starts_with("libplugin_a.so+0x")),
            "{:#?}",
            g.native_stack
        );
        innermost_is_caller(g);
    }
}

/// The frame after the plugin's is the host's `call`.
fn innermost_is_caller(g: &Group) {
    let f = &g.native_stack[1];
    assert_eq!(f.function.as_deref(), Some("call"), "{:#?}", g.native_stack);
}

#[test]
fn a_runtime_unloaded_and_loaded_again_is_called_and_attributed_anew() {
    let rt = runtime_13();
    let filler = plugin('a');
    let program = build("runtime_reload", &["tests/c/runtime_reload.c"], &["-ldl"]);
    let out = run_both(&program, &[rt.to_str().unwrap(), filler.to_str().unwrap()], &[]);
    assert!(out.stdout.contains("unloaded"), "{}", out.stdout);
    let r = out.report();
    let line = line_of("tests/c/runtime_reload.c", "/* LEAK reloaded runtime */");
    for bytes in [1111, 2222] {
        let g = group_of(&r, bytes);
        // Attributed to cudaMalloc both times: the second copy's function
        // was taken up by the hook, not handed out unwatched.
        assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1), "{bytes}");
        innermost_is(g, "round_trip", "runtime_reload.c", line);
    }
    assert_eq!(r.leaks.len(), 2);
    assert_eq!((r.totals.allocations, r.totals.frees), (4, 2));
}

#[test]
fn a_global_runtime_loaded_after_a_private_one_answers_a_new_lookup() {
    // The adopted private function (of cudaDeviceReset, a hooked runtime
    // function) answers after one compare until the program looks a
    // runtime name up again; that lookup must reach the global copy loaded
    // since (status 18 if it did not). cudaMalloc, not hooked, is
    // libcudart's own and reaches each copy as without the library.
    let program = build(
        "runtime_late_global",
        &["tests/c/runtime_late_global.c"],
        &["-ldl"],
    );
    let private = runtime_13();
    let global = sim_dir().join("libcudart.so.12");
    let out = run_both(
        &program,
        &[private.to_str().unwrap(), global.to_str().unwrap()],
        &[],
    );
    assert!(out.stdout.contains("private 2/2, global 1/1"), "{}", out.stdout);
    let r = out.report();
    for (bytes, marker) in [
        (3131, "/* LEAK private copy */"),
        (2424, "/* LEAK global copy */"),
    ] {
        let g = group_of(&r, bytes);
        assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1), "{bytes}");
        innermost_is(
            g,
            "main",
            "runtime_late_global.c",
            line_of("tests/c/runtime_late_global.c", marker),
        );
    }
}

const ARRAYS: &str = "tests/c/arrays.c";

/// (marker, function, api, bytes) of each planted array leak.
const ARRAY_LEAKS: &[(&str, &str, &str, u64)] = &[
    // 100 x 10 elements of 2 floats
    (
        "/* LEAK cuArrayCreate_v2 */",
        "driver_array",
        "cuArrayCreate_v2",
        8000,
    ),
    // 16 x 8 x 4 elements of one 16-bit channel
    (
        "/* LEAK cuArray3DCreate_v2 */",
        "driver_array_3d",
        "cuArray3DCreate_v2",
        1024,
    ),
    // 3 levels of 64x64, 32x32, 16x16 elements of 4 bytes
    (
        "/* LEAK cuMipmappedArrayCreate */",
        "driver_mipmapped",
        "cuMipmappedArrayCreate",
        21504,
    ),
    // 50 x 2 float4
    (
        "/* LEAK cudaMallocArray */",
        "runtime_array",
        "cudaMallocArray",
        1600,
    ),
    // 10 x 10 x 10 bytes
    (
        "/* LEAK cudaMalloc3DArray */",
        "runtime_array_3d",
        "cudaMalloc3DArray",
        1000,
    ),
    // 2 levels of 32x32, 16x16 float4
    (
        "/* LEAK cudaMallocMipmappedArray */",
        "runtime_mipmapped",
        "cudaMallocMipmappedArray",
        20480,
    ),
];

#[test]
fn cuda_arrays_are_recorded_as_arrays_leaked_clean_and_badly_released() {
    use cudaleak_core::record::MemoryKind;
    let program = program("arrays");
    let out = run_both(&program, &["leak"], &[]);
    let r = out.report();
    assert_eq!(r.leaks.len(), ARRAY_LEAKS.len(), "{:#?}", r.leaks);
    for &(marker, function, api, bytes) in ARRAY_LEAKS {
        let g = group_at(&r, function, "arrays.c", line_of(ARRAYS, marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.blocks, g.bytes),
            (api, MemoryKind::Array, 1, bytes),
            "{marker}"
        );
    }
    let total: u64 = ARRAY_LEAKS.iter().map(|l| l.3).sum();
    assert_eq!(r.totals.by_memory[&MemoryKind::Array].bytes, total);
    assert_eq!((r.totals.allocations, r.totals.frees), (7, 1));

    let out = run_both(&program, &["clean"], &[]);
    assert!(out.reports().iter().all(|r| r.leaks.is_empty()), "{}", out.stderr);

    let out = run_both(&program, &["bad"], &[]);
    let r = out.report();
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!(r.totals.invalid_frees, 3);
    assert_eq!(r.totals.frees, 3);
}

const IMPORTED: &str = "tests/c/imported.c";

#[test]
fn imported_memory_and_pools_are_reported_apart_leaked_clean_and_badly_released() {
    use cudaleak_core::record::MemoryKind;
    let program = program("imported");
    let out = run_both(&program, &["leak"], &[]);
    let r = out.report();
    assert_eq!(r.leaks.len(), 3, "{:#?}", r.leaks);
    for (marker, function, api, shared, kind, bytes) in [
        (
            "/* LEAK ipc */",
            "open_ipc",
            "cuIpcOpenMemHandle_v2",
            MemoryKind::Device,
            MemoryKind::Imported,
            3000,
        ),
        (
            "/* LEAK import */",
            "import_handle",
            "cuMemImportFromShareableHandle",
            MemoryKind::Device,
            MemoryKind::Imported,
            0,
        ),
        (
            "/* LEAK pool */",
            "make_pool",
            "cuMemPoolCreate",
            MemoryKind::Reservation,
            MemoryKind::Pool,
            0,
        ),
    ] {
        let g = group_at(&r, function, "imported.c", line_of(IMPORTED, marker));
        assert_eq!(
            (g.api.as_str(), g.memory, g.memory_kind, g.blocks, g.bytes),
            (api, shared, Some(kind), 1, bytes),
            "{marker}"
        );
    }
    // Apart from what the process allocated: not in live bytes.
    assert_eq!(r.totals.live_bytes, 0);
    assert_eq!(r.leaked_bytes(), 0);
    assert_eq!(
        (
            r.totals.by_memory[&MemoryKind::Imported].blocks,
            r.totals.by_memory[&MemoryKind::Imported].bytes
        ),
        (2, 3000)
    );
    assert_eq!(r.totals.by_memory[&MemoryKind::Pool].blocks, 1);
    assert!(
        out.stderr
            .contains("imported 2.9 KiB in 2 blocks, opened from another process"),
        "{}",
        out.stderr
    );

    let out = run_both(&program, &["clean"], &[]);
    assert!(out.reports().iter().all(|r| r.leaks.is_empty()), "{}", out.stderr);

    let out = run_both(&program, &["bad"], &[]);
    let r = out.report();
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!(r.totals.invalid_frees, 4);
}

#[test]
fn a_driver_unloaded_and_loaded_again_elsewhere_is_called_there() {
    // Without the dlclose handling the second cuMemAlloc_v2 hook calls the
    // first copy's function, which is no longer mapped.
    let program = build("driver_reload", &["tests/c/driver_reload.c"], &["-ldl"]);
    let out = run_both(&program, &[], &[]);
    assert!(out.stdout.contains("unloaded"), "{}", out.stdout);
    let r = out.report();
    let line = line_of("tests/c/driver_reload.c", "/* LEAK reloaded driver */");
    for bytes in [3333, 4444] {
        let g = group_of(&r, bytes);
        assert_eq!((g.api.as_str(), g.blocks), ("cuMemAlloc_v2", 1), "{bytes}");
        innermost_is(g, "round_trip", "driver_reload.c", line);
    }
    assert_eq!(r.leaks.len(), 2);
    assert_eq!((r.totals.allocations, r.totals.frees), (4, 2));
}

#[test]
fn a_runtime_call_with_no_runtime_anywhere_gets_an_error_and_a_warning_naming_the_caller() {
    // A plugin whose cudaDeviceReset is undefined (it does not link
    // libcudart), bound lazily: under the library the call reaches our
    // export, which finds no runtime in the plugin's scope or globally.
    // (Without the library the loader kills the process: "undefined
    // symbol".)
    let plugin = build(
        "libreset_plugin.so",
        &["tests/c/reset_plugin.c"],
        &["-shared", "-fPIC", "-ldl"],
    );
    let out = run_traced(&host(false), &["lazy", plugin.to_str().unwrap()], &[]);
    // plugin_leak returns 100 + the error of its cudaDeviceReset
    // (cudaErrorInsufficientDriver).
    assert_eq!(out.status.code(), Some(135), "stderr:\n{}", out.stderr);
    let warning = out
        .stderr
        .lines()
        .find(|l| l.contains("no real cudaDeviceReset"))
        .unwrap_or_else(|| panic!("no warning:\n{}", out.stderr));
    assert!(
        warning.contains("libreset_plugin.so called cudaDeviceReset"),
        "{warning}"
    );
    assert_eq!(
        out.stderr.matches("no real cudaDeviceReset").count(),
        1,
        "{}",
        out.stderr
    );
}

/// The runtime's allocation functions are not ours to export (their blocks
/// are recorded at the driver): a plugin that calls cudaMalloc without
/// any runtime loaded fails under the library exactly as without it.
#[test]
fn a_runtime_allocation_with_no_runtime_anywhere_fails_as_it_would_without_the_library() {
    let plugin = build(
        "libplugin_none.so",
        &[PLUGIN],
        &["-shared", "-fPIC", "-DPLUGIN_BYTES=99", "-ldl"],
    );
    let (traced, plain) = run_traced_and_untraced(&host(false), &["lazy", plugin.to_str().unwrap()], &[]);
    assert_eq!(traced.status.code(), Some(127), "stderr:\n{}", traced.stderr);
    for out in [&traced, &plain] {
        assert!(
            out.stderr.contains("undefined symbol: cudaMalloc"),
            "{}",
            out.stderr
        );
    }
}

/// A wrapper library that defines cudaMalloc and forwards with
/// dlsym(RTLD_NEXT): the lookup is the wrapper's, so it gets libcudart's
/// function, not our hook (which called the wrapper back, forever).
#[test]
fn a_wrapper_that_forwards_with_rtld_next_is_not_called_back() {
    let rt = sim_dir().join("libcudart.so.12").display().to_string();
    let wrapper = build(
        "libwrapper.so",
        &["tests/c/wrapper.c"],
        &["-shared", "-fPIC", "-Wl,--no-as-needed", &rt, "-ldl"],
    );
    let program = build(
        "wrapped",
        &["tests/c/wrapped.c"],
        &[&wrapper.display().to_string(), "-Wl,--no-as-needed", &rt, "-ldl"],
    );
    let out = run_both(&program, &[], &[]);
    let r = out.report();
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_of(&r, 2121);
    assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1));
    innermost_is(
        g,
        "leak",
        "wrapped.c",
        line_of("tests/c/wrapped.c", "/* LEAK wrapped */"),
    );
}

/// dlsym(RTLD_DEFAULT) from an RTLD_LOCAL plugin searches the plugin's
/// scope too: it finds the plugin's libcudart (our hook, which calls it;
/// it was NULL, decided for our scope instead of the caller's).
#[test]
fn a_local_plugin_finds_its_runtime_with_rtld_default() {
    let rt = sim_dir().join("libcudart.so.12").display().to_string();
    let plugin = build(
        "libdefault_lookup.so",
        &["tests/c/default_lookup.c"],
        &["-shared", "-fPIC", "-Wl,--no-as-needed", &rt, "-ldl"],
    );
    let out = run_both(&host(false), &["now", plugin.to_str().unwrap()], &[]);
    let r = out.report();
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_of(&r, 3131);
    assert_eq!((g.api.as_str(), g.blocks), ("cudaMalloc", 1));
    let line = line_of("tests/c/default_lookup.c", "/* LEAK default lookup */");
    innermost_is(g, "plugin_leak", "default_lookup.c", line);
}

/// A plugin loaded, called and unloaded 300 times: every load allocates
/// through its own libcudart. Callers' slots of unloaded objects are
/// reused; the 257th load used to find no slot and fail its cudaMalloc.
#[test]
fn a_plugin_loaded_three_hundred_times_allocates_every_time() {
    let a = plugin('a');
    let program = build("plugin_cycle", &["tests/c/plugin_cycle.c"], &["-ldl"]);
    let out = run_both(&program, &["300", a.to_str().unwrap()], &[]);
    let r = out.report();
    assert_eq!(r.totals.live_bytes, 300 * 4242);
    assert_eq!((r.totals.allocations, r.totals.frees), (600, 300));
    assert!(r
        .leaks
        .iter()
        .all(|g| g.api == "cudaMalloc" && g.bytes == 4242 * g.blocks));
}
