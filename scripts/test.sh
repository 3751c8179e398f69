#!/usr/bin/env bash
# The project's test command (README.md). `cargo test` does not build the
# cdylib, so the preload library and the CLI are built first; the
# integration tests then run real processes under target/release/libcudaleak.so.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import pytest' 2>/dev/null; then
    echo "scripts/test.sh: python3 lacks pytest; run: python3 -m pip install -r requirements-dev.txt" >&2
    exit 1
fi
cargo build --release --workspace
cargo test --release --workspace "$@"
