#!/bin/sh
# Writes python/cudaleak/_tables.py, the Python module's copy of the
# tables it shares with the command (the units of parse_size and
# format_size, the noise frames), from the Rust tables themselves
# (cudaleak_core::base::units, cudaleak_core::report::render). tests/python.rs renders
# the same text and fails when the file differs, so the two cannot drift
# (docs/decisions.md, "The Python module's tables are generated from the
# Rust ones").
#
#     scripts/gen-python-tables.sh
set -eu
cd "$(dirname "$0")/.."
cargo test --release --test python -- --exact --ignored write_the_python_tables
echo "wrote python/cudaleak/_tables.py"
