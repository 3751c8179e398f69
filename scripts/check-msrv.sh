#!/usr/bin/env bash
# The rust-version that Cargo.toml promises is true: the whole
# workspace, tests included, type-checks with exactly that toolchain, and
# the messages that tell users which Rust to install name the same one.
#
# 1.88 is the floor: `#[unsafe(naked)]` and `naked_asm!` (the hooks' entry
# stubs and the dlsym override) are stable from 1.88 on. A newer std API
# or a dependency that asks for a newer rustc fails here, not on a user's
# machine.
#
# `cargo check` only, into its own target directory (target/msrv), so the
# release build of the tests is left as it is. Cost on CI's 2 cores: the
# toolchain download (minimal profile) and about a minute of
# checking from cold.
set -euo pipefail
cd "$(dirname "$0")/.."

msrv=$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml)
if [ -z "$msrv" ]; then
    echo "scripts/check-msrv.sh: no rust-version in Cargo.toml's [workspace.package]" >&2
    exit 1
fi
# What users read: "needs Rust X or newer" (README, the build backend's
# message, docs/packaging.md and the test that reads that message).
stale=$(grep -rnE "Rust [0-9]+\.[0-9]+ or newer" README.md docs build_backend tests \
    | grep -v "Rust $msrv or newer" || true)
if [ -n "$stale" ]; then
    echo "scripts/check-msrv.sh: these name another Rust than rust-version ($msrv):" >&2
    echo "$stale" >&2
    exit 1
fi
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
    rustup toolchain install "$msrv" --profile minimal
fi
start=$SECONDS
cargo "+$msrv" check --workspace --all-targets --locked --target-dir target/msrv
echo "scripts/check-msrv.sh: the workspace checks with Rust $msrv ($((SECONDS - start)) s)"
