#!/usr/bin/env bash
# The project's test command (README.md). It needs cargo, a C compiler,
# binutils and python3 (3.9 or newer, with venv), and installs the Python
# packages the tests use (requirements-dev.txt, requirements-wheel.txt) into
# its own virtual environment, target/test-venv, from PyPI: nothing comes
# first.
#
# `cargo test` does not build the cdylib, so the preload library and the CLI
# are built first; the integration tests then run real processes under
# target/release/libcudaleak.so. Then the wheel is built (a second, zig-linked
# release build: scripts/build-wheel.sh) and tests/wheel.rs installs it into
# fresh virtual environments, offline, and uses it as a person would; the
# suites that run processes under the library run once more on the wheel's
# own libcudaleak.so.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests need beyond the toolchain (Chromium, Go, speedscope from
# npm, libc's debug file, the aarch64 tools): installed here, or, where
# this user cannot, one line names the command that does, before any
# test runs (a fresh clone failed after 17 minutes on a missing tool).
scripts/install-test-deps.sh

# Two groups of tests run only where they can: the agreement tests with
# ../shared (the schema and contract this project's copies follow), which
# exists beside the lead's checkout and CI's but not in a user's clone; and
# the tests that act as another user, which need root. In a user's clone
# one line says what did not run. CI sets CUDALEAK_TEST_EVERY_GROUP=1
# (.ci/run): there a group that cannot run fails the command, before
# anything is built, so a green CI means every group ran.
with_shared=0 as_root=0 missing=0
if [ -d ../shared ]; then
    with_shared=1
else
    echo "scripts/test.sh: no ../shared beside this checkout: the agreement tests with it will not run" >&2
    missing=1
fi
if [ "$(id -u)" = 0 ]; then
    as_root=1
else
    echo "scripts/test.sh: not root: the tests that act as another user will not run" >&2
    missing=1
fi
if [ "$missing" = 1 ] && [ "${CUDALEAK_TEST_EVERY_GROUP:-}" = 1 ]; then
    echo "scripts/test.sh: CUDALEAK_TEST_EVERY_GROUP=1 asks for every group of tests: stopping" >&2
    exit 1
fi

venv=target/test-venv
stamp="$venv/requirements.stamp"
# What the offline installs in tests/wheel.rs take from target/wheelhouse:
# pytest; what a build from source asks for with build isolation
# (pyproject.toml's build-system requires); and pip, which pipx brings up
# to date in its shared environment.
wheelhouse="pytest maturin>=1.9,<2 pip"
if ! { cat requirements-dev.txt requirements-wheel.txt; echo "$wheelhouse"; } | cmp -s - "$stamp"; then
    rm -rf "$venv" target/wheelhouse
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r requirements-dev.txt -r requirements-wheel.txt
    # shellcheck disable=SC2086 # one requirement per word
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check \
        --dest target/wheelhouse $wheelhouse
    { cat requirements-dev.txt requirements-wheel.txt; echo "$wheelhouse"; } >"$stamp"
fi
export PATH="$PWD/$venv/bin:$PATH"

cargo build --release --workspace
cargo test --release --workspace "$@"
# The tests that need a tool are #[ignore]d (`cargo test` reports them as
# ignored, never as passed: docs/decisions.md, "A test can fail, or it is
# not a test"); here they run, and a missing tool
# fails them. The ../shared and root groups join the list where the checks
# at the top found them possible.
ignored=(--test html --test exports --test real_runtime --test python --test reports --test budgets --test metrics --test top)
# Every test file with #[ignore]d tests is run here (or below, as the
# wheel's, or only beside ../shared or as root, which say so): one missing
# from these lists would never run anywhere.
for f in tests/*.rs; do
    name=$(basename "$f" .rs)
    if grep -q '#\[ignore' "$f"; then
        case " ${ignored[*]} --test artifacts --test versions --test cli_safety --test gate --test endings --test wheel " in
            *" --test $name "*) ;;
            *) echo "scripts/test.sh: $f has ignored tests that no step runs: add it to the list" >&2; exit 1 ;;
        esac
    fi
done

if [ "$with_shared" = 1 ]; then
    ignored+=(--test artifacts --test versions)
fi
if [ "$as_root" = 1 ]; then
    ignored+=(--test cli_safety --test gate --test endings)
fi
# The generator of python/cudaleak/_tables.py is an ignored test of its
# own (scripts/gen-python-tables.sh); the check beside it always runs.
skip=(--skip write_the_python_tables)
if ! python -c "import torch.cuda._memory_viz" 2>/dev/null; then
    skip+=(--skip torch_snapshot_is_read_by_pytorchs_memory_viz)
    echo "scripts/test.sh: no PyTorch here: PyTorch's reader of --format torch-snapshot did not run"
fi
cargo test --release "${ignored[@]}" -- --ignored "${skip[@]}"
# The GPU checks' own logic (parsers, checkers, the script's exit status),
# with fake frameworks: they must be able to fail before a GPU runs them.
python gpu/test_check_report.py
wheel_start=$SECONDS
scripts/build-wheel.sh
echo "scripts/test.sh: the wheel took $((SECONDS - wheel_start)) s to build"
cargo test --release --test wheel -- --ignored
# The processes-under-LD_PRELOAD suites once more, on the library the wheel
# ships (zig-linked against glibc 2.28, without debug info).
CUDALEAK_TEST_LIBRARY=python/cudaleak/_lib/libcudaleak.so \
    cargo test --release --test interception --test python --test live --test oom
