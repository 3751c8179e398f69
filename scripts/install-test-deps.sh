#!/bin/sh
# Packages the tests need beyond the toolchain, from the distribution:
# - Chromium, for the browser tests of `cudaleak report --format html`
#   (tests/html.rs);
# - Go (golang-go), whose `go tool pprof` reads `--format pprof` back
#   (tests/exports.rs).
# With CI=true those tests fail when their tool is missing; elsewhere they
# print "SKIPPED: ... not installed" and return.
set -eu
missing=""
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-headless-shell >/dev/null 2>&1; then
    missing="$missing chromium"
fi
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/lib/go/bin/go ]; then
    missing="$missing golang-go"
fi
if [ -z "$missing" ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
# shellcheck disable=SC2086 # one word per package
$SUDO apt-get install -y --no-install-recommends $missing
