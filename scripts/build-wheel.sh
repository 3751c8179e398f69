#!/usr/bin/env bash
# Builds the wheel target/wheels/cudaleak-VERSION-py3-none-manylinux_2_28_ARCH.whl
# (README.md, "Installing"). Needs maturin, ziglang and cargo-zigbuild on
# PATH: scripts/test.sh installs them into target/test-venv, or
# `python3 -m pip install -r requirements-wheel.txt`.
#
# maturin builds one crate per wheel (the command line, bindings = "bin"),
# so the preload library is built first and handed to it as a file of the
# Python package (pyproject.toml, [tool.maturin] include). Both are linked
# by zig against glibc stubs of the manylinux baseline, not against this
# machine's newer glibc, so that the tag auditwheel checks is true.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in maturin cargo-zigbuild; do
    command -v "$tool" >/dev/null || {
        echo "scripts/build-wheel.sh needs $tool: python3 -m pip install -r requirements-wheel.txt" >&2
        exit 1
    }
done
# One place says the baseline: pyproject.toml's compatibility = "manylinux_2_28".
tag=$(sed -n 's/^compatibility = "\(manylinux_[0-9]*_[0-9]*\)"$/\1/p' pyproject.toml)
[ -n "$tag" ] || { echo "pyproject.toml names no manylinux compatibility" >&2; exit 1; }
glibc=${tag#manylinux_}
glibc=${glibc/_/.}
target="$(uname -m)-unknown-linux-gnu"

# A target directory of its own: cargo-zigbuild and maturin --zig set the
# compiler environment differently, and in one directory each would
# rebuild every crate the other built, on every run.
cargo zigbuild --profile wheel --target "$target.$glibc" --target-dir target/wheel-lib -p cudaleak-preload
install -D -m 0755 "target/wheel-lib/$target/wheel/libcudaleak.so" python/cudaleak/_lib/libcudaleak.so
rm -f target/wheels/cudaleak-*.whl
maturin build --zig --target "$target" --out target/wheels
ls -l target/wheels/cudaleak-*.whl
