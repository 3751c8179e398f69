"""Shared helpers of the GPU checks (scripts/gpu-validate.sh), and the
checkers of the sections that have no workload script of their own.

Every check compares what cudaleak reported with a ground truth that does
not come from cudaleak (the planted program's own account of what it
leaked, compute-sanitizer, PyTorch's counters and messages), with a stated
tolerance, and prints exactly one line:

    CHECK <name>: PASS|FAIL <figure> (tolerance <tolerance>)

The line is also appended to the file named by GPU_CHECK_LOG, from which
gpu-validate.sh counts checks and failures. `finish()` exits 1 when a
check of this process failed.

Reports are read through the CLI (`$CUDALEAK_CLI report --format json
PATH`) when CUDALEAK_CLI is set, else from the JSON file itself.

    python3 check_report.py nvcc REPORT_DIR PLANTED_TXT [--name N] [--sanitizer OUT_TXT]
    python3 check_report.py stacks REPORT_DIR MODE      (tests/python/stacks.py all|deadlock)
    python3 check_report.py graphs REPORT_DIR MODE ACCOUNT_TXT [--under RUN_TXT]
                                                        (gpu/graphs_resets.cu MODE)

Plain Python 3.8+, no third-party module: it runs outside the preload.
"""

import functools
import glob
import json
import os
import re
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LEAKS_CU = os.path.join(HERE, "leaks.cu")
GRAPHS_CU = os.path.join(HERE, "graphs_resets.cu")
STACKS_PY = os.path.join(ROOT, "tests", "python", "stacks.py")

MiB = 1 << 20
GiB = 1 << 30

_failed = []
_count = [0]


# --- Results -----------------------------------------------------------------


def check(name, ok, figure, tolerance):
    """Prints `CHECK name: PASS|FAIL figure (tolerance tolerance)`, records a
    failure, appends the line to $GPU_CHECK_LOG. Returns ok (a bool)."""
    ok = bool(ok)
    # One ": " per line, after the name: gpu-validate.sh splits there.
    name = " ".join(str(name).replace(": ", " ").split())
    figure = " ".join(str(figure).split())
    tolerance = " ".join(str(tolerance).split())
    line = "CHECK %s: %s %s (tolerance %s)" % (name, "PASS" if ok else "FAIL", figure, tolerance)
    print(line, flush=True)
    log = os.environ.get("GPU_CHECK_LOG")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")
    _count[0] += 1
    if not ok:
        _failed.append(name)
    return ok


def failures():
    return list(_failed)


def finish():
    """Exits 1 when a check of this process failed, else 0."""
    sys.stdout.flush()
    sys.exit(1 if _failed else 0)


def guarded(name):
    """Decorator: an exception in a checker (a missing report, a field
    absent) becomes one FAIL line named `name` instead of a traceback
    that no count would see."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - reported as a failed check
                traceback.print_exc(file=sys.stderr)
                check(name, False, "checker error: %s: %s" % (type(e).__name__, e), "the checker runs to its end")
                return None

        return run

    return wrap


def within(value, expected, abs_tol=0, rel_tol=0.0):
    """|value - expected| <= max(abs_tol, rel_tol * |expected|)."""
    return abs(value - expected) <= max(abs_tol, rel_tol * abs(expected))


def fmt_bytes(n):
    if n is None:
        return "None"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return "%d B (%.2f %s)" % (n, n / size, unit)
    return "%d B" % n


def round_up(n, unit):
    return (n + unit - 1) // unit * unit


# --- Ground truth from source files ------------------------------------------


def marker_line(path, marker):
    """The 1-based line of `path` whose comment (#, // or /*) starts with
    `marker` (e.g. "LEAK cudaMalloc"; a leading "# " is ignored), not
    followed by a word character: exactly one such line, else ValueError.
    The checks name markers in strings, which are no comments."""
    marker = re.sub(r"^(#|//|/\*)\s*", "", marker)
    pat = re.compile(r"(?:#|//|/\*)\s*" + re.escape(marker) + r"(?![\w])")
    with open(path) as f:
        hits = [i for i, text in enumerate(f, 1) if pat.search(text)]
    if len(hits) != 1:
        raise ValueError("%s: %d lines carry %r (want exactly 1)" % (path, len(hits), marker))
    return hits[0]


def read_truth(path):
    with open(path) as f:
        return json.load(f)


def write_truth(data, path=None):
    """Writes a workload's ground truth (JSON) to `path` or
    $GPU_CHECK_TRUTH; a no-op when neither is given."""
    path = path or os.environ.get("GPU_CHECK_TRUTH")
    if not path:
        return None
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def parse_planted(text):
    """gpu/leaks.cu's own account, lines `planted API MEMORY BYTES FUNCTION`."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "planted":
            out.append({"api": parts[1], "memory": parts[2], "bytes": int(parts[3]), "function": parts[4]})
    return out


# --- Reports ------------------------------------------------------------------


def load_report(path, cli=None):
    """A report (dict): `cudaleak report --format json PATH` through the CLI
    ($CUDALEAK_CLI or `cli`), else the JSON file itself (a directory: its
    newest report by sequence)."""
    cli = cli if cli is not None else os.environ.get("CUDALEAK_CLI")
    if cli:
        p = subprocess.run([cli, "report", "--format", "json", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("%s report --format json %s: exit %d: %s"
                               % (cli, path, p.returncode, p.stderr.decode(errors="replace").strip()[-400:]))
        return json.loads(p.stdout.decode())
    if os.path.isdir(path):
        files = report_files(path)
        if not files:
            raise FileNotFoundError("no report in %s" % path)
        path = files[-1]
    with open(path) as f:
        return json.load(f)


def report_files(directory, trigger=None):
    """Report files of `directory` (cudaleak.*.TRIGGER.json, or with the
    8-hex-digit suffix a taken name gets), oldest first by (pid, sequence)."""
    names = set(glob.glob(os.path.join(directory, "cudaleak.*.json")))
    out = []
    for path in names:
        parts = os.path.basename(path).split(".")
        # ... .<sequence>.<trigger>.json or ... .<sequence>.<trigger>.<8 hex>.json
        trig = parts[-2]
        if re.fullmatch(r"[0-9a-f]{8}", trig) and len(parts) >= 4:
            trig = parts[-3]
        if trig == "timeline" or (trigger is not None and trig != trigger):
            continue
        try:
            with open(path) as f:
                head = json.load(f)
            key = (head.get("pid", 0), head.get("sequence", 0), path)
        except (OSError, ValueError):
            key = (0, 0, path)
        out.append((key, path))
    return [p for _, p in sorted(out)]


def _basename(p):
    return os.path.basename(p) if p else p


def frame_matches(frame, function=None, line=None, file=None):
    """A frame (native or Python) at `line` of `file` (basename compared)
    in `function`: the name itself, a C++ demangled `name(...)`, or a
    Python qualified `Class.name`. None matches anything."""
    if line is not None and frame.get("line") != line:
        return False
    if file is not None and _basename(frame.get("file")) != _basename(file):
        return False
    if function is not None:
        f = frame.get("function") or ""
        if not (f == function or f.startswith(function + "(") or f.endswith("." + function)
                or f.endswith("::" + function) or ("::" + function + "(") in f):
            return False
    return True


def groups_at(report, line, file=None, function=None, stack="python", key="leaks", innermost=False):
    """The groups of report[key] whose `stack` ("python", "native" or
    "any") has a frame at (function, file, line). innermost: only the
    first frame of the stack that is in `file` counts (the call site in the
    program's own code, below the allocation APIs)."""
    groups = report.get(key) or []
    if key == "peak":
        groups = (report.get("peak") or {}).get("groups", [])
    stacks = {"python": ("python_stack",), "native": ("native_stack",), "any": ("python_stack", "native_stack")}[stack]
    out = []
    for g in groups:
        for s in stacks:
            frames = g.get(s) or []
            if innermost and file is not None:
                frames = [f for f in frames if _basename(f.get("file")) == _basename(file)][:1]
            if any(frame_matches(f, function, line, file) for f in frames):
                out.append(g)
                break
    return out


def total(groups):
    """(blocks, bytes) of a list of groups."""
    return (sum(g["blocks"] for g in groups), sum(g["bytes"] for g in groups))


def block_sizes(groups):
    """Each block's size: from `examples` when they list every block, else
    the group's bytes spread evenly over its blocks."""
    sizes = []
    for g in groups:
        ex = [e["size"] for e in (g.get("examples") or [])]
        if len(ex) == g["blocks"]:
            sizes.extend(ex)
        elif g["blocks"]:
            each, rest = divmod(g["bytes"], g["blocks"])
            sizes.extend([each + (1 if i < rest else 0) for i in range(g["blocks"])])
    return sorted(sizes)


def top_frame(group, file=None):
    """(function, line) of the group's first native frame in `file` (or its
    first named frame)."""
    for f in group.get("native_stack") or []:
        if (file is not None and _basename(f.get("file")) == _basename(file)) or (file is None and f.get("function")):
            return (f.get("function"), f.get("line"))
    return (None, None)


# --- compute-sanitizer ---------------------------------------------------------

# compute-sanitizer --leak-check full (and cuda-memcheck before it) prints, per
# leaked allocation, "========= Leaked 1048576 bytes at 0x7f5e40000000"; newer
# releases group digits ("Leaked 4,092 bytes at 0x7b95b4000000"), may add
# " called NAME" (NVTX names) or " on the device heap" (device-side malloc),
# and end with "========= LEAK SUMMARY: 4092 bytes leaked in 1 allocations".
_LEAKED = re.compile(r"Leaked\s+([\d,]+)\s+bytes?\s+at\s+(0x[0-9a-fA-F]+)(.*)$")
_SUMMARY = re.compile(r"LEAK SUMMARY:\s*([\d,]+)\s+bytes?\s+leaked\s+in\s+([\d,]+)\s+allocations?")


def parse_sanitizer(text):
    """{"sizes": sorted sizes of the leaked allocations (host-API ones:
    cudaMalloc & co.), "device_heap": sizes of device-heap leaks,
    "summary": (bytes, allocations) of the LEAK SUMMARY line or None}."""
    sizes, heap, summary = [], [], None
    for line in text.splitlines():
        m = _LEAKED.search(line)
        if m:
            n = int(m.group(1).replace(",", ""))
            (heap if "device heap" in m.group(3) else sizes).append(n)
            continue
        m = _SUMMARY.search(line)
        if m:
            summary = (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")))
    return {"sizes": sorted(sizes), "device_heap": sorted(heap), "summary": summary}


# --- PyTorch's messages --------------------------------------------------------

_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": MiB, "GiB": GiB, "TiB": 1 << 40}


def parse_torch_size(text):
    """PyTorch's format_size ("117.19 GiB", "512 bytes") as (bytes,
    precision): the message rounds to 2 decimals, so the true value is
    within +-precision (half of 0.01 of the unit; 0 for bytes)."""
    m = re.match(r"\s*([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)\b", text)
    if not m:
        raise ValueError("not a PyTorch size: %r" % text[:40])
    unit = _UNITS[m.group(2)]
    value = float(m.group(1)) * unit
    return (int(round(value)), 0 if unit == 1 else unit * 0.005)


def parse_oom_request(message):
    """The request size an OutOfMemoryError message states: "Tried to
    allocate X" (caching allocator: the rounded segment it asked the driver
    for) or "Requested : X" (backend:cudaMallocAsync: the tensor's bytes).
    (bytes, precision, which)."""
    m = re.search(r"Tried to allocate\s+([\d.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB))", message)
    if m:
        return parse_torch_size(m.group(1)) + ("Tried to allocate",)
    m = re.search(r"Requested\s*:\s*([\d.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB))", message)
    if m:
        return parse_torch_size(m.group(1)) + ("Requested",)
    raise ValueError("no request size in the message: %r" % message[:120])


def parse_oom_free(message):
    """The free device memory an OutOfMemoryError message states, measured
    by PyTorch after the failed call, as cudaleak's oom snapshot is: "of
    which X is free" (caching allocator) or "Free (according to CUDA): X"
    (backend:cudaMallocAsync). (bytes, precision), or None."""
    m = re.search(r"of which\s+([\d.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB))\s+is free", message) or re.search(
        r"Free \(according to CUDA\)\s*:\s*([\d.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB))", message)
    return parse_torch_size(m.group(1)) if m else None


# --- nvcc section: gpu/leaks.cu -------------------------------------------------

NVCC_KINDS_SANITIZER = ("device", "managed", "host")


def check_nvcc(report_dir, planted_path, name="nvcc", source=LEAKS_CU):
    """cudaleak's exit report of gpu/leaks.cu against the program's own
    account of its planted leaks (planted_path: its stdout) and the
    `/* LEAK <api> */` lines of the source."""
    with open(planted_path) as f:
        planted = parse_planted(f.read())
    check("%s planted list" % name, len(planted) == 5, "%d planted leaks in %s" % (len(planted), os.path.basename(planted_path)),
          "5 (leaks.cu plants 5)")
    r = load_report(report_dir)
    matched = []
    for p in planted:
        line = marker_line(source, "LEAK " + p["api"])
        gs = groups_at(r, line, file=source, function=p["function"], stack="native", innermost=True)
        matched.extend(gs)
        blocks, nbytes = total(gs)
        apis = sorted(set(g["api"] for g in gs))
        mems = sorted(set(g["memory"] for g in gs))
        ok = (blocks, nbytes) == (1, p["bytes"]) and apis == [p["api"]] and mems == [p["memory"]]
        check("%s %s" % (name, p["api"]), ok,
              "%d block(s) %d B api %s memory %s at %s() leaks.cu line %d; planted 1 block %d B %s %s"
              % (blocks, nbytes, ",".join(apis) or "-", ",".join(mems) or "-", p["function"], line,
                 p["bytes"], p["api"], p["memory"]),
              "exact")
    ids = set(id(g) for g in matched)
    # Loaded modules (the runtime's own fatbin among them) are no leaks.
    others = [g for g in r.get("leaks", []) if id(g) not in ids and _kind(g) != "module"]
    ob, on = total(others)
    check("%s nothing else" % name, ob == 0,
          "%d other block(s), %d B%s" % (ob, on, "".join(
              "; %s %s %d B at %s:%s" % ((g["api"], g["memory"], g["bytes"]) + top_frame(g)) for g in others[:4])),
          "0 blocks besides the planted ones")
    return r


def check_sanitizer(report_dir, sanitizer_path, name="nvcc sanitizer"):
    """compute-sanitizer --leak-check full on the same program against
    cudaleak's report: the same multiset of allocation sizes on the kinds
    the sanitizer reports (the cudaMalloc family: device, managed and
    pinned host memory; not VMM handles, not device-side malloc)."""
    with open(sanitizer_path, errors="replace") as f:
        s = parse_sanitizer(f.read())
    summary = s["summary"]
    parsed = (sum(s["sizes"]) + sum(s["device_heap"]), len(s["sizes"]) + len(s["device_heap"]))
    check("%s output parsed" % name, summary is not None and summary == parsed and parsed[1] > 0,
          "%d Leaked lines, %d B; LEAK SUMMARY %s" % (parsed[1], parsed[0],
                                                     "%d B in %d" % summary if summary else "missing"),
          "Leaked lines add up to the LEAK SUMMARY line, at least 1")
    r = load_report(report_dir)
    ours = block_sizes([g for g in r.get("leaks", []) if g["memory"] in NVCC_KINDS_SANITIZER and not g.get("memory_kind")])
    check("%s same leaks" % name, ours == s["sizes"] and ours,
          "cudaleak %s, compute-sanitizer %s (device heap, not compared: %s)"
          % (ours, s["sizes"], s["device_heap"] or "none"),
          "equal multisets of sizes, memory %s" % "/".join(NVCC_KINDS_SANITIZER))


# --- python section: tests/python/stacks.py on the simulated driver ------------

# Planted by tests/python/stacks.py `all` (sizes from its source, as
# tests/python.rs states them): marker -> (blocks, bytes).
STACKS_ALL = {
    "cdll": (1, 1001), "pydll": (1, 1002), "thread": (1, 1003), "inner": (1, 1005),
    "generator": (2, 2 * 1004), "method": (1, 1006), "classmethod": (1, 1007),
    "init": (10, 10 * 1009), "line_a": (3, 3 * 1010), "line_b": (3, 3 * 1011),
}


def check_stacks(report_dir, mode, name="python", source=STACKS_PY):
    r = load_report(report_dir)
    py = r.get("python") or ""
    check("%s %s capture" % (name, mode), py.startswith("CPython 3."), "python field %r" % py, "CPython 3.x")
    if mode == "all":
        want = STACKS_ALL
    elif mode == "deadlock":
        want = {"deadlock": (1, 1008)}
    else:
        raise ValueError("unknown stacks.py mode %r" % mode)
    for marker, (blocks, nbytes) in sorted(want.items()):
        line = marker_line(source, "# LEAK " + marker)
        got = total(groups_at(r, line, file=source, stack="python"))
        check("%s %s %s" % (name, mode, marker), got == (blocks, nbytes),
              "%d block(s) %d B at stacks.py line %d; planted %d block(s) %d B" % (got + (line, blocks, nbytes)),
              "exact")
    if mode == "all":
        allb = sum(g["blocks"] for g in r.get("leaks", []) if _kind(g) != "module")
        want_b = sum(b for b, _ in want.values())
        check("%s all total" % name, allb == want_b, "%d blocks in the report; planted %d" % (allb, want_b), "exact")


# --- graphs section: gpu/graphs_resets.cu ---------------------------------------
#
# One run per mode. What each mode must leave is stated here (the program's
# own account, its `leak`/`clean`/`dump` lines, is checked against it, so a
# program that printed nothing cannot pass), and found in the report by the
# `/* LEAK name */` and `/* CLEAN name */` lines of the source.


def _leak(marker, api, blocks, nbytes, function, memory="device", kind=None, torn=0, at_least=False):
    """A planted leak: `blocks` blocks of `nbytes` in all at the marked line
    of `function`, `memory` (None: not compared) and `memory_kind` (None:
    absent), `torn` of them torn down (all of its bytes: every block of a
    torn-down group was); at_least: the report's bytes may exceed nbytes
    (a module: the sizes of its device globals as far as cudaleak knows
    them, the program's one global at least)."""
    return {"marker": marker, "api": api, "blocks": blocks, "bytes": nbytes, "function": function,
            "memory": memory, "kind": kind, "torn": torn, "at_least": at_least}


def _clean(marker, api, nbytes, launches, function):
    """An allocation freed again at the marked line: nothing reported there."""
    return {"marker": marker, "api": api, "bytes": nbytes, "launches": launches, "function": function}


def _reset_mode():
    return {"leaks": [_leak("before_reset", "cudaMalloc", 1, 64 * MiB, "reset_twice", torn=1),
                      _leak("after_reset", "cudaMalloc", 1, 64 * MiB, "reset_twice")],
            # Exact: the device never held more than one 64 MiB block.
            "totals": {"live_bytes": 64 * MiB, "torn_down_blocks": 1, "torn_down_bytes": 64 * MiB,
                       "peak_bytes": 64 * MiB}}


def _pool_mode(api):
    return {"leaks": [_leak("pool", api, 1, 3 * MiB, "pool_alloc")]}


# mode -> leaks, cleans, and the figures of totals:
#   net_blocks: allocations - frees (every graph block allocated by a
#     launch is freed again except the planted ones; also shows that the
#     free nodes and auto-free were seen), min_allocations: allocations at
#     least (each launch's block counted), min_peak: peak_bytes at least
#     (memory allocated and freed within one launch counts in the peak),
#   totals: exact values of totals fields,
#   dump: (marker, blocks) of the one live dump (trigger api),
#   modules: the module-kind groups all at the marked load line.
GRAPH_MODES = {
    "graph_leak": {"leaks": [_leak("graph_node", "cudaGraphAddMemAllocNode", 1, 8 * MiB, "graph_leak", kind="graph")],
                   "net_blocks": 1, "min_allocations": 1, "min_peak": 8 * MiB},
    "graph_paired": {"cleans": [_clean("graph_paired", "cudaGraphAddMemAllocNode", 8 * MiB, 3, "graph_paired")],
                     "net_blocks": 0, "min_allocations": 3, "min_peak": 8 * MiB},
    "capture": {"leaks": [_leak("capture", "cudaMallocAsync", 1, 4 * MiB, "captured", kind="graph")],
                "cleans": [_clean("capture_paired", "cudaMallocAsync", 6 * MiB, 1, "captured")],
                "net_blocks": 1, "min_allocations": 2, "min_peak": 10 * MiB},
    "auto_free": {"leaks": [_leak("auto_free", "cudaGraphAddMemAllocNode", 1, 2 * MiB, "auto_free", kind="graph")],
                  "net_blocks": 1, "min_allocations": 3, "min_peak": 2 * MiB},
    "trim": {"cleans": [_clean("trim", "cudaGraphAddMemAllocNode", 16 * MiB, 1, "trim_graph_pool")],
             "net_blocks": 0, "min_allocations": 1, "min_peak": 16 * MiB},
    "reset_peak": _reset_mode(),
    "thread_exit": _reset_mode(),
    "pool": _pool_mode("cudaMallocFromPoolAsync"),
    "pool_ptsz": _pool_mode("cudaMallocFromPoolAsync_ptsz"),
    "module": {"leaks": [_leak("module", "cuModuleLoad", 1, 1 * MiB, "module_load", memory=None, kind="module",
                               at_least=True)], "modules": True},
    "module_loop": {"leaks": [_leak("module", "cuModuleLoad", 5, 5 * MiB, "module_load", memory=None, kind="module",
                                    at_least=True)], "modules": True, "dump": ("module", 3, 3 * MiB)},
}


def parse_graphs_account(text):
    """gpu/graphs_resets.cu's own account: {"leaks": [(name, api, blocks,
    bytes, function)], "cleans": [(name, api, bytes, launches, function)],
    "dumps": [(name, blocks, bytes)], "done": [mode]} in the order printed."""
    out = {"leaks": [], "cleans": [], "dumps": [], "done": []}
    for line in text.splitlines():
        p = line.split()
        try:
            if len(p) == 6 and p[0] == "leak":
                out["leaks"].append((p[1], p[2], int(p[3]), int(p[4]), p[5]))
            elif len(p) == 6 and p[0] == "clean":
                out["cleans"].append((p[1], p[2], int(p[3]), int(p[4]), p[5]))
            elif len(p) == 4 and p[0] == "dump":
                out["dumps"].append((p[1], int(p[2]), int(p[3])))
            elif len(p) == 2 and p[0] == "done":
                out["done"].append(p[1])
        except ValueError:
            continue
    return out


def _fmt_account(a):
    lines = ["%s %s" % (word[:-1], " ".join(map(str, x))) for word in ("leaks", "cleans", "dumps") for x in a[word]]
    lines += ["done " + x for x in a["done"]]
    return "; ".join(lines) or "nothing"


def _kind(g):
    return g.get("memory_kind") or None


def _fmt_groups(gs):
    return "; ".join("%s %s/%s %d block(s) %d B at %s:%s"
                     % ((g["api"], g["memory"], _kind(g) or "-", g["blocks"], g["bytes"]) + top_frame(g, GRAPHS_CU))
                     for g in gs[:4]) or "none"


def check_graphs(report_dir, mode, account_path, name=None, source=GRAPHS_CU, under_path=None):
    """cudaleak's reports of one run of gpu/graphs_resets.cu MODE against
    GRAPH_MODES[mode], the marked lines of the source and the program's own
    account (account_path: the stdout of a run without the library;
    under_path: the stdout of the run under it, which must say the same)."""
    name = name or "graphs %s" % mode
    spec = GRAPH_MODES[mode]
    leaks, cleans = spec.get("leaks", []), spec.get("cleans", [])

    # The program's own account, against what the mode plants.
    with open(account_path) as f:
        acc = parse_graphs_account(f.read())
    want = {"leaks": [(l["marker"], l["api"], l["blocks"], l["bytes"], l["function"]) for l in leaks],
            "cleans": [(c["marker"], c["api"], c["bytes"], c["launches"], c["function"]) for c in cleans],
            "dumps": [spec["dump"]] if "dump" in spec else [], "done": [mode]}
    check("%s account" % name, acc == want,
          "program printed: %s%s"
          % (_fmt_account(acc), "" if acc == want else "; GRAPH_MODES plants: " + _fmt_account(want)),
          "exactly what GRAPH_MODES states for %s" % mode)
    if under_path:
        with open(under_path) as f:
            under = parse_graphs_account(f.read())
        check("%s account under cudaleak" % name, under == acc,
              "under the library: %s" % ("the same" if under == acc else _fmt_account(under)),
              "the same lines as without it")

    r = load_report(report_dir)
    check("%s exit report" % name, r.get("trigger") == "exit",
          "trigger %s, sequence %s" % (r.get("trigger"), r.get("sequence")), "the exit report")

    def at(rep, marker, function):
        line = marker_line(source, marker)
        return line, groups_at(rep, line, file=source, function=function, stack="native", innermost=True)

    matched = []
    for l in leaks:
        line, gs = at(r, "LEAK " + l["marker"], l["function"])
        matched.extend(gs)
        blocks, nbytes = total(gs)
        apis = sorted(set(g["api"] for g in gs))
        mems = sorted(set(str(g["memory"]) for g in gs))
        kinds = sorted(set(_kind(g) or "none" for g in gs))
        torn_b = sum(g.get("torn_down_blocks") or 0 for g in gs)
        torn_n = sum(g.get("torn_down_bytes") or 0 for g in gs)
        torn_want = (l["torn"], l["bytes"] * l["torn"] // l["blocks"])
        ok = (blocks == l["blocks"] and (nbytes >= l["bytes"] if l["at_least"] else nbytes == l["bytes"])
              and apis == [l["api"]] and kinds == [l["kind"] or "none"] and (torn_b, torn_n) == torn_want
              and (l["memory"] is None or mems == [l["memory"]]))
        check("%s %s" % (name, l["marker"]), ok,
              "%d block(s) %d B api %s memory %s kind %s torn down %d block(s) %d B at %s() line %d"
              % (blocks, nbytes, ",".join(apis) or "-", ",".join(mems) or "-", ",".join(kinds) or "-",
                 torn_b, torn_n, l["function"], line),
              "%d block(s), %s%d B, api %s, memory %s, kind %s, torn down %d block(s) %d B"
              % (l["blocks"], ">= " if l["at_least"] else "", l["bytes"], l["api"], l["memory"] or "any",
                 l["kind"] or "none", torn_want[0], torn_want[1]))
    for c in cleans:
        line, gs = at(r, "CLEAN " + c["marker"], c["function"])
        blocks, nbytes = total(gs)
        check("%s %s freed" % (name, c["marker"]), blocks == 0,
              "%d block(s) %d B left at %s() line %d (%d B x %d launch(es) allocated and freed)"
              % (blocks, nbytes, c["function"], line, c["bytes"], c["launches"]), "0 blocks")
        matched.extend(gs)

    # Anything else left is a false leak. Modules are left to the module
    # modes' own check (below), so that one cause fails one check.
    ids = set(id(g) for g in matched)
    others = [g for g in r.get("leaks", []) if id(g) not in ids and _kind(g) != "module"]
    check("%s nothing else" % name, total(others)[0] == 0,
          "%d other block(s), %d B: %s" % (total(others) + (_fmt_groups(others),)), "0 blocks besides the planted ones")
    if spec.get("modules"):
        stray = [g for g in r.get("leaks", []) if id(g) not in ids and _kind(g) == "module"]
        check("%s modules only at the load" % name, not stray,
              "%d module group(s) elsewhere: %s" % (len(stray), _fmt_groups(stray)),
              "every module-kind group at the marked cuModuleLoad line (none of the runtime's own)")

    # Loaded modules (the runtime's own fatbins, should they be reported)
    # are no part of what a mode plants. Their blocks count in allocations
    # and frees, so their share is added there; they count in none of
    # live_bytes, the peak or the torn-down totals (no leaks, estimated
    # bytes), so nothing is added to those.
    t = r.get("totals") or {}
    mods = [g for g in r.get("leaks", []) if _kind(g) == "module" and not spec.get("modules")]
    m_blocks = sum(g["blocks"] for g in mods)
    m_torn_n = sum(g.get("torn_down_bytes") or 0 for g in mods)
    m_live_n = sum(g["bytes"] for g in mods) - m_torn_n
    m_note = (" (with %d module group(s) not planted: %d block(s), %d B)" % (len(mods), m_blocks, m_live_n + m_torn_n)
              if mods else "")
    if "net_blocks" in spec:
        a, fr = t.get("allocations"), t.get("frees")
        net = spec["net_blocks"] + m_blocks
        ok = a is not None and fr is not None and a - fr == net and a >= spec["min_allocations"]
        check("%s allocations and frees" % name, ok, "allocations %s, frees %s%s" % (a, fr, m_note),
              "allocations - frees == %d, allocations >= %d" % (net, spec["min_allocations"]))
    if "min_peak" in spec:
        pk = t.get("peak_bytes")
        check("%s peak" % name, pk is not None and pk >= spec["min_peak"], "peak_bytes %s" % fmt_bytes(pk),
              ">= %s (the largest launch's graph memory)" % fmt_bytes(spec["min_peak"]))
    if "totals" in spec:
        want_t = dict(sorted(spec["totals"].items()))
        got = dict((k, t.get(k)) for k in sorted(spec["totals"]))
        check("%s totals" % name, got == want_t, " ".join("%s %s" % kv for kv in sorted(got.items())) + m_note,
              "exactly " + " ".join("%s %s" % kv for kv in sorted(want_t.items())))

    if "dump" in spec:
        marker, dblocks, dbytes = spec["dump"]
        l = [x for x in leaks if x["marker"] == marker][0]
        files = report_files(report_dir, "api")
        figure = "%d api-trigger report(s)" % len(files)
        ok = len(files) == 1
        if ok:
            d = load_report(files[0])
            line, gs = at(d, "LEAK " + marker, l["function"])
            blocks, nbytes = total(gs)
            kinds = sorted(set(_kind(g) or "none" for g in gs))
            ok = blocks == dblocks and nbytes >= dbytes and kinds == [l["kind"] or "none"]
            figure += ": %d block(s) %d B kind %s at line %d" % (blocks, nbytes, ",".join(kinds) or "-", line)
        check("%s live dump" % name, ok, figure,
              "one live dump with %d block(s), >= %d B, kind %s at the marked line" % (dblocks, dbytes, l["kind"]))
    return r


def main(argv):
    if len(argv) >= 3 and argv[0] == "nvcc":
        rest = argv[1:]
        label = "nvcc"
        sanitizer = None
        if "--name" in rest:
            i = rest.index("--name")
            label = rest[i + 1]
            del rest[i:i + 2]
        if "--sanitizer" in rest:
            i = rest.index("--sanitizer")
            sanitizer = rest[i + 1]
            del rest[i:i + 2]
        report_dir, planted = rest[0], rest[1]
        guarded(label)(check_nvcc)(report_dir, planted, label)
        if sanitizer:
            guarded("%s sanitizer" % label)(check_sanitizer)(report_dir, sanitizer, "%s sanitizer" % label)
    elif len(argv) == 3 and argv[0] == "stacks":
        guarded("python %s" % argv[2])(check_stacks)(argv[1], argv[2])
    elif len(argv) >= 4 and argv[0] == "graphs":
        rest = argv[1:]
        opts = {}
        for flag in ("--under", "--name"):
            if flag in rest:
                i = rest.index(flag)
                opts[flag] = rest[i + 1]
                del rest[i:i + 2]
        if len(rest) != 3 or rest[1] not in GRAPH_MODES:
            sys.stderr.write(__doc__)
            sys.exit(2)
        report_dir, mode, account = rest
        label = opts.get("--name") or "graphs %s" % mode
        guarded(label)(check_graphs)(report_dir, mode, account, label, under_path=opts.get("--under"))
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)
    finish()


if __name__ == "__main__":
    main(sys.argv[1:])
