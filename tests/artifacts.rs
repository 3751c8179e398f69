//! The shipped artifacts: what the library exports, that the CLI does not
//! interpose on itself, that our schema and contract agree with the shared
//! ones, and that the README's main command works.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use support::*;

/// Everything libcudaleak.so may export: the hooked CUDA functions, the
/// libc entry points it needs, and the in-process API. Nothing else, so
/// that the library never shadows a symbol by accident.
const EXPORTS: &[&str] = &[
    // driver
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemFreeHost",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuCtxDestroy_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetProcAddress_v2_ptsz",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuArrayDestroy",
    "cuMipmappedArrayDestroy",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemImportFromShareableHandle",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    // driver: the variants cuGetProcAddress hands out by version (v1
    // entry points included) and the allocation kinds hooked with them
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemAllocHost",
    "cuMemFree",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuIpcOpenMemHandle",
    "cuCtxDestroy",
    "cuCtxAttach",
    "cuCtxDetach",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuMemHostRegister",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemRetainAllocationHandle",
    "cuMulticastCreate",
    "cuMulticastBindMem",
    "cuMulticastBindMem_v2",
    "cuMulticastBindAddr",
    "cuMulticastBindAddr_v2",
    "cuMulticastUnbind",
    "cuMemPoolImportPointer",
    "cuMemPoolImportFromShareableHandle",
    "cuImportExternalMemory",
    "cuDestroyExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
    "cuExternalMemoryGetMappedMipmappedArray",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuCtxFromGreenCtx",
    "cuStreamBeginCapture",
    "cuStreamBeginCapture_ptsz",
    "cuStreamBeginCapture_v2",
    "cuStreamBeginCapture_v2_ptsz",
    "cuStreamBeginCaptureToGraph",
    "cuStreamBeginCaptureToGraph_ptsz",
    "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz",
    "cuGraphCreate",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphAddNode",
    "cuGraphAddNode_v2",
    "cuGraphInstantiate",
    "cuGraphInstantiate_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphInstantiateWithParams",
    "cuGraphInstantiateWithParams_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuModuleLoad",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleLoadFatBinary",
    "cuModuleUnload",
    "cuLibraryLoadData",
    "cuLibraryLoadFromFile",
    "cuLibraryUnload",
    // runtime: only what the runtime does itself (its allocations are
    // recorded at the driver)
    "cudaDeviceReset",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPointByVersion",
    // libc
    "dlsym",
    "dlclose",
    "exit",
    "_exit",
    "_Exit",
    "__libc_start_main",
    // ways out that run no destructor: the old image's report before exec,
    // and a SIGINT/SIGTERM a process sends itself (CPython's Ctrl-C exit)
    "execve",
    "execv",
    "execvp",
    "execvpe",
    "fexecve",
    "execveat",
    "kill",
    "raise",
    // in-process API
    "cudaleak_dump",
    "cudaleak_checkpoint",
    "cudaleak_live_since",
    "cudaleak_leaks_since_json",
    "cudaleak_free",
    "cudaleak_peak_window_begin",
    "cudaleak_peak_window_bytes",
    "cudaleak_peak_window_end",
    "cudaleak_peak_json",
    "cudaleak_peak_bytes",
];

fn defined_dynamic_symbols(path: &std::path::Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(path)
        .output()
        .expect("nm (binutils)");
    assert!(out.status.success(), "nm failed on {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .nth(2)
                .map(|s| s.split('@').next().unwrap().to_string())
        })
        .collect()
}

#[test]
fn the_library_exports_exactly_the_allowlist() {
    let got = defined_dynamic_symbols(&lib());
    let want: BTreeSet<String> = EXPORTS.iter().map(|s| s.to_string()).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "extra exports: {extra:?}\nmissing exports: {missing:?}"
    );
}

#[test]
fn the_cli_does_not_interpose_on_itself() {
    let got = defined_dynamic_symbols(&cli());
    let hooks: Vec<_> = got.iter().filter(|s| EXPORTS.contains(&s.as_str())).collect();
    assert!(
        hooks.is_empty(),
        "the cudaleak binary exports hook symbols: {hooks:?}"
    );
    let needed = Command::new("readelf")
        .args(["-d"])
        .arg(cli())
        .output()
        .expect("readelf");
    assert!(!String::from_utf8_lossy(&needed.stdout).contains("libcudaleak"));
}

/// Every key and value of `shared` is in `ours` unchanged; ours may only
/// add object keys (schema extensions), and triggers at the end of the
/// list of triggers (the shared contract: "wherever else the project adds
/// triggers (see the schema's list)"; the project adds "oom").
fn assert_superset(shared: &Value, ours: &Value, path: &str) {
    match (shared, ours) {
        (Value::Array(a), Value::Array(b)) if path == "/properties/trigger/enum" => {
            assert_eq!(a[..], b[..a.len().min(b.len())], "schemas differ at {path}");
            assert!(b.len() >= a.len(), "our schema lacks triggers at {path}");
        }
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if k == "description" && path.is_empty() {
                    continue; // our top-level description says it is an extended copy
                }
                let inner = b.get(k).unwrap_or_else(|| panic!("our schema lacks {path}/{k}"));
                assert_superset(v, inner, &format!("{path}/{k}"));
            }
        }
        _ => assert_eq!(shared, ours, "schemas differ at {path}"),
    }
}

fn our_schema() -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo().join("schema/report.schema.json")).unwrap()).unwrap()
}

#[test]
fn our_schema_is_a_valid_json_schema() {
    jsonschema::draft202012::meta::validate(&our_schema())
        .expect("our schema is a valid draft 2020-12 schema");
}

/// `../shared` (the project's shared contract, beside the checkout):
/// scripts/test.sh runs these two with `--ignored` where it exists.
fn shared_file(name: &str) -> PathBuf {
    let p = repo().join("../shared").join(name);
    required(p.is_file().then_some(p), "../shared beside the checkout")
}

#[test]
#[ignore = "needs ../shared beside the checkout; scripts/test.sh runs it there (--ignored)"]
fn our_schema_copy_agrees_with_the_shared_contract() {
    let ours = our_schema();
    let shared_path = shared_file("report.schema.json");
    let shared: Value = serde_json::from_str(&std::fs::read_to_string(shared_path).unwrap()).unwrap();
    assert_superset(&shared, &ours, "");
}

#[test]
#[ignore = "needs ../shared beside the checkout; scripts/test.sh runs it there (--ignored)"]
fn our_contract_contains_the_shared_contract() {
    let ours = std::fs::read_to_string(repo().join("CONTRACT.md")).unwrap();
    let shared_path = shared_file("CONTRACT.md");
    let shared = std::fs::read_to_string(shared_path).unwrap();
    for line in shared.lines().filter(|l| !l.trim().is_empty()) {
        assert!(ours.contains(line), "CONTRACT.md lacks the shared line: {line}");
    }
}

#[test]
fn the_demo_shows_a_real_report() {
    let dir = TempDir::new("demo");
    let mut cmd = Command::new(cli());
    cmd.args(["demo", "--dir"]).arg(dir.path());
    let (status, stdout, stderr) = run_command(cmd, std::time::Duration::from_secs(60));
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("in load_weights"), "{stderr}");
    assert!(
        stderr.contains("cudaleak: 74448896 bytes leaked in 5 blocks; report: "),
        "{stderr}"
    );
    let reports = reports_in(dir.path());
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].leaks.len(), 3);
    assert!(stdout.contains("Render it again with: cudaleak report"));
}

/// Without `--dir`, the demo runs from a private directory held by a
/// descriptor (`/proc/self/fd/N`), but what the user reads names it by its
/// path: the library's stderr line, the report's `command`, the page.
#[test]
fn the_demo_names_its_files_by_their_paths() {
    let cwd = TempDir::new("demo-paths");
    let mut cmd = Command::new(cli());
    cmd.arg("demo").env("TMPDIR", cwd.path()).current_dir(cwd.path());
    let (status, stdout, stderr) = run_command(cmd, std::time::Duration::from_secs(60));
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("/proc/self/fd"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("leaked in 5 blocks; report: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    let path = std::path::Path::new(line.rsplit("report: ").next().unwrap());
    assert!(path.starts_with(cwd.path()), "{line}");
    let report = reports_in(path.parent().unwrap()).remove(0);
    let demo_dir = path.parent().unwrap().parent().unwrap();
    assert_eq!(report.command, [demo_dir.join("demo").display().to_string()]);
    let page = std::fs::read_to_string(path.with_extension("html")).unwrap();
    assert!(
        !page.contains("/proc/self/fd"),
        "the page names the program by its path"
    );
}
