#!/bin/sh
# What the tests need beyond the toolchain, from the distribution and, for
# speedscope, from npm through its lock file:
# - Chromium, for the browser tests of `cudaleak report --format html`
#   (tests/html.rs) and for speedscope (tests/exports.rs);
# - Go (golang-go), whose `go tool pprof` reads `--format pprof` back;
# - node and npm, to install speedscope (tests/speedscope/package-lock.json),
#   which opens `--format speedscope` (tests/exports.rs);
# - libc6-dbg, libc's debug file, whose symbol table names libc's start-up
#   frames at dump time (tests/reports.rs);
# - gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user, for
#   scripts/aarch64-check.sh (the aarch64 build, its unit tests and
#   planted-leak programs under qemu-aarch64; docs/platforms.md);
# - prometheus, prometheus-node-exporter and prometheus-pushgateway, which
#   serve, scrape and query the metrics (tests/metrics.rs);
# - tmux, the real terminal that drives `cudaleak top`'s interactive view
#   (tests/top.rs).
# Tests that need one of these are #[ignore]d with the reason in a plain
# `cargo test`; scripts/test.sh runs them, and there a missing tool fails
# them (docs/decisions.md, "A test can fail, or it is not a test").
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
missing=""
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-headless-shell >/dev/null 2>&1; then
    missing="$missing chromium"
fi
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/lib/go/bin/go ]; then
    missing="$missing golang-go"
fi
if ! command -v npm >/dev/null 2>&1; then
    missing="$missing nodejs npm"
fi
if command -v dpkg >/dev/null 2>&1 && ! dpkg -s libc6-dbg >/dev/null 2>&1; then
    missing="$missing libc6-dbg"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
    missing="$missing gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
fi
if ! command -v qemu-aarch64 >/dev/null 2>&1; then
    missing="$missing qemu-user"
fi
# Prometheus and node_exporter scrape the metrics files (tests/metrics.rs).
if ! command -v prometheus >/dev/null 2>&1; then
    missing="$missing prometheus"
fi
if ! command -v prometheus-node-exporter >/dev/null 2>&1; then
    missing="$missing prometheus-node-exporter"
fi
if ! command -v prometheus-pushgateway >/dev/null 2>&1; then
    missing="$missing prometheus-pushgateway"
fi
# A terminal for the interactive view (tests/top.rs).
if ! command -v tmux >/dev/null 2>&1; then
    missing="$missing tmux"
fi
if [ -n "$missing" ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1 || ! sudo -n true 2>/dev/null; then
            echo "the tests need these packages:$missing" >&2
            echo "install them as root with: sudo $0" >&2
            exit 1
        fi
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update
    # shellcheck disable=SC2086 # one word per package
    $SUDO apt-get install -y --no-install-recommends $missing
fi
if [ ! -f "$root/tests/speedscope/node_modules/speedscope/dist/release/index.html" ]; then
    npm ci --prefix "$root/tests/speedscope" --no-audit --no-fund
fi
