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

    with cudaleak.peak_limit("2 GiB"):
        train_step()          # raises cudaleak.PeakLimitError if the block's
                              # GPU memory peak went over 2 GiB
"""

import ctypes
import gc
import json
import warnings

from cudaleak._install import library_path
from cudaleak._tables import BINARY_UNITS, NOISE_MODULES, NOISE_PREFIXES, RUNNER_FILE_PARTS, SIZE_UNITS

__all__ = [
    "available",
    "checkpoint",
    "dump",
    "format_size",
    "leaks_since",
    "library_path",
    "live_since",
    "no_leaks",
    "parse_size",
    "release_framework_caches",
    "LeakError",
    "peak_limit",
    "PeakLimitError",
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
            # Peak windows came later: a library from before them keeps
            # every other call working (_peak_api() says which it is).
            try:
                for name in (
                    "cudaleak_peak_window_begin",
                    "cudaleak_peak_window_bytes",
                    "cudaleak_peak_window_end",
                    "cudaleak_peak_bytes",
                ):
                    getattr(lib, name).restype = ctypes.c_uint64
                    getattr(lib, name).argtypes = []
                lib.cudaleak_peak_json.restype = ctypes.c_void_p
                lib.cudaleak_peak_json.argtypes = []
                lib.cudaleak_has_peak_windows = True
            except AttributeError:
                lib.cudaleak_has_peak_windows = False
    return _lib or None


def _peak_api():
    """The library, when it has peak windows; None without the library.
    Raises RuntimeError for a preloaded library older than this module."""
    lib = _library()
    if lib is not None and not lib.cudaleak_has_peak_windows:
        raise RuntimeError(
            "cudaleak: the preloaded libcudaleak.so has no peak windows: it is older than this "
            "module; use the library installed with it (cudaleak.library_path())"
        )
    return lib


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
    return _report_from(lib, lib.cudaleak_leaks_since_json(cp))


def _report_from(lib, ptr):
    """The report (dict) in a string the library returned, which is freed;
    None for a null one."""
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


def format_size(nbytes):
    """A size as people read it, as cudaleak's text reports write it:
    "600 bytes", "1 byte", "4.0 KiB (4096 bytes)"."""
    nbytes = int(nbytes)
    if nbytes < 1024:
        return "1 byte" if nbytes == 1 else "%d bytes" % nbytes
    value, unit = float(nbytes), "bytes"
    for unit in BINARY_UNITS:
        value /= 1024.0
        if round(value, 1) < 1024.0:
            break
    return "%.1f %s (%d bytes)" % (value, unit, nbytes)


def _count(n, noun):
    return "1 %s" % noun if n == 1 else "%d %ss" % (n, noun)


def parse_size(limit):
    """Bytes from an int or a string such as "1 MiB", "512KiB", "10 MB"
    (as pytest-memray's limit_leaks takes them)."""
    if limit is None:
        return 0
    if isinstance(limit, int):
        if limit < 0:
            raise ValueError("cudaleak: a size limit cannot be negative: %r" % (limit,))
        return limit
    text = str(limit).strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ").strip()
    unit = text[len(number):].strip().lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if value < 0 or unit not in SIZE_UNITS:
        raise ValueError("cudaleak: not a size: %r (write e.g. 4096, \"1 MiB\", \"10 MB\")" % (limit,))
    return int(round(value * SIZE_UNITS[unit]))


# Frames that belong to the test runner or to cudaleak itself: left out of
# the stacks a failure shows, where pytest's and pluggy's frames came
# before the test's own line, as the command leaves them out of its text
# (_tables.py).
_RUNNER_PARTS = RUNNER_FILE_PARTS


def _is_runner(frame):
    file = (frame.get("file") or "").replace("\\", "/")
    return any(part in file for part in _RUNNER_PARTS)


def _is_user(frame):
    """The user's own code: not the runner, not an installed package, not
    the standard library."""
    import sysconfig

    file = (frame.get("file") or "").replace("\\", "/")
    if not file or file.startswith("<") or _is_runner(frame):
        return False
    if "/site-packages/" in file or "/dist-packages/" in file:
        return False
    stdlib = sysconfig.get_paths().get("stdlib")
    return not (stdlib and file.startswith(stdlib.replace("\\", "/") + "/"))


# Native machinery left out of the text, as `cudaleak report` does without
# --full-stacks (CONTRACT.md, "Noise"): program start, the interpreter's own
# frames, foreign-call machinery (libffi, ctypes). The lists are the
# command's own (_tables.py is generated from them, so the two agree).
def _is_noise(frame):
    name = frame.get("function") or ""
    if name.startswith(NOISE_PREFIXES):
        return True
    module = (frame.get("module") or "").rsplit("/", 1)[-1]
    return module.startswith(NOISE_MODULES)


def _native_frames(group):
    """The native frames between the innermost Python line and the CUDA
    call, machinery left out."""
    top = []
    merged = group.get("merged_stack") or []
    if merged:
        for f in merged:
            if f.get("kind") == "python":
                break
            top.append(f)
    else:
        for f in group.get("native_stack", []):
            if (f.get("function") or "").startswith(("_PyEval_", "PyEval_Eval")):
                break
            top.append(f)
    return [f for f in top if f.get("function") and not _is_noise(f)]


def _python_frames(group):
    return [f for f in group.get("python_stack", []) if not _is_runner(f)]


def first_user_line(group, prefer_file=None):
    """The line to name for a group: the innermost frame in `prefer_file`
    (the test's own file), else the innermost of the user's own frames,
    else the innermost Python frame."""
    frames = _python_frames(group)
    if prefer_file:
        prefer = str(prefer_file)
        for f in frames:
            if f.get("file") == prefer:
                return f
    for f in frames:
        if _is_user(f):
            return f
    return frames[0] if frames else None


def format_groups(report, max_groups=10, max_frames=8, prefer_file=None):
    """The leaked groups of a report as text: the user's own lines first
    (the test's file first of all), then other Python lines, then the
    innermost native frames. The test runner's frames are left out."""
    lines = []
    for group in report.get("leaks", [])[:max_groups]:
        lines.append(
            "%s in %s allocated by %s (%s memory):"
            % (format_size(group["bytes"]), _count(group["blocks"], "block"), group["api"], group["memory"])
        )
        frames = _python_frames(group)
        first = first_user_line(group, prefer_file)
        user = [f for f in frames if _is_user(f)]
        ordered = ([first] if first else []) + [f for f in user if f is not first]
        ordered += [f for f in frames if f not in ordered]
        for frame in ordered[:max_frames]:
            lines.append("    " + _frame_line(frame))
        natives = _native_frames(group)[: max(2, max_frames // 2)]
        for frame in natives:
            file = frame.get("file")
            where = " %s:%s" % (file, frame.get("line")) if file else ""
            lines.append("    [native] %s%s" % (frame["function"], where))
    rest = report.get("leaks", [])[max_groups:]
    if rest:
        lines.append(
            "... and %s, %s" % (_count(len(rest), "more group"), format_size(sum(g["bytes"] for g in rest)))
        )
    return "\n".join(lines)


class LeakError(AssertionError):
    """CUDA memory allocated inside a checked region was still allocated at
    its end. `report` holds the report (dict) of those blocks. The first
    line of the message (pytest's short summary) names the size and the
    first of the user's own lines."""

    def __init__(self, report, where="the checked region", prefer_file=None):
        self.report = report
        leaks = report.get("leaks", [])
        nbytes = sum(g["bytes"] for g in leaks)
        blocks = sum(g["blocks"] for g in leaks)
        first = first_user_line(leaks[0], prefer_file) if leaks else None
        at = " at %s" % _frame_line(first) if first else ""
        super().__init__(
            "cudaleak: %s leaked %s of CUDA memory in %s%s\n%s"
            % (where, format_size(nbytes), _count(blocks, "block"), at,
               format_groups(report, prefer_file=prefer_file))
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


def release_framework_caches(framework):
    """Gives memory that a framework's caching allocator holds back to the
    driver before a check, so that a region that freed everything does not
    look like a leak. "torch": when PyTorch is already imported and CUDA is
    initialized, synchronizes, collects garbage and empties the cache; a
    no-op otherwise (it never imports torch). None: nothing."""
    if framework is None:
        return
    if framework != "torch":
        raise ValueError("cudaleak: unknown framework %r (known: \"torch\")" % (framework,))
    import sys

    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return
    initialized = getattr(cuda, "is_initialized", None)
    if initialized is not None and not initialized():
        return
    cuda.synchronize()
    gc.collect()
    cuda.empty_cache()


def check_since(cp, where="the checked region", limit=0, filter=None, framework=None, prefer_file=None):
    """Raises LeakError if blocks allocated since checkpoint cp are still
    live (after suppressions): groups that `filter(group)` keeps (all when
    None) and whose bytes exceed `limit` (bytes, or a string such as
    "1 MiB")."""
    __tracebackhide__ = True
    if cp is None:
        return
    limit = parse_size(limit)
    release_framework_caches(framework)
    gc.collect()  # tensors in reference cycles are garbage, not leaks
    blocks, _ = live_since(cp)
    if not blocks:
        return
    report = leaks_since(cp)
    if not report:
        return
    kept = [g for g in report.get("leaks", []) if (filter is None or filter(g)) and g["bytes"] > limit]
    if kept:
        report = dict(report, leaks=kept)
        raise LeakError(report, where, prefer_file=prefer_file)


class no_leaks(object):
    """Fails (LeakError) when CUDA memory allocated in the region is still
    allocated when it ends. An exception from the region itself propagates
    unchanged. A no-op, with one warning, without the library.

    As pytest-memray's limit_leaks: `limit` (bytes or "1 MiB") is what one
    group (one stack) may leave allocated; `filter(group)` keeps the groups
    that count (a report group, a dict); `warmups` runs a decorated
    function that many times unchecked first (one-time initialization is
    not a leak). `framework="torch"` empties PyTorch's caching allocator
    before the check (see release_framework_caches).

        with cudaleak.no_leaks(limit="1 MiB"): ...
        @cudaleak.no_leaks(warmups=1)
        def step(): ...
    """

    def __init__(self, where="the with-block", limit=0, warmups=0, filter=None, framework=None):
        self.where = where
        self.limit = parse_size(limit)
        self.warmups = int(warmups)
        self.filter = filter
        self.framework = framework
        self._cp = None
        # The file whose lines come first in the failure: where the region is.
        self._file = None
        if self.warmups < 0:
            raise ValueError("cudaleak: warmups cannot be negative")
        if framework not in (None, "torch"):
            raise ValueError("cudaleak: unknown framework %r (known: \"torch\")" % (framework,))

    def __enter__(self):
        if self.warmups:
            raise ValueError("cudaleak: warmups repeat a function: use @no_leaks(warmups=N) as a decorator")
        if not available():
            _warn_not_loaded(stacklevel=3)
            self._cp = None
            return self
        import sys

        if self._file is None:
            self._file = sys._getframe(1).f_code.co_filename
        self._cp = checkpoint()
        return self

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = True
        if exc_type is None:
            check_since(self._cp, self.where, self.limit, self.filter, self.framework, prefer_file=self._file)
        return False

    def __call__(self, func):
        import functools

        where = self.where if self.where != "the with-block" else getattr(func, "__qualname__", "the function")

        @functools.wraps(func)
        def checked(*args, **kwargs):
            __tracebackhide__ = True
            for _ in range(self.warmups):
                func(*args, **kwargs)
            region = no_leaks(where, self.limit, 0, self.filter, self.framework)
            region._file = func.__code__.co_filename
            with region:
                return func(*args, **kwargs)

        return checked


def _peak_report():
    """A report (dict) whose `peak` holds what each call site held at the
    process's peak, or None."""
    lib = _peak_api()
    if lib is None:
        return None
    return _report_from(lib, lib.cudaleak_peak_json())


class PeakLimitError(AssertionError):
    """A region's CUDA memory peak went over its limit. `peak`: the most
    bytes it held above what was live when it began; `limit`: its limit;
    `report`: a report (dict) whose `leaks` are the call sites named: those
    at the region's peak when it was the process's peak (`at_peak` True),
    else what the region allocated and still held at its end."""

    def __init__(self, where, peak, limit, report=None, at_peak=False, prefer_file=None):
        self.peak = peak
        self.limit = limit
        self.report = report
        self.at_peak = at_peak
        msg = "%s: CUDA memory peak %s over what was live when it began, over its limit of %s" % (
            where,
            format_size(peak),
            format_size(limit),
        )
        leaks = (report or {}).get("leaks", [])
        if leaks and at_peak:
            msg += "\nwhat the process held at that peak, by call site:\n" + format_groups(
                report, max_groups=5, prefer_file=prefer_file
            )
        elif leaks:
            msg += "\nwhat it allocated and still held at its end (its peak was below the process's):\n" + (
                format_groups(report, max_groups=5, prefer_file=prefer_file)
            )
        else:
            msg += "\nit freed all it allocated, and its peak was below the process's"
        AssertionError.__init__(self, msg)


class peak_limit(object):
    """Fails (PeakLimitError) when the CUDA memory the process holds rises
    more than `limit` (bytes, or "2 GiB") above what it held when the
    region began, at any moment inside it: the region's own peak, freed
    memory included. The library keeps the peak exactly, whatever thread
    allocates; regions open at once share one mark (the most since the
    oldest began). An exception from the region propagates unchanged. A
    no-op, with one warning, without the library. `peak` holds the
    region's peak after it ends.

        with cudaleak.peak_limit("2 GiB"):
            train_step()
    """

    def __init__(self, limit, where="the with-block", framework=None):
        if limit is None:
            raise ValueError("cudaleak: peak_limit needs a limit (bytes, or a string such as \"2 GiB\")")
        self.limit = parse_size(limit)
        self.where = where
        if framework not in (None, "torch"):
            raise ValueError("cudaleak: unknown framework %r (known: \"torch\")" % (framework,))
        self.framework = framework
        self.peak = None
        self._start = None
        self._mark = None
        self._process_peak = 0
        self._cp = None
        self._file = None

    def begin(self):
        """Opens the region (as `with` does). framework="torch" first gives
        PyTorch's cached segments back, so that segments earlier code left
        in the cache do not hide the region's own growth."""
        lib = _peak_api()
        if lib is None:
            _warn_not_loaded(stacklevel=4)
            return
        if self._start is not None:
            raise RuntimeError("cudaleak: this peak_limit is already open; use one per region")
        release_framework_caches(self.framework)
        self._process_peak = lib.cudaleak_peak_bytes()
        self._start = lib.cudaleak_peak_window_begin()
        self._mark = self._start
        self._cp = checkpoint()

    def high(self):
        """The region's peak so far (bytes over its start); None when it is
        not open."""
        lib = _library()
        if lib is None or self._start is None:
            return None
        self._mark = lib.cudaleak_peak_window_bytes()
        return max(0, self._mark - self._start)

    def end(self):
        """Closes the region; returns its peak (None without the library)."""
        lib = _library()
        if lib is None or self._start is None:
            return None
        self._mark = lib.cudaleak_peak_window_end()
        self.peak = max(0, self._mark - self._start)
        self._start = None
        return self.peak

    def error(self, peak):
        """The PeakLimitError for `peak`, or None when it is within the limit."""
        if peak is None or peak <= self.limit:
            return None
        # The region set the process's peak (its mark passed the peak read
        # when it began, and is the peak now): the library holds what each
        # call site held then. Else, what the region still holds.
        process = _peak_report() if self._mark > self._process_peak else None
        if process and (process.get("peak") or {}).get("bytes") == self._mark:
            report = dict(process, leaks=process["peak"].get("groups", []))
            return PeakLimitError(self.where, peak, self.limit, report, at_peak=True, prefer_file=self._file)
        return PeakLimitError(self.where, peak, self.limit, leaks_since(self._cp), prefer_file=self._file)

    def __enter__(self):
        import sys

        if self._file is None:
            self._file = sys._getframe(1).f_code.co_filename
        self.begin()
        return self

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = True
        peak = self.end()
        if exc_type is None:
            err = self.error(peak)
            if err is not None:
                raise err
        return False
