//! Builds the simulated CUDA driver and runtime (sim/) and the demo
//! program, so that `cudaleak demo` can show a real report on a machine
//! without a GPU, and the integration tests have a driver to run against.
//!
//! Outputs in $OUT_DIR/sim: libcuda.so.1, libcudart.so.12, cudart_static.o
//! (for programs with the runtime linked in, as nvcc does by default) and
//! demo. Tests find the directory through CUDALEAK_SIM_DIR.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C compiler for the target, by the `cc` crate's conventions: a
/// cross or manylinux build (scripts/build-wheel.sh, maturin --zig) names
/// it in CC_<target>, so that the simulated driver the demo ships links
/// against the same old glibc as the rest of the wheel.
fn compiler() -> String {
    let target = std::env::var("TARGET").unwrap_or_default();
    [
        format!("CC_{target}"),
        format!("CC_{}", target.replace('-', "_")),
        "TARGET_CC".into(),
        "CC".into(),
    ]
    .iter()
    .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
    .unwrap_or_else(|| "cc".into())
}

/// `CUDALEAK_SIM_WERROR=1` (set by `.ci/run`): the simulation's warnings
/// are errors, so that a warning in it fails CI rather than scroll by.
/// Only with the host's own compiler: a cross or zig build (the wheel's)
/// may warn about what gcc does not.
fn werror() -> bool {
    std::env::var("CUDALEAK_SIM_WERROR").is_ok_and(|v| v == "1") && compiler() == "cc"
}

fn cc(args: &[&str]) {
    let compiler = compiler();
    let mut args = args.to_vec();
    if werror() {
        args.push("-Werror");
    }
    let status = Command::new(&compiler).args(&args).status().unwrap_or_else(|e| {
        panic!("cannot run the C compiler {compiler:?}: {e} (cudaleak's simulated driver needs one)")
    });
    assert!(status.success(), "{compiler} {args:?} failed");
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let sim = root.join("sim");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("sim");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/sim");
    let inc = format!("-I{}", sim.join("include").display());
    let p = |name: &str| out.join(name).display().to_string();
    let src = |name: &str| sim.join(name).display().to_string();

    cc(&[
        "-O2",
        "-g",
        "-fPIC",
        "-shared",
        "-Wall",
        &inc,
        "-Wl,-soname,libcuda.so.1",
        "-o",
        &p("libcuda.so.1"),
        &src("driver.c"),
        "-lpthread",
    ]);
    cc(&[
        "-O2",
        "-g",
        "-fPIC",
        "-shared",
        "-Wall",
        &inc,
        "-Wl,-soname,libcudart.so.12",
        &format!("-Wl,--version-script={}", src("libcudart.so.12.map")),
        "-Wl,-rpath,$ORIGIN",
        "-o",
        &p("libcudart.so.12"),
        &src("runtime.c"),
        &src("runtime_stubs.c"),
        "-ldl",
        "-lpthread",
    ]);
    cc(&[
        "-O2",
        "-g",
        "-fPIC",
        "-Wall",
        &inc,
        "-c",
        "-o",
        &p("cudart_static.o"),
        &src("runtime.c"),
    ]);
    cc(&[
        "-O0",
        "-g",
        "-Wall",
        &inc,
        "-o",
        &p("demo"),
        &src("demo.c"),
        &p("libcudart.so.12"),
        "-Wl,-rpath,$ORIGIN",
    ]);

    println!("cargo:rustc-env=CUDALEAK_SIM_DIR={}", out.display());
    println!("cargo:rerun-if-env-changed=CUDALEAK_SIM_WERROR");
    for f in [
        "driver.c",
        "driver_entry_points.h",
        "runtime.c",
        "cudart_lookups.h",
        "runtime_stubs.c",
        "cudart_exports.h",
        "demo.c",
        "libcudart.so.12.map",
        "include/cuda.h",
        "include/cuda_runtime_api.h",
    ] {
        println!("cargo:rerun-if-changed={}", Path::new("sim").join(f).display());
    }
    for var in ["CC", "TARGET_CC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rerun-if-env-changed=CC_{target}");
    println!("cargo:rerun-if-env-changed=CC_{}", target.replace('-', "_"));
}
