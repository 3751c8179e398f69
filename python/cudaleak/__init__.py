"""cudaleak's in-process API for Python.

Works when the process runs under the library (``cudaleak run -- ...`` or
``LD_PRELOAD=$(cudaleak lib)``); otherwise every call is a no-op and
:func:`no_leaks` warns once. Importing it never needs the library.

    import cudaleak

    with cudaleak.no_leaks():
        train_step()          # raises cudaleak.LeakError if CUDA memory
                              # allocated here is still allocated at the end

    cp = cudaleak.checkpoint()
    ...
    blocks, nbytes = cudaleak.live_since(cp)
    cudaleak.dump("after epoch 3")   # writes a report now (trigger "api")
"""

import ctypes
import gc
import json
import warnings
from contextlib import contextmanager

from cudaleak._install import library_path

__all__ = [
    "available",
    "checkpoint",
    "dump",
    "leaks_since",
    "library_path",
    "live_since",
    "no_leaks",
    "LeakError",
]

_lib = None


def _library():
    """The preloaded library's API, or None. Looked up in the process's
    global scope: present exactly when libcudaleak.so is preloaded."""
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL(None)
            lib.cudaleak_checkpoint.restype = ctypes.c_uint64
            lib.cudaleak_checkpoint.argtypes = []
            lib.cudaleak_dump.restype = ctypes.c_int
            lib.cudaleak_dump.argtypes = [ctypes.c_char_p]
            lib.cudaleak_live_since.restype = ctypes.c_int
            lib.cudaleak_live_since.argtypes = [
                ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_uint64),
                ctypes.POINTER(ctypes.c_uint64),
            ]
            lib.cudaleak_leaks_since_json.restype = ctypes.c_void_p
            lib.cudaleak_leaks_since_json.argtypes = [ctypes.c_uint64]
            lib.cudaleak_free.restype = None
            lib.cudaleak_free.argtypes = [ctypes.c_void_p]
        except (OSError, AttributeError):
            _lib = False
        else:
            _lib = lib
    return _lib or None


def available():
    """True when the process runs under libcudaleak.so."""
    return _library() is not None


def checkpoint():
    """Starts a checkpoint; returns its id (None without the library)."""
    lib = _library()
    return lib.cudaleak_checkpoint() if lib else None


def live_since(cp):
    """(blocks, bytes) still live that were allocated since checkpoint cp."""
    lib = _library()
    if lib is None or cp is None:
        return (0, 0)
    blocks, nbytes = ctypes.c_uint64(0), ctypes.c_uint64(0)
    lib.cudaleak_live_since(cp, ctypes.byref(blocks), ctypes.byref(nbytes))
    return (blocks.value, nbytes.value)


def leaks_since(cp):
    """A report (dict, schema/report.schema.json) of the blocks still live
    that were allocated since checkpoint cp, suppressions applied."""
    lib = _library()
    if lib is None or cp is None:
        return None
    ptr = lib.cudaleak_leaks_since_json(cp)
    if not ptr:
        return None
    try:
        return json.loads(ctypes.string_at(ptr).decode("utf-8"))
    finally:
        lib.cudaleak_free(ptr)


def dump(reason="python"):
    """Writes a report now (trigger "api"); True when one was written."""
    lib = _library()
    return bool(lib) and lib.cudaleak_dump(str(reason).encode("utf-8")) == 0


def _frame_line(frame):
    line = frame.get("line")
    where = "%s:%s" % (frame.get("file"), line) if line is not None else str(frame.get("file"))
    return "%s in %s" % (where, frame.get("function"))


def format_groups(report, max_groups=10, max_frames=8):
    """The leaked groups of a report as text: Python frames first (the
    lines people think in), then the innermost native frames."""
    lines = []
    for group in report.get("leaks", [])[:max_groups]:
        lines.append(
            "%d bytes in %d block(s) allocated by %s (%s memory):"
            % (group["bytes"], group["blocks"], group["api"], group["memory"])
        )
        for frame in group.get("python_stack", [])[:max_frames]:
            lines.append("    " + _frame_line(frame))
        natives = [f for f in group.get("native_stack", []) if f.get("function")][: max(2, max_frames // 2)]
        for frame in natives:
            file = frame.get("file")
            where = " %s:%s" % (file, frame.get("line")) if file else ""
            lines.append("    [native] %s%s" % (frame["function"], where))
    rest = report.get("leaks", [])[max_groups:]
    if rest:
        lines.append("... and %d more group(s)" % len(rest))
    return "\n".join(lines)


class LeakError(AssertionError):
    """CUDA memory allocated inside a checked region was still allocated at
    its end. `report` holds the report (dict) of those blocks."""

    def __init__(self, report, where="the checked region"):
        self.report = report
        leaks = report.get("leaks", [])
        nbytes = sum(g["bytes"] for g in leaks)
        blocks = sum(g["blocks"] for g in leaks)
        super().__init__(
            "cudaleak: %s leaked %d bytes of CUDA memory in %d block(s):\n%s"
            % (where, nbytes, blocks, format_groups(report))
        )


_warned = False


def _warn_not_loaded(stacklevel):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "cudaleak: libcudaleak.so is not preloaded, so CUDA leaks are not checked "
            "(run under `cudaleak run -- ...` or LD_PRELOAD=$(cudaleak lib))",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def check_since(cp, where="the checked region"):
    """Raises LeakError if blocks allocated since checkpoint cp are still
    live (after suppressions)."""
    if cp is None:
        return
    gc.collect()  # tensors in reference cycles are garbage, not leaks
    blocks, _ = live_since(cp)
    if not blocks:
        return
    report = leaks_since(cp)
    if report and report.get("leaks"):
        raise LeakError(report, where)


@contextmanager
def no_leaks(where="the with-block"):
    """Fails (LeakError) when CUDA memory allocated in the block is still
    allocated when it ends. An exception from the block itself propagates
    unchanged. A no-op, with one warning, without the library."""
    if not available():
        _warn_not_loaded(stacklevel=4)
        yield
        return
    cp = checkpoint()
    yield
    check_since(cp, where)
