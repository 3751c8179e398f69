"""Where the wheel put the library and the command, seen from this package.

The wheel (pyproject.toml) installs the package into site-packages with
libcudaleak.so in cudaleak/_lib/, and the `cudaleak` command into the
scripts directory of the same installation (a venv's bin/, ~/.local/bin,
/usr/local/bin). In a source checkout the package is python/cudaleak and
both come from `cargo build --release`, in target/release/.
"""

import os
import shutil
import sys
import sysconfig

# The real directory: under `cudaleak run` the package may be imported
# through a link in a private directory (the command's PYTHONPATH), and
# the command and library are found from where it really is.
_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))
_COMMAND = "cudaleak"


def library_path():
    """The libcudaleak.so that came with this package, or None."""
    candidates = [
        os.path.join(_PACKAGE_DIR, "_lib", "libcudaleak.so"),
        # python/cudaleak in a source checkout -> target/release
        os.path.join(_PACKAGE_DIR, "..", "..", "target", "release", "libcudaleak.so"),
    ]
    for path in candidates:
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


def _scripts_dirs():
    # site-packages/cudaleak -> lib/python3.X/site-packages -> prefix/bin:
    # the installation this very package belongs to comes first.
    prefix = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "..", ".."))
    yield os.path.join(prefix, "bin")
    yield os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "target", "release"))
    yield sysconfig.get_path("scripts")
    try:
        yield sysconfig.get_path("scripts", "%s_user" % os.name)
    except KeyError:
        pass
    yield os.path.dirname(sys.executable)


def command_path():
    """The `cudaleak` command installed with this package, or None."""
    for directory in _scripts_dirs():
        path = os.path.join(directory, _COMMAND)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which(_COMMAND)
