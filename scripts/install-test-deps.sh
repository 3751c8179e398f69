#!/bin/sh
# Packages the tests need beyond the toolchain, from the distribution:
# Chromium for the browser tests of `cudaleak report --format html`
# (tests/html.rs). Those tests are #[ignore]d ("needs Chromium") in a plain
# `cargo test`; scripts/test.sh runs them, and there a missing Chromium
# fails them.
set -eu
if command -v chromium >/dev/null 2>&1 || command -v chromium-headless-shell >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium
