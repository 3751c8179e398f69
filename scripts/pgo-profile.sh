#!/usr/bin/env bash
# Makes crates/cudaleak-preload/pgo/libcudaleak.profdata.xz, the profile
# the wheel's libcudaleak.so is optimized with (docs/packaging.md,
# "The optimization profile"; docs/performance.md says what it saves).
#
# The library is built instrumented (-Cprofile-generate, the library's
# crate only: the build backend applies the profile to that crate only),
# then runs the benchmark shapes on the simulated driver: a training step
# from C and from Python (ctypes), an inference loop on cudaMallocAsync,
# and the pairs programs (one stack, the driver API, 1,024 stacks in
# turn, a Python caller). llvm-profdata merges what they counted into the
# profile, which is compressed; beside it go the functions that ran (by
# symbol) and the rustc that made it, which the build backend checks.
#
# Run it after a change to the code a hook runs: the wheel's build
# (scripts/build-wheel.sh) fails, naming them, when functions that ran
# while the profile was made changed or moved, or another rustc builds. Needs llvm-profdata of the rustc that builds
# (`rustup component add llvm-tools`), what scripts/build-wheel.sh needs
# (cargo-zigbuild and zig on PATH: target/test-venv/bin has them after
# scripts/test.sh), a C compiler, python3 and xz.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=crates/cudaleak-preload/pgo/libcudaleak.profdata.xz
functions=crates/cudaleak-preload/pgo/profiled-functions.txt
made_by=crates/cudaleak-preload/pgo/rustc-version.txt

host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    echo "scripts/pgo-profile.sh: no llvm-profdata for $(rustc --version): rustup component add llvm-tools" >&2
    exit 1
fi
if ! command -v cargo-zigbuild >/dev/null; then
    echo "scripts/pgo-profile.sh: needs cargo-zigbuild and zig, as scripts/build-wheel.sh does: python3 -m pip install -r requirements-wheel.txt" >&2
    exit 1
fi
if [ "$(uname -m)" != x86_64 ]; then
    echo "scripts/pgo-profile.sh: the profile is made on x86_64 (the build backend applies it there only)" >&2
    exit 1
fi

# (under target/, not /tmp: the link wrapper below is run from it, and
# /tmp may be mounted noexec)
mkdir -p target
work=$(mktemp -d "$root/target/pgo-profile.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/raw" "$work/reports" "$work/bench"

# The simulated driver and runtime (build.rs, with the command's crate)
# and the benchmark programs, as scripts/bench.py builds them.
cargo build --release -p cudaleak-cli >/dev/null
python3 -c 'import sys; sys.path.insert(0, "scripts"); import bench; bench.build(sys.argv[1])' "$work/bench"

# Built exactly as scripts/build-wheel.sh builds it (zig, the wheel
# profile, its target directory): the profile finds functions by symbol,
# and a Rust symbol carries a hash of how cargo built the crate (its -C
# metadata), which differs between this build and one without zig, and
# between rustc versions. Only the link differs: zig's cc takes the
# `-u SYMBOL` that rustc passes for the profiler's runtime for a file name,
# so a wrapper hands it on as `-Wl,--undefined=SYMBOL` to cargo-zigbuild's
# linker (flags after `--` leave the -C metadata as it is).
cat >"$work/zig-cc-profiling.sh" <<'EOF'
#!/usr/bin/env bash
args=()
while [ $# -gt 0 ]; do
    if [ "$1" = -u ] && [ $# -gt 1 ]; then args+=("-Wl,--undefined=$2"); shift 2; else args+=("$1"); shift; fi
done
exec "$CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER" "${args[@]}"
EOF
chmod +x "$work/zig-cc-profiling.sh"
glibc=$(sed -n 's/^compatibility = "manylinux_\([0-9]*\)_\([0-9]*\)"$/\1.\2/p' pyproject.toml)
cargo-zigbuild rustc --profile wheel --target "x86_64-unknown-linux-gnu.$glibc" -p cudaleak-preload --lib \
    --target-dir target/wheel-lib -- -Cprofile-generate="$work/raw" \
    -Clinker="$work/zig-cc-profiling.sh" -Clinker-flavor=gcc
lib=$root/target/wheel-lib/x86_64-unknown-linux-gnu/wheel/libcudaleak.so

run() {
    env SIMCUDA_BACKING=threaded SIMCUDA_RUNTIME="$work/bench/libcudart.so.12" \
        LD_LIBRARY_PATH="$work/bench" CUDALEAK_DIR="$work/reports" CUDALEAK_SUMMARY=0 \
        GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432 \
        LLVM_PROFILE_FILE="$work/raw/%p-%m.profraw" BENCH_WORK_ITERS=200 LD_PRELOAD="$lib" "$@" >/dev/null
}
run "$work/bench/step" train 40 64 20
run "$work/bench/step" async 40 16 20
run python3 bench/py_step.py train 20 64 30
run "$work/bench/pairs" runtime 50000 20
run "$work/bench/pairs" driver 50000 20
run "$work/bench/pairs" mixed 50000 20
run python3 bench/py_pairs.py 20000 20

mkdir -p "$(dirname "$out")"
# Every instrumented function, those that never ran too (with no counts):
# a function's local copies in other codegen units are then all in it, so
# that rustc's word that one is missing means it moved or was renamed.
"$profdata" merge -o "$work/libcudaleak.profdata" "$work"/raw/*.profraw
xz -9 -c "$work/libcudaleak.profdata" >"$out.tmp"
mv "$out.tmp" "$out"

# The functions that ran, by symbol: a strict build (scripts/build-wheel.sh)
# fails when rustc finds any of them changed or missing. A function local
# to its codegen unit is named "MODULE;SYMBOL" in the profile and by its
# symbol alone in rustc's warnings: the symbol is what is listed.
"$profdata" merge --sparse -o "$work/ran.profdata" "$work"/raw/*.profraw
"$profdata" show --all-functions "$work/ran.profdata" |
    sed -n 's/^  \([^ ].*\):$/\1/p' | sed 's/^.*;//' | sort -u >"$functions.tmp"
mv "$functions.tmp" "$functions"
rustc -V >"$made_by"
# The library is left built instrumented in target/wheel-lib: the next
# wheel build rebuilds it (its flags differ).
echo "scripts/pgo-profile.sh: $out ($(wc -c <"$out") bytes, $(wc -l <"$functions") functions) from $(rustc --version)"
