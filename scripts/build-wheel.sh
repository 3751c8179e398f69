#!/usr/bin/env bash
# Builds the wheel target/wheels/cudaleak-VERSION-py3-none-manylinux_2_28_ARCH.whl
# (docs/packaging.md). It is the standard build, `pip wheel .` through the
# project's build backend (build_backend/cudaleak_build.py), which every
# other way of installing from source uses too; this script only insists on
# zig, so that the wheel carries the manylinux tag, and builds with the
# tools of the Python it runs (`python3`, or $PYTHON): maturin, ziglang and
# cargo-zigbuild, from `python3 -m pip install -r requirements-wheel.txt`
# (scripts/test.sh installs them into target/test-venv). On x86_64 it
# insists on the optimization profile too (pgo=strict): the wheel fails to
# build when the profile is another rustc's or no longer matches the code
# that ran when it was made (scripts/pgo-profile.sh makes it again).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
missing=$("$python" - <<'EOF'
import importlib.util, os, shutil, sysconfig
need = [m for m in ("maturin", "ziglang") if importlib.util.find_spec(m) is None]
path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
if not shutil.which("cargo-zigbuild", path=path):
    need.append("cargo-zigbuild")
print(" ".join(need))
EOF
)
if [ -n "$missing" ]; then
    echo "scripts/build-wheel.sh needs $missing for $python: $python -m pip install -r requirements-wheel.txt" >&2
    exit 1
fi
rm -f target/wheels/cudaleak-*.whl
# (The profile is x86_64's: another machine's wheel is built without it,
# as the backend's note says.)
pgo=auto
if [ "$(uname -m)" = x86_64 ]; then pgo=strict; fi
"$python" -m pip wheel --verbose --no-deps --no-build-isolation --disable-pip-version-check \
    --config-settings zig=yes --config-settings pgo=$pgo --wheel-dir target/wheels .
ls -l target/wheels/cudaleak-*.whl
