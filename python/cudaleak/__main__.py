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
            "(install again from source, which builds the command with the package: "
            "`pip install --force-reinstall ./cudaleak` from a clone, or `pip install --force-reinstall git+URL`; "
            "in a checkout, `cargo build --release` builds it into target/release)\n"
        )
        return 2
    os.execv(command, [command] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
