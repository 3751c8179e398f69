#!/usr/bin/env bash
# cudaleak on aarch64 (GH200, GB200: Grace CPUs), on an x86-64 machine,
# without the hardware (docs/decisions.md, "aarch64 is built and tested
# under emulation"). docs/platforms.md says what this checks
# and what it cannot.
#
# 1. Builds the workspace for aarch64-unknown-linux-gnu with the
#    distribution's cross compiler (gcc-aarch64-linux-gnu, which links and
#    compiles the simulated driver and runtime in build.rs).
# 2. Runs the unit tests of the core and the preload crate under
#    qemu-aarch64 (qemu-user), cargo's runner.
# 3. Runs planted-leak programs (tests/c, built by the cross compiler) on
#    the aarch64 simulated driver and runtime under qemu-aarch64, with the
#    aarch64 libcudaleak.so preloaded, checked by the integration tests'
#    own assertions (tests/interception.rs and others, run natively; their
#    tests/support runs each traced program through CUDALEAK_TEST_EMULATOR):
#    every hooked API's exact blocks, bytes, functions and lines through
#    the naked entry stubs, the dlsym override and the entry-point lookups.
#
# Needs (scripts/install-test-deps.sh installs them): gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user; and the rustup target, added here.
# Takes about 9 minutes from cold on a 2-core machine (measured: 3.5 for
# the aarch64 build, 4.5 for the unit tests' build and run, the core's
# 93 tests taking 1.5 under qemu; 1.3 for the planted leaks), about 2
# when the builds are warm: too long for every CI run. `.ci/run` runs
# `scripts/aarch64-check.sh build` instead: step 1 alone, a debug build
# into target/aarch64-build (about 2 minutes from cold), which assembles
# the aarch64 stubs and links the library (docs/platforms.md).
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    command -v "$tool" >/dev/null || {
        echo "scripts/aarch64-check.sh needs $tool (scripts/install-test-deps.sh installs it)" >&2
        exit 1
    }
done
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot"
# build.rs's compiler for the simulated driver and runtime (the cc crate's
# convention).
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc

start=$SECONDS
step() {
    echo "scripts/aarch64-check.sh: $1 ($((SECONDS - start)) s)"
}

if [ "${1:-}" = build ]; then
    cargo build --locked --target "$target" --workspace --target-dir target/aarch64-build
    step "built for $target (debug, target/aarch64-build)"
    exit 0
fi

cargo build --release --target "$target" --workspace
step "built for $target"
cargo test --release --target "$target" -p cudaleak-core -p cudaleak-preload
step "unit tests passed under qemu-aarch64"

# The simulated driver and runtime build.rs made for aarch64: the newest
# (an older build's directory may linger beside it).
sim=$(ls -td target/$target/release/build/cudaleak-cli-*/out/sim 2>/dev/null | head -1)
if [ ! -f "$sim/libcudart.so.12" ]; then
    echo "scripts/aarch64-check.sh: no aarch64 simulated runtime under target/$target/release/build" >&2
    exit 1
fi
# Planted-leak programs and the library on aarch64; the tests themselves
# natively (x86-64), as in scripts/test.sh. The suites whose programs
# tests/support starts (run_traced, spawn_traced, run_untraced). Left out,
# for reasons of the emulation or of the simulation, not of the code:
# - exec, and `cudaleak run` (cudaleak_run_lists_...): qemu-user runs only
#   the program it was given; another program started from it (exec, or
#   the x86-64 command starting an aarch64 one) needs binfmt_misc, which
#   containers rarely have; so do the tests that start programs without
#   tests/support (every_request_of_the_real_runtimes_...,
#   the_simulated_driver_resolves_...);
# - a_process_without_allocation_...: it runs /bin/true, an x86-64 program;
# - 16_kib_stack: aarch64's glibc refuses stacks under PTHREAD_STACK_MIN
#   (128 KiB), so the program cannot make its 16 KiB thread;
# - 32_bit: the simulated driver places CUDA 3.1's 32-bit allocations
#   with MAP_32BIT, which only x86-64 has (sim/driver.c);
# - python and pytorch_cache: no aarch64 Python or C++ compiler here.
CUDALEAK_TEST_CC=aarch64-linux-gnu-gcc \
    CUDALEAK_TEST_EMULATOR="qemu-aarch64 -L $sysroot" \
    CUDALEAK_TEST_LIBRARY="target/$target/release/libcudaleak.so" \
    CUDALEAK_TEST_SIM_DIR="$sim" \
    cargo test --release --test interception --test live --test reliability \
    --test loading --test oom --test versions -- \
    --skip exec \
    --skip cudaleak_run_lists_oom_reports \
    --skip every_request_of_the_real_runtimes \
    --skip the_simulated_driver_resolves_names \
    --skip a_process_without_allocation_calls_writes_no_report \
    --skip 16_kib_stack \
    --skip 32_bit \
    --skip python \
    --skip pytorch_cache
step "planted leaks reported exactly under qemu-aarch64"
