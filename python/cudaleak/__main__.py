"""`python -m cudaleak ARGS...` is `cudaleak ARGS...`: the command that was
installed with this package, run in place of this interpreter (same
arguments, environment, exit status and signals)."""

import os
import sys

from cudaleak._install import command_path


def main():
    command = command_path()
    if command is None:
        sys.stderr.write(
            "cudaleak: cannot find the cudaleak command next to this Python package "
            "(reinstall it with `pip install cudaleak`, or build it with `cargo build --release`)\n"
        )
        return 2
    os.execv(command, [command] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
