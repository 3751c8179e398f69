#!/usr/bin/env bash
# Runs the Python-stack tests (tests/python.rs) under every CPython it finds,
# one after another: CI has one Python, the frame reader supports 3.8 and
# later (tables for 3.8-3.13, the interpreter's own _Py_DebugOffsets from
# 3.13). On 3.13 and later the tests run twice, the second time with the
# frame layout forced to come from _Py_DebugOffsets (CUDALEAK_PYTHON_OFFSETS=1,
# which is what 3.14+ always use).
#
#     scripts/test-python-versions.sh [python3.X ...]
#
# Without arguments it takes python3.8 ... python3.15 from PATH and from
# pyenv (~/.pyenv/versions/*). Each needs pytest and pytest-xdist
# (python3.X -m pip install -r requirements-dev.txt). Results go in
# docs/python-versions.md.
set -euo pipefail
cd "$(dirname "$0")/.."
pythons=("$@")
if [ ${#pythons[@]} -eq 0 ]; then
    for minor in 8 9 10 11 12 13 14 15; do
        # (pyenv's shims answer `command -v` for versions they will not run)
        for candidate in "$HOME"/.pyenv/versions/3."$minor".*/bin/python3 "$(command -v "python3.$minor" || true)"; do
            if [ -x "$candidate" ] && "$candidate" -c '' 2>/dev/null; then
                pythons+=("$candidate")
                break
            fi
        done
    done
fi
if [ ${#pythons[@]} -eq 0 ]; then
    echo "test-python-versions.sh: no python3.8 ... python3.15 found" >&2
    exit 1
fi
cargo build --release --workspace
failed=()
for py in "${pythons[@]}"; do
    version=$("$py" -c 'import sys; print(sys.version.split()[0])')
    paths=(table)
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 13))'; then
        paths=(table offsets)
    fi
    for path in "${paths[@]}"; do
        offsets=0
        [ "$path" = offsets ] && offsets=1
        echo "== CPython $version ($py), frame layout: $path"
        log=$(mktemp)
        if CUDALEAK_PYTHON_OFFSETS=$offsets CUDALEAK_TEST_PYTHON="$py" cargo test --release --test python >"$log" 2>&1; then
            grep '^test result' "$log"
        else
            grep -E '^test .* FAILED$|panicked|^test result' "$log" || tail -n 20 "$log"
            failed+=("$version/$path")
        fi
        rm -f "$log"
    done
done
if [ ${#failed[@]} -ne 0 ]; then
    echo "failed under: ${failed[*]}" >&2
    exit 1
fi
echo "all passed"
