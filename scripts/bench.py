#!/usr/bin/env python3
"""cudaleak's benchmarks: one command, one table (docs/performance.md).

    cargo build --release && python3 scripts/bench.py [--runs 5] [--pairs 1000000]

Every figure is the median of --runs runs. Configurations that are
compared run side by side, round-robin within each round, so that machine
noise hits them alike; ratios are computed from the medians of one run of
this script. Needs cc, heaptrack (apt-get install heaptrack) and memray
(python3 -m pip install memray); a missing one is reported and skipped.

All programs run on the simulated driver with SIMCUDA_BACKING=malloc: each
cudaMalloc is one malloc, so heaptrack and memray (which track malloc)
record exactly one allocation per pair, as cudaleak does.

Real shapes (bench/step.c, bench/py_step.py; docs/decisions.md, "The keep
rule: a mechanism stays only if it saves 5 % on a real shape") run only when named,
each library given by name, the first the reference of the others:

    python3 scripts/bench.py --only shapes|train|train-py|xfree|ranks|async|cache \
        [--variant base=PATH --variant no-sole=PATH ...] [--rounds 7] [--no-instructions] [--no-tools] \
        [--cache-sim]

--cache-sim adds the misses of callgrind's simulated caches per pair to
the instructions: where the program's own code fills the instruction
cache (the Python shape), they weigh more than the instructions.
"""

import argparse
import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import re
import tempfile
import time
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target", "release", "libcudaleak.so")
CLI = os.path.join(ROOT, "target", "release", "cudaleak")
# A --variant setting that is not the program's: each run of that variant
# is watched by `cudaleak top PID` (its text mode, output discarded), so
# that the library publishes its live view once a second throughout.
VIEWED = "BENCH_VIEWED"
CPU_TIME = False  # --cpu-time


def sh(cmd, env=None, cwd=None):
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr))
    return out.stdout


def built_simulator():
    """The directory where `cargo build --release` (build.rs) left the
    simulated driver and runtime: the newest, when builds left several."""
    found = glob.glob(os.path.join(ROOT, "target", "release", "build", "cudaleak-cli-*", "out", "sim",
                                   "libcudart.so.12"))
    if not found:
        sys.exit("bench.py: no simulated driver built: run `cargo build --release` first")
    return os.path.dirname(max(found, key=os.path.getmtime))


def build(work):
    """The simulated driver and runtime (build.rs's, copied), a variant of
    the driver, and the benchmark programs."""
    inc = "-I" + os.path.join(ROOT, "sim", "include")
    sim = os.path.join(ROOT, "sim")
    # The runtime's run path is $ORIGIN: beside the copied driver.
    for name in ("libcuda.so.1", "libcudart.so.12"):
        shutil.copy2(os.path.join(built_simulator(), name), os.path.join(work, name))
    # The same driver without cuCtxGetCurrent/cuCtxGetDevice, as an old or
    # partial driver may be: the library must not pay a failed lookup per
    # call on it (docs/decisions.md, "A driver without context queries pays
    # no failed lookup per call").
    os.makedirs(os.path.join(work, "no-ctx-queries"), exist_ok=True)
    sh(["cc", "-O2", "-g", "-fPIC", "-shared", inc, "-DSIMCUDA_NO_CTX_QUERIES", "-Wl,-soname,libcuda.so.1", "-o",
        os.path.join(work, "no-ctx-queries", "libcuda.so.1"), os.path.join(sim, "driver.c"), "-lpthread"])
    sh(["cc", "-O2", "-g", inc, "-o", os.path.join(work, "pairs"), os.path.join(ROOT, "bench", "pairs.c"),
        os.path.join(work, "libcudart.so.12"), os.path.join(work, "libcuda.so.1"), "-lpthread", "-ldl",
        "-Wl,-rpath," + work])
    sh(["cc", "-O2", "-g", inc, "-o", os.path.join(work, "step"), os.path.join(ROOT, "bench", "step.c"),
        os.path.join(work, "libcudart.so.12"), os.path.join(work, "libcuda.so.1"), "-lpthread", "-ldl",
        "-Wl,-rpath," + work])


def base_env(work, reports):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("CUDALEAK_") or k == "LD_PRELOAD":
            del env[k]
    if CPU_TIME:
        env["BENCH_CPU_TIME"] = "1"
    env.update(
        # One string hash for every run: with a random one, the interpreter's
        # own instructions for the same Python program move by tens a pair
        # from run to run (its dict lookups), more than a change measured.
        PYTHONHASHSEED="0",
        SIMCUDA_BACKING="malloc",
        SIMCUDA_RUNTIME=os.path.join(work, "libcudart.so.12"),
        LD_LIBRARY_PATH=work,
        CUDALEAK_DIR=reports,
        CUDALEAK_SUMMARY="0",
    )
    return env


def configs_native(work, reports, have_heaptrack):
    env = base_env(work, reports)
    with_lib = dict(env, LD_PRELOAD=LIB)
    out = {
        "no library": (None, env),
        "cudaleak, stacks": (None, with_lib),
        "cudaleak, stacks off": (None, dict(with_lib, CUDALEAK_STACK_DEPTH="0")),
    }
    if have_heaptrack:
        out["heaptrack"] = (["heaptrack", "-o", os.path.join(reports, "heaptrack")], env)
    return out


def measure(prefix, env, argv):
    """Runs argv (under prefix, e.g. heaptrack) and returns the number the
    benchmark program printed last."""
    out = sh((prefix or []) + argv, env=env)
    nums = [l for l in out.splitlines() if l.strip() and l.strip().replace(".", "", 1).isdigit()]
    return float(nums[-1])


def side_by_side(configs, argv, runs):
    samples = {name: [] for name in configs}
    for _ in range(runs):
        for name, (prefix, env) in configs.items():
            samples[name].append(measure(prefix, env, argv))
    return {name: statistics.median(v) for name, v in samples.items()}


def have(tool):
    return shutil.which(tool) is not None


def have_memray():
    return subprocess.run([sys.executable, "-c", "import memray"], capture_output=True).returncode == 0


def row(label, value, unit, note=""):
    print("| %-58s | %12s | %-6s | %s" % (label, value, unit, note))


def compare_baseline(work, reports, pairs, args):
    """The same pair under the baseline library and this one, round-robin:
    stacks off (the bookkeeping alone, where a few ns show most) and on,
    and with the sampled timeline on (CUDALEAK_TIMELINE=1, its sampler
    reading the counters every 100 ms)."""
    env = base_env(work, reports)
    for label, extra in (("stacks off", {"CUDALEAK_STACK_DEPTH": "0"}), ("20 frames", {})):
        configs = {
            "baseline": (None, dict(env, LD_PRELOAD=os.path.abspath(args.baseline_lib), **extra)),
            "this build": (None, dict(env, LD_PRELOAD=LIB, **extra)),
            "this build, timeline on": (None, dict(env, LD_PRELOAD=LIB, CUDALEAK_TIMELINE="1", **extra)),
        }
        med = side_by_side(configs, [pairs, "runtime", str(args.pairs), "20"], args.runs)
        base = med["baseline"]
        for name, v in med.items():
            row("alloc/free pair, %s: %s" % (label, name), "%.1f" % v, "ns",
                "" if name == "baseline" else "%+.1f ns vs baseline (goal <= +5: the peak's counters)" % (v - base))


def old_driver(work, reports, pairs, args):
    """Per-pair overhead on a driver without cuCtxGetCurrent/cuCtxGetDevice
    against the full driver's: goal within 1.5x."""
    full = base_env(work, reports)
    old = dict(full, LD_LIBRARY_PATH=os.path.join(work, "no-ctx-queries") + ":" + work)
    med = side_by_side({
        "full driver, no library": (None, full),
        "full driver, cudaleak": (None, dict(full, LD_PRELOAD=LIB)),
        "driver without context queries, no library": (None, old),
        "driver without context queries, cudaleak": (None, dict(old, LD_PRELOAD=LIB)),
    }, [pairs, "runtime", str(args.pairs), "20"], args.runs)
    costs = {}
    for driver in ("full driver", "driver without context queries"):
        base = med[driver + ", no library"]
        costs[driver] = med[driver + ", cudaleak"] - base
        row("alloc/free pair, 20 frames, %s: no library" % driver, "%.0f" % base, "ns")
        row("alloc/free pair, 20 frames, %s: cudaleak" % driver, "%.0f" % med[driver + ", cudaleak"], "ns",
            "+%.0f ns" % costs[driver])
    row("overhead ratio, driver without context queries / full driver",
        "%.2f" % (costs["driver without context queries"] / costs["full driver"]), "", "goal <= 1.5")


def oom_delay(work, reports, pairs, args):
    """How long a failing cudaMalloc keeps its thread when it takes the
    snapshot of an out-of-memory report, by live blocks (over
    1024 stacks); with CUDALEAK_OOM_REPORTS=0 (no snapshot) and without
    the library for comparison."""
    env = base_env(work, reports)
    configs = {
        "no library": (None, env),
        "cudaleak": (None, dict(env, LD_PRELOAD=LIB)),
        "cudaleak, CUDALEAK_OOM_REPORTS=0": (None, dict(env, LD_PRELOAD=LIB, CUDALEAK_OOM_REPORTS="0")),
    }
    for live in (10_000, 1_000_000):
        med = side_by_side(configs, [pairs, "oom", str(live), "20"], args.runs)
        for name, v in med.items():
            row("failing cudaMalloc, %d live blocks: %s" % (live, name), "%.0f" % v, "us",
                "the snapshot" if name == "cudaleak" else "")


# ---- instructions per pair, fresh stacks, threads, exit reports ----------
# Each row names its goal: docs/decisions.md, "Overhead goals against
# heaptrack and memray".

def collected_instructions(env, argv):
    """Instructions the program (and the library in it) executed, counted
    by callgrind: stable on a shared, noisy machine where nanoseconds are
    not."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), out.returncode, out.stderr[-2000:]))
    m = re.findall(r"Collected : (\d+)", out.stderr)
    if not m:
        raise RuntimeError("no callgrind total in:\n" + out.stderr[-2000:])
    return int(m[-1])


def per_pair_instructions(env, argv_of, n1, n2):
    """Instructions per pair, by differencing two run lengths: start-up,
    exit and the exit report cancel out."""
    return (collected_instructions(env, argv_of(n2)) - collected_instructions(env, argv_of(n1))) / (n2 - n1)


def instructions(work, reports, pairs, args):
    """Instructions per alloc/free pair that the library adds, per case,
    and memray's for the Python pair in the same run."""
    if not have("valgrind"):
        print("valgrind not found (apt-get install valgrind): instruction counts skipped", file=sys.stderr)
        return
    env = base_env(work, reports)
    on = dict(env, LD_PRELOAD=LIB)
    n1, n2 = 2000, 6000
    cases = [
        ("C caller, one stack, 20 frames", lambda n: [pairs, "runtime", str(n), "20"], {}),
        ("C caller, stacks off", lambda n: [pairs, "runtime", str(n), "20"], {"CUDALEAK_STACK_DEPTH": "0"}),
        ("C caller, driver API, 20 frames", lambda n: [pairs, "driver", str(n), "20"], {}),
        ("C caller, 1024 stacks in turn", lambda n: [pairs, "mixed", str(n), "20"], {}),
        ("C caller, a fresh stack every pair", lambda n: [pairs, "fresh", str(n), "20"], {}),
    ]
    for label, argv_of, extra in cases:
        base = per_pair_instructions(env, argv_of, n1, n2)
        lib = per_pair_instructions(dict(on, **extra), argv_of, n1, n2)
        row("instructions per pair, %s: cudaleak" % label, "%.0f" % (lib - base), "instr",
            "program alone: %.0f" % base)
    script = os.path.join(ROOT, "bench", "py_pairs.py")
    py = lambda n: [sys.executable, script, str(n), "20"]  # noqa: E731
    base = per_pair_instructions(env, py, n1, n2)
    lib = per_pair_instructions(on, py, n1, n2)
    row("instructions per pair, Python (ctypes CDLL), 20 frames: cudaleak", "%.0f" % (lib - base), "instr",
        "program alone: %.0f" % base)
    if have_memray():
        out = os.path.join(reports, "memray-instr.bin")
        mem = lambda n: [sys.executable, "-m", "memray", "run", "--native", "-q", "-f", "-o", out,  # noqa: E731
                         script, str(n), "20"]
        m = per_pair_instructions(env, mem, n1, n2)
        row("instructions per pair, Python (ctypes CDLL), 20 frames: memray --native", "%.0f" % (m - base),
            "instr", "ratio cudaleak / memray %.2f (goal <= 0.20)" % ((lib - base) / (m - base)))


def with_heaptrack(configs, reports, env):
    """Adds heaptrack, run the same way, to a side-by-side set (every
    benchmark against heaptrack in the same run)."""
    if have("heaptrack"):
        configs["heaptrack"] = (["heaptrack", "-o", os.path.join(reports, "heaptrack")], env)
    return configs


def fresh_stacks(work, reports, pairs, args):
    """A call stack never seen before on every pair: the depot grows by one
    stack per pair. Goal: the cost at 10M within 1.5x the cost at 100k."""
    env = base_env(work, reports)
    configs = with_heaptrack({"no library": (None, env), "cudaleak": (None, dict(env, LD_PRELOAD=LIB))}, reports, env)
    cost, theirs = {}, {}
    for n in (100_000, args.fresh_pairs):
        med = side_by_side(configs, [pairs, "fresh", str(n), "20"], max(1, args.runs // 2))
        cost[n] = med["cudaleak"] - med["no library"]
        row("fresh stack every pair, %d pairs: cudaleak" % n, "%.0f" % med["cudaleak"], "ns",
            "+%.0f ns (program alone %.0f)" % (cost[n], med["no library"]))
        if "heaptrack" in med:
            theirs[n] = med["heaptrack"] - med["no library"]
            row("fresh stack every pair, %d pairs: heaptrack" % n, "%.0f" % med["heaptrack"], "ns",
                "+%.0f ns; ratio cudaleak / heaptrack %.2f" % (theirs[n], cost[n] / theirs[n]))
    row("fresh stacks: cost at %d / cost at 100k" % args.fresh_pairs,
        "%.2f" % (cost[args.fresh_pairs] / cost[100_000]), "", "goal <= 1.5")
    if theirs:
        row("fresh stacks, heaptrack: cost at %d / cost at 100k" % args.fresh_pairs,
            "%.2f" % (theirs[args.fresh_pairs] / theirs[100_000]), "", "")


def threads_cpu(work, reports, pairs, args):
    """CPU time per pair per thread with 1, 2 and 8 allocating threads
    (the process's CPU clock, so waiting for a core is not counted).
    Goal: the library's cost at 2 and 8 threads within 1.2x its cost at 1.
    The simulation runs with SIMCUDA_BACKING=threaded: no lock, table or
    counter of its own shared by the threads. With its default backing its
    global mutex dominates (the program alone went from 42 to 460 ns per
    pair at 2 threads), and the library's share came out negative.
    Twice: with nothing else live (the peak is one block per thread, so
    every allocation may be a new peak), and with 256 MiB held by the main
    thread, as a program holds its memory (live_bytes.rs: each thread's
    share of the live count then stays its own). A third time with 256 MiB
    held after 64 short-lived threads each made one pair and exited, as a
    data loader's workers do (live_bytes.rs, case 3: the quota follows the
    threads that count now)."""
    for held, exited in ((0, 0), (256 << 20, 0), (256 << 20, 64)):
        env = dict(base_env(work, reports), BENCH_CPU_TIME="process", SIMCUDA_BACKING="threaded",
                   BENCH_HELD_BYTES=str(held), BENCH_EXITED_THREADS=str(exited))
        configs = with_heaptrack({"no library": (None, env), "cudaleak": (None, dict(env, LD_PRELOAD=LIB))},
                                 reports, env)
        one, their_one = None, None
        what = "256 MiB held" if held else "nothing held"
        if exited:
            what += ", after %d exited threads" % exited
        for t in (1, 2, 8):
            n = max(10_000, args.pairs // (2 * t))
            med = side_by_side(configs, [pairs, "runtime", str(n), "20", str(t)], args.runs)
            cost = med["cudaleak"] - med["no library"]
            one = cost if t == 1 else one
            row("CPU per pair, %d thread(s), %s: cudaleak" % (t, what), "%.0f" % med["cudaleak"], "ns",
                "+%.0f ns; %.2fx the 1-thread cost (goal <= 1.2)" % (cost, cost / one))
            if "heaptrack" in med:
                theirs = med["heaptrack"] - med["no library"]
                their_one = theirs if t == 1 else their_one
                row("CPU per pair, %d thread(s), %s: heaptrack" % (t, what), "%.0f" % med["heaptrack"], "ns",
                    "+%.0f ns; %.2fx its 1-thread cost" % (theirs, theirs / their_one))
    # One thread while the library dumps every 50 ms on its own thread: a
    # dump pauses the thread that allocates alone rather than ending its
    # lock-free mode (sole.rs, case 8). The thread's own CPU time, so the
    # dump thread's work is not counted.
    env = dict(base_env(work, reports), BENCH_CPU_TIME="1", SIMCUDA_BACKING="threaded")
    configs = {
        "no library": (None, env),
        "cudaleak": (None, dict(env, LD_PRELOAD=LIB)),
        "cudaleak, interval dumps": (None, dict(env, LD_PRELOAD=LIB, CUDALEAK_INTERVAL="0.05")),
    }
    med = side_by_side(configs, [pairs, "runtime", str(max(10_000, args.pairs)), "20", "1"], args.runs)
    for name in ("cudaleak", "cudaleak, interval dumps"):
        row("thread CPU per pair, 1 thread: %s" % name, "%.0f" % med[name], "ns",
            "+%.0f ns" % (med[name] - med["no library"]))
    # What a live dump costs the thread that allocates alone, in its
    # longest pair: 1M blocks live, SIGUSR1 every 250 ms for 3 s. A dump
    # pauses that thread for 16,384 blocks' copy at a time (sole.rs, case
    # 8); paused for the whole copy, it waited 13 ms.
    held = 1_000_000
    env = dict(base_env(work, reports), SIMCUDA_BACKING="threaded")
    configs = {"no library": (None, env), "cudaleak": (None, dict(env, LD_PRELOAD=LIB))}
    med = side_by_side(configs, [pairs, "stall", str(held), "20"], min(args.runs, 3))
    row("longest pair, 1 thread, %d blocks live, a dump every 250 ms: cudaleak" % held, "%.2f" % med["cudaleak"],
        "ms", "no library: %.2f ms" % med["no library"])


def exit_time(env, argv):
    """Milliseconds from the end of main (the program prints its
    CLOCK_REALTIME) until the process is gone: the exit report's time."""
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    gone = time.time_ns()
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(argv), out.returncode, out.stderr[-2000:]))
    # The program's last line; heaptrack prints its own lines after it.
    ends = [w for w in out.stdout.split() if w.isdigit() and len(w) >= 18]
    return (gone - float(ends[-1])) / 1e6


def exit_reports(work, reports, pairs, args):
    """The exit report's time: one leak (goal <= 10 ms), and 1M leaks
    from 1M distinct stacks with the timeline on and off (goal <= 3 s)."""
    env = base_env(work, reports)
    cases = [
        ("1 leak, no library", env, 1),
        ("1 leak, cudaleak", dict(env, LD_PRELOAD=LIB), 1),
        ("%d leaks, distinct stacks, cudaleak" % args.exit_leaks, dict(env, LD_PRELOAD=LIB), args.exit_leaks),
        ("%d leaks, distinct stacks, cudaleak, timeline on" % args.exit_leaks,
         dict(env, LD_PRELOAD=LIB, CUDALEAK_TIMELINE="1"), args.exit_leaks),
    ]
    for label, e, n in cases:
        runs = args.runs if n == 1 else max(1, args.runs // 2)
        t = statistics.median(exit_time(e, [pairs, "leaks", str(n), "20"]) for _ in range(runs))
        row("exit report, %s" % label, "%.1f" % t, "ms", "goal <= 10" if n == 1 else "goal <= 3000")
    # heaptrack writes no report at exit (heaptrack_print reads its data
    # afterwards); its exit is the end of its recording: what it still
    # writes once main returns.
    if have("heaptrack"):
        prefix = ["heaptrack", "-o", os.path.join(reports, "heaptrack")]
        for n in (1, args.exit_leaks):
            runs = args.runs if n == 1 else max(1, args.runs // 2)
            t = statistics.median(exit_time(env, prefix + [pairs, "leaks", str(n), "20"]) for _ in range(runs))
            row("end of main to exit, %d leak(s)%s: heaptrack" % (n, ", distinct stacks" if n > 1 else ""),
                "%.1f" % t, "ms", "no report at exit; its data is read afterwards")


def trace_ring(work, reports, pairs, args):
    """The allocation-event ring (CUDALEAK_TRACE): what a pair
    (two events) costs with the ring off (the default: one load and an
    untaken branch per hook) and on, in ns and, under callgrind, in
    instructions (30,000 - 10,000 pairs, divided by 20,000)."""
    env = base_env(work, reports)
    configs = {
        "no library": (None, env),
        "cudaleak, CUDALEAK_TRACE=0 (off)": (None, dict(env, LD_PRELOAD=LIB)),
        "cudaleak, CUDALEAK_TRACE=4096": (None, dict(env, LD_PRELOAD=LIB, CUDALEAK_TRACE="4096")),
    }
    for threads in ("1", "2"):
        med = side_by_side(configs, [pairs, "runtime", str(args.pairs), "20", threads], args.runs)
        off = med["cudaleak, CUDALEAK_TRACE=0 (off)"]
        for name, v in med.items():
            row("alloc/free pair, 20 frames, %s thread(s): %s" % (threads, name), "%.1f" % v, "ns",
                "+%.1f ns per event" % ((v - off) / 2) if "4096" in name else "")
    if not have("valgrind"):
        print("valgrind not found (apt-get install valgrind): instruction counts skipped", file=sys.stderr)
        return
    counts = {}
    for name, (_, e) in configs.items():
        n = [collected_instructions(e, [pairs, "runtime", str(k), "20"]) for k in (10_000, 30_000)]
        counts[name] = (n[1] - n[0]) / 20_000
    off = counts["cudaleak, CUDALEAK_TRACE=0 (off)"]
    for name, v in counts.items():
        row("instructions per pair, 20 frames: %s" % name, "%.0f" % v, "",
            "+%.0f per event" % ((v - off) / 2) if "4096" in name else "")


def ratios(work, reports, pairs, args):
    """The pair's cost against heaptrack (C callers: one stack at 20 and 60
    frames, 1024 stacks in turn) and memray --native (a Python caller),
    side by side: the ratios of the overhead goals."""
    heaptrack, memray = have("heaptrack"), have_memray()
    for depth in (20, 60):
        med = side_by_side(configs_native(work, reports, heaptrack),
                           [pairs, "runtime", str(args.pairs), str(depth)], args.runs)
        base = med["no library"]
        for name, v in med.items():
            row("alloc/free pair, %d frames deep: %s" % (depth, name), "%.0f" % v, "ns",
                "" if name == "no library" else "+%.0f ns" % (v - base))
        if heaptrack:
            ratio = (med["cudaleak, stacks"] - base) / (med["heaptrack"] - base)
            row("overhead ratio cudaleak / heaptrack, %d frames" % depth, "%.2f" % ratio, "",
                "goal <= 0.12 (one stack)")

    # The same pair from 1024 different call stacks in turn (30 frames):
    # no two consecutive captures alike, so no replay (capture/unwind/replay.rs).
    med = side_by_side(configs_native(work, reports, heaptrack), [pairs, "mixed", str(args.pairs), "20"], args.runs)
    base = med["no library"]
    for name, v in med.items():
        row("alloc/free pair, 1024 stacks in turn, 30 frames: %s" % name, "%.0f" % v, "ns",
            "" if name == "no library" else "+%.0f ns" % (v - base))
    if heaptrack:
        ratio = (med["cudaleak, stacks"] - base) / (med["heaptrack"] - base)
        row("overhead ratio cudaleak / heaptrack, 1024 stacks in turn", "%.2f" % ratio, "", "goal <= 0.20")

    # Python caller, 20 frames deep, through ctypes.
    env = base_env(work, reports)
    script = os.path.join(ROOT, "bench", "py_pairs.py")
    argv = [sys.executable, script, str(args.py_pairs), "20"]
    py = {
        "no library": (None, env),
        "cudaleak, native + Python stacks": (None, dict(env, LD_PRELOAD=LIB)),
        "cudaleak, native stacks only": (None, dict(env, LD_PRELOAD=LIB, CUDALEAK_PYTHON="0")),
    }
    if memray:
        py["memray --native"] = ([sys.executable, "-m", "memray", "run", "--native", "-q", "-f",
                                  "-o", os.path.join(reports, "memray.bin")], env)
    samples = {k: [] for k in py}
    for _ in range(args.runs):
        for name, (prefix, e) in py.items():
            cmd = (prefix + [script, str(args.py_pairs), "20"]) if prefix else argv
            samples[name].append(measure(None, e, cmd))
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["no library"]
    for name, v in med.items():
        row("Python, 20 frames deep (ctypes): %s" % name, "%.0f" % v, "ns",
            "" if name == "no library" else "+%.0f ns" % (v - base))
    py_cost = med["cudaleak, native + Python stacks"] - med["cudaleak, native stacks only"]
    row("Python stack capture, 20 frames (with - without)", "%.0f" % py_cost, "ns", "goal <= 500")
    if memray:
        ratio = (med["cudaleak, native + Python stacks"] - base) / (med["memray --native"] - base)
        row("overhead ratio cudaleak / memray --native", "%.2f" % ratio, "", "goal <= 0.20")


# ---- real shapes, and what each mechanism pays on them ----
#
# Shapes of real programs (bench/step.c, bench/py_step.py), each without
# the library, with every library of --variant (or --lib), and beside
# heaptrack and memray --native where they run. CPU time over --rounds
# interleaved rounds (round-robin over the configurations within a
# round), median and spread ((max - min) / median); instructions by
# callgrind, two run lengths differenced so that start-up and exit cancel.
# glibc's arenas are held steady on both sides of every comparison
# (SHAPE_TUNABLES). The simulation runs with SIMCUDA_BACKING=threaded (one
# malloc per block, no lock of its own; see threads_cpu): with its default
# backing its global mutex would be the multi-threaded shapes' cost.

SHAPE_TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=1073741824:"
                  "glibc.malloc.mmap_threshold=33554432")
SHAPE_DEPTH = 20      # native frames of the C shapes
SHAPE_PY_DEPTH = 30   # Python frames of the Python training step
SHAPE_OPS = 64        # ops of a training (or caching-allocator) step
SHAPE_LAYERS = 16     # layers of an inference request
KEEP_RULE = 0.05      # keep a mechanism that saves >= 5% of the overhead


def shape_variants(args):
    """[(name, path, extra environment)]: every --variant, or the one
    library measured. A variant is NAME=PATH, then VAR=VALUE settings for
    it after commas (metrics=target/release/libcudaleak.so,CUDALEAK_METRICS_DIR=/tmp/m)."""
    if not args.variant:
        return [("cudaleak", LIB, {})]
    out = []
    for v in args.variant:
        name, _, rest = v.partition("=")
        path, *settings = rest.split(",")
        if not path or not os.path.exists(path):
            sys.exit("--variant %s: no library at %r" % (v, path))
        extra = {}
        for s in settings:
            k, eq, val = s.partition("=")
            if not eq or not k:
                sys.exit("--variant %s: %r is not VAR=VALUE" % (v, s))
            extra[k] = val
        out.append((name, os.path.abspath(path), extra))
    return out


def shape_libs(args):
    """[(name, path)] of [`shape_variants`]."""
    return [(n, p) for n, p, _ in shape_variants(args)]


def shape_env(work, reports, iters):
    # PYTHONHASHSEED: the Python shape's instruction counts repeat.
    return dict(base_env(work, reports), SIMCUDA_BACKING="threaded", GLIBC_TUNABLES=SHAPE_TUNABLES,
                BENCH_WORK_ITERS=str(iters), PYTHONHASHSEED="0")


def shape_configs(args, env, reports, python=False):
    """name -> (prefix, env). A prefix may hold "{i}", replaced by the
    process's index (the 8-process shape: one heaptrack file each)."""
    out = {"no library": (None, env)}
    for name, path, extra in shape_variants(args):
        out[name] = (None, dict(env, LD_PRELOAD=path, **extra))
    if args.no_tools:
        print("  heaptrack, memray: not run (--no-tools)")
        return out
    if have("heaptrack"):
        out["heaptrack"] = (["heaptrack", "-o", os.path.join(reports, "heaptrack-{i}")], env)
    else:
        print("  heaptrack: not installed (apt-get install heaptrack); not run")
    if python and have_memray():
        out["memray --native"] = ([sys.executable, "-m", "memray", "run", "--native", "-q", "-f",
                                   "-o", os.path.join(reports, "memray-{i}.bin")], env)
    return out


def shape_run(prefix, env, argv, i=0):
    """Starts one run; returns its Popen (with the viewer of a variant
    that has BENCH_VIEWED=1 as `.viewer`)."""
    cmd = [a.replace("{i}", str(i)) for a in (prefix or [])] + argv
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.viewer = None
    if env.get(VIEWED) == "1":
        proc.viewer = subprocess.Popen([CLI, "top", str(proc.pid), "--timeout", "60"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc


def shape_result(proc):
    """(CPU ns per unit: the program's last number, pairs, units, in-call
    ns per pair or None)."""
    out, err = proc.communicate()
    if getattr(proc, "viewer", None) is not None:
        try:
            proc.viewer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.viewer.kill()
            proc.viewer.wait()
        # 0: it saw the program's views to its end.
        if proc.viewer.returncode != 0:
            raise RuntimeError("the viewer of %s failed (%d)" % (" ".join(proc.args), proc.viewer.returncode))
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(proc.args), proc.returncode, out[-2000:],
                                                      err[-2000:]))
    lines = [l.strip() for l in out.splitlines()]
    nums = [l for l in lines if l.replace(".", "", 1).isdigit()]
    kv = dict(l.split() for l in lines if re.match(r"^(pairs|units|incall|long_calls) [0-9.]+$", l))
    return float(nums[-1]), int(kv["pairs"]), int(kv["units"]), float(kv["incall"]) if "incall" in kv else None


class Samples:
    """Per configuration, one entry per round: CPU ns per unit, and the
    in-call ns per pair (None where the run gave none)."""

    def __init__(self, names):
        self.cpu = {n: [] for n in names}
        self.incall = {n: [] for n in names}
        self.pairs_per_unit = None

    def add(self, name, got):
        """got: shape_result()s of the processes of one run (median)."""
        self.cpu[name].append(statistics.median(g[0] for g in got))
        calls = [g[3] for g in got if g[3] is not None]
        self.incall[name].append(statistics.median(calls) if calls else None)
        self.pairs_per_unit = got[0][1] / got[0][2]


def shape_rounds(configs, argv, rounds, procs=1):
    """Samples of each configuration over interleaved rounds; with
    procs > 1, the runs of a round start together and each entry is the
    median over the processes (each process's own CPU time)."""
    out = Samples(configs)
    for _ in range(rounds):
        for name, (prefix, env) in configs.items():
            running = [shape_run(prefix, env, argv, i) for i in range(procs)]
            out.add(name, [shape_result(p) for p in running])
    return out


def spread(v):
    return (max(v) - min(v)) / statistics.median(v)


def callgrind_events(stderr):
    """callgrind's totals by event name ("Ir", and with --cache-sim=yes
    "I1mr", "D1mr", ...), from its summary on stderr; None when absent."""
    names = re.findall(r"Events\s*:\s*(.+)", stderr)
    values = re.findall(r"Collected\s*:\s*(.+)", stderr)
    if not names or not values:
        return None
    return dict(zip(names[-1].split(), (int(v) for v in values[-1].split())))


# Per configuration, (I1 misses, D1 read misses) per unit, from the last
# shape_instructions(..., cache_sim=True); empty without --cache-sim.
SHAPE_MISSES = {}


def shape_instructions(configs, argv_of, n1, n2, procs=1, cache_sim=False):
    """Instructions per unit (the difference of two run lengths, n2 - n1
    units), per library configuration (the tools are not counted). With
    procs > 1, that many run at once, and the figure is their median.
    With cache_sim, callgrind also simulates the caches (I1 and D1 of
    32 KiB, 8-way, 64-byte lines), and SHAPE_MISSES gets the misses per
    unit: on the Python shape they, not the instructions, decide what the
    library costs (docs/performance.md, "why train-py pays more than its
    instructions say")."""
    SHAPE_MISSES.clear()
    if not have("valgrind"):
        print("  valgrind not found (apt-get install valgrind): instructions skipped", file=sys.stderr)
        return {}
    out = {}
    for name, (prefix, env) in configs.items():
        if prefix:
            continue
        counts = []
        for n in (n1, n2):
            cmd = (["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
                   + (["--cache-sim=yes"] if cache_sim else []) + argv_of(n))
            running = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True) for _ in range(procs)]
            got = []
            for p in running:
                _, err = p.communicate()
                events = callgrind_events(err)
                if p.returncode != 0 or not events or (cache_sim and "I1mr" not in events):
                    raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, err[-2000:]))
                got.append(events)
            counts.append({e: statistics.median(g[e] for g in got) for e in got[0]})
        out[name] = (counts[1]["Ir"] - counts[0]["Ir"]) / (n2 - n1)
        if cache_sim:
            SHAPE_MISSES[name] = tuple((counts[1][e] - counts[0][e]) / (n2 - n1) for e in ("I1mr", "D1mr"))
    return out


SHAPE_VERDICTS = []  # (shape, variant, instructions, CPU medians, spreads ok, CPU paired, above, rounds, in-call paired)


def paired(a, b):
    """Round by round, a - b: the runs of one round are next to each other
    in time, so the machine's drift hits both."""
    return [x - y for x, y in zip(a, b) if x is not None and y is not None]


def pct(x):
    return "n/a" if x is None else "%+.1f%%" % (100 * x)


def shape_table(title, smp, instr, unit, args, note=""):
    """Two tables. Each configuration: CPU per unit (median, spread), its
    overhead per unit and per pair and share of the program's CPU, the
    in-call time per pair, and the same in instructions. Then each variant
    against the first library (the reference, e.g. base): how much more
    overhead it pays, by instructions, by the CPU medians, by the CPU
    paired round by round, and by the in-call time paired."""
    samples, ppu = smp.cpu, smp.pairs_per_unit
    rounds = len(next(iter(samples.values())))
    print()
    print("### %s" % title)
    print()
    print("GLIBC_TUNABLES=%s; %d interleaved rounds; %.0f pairs per %s%s; load average at the end %.1f" % (
        SHAPE_TUNABLES, rounds, ppu, unit, "; " + note if note else "", os.getloadavg()[0]))
    print()
    print("| configuration | CPU ns/%s | spread | overhead ns/%s | share of CPU | overhead ns/pair "
          "| in-call ns/pair | spread | instr/%s | overhead instr/pair |" % (unit, unit, unit))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = {k: statistics.median(v) for k, v in samples.items()}
    inc = {k: statistics.median([x for x in v if x is not None]) if any(x is not None for x in v) else None
           for k, v in smp.incall.items()}
    base = med["no library"]
    for name, v in samples.items():
        ovh = med[name] - base
        cells = ["%.0f" % med[name], "%.1f%%" % (100 * spread(v))]
        cells += ["", "", ""] if name == "no library" else [
            "%+.0f" % ovh, "%+.2f%%" % (100 * ovh / base), "%+.0f" % (ovh / ppu)]
        if inc[name] is not None:
            cells += ["%.0f" % inc[name], "%.1f%%" % (100 * spread([x for x in smp.incall[name] if x is not None]))]
        else:
            cells += ["", ""]
        if name in instr:
            cells += ["%.0f" % instr[name],
                      "" if name == "no library" else "%+.0f" % ((instr[name] - instr["no library"]) / ppu)]
        else:
            cells += ["(not counted)" if name in ("heaptrack", "memray --native") else "", ""]
        print("| %s | %s |" % (name, " | ".join(cells)))
    if SHAPE_MISSES.get("no library"):
        alone = SHAPE_MISSES["no library"]
        print()
        print("Simulated cache misses per pair (callgrind --cache-sim=yes: I1 and D1 of 32 KiB, 8-way, "
              "64-byte lines); the program alone: %.0f I1, %.0f D1 reads:" % (alone[0] / ppu, alone[1] / ppu))
        print()
        print("| configuration | I1 misses added per pair | D1 read misses added per pair |")
        print("|---|---:|---:|")
        for name, (i1, d1) in SHAPE_MISSES.items():
            if name != "no library":
                print("| %s | %+.1f | %+.1f |" % (name, (i1 - alone[0]) / ppu, (d1 - alone[1]) / ppu))
    libs = [n for n, _ in shape_libs(args)]
    if len(libs) < 2:
        return
    ref = libs[0]
    ref_cpu = med[ref] - base
    ref_ins = instr[ref] - instr["no library"] if ref in instr and "no library" in instr else None
    ref_inc = inc[ref] - inc["no library"] if inc.get(ref) is not None and inc.get("no library") is not None else None
    print()
    print("Each variant's overhead against %s's (+: the variant pays more, i.e. the mechanism it turns off "
          "saves that share of %s's overhead):" % (ref, ref))
    print()
    print("| variant | instructions | CPU medians | both spreads < 5% | CPU paired by round (rounds above) "
          "| in-call paired by round (rounds above) |")
    print("|---|---:|---:|---|---:|---:|")
    for name in libs[1:]:
        ins_d = (instr[name] - instr["no library"] - ref_ins) / ref_ins if name in instr and ref_ins else None
        cpu_d = (med[name] - base - ref_cpu) / ref_cpu if ref_cpu else None
        ok = rounds >= 7 and max(spread(samples[name]), spread(samples[ref])) < KEEP_RULE
        pc = paired(samples[name], samples[ref])
        pc_d = statistics.median(pc) / ref_cpu if pc and ref_cpu else None
        pi = paired(smp.incall[name], smp.incall[ref])
        pi_d = statistics.median(pi) / ref_inc if pi and ref_inc else None
        print("| %s | %s | %s | %s | %s (%d/%d) | %s (%d/%d) |" % (
            name, pct(ins_d), pct(cpu_d), "yes" if ok else "no", pct(pc_d), sum(1 for d in pc if d > 0), len(pc),
            pct(pi_d), sum(1 for d in pi if d > 0), len(pi)))
        SHAPE_VERDICTS.append((title.split(":")[0], name, ins_d, cpu_d, ok, pc_d,
                               "%d/%d" % (sum(1 for d in pc if d > 0), len(pc)), pi_d,
                               "%d/%d" % (sum(1 for d in pi if d > 0), len(pi))))


def shape_verdicts():
    """Each variant against the reference, shape by shape. The keep rule
    (docs/decisions.md, "The keep rule: a mechanism stays only if it saves
    5 % on a real shape"): a mechanism stays where turning it off costs >= 5% more
    overhead on a real shape, in instructions, or in CPU time over 7+
    interleaved rounds whose spreads are under 5%."""
    if not SHAPE_VERDICTS:
        return
    print()
    print("### What each mechanism saves, shape by shape (+: the variant without it pays more)")
    print()
    print("| shape | variant | instructions | CPU medians (spreads < 5%) | CPU paired (rounds above) "
          "| in-call paired (rounds above) | keep rule met, as written | and paired |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for shape, name, ins_d, cpu_d, ok, pc_d, pc_n, pi_d, pi_n in SHAPE_VERDICTS:
        by_ins = ins_d is not None and ins_d >= KEEP_RULE
        by_cpu = ok and cpu_d is not None and cpu_d >= KEEP_RULE
        # The CPU branch again, from the rounds' pairs: the median paired
        # difference is >= 5% too, and the variant paid more in all but at
        # most one round (a sign test: 6 of 7 by chance is p = 0.06).
        above, n = (int(x) for x in pc_n.split("/"))
        steady = by_cpu and pc_d is not None and pc_d >= KEEP_RULE and above >= n - 1
        met = "yes (instructions)" if by_ins else "yes (CPU)" if by_cpu else "no"
        print("| %s | %s | %s | %s (%s) | %s (%s) | %s (%s) | %s | %s |" % (
            shape, name, pct(ins_d), pct(cpu_d), "yes" if ok else "no", pct(pc_d), pc_n, pct(pi_d), pi_n,
            met, "yes" if by_ins or steady else "no"))


def shape_calibration(work, args):
    """Iterations of the work loops per 10 µs, measured once without the
    library (or given), so that every run does the same work."""
    if args.work_iters is None:
        args.work_iters = int(sh([os.path.join(work, "step"), "calibrate"]).split()[-1])
    return args.work_iters


def shape_py_calibration(args):
    if args.py_work_iters is None:
        args.py_work_iters = int(sh([sys.executable, os.path.join(ROOT, "bench", "py_step.py"),
                                     "calibrate"]).split()[-1])
    return args.py_work_iters


def shape_train(work, reports, pairs, args, caching=False):
    """A training step, 20 native frames (or, caching=True, the same step
    whose ops take their memory from the program's cache and which grows 3
    segments: what a default PyTorch run pays)."""
    step = os.path.join(work, "step")
    mode = "cache" if caching else "train"
    iters = shape_calibration(work, args)
    env = shape_env(work, reports, iters)
    configs = shape_configs(args, env, reports)
    print("  memray --native: not run (it runs Python programs only; this is a C program)")
    argv = lambda n: [step, mode, str(n), str(SHAPE_OPS), str(SHAPE_DEPTH)]  # noqa: E731
    smp = shape_rounds(configs, argv(args.steps), args.rounds)
    # The caching-allocator step has 3 pairs a step: a longer difference,
    # so that the dumper thread's polls (every 200 ms, longer under
    # callgrind) stay small beside them.
    instr = {} if args.no_instructions else shape_instructions(configs, argv, 10, 90 if caching else 30,
                                                               cache_sim=args.cache_sim)
    if caching:
        title = ("cache: caching-allocator step, %d ops of 10 µs per pass, 3 segments grown and released, "
                 "%d frames" % (SHAPE_OPS, SHAPE_DEPTH))
    else:
        title = ("train: training step, %d ops of 10 µs per pass (forward on main, backward on a second thread), "
                 "2 GiB held, %d native frames" % (SHAPE_OPS, SHAPE_DEPTH))
    shape_table(title, smp, instr, "step", args,
                "work loop %d iterations per op; %d steps a run" % (iters, args.steps))


def shape_cache(work, reports, pairs, args):
    shape_train(work, reports, pairs, args, caching=True)


def shape_train_py(work, reports, pairs, args):
    """The training step from a 30-frame Python stack (ctypes)."""
    iters = shape_py_calibration(args)
    env = shape_env(work, reports, iters)
    configs = shape_configs(args, env, reports, python=True)
    if not have_memray():
        print("  memray: not installed for %s (python -m pip install memray); not run" % sys.executable)
    script = os.path.join(ROOT, "bench", "py_step.py")
    steps = max(10, args.steps // 2)
    argv = lambda n: [sys.executable, script, "train", str(n), str(SHAPE_OPS), str(SHAPE_PY_DEPTH)]  # noqa: E731
    smp = Samples(configs)
    for _ in range(args.rounds):
        for name, (prefix, e) in configs.items():
            a = argv(steps)
            if prefix and "memray" in prefix[2:4]:
                a = a[1:]  # memray's prefix names the interpreter
            smp.add(name, [shape_result(shape_run(prefix, e, a))])
    instr = {} if args.no_instructions else shape_instructions(configs, argv, 4, 12, cache_sim=args.cache_sim)
    shape_table("train-py: training step from Python, %d ops of 10 µs per pass, 2 GiB held, %d Python frames"
                % (SHAPE_OPS, SHAPE_PY_DEPTH), smp, instr, "step", args,
                "Python work loop %d iterations per op; %d steps a run" % (iters, steps))


def shape_xfree(work, reports, pairs, args):
    """Allocated on one thread, freed on another: 1 thread (alone), 2 and
    8 (producer/consumer pairs handing pointers over), CPU per pair."""
    step = os.path.join(work, "step")
    env = shape_env(work, reports, 0)
    configs = shape_configs(args, env, reports)
    print("  memray --native: not run (it runs Python programs only; this is a C program)")
    one = {}
    for t in (1, 2, 8):
        producers = max(1, t // 2)
        argv = lambda n: [step, "xfree", str(n // producers), str(SHAPE_DEPTH), str(t)]  # noqa: E731
        smp = shape_rounds(configs, argv(args.xfree_pairs), args.rounds)
        instr = {} if args.no_instructions else shape_instructions(configs, argv, 8192, 24576, cache_sim=args.cache_sim)
        shape_table("xfree-%d: %s, 4 KiB .. 2 MiB blocks, 16 call sites, 2 GiB held, %d frames" % (
            t, "one thread allocates and frees" if t == 1 else
            "%d producer/consumer pairs, each block freed by the other thread" % producers, SHAPE_DEPTH),
            smp, instr, "pair", args, "%d pairs a run" % args.xfree_pairs)
        med = {k: statistics.median(v) for k, v in smp.cpu.items()}
        for name in med:
            if name == "no library":
                continue
            cost = med[name] - med["no library"]
            if t == 1:
                one[name] = cost
            else:
                row("xfree, %d threads: %s" % (t, name), "%+.0f" % cost, "ns/pair",
                    "%.2fx its 1-thread cost (%+.0f)" % (cost / one[name], one[name]))


def shape_ranks(work, reports, pairs, args):
    """8 processes on the machine's cores, each the training step (ranks
    on one machine), against one process alone, in the same rounds."""
    step = os.path.join(work, "step")
    iters = shape_calibration(work, args)
    env = shape_env(work, reports, iters)
    configs = shape_configs(args, env, reports)
    print("  memray --native: not run (it runs Python programs only; this is a C program)")
    steps = max(10, args.steps // 2)
    argv = lambda n: [step, "train", str(n), str(SHAPE_OPS), str(SHAPE_DEPTH)]  # noqa: E731
    alone, eight = Samples(configs), Samples(configs)
    for _ in range(args.rounds):
        for name, (prefix, e) in configs.items():
            alone.add(name, [shape_result(shape_run(prefix, e, argv(steps)))])
            running = [shape_run(prefix, e, argv(steps), i) for i in range(args.ranks)]
            eight.add(name, [shape_result(p) for p in running])
    ppu = alone.pairs_per_unit
    if args.no_instructions:
        ia = ie = {}
    else:
        ia = shape_instructions(configs, argv, 10, 30, cache_sim=args.cache_sim)
        ie = shape_instructions(configs, argv, 10, 30, procs=args.ranks, cache_sim=args.cache_sim)
    shape_table("ranks-1: the training step, one process alone (%d frames)" % SHAPE_DEPTH,
                alone, ia, "step", args, "%d steps a run; in the rounds of ranks-%d" % (steps, args.ranks))
    shape_table("ranks-%d: the training step, %d processes at once on %d CPUs (median process)" % (
        args.ranks, args.ranks, os.cpu_count()), eight, ie, "step", args, "%d steps a run" % steps)
    for name in alone.cpu:
        if name == "no library":
            continue
        a = statistics.median(alone.cpu[name]) - statistics.median(alone.cpu["no library"])
        e = statistics.median(eight.cpu[name]) - statistics.median(eight.cpu["no library"])
        row("ranks: %s, overhead per pair, %d processes vs 1" % (name, args.ranks), "%+.0f" % (e / ppu),
            "ns", "alone %+.0f ns; %.2fx" % (a / ppu, e / a if a else float("nan")))


def shape_async(work, reports, pairs, args):
    """An inference loop on cudaMallocAsync/cudaFreeAsync, one thread."""
    step = os.path.join(work, "step")
    iters = shape_calibration(work, args)
    env = shape_env(work, reports, iters)
    configs = shape_configs(args, env, reports)
    print("  memray --native: not run (it runs Python programs only; this is a C program)")
    argv = lambda n: [step, "async", str(n), str(SHAPE_LAYERS), str(SHAPE_DEPTH)]  # noqa: E731
    smp = shape_rounds(configs, argv(args.requests), args.rounds)
    instr = {} if args.no_instructions else shape_instructions(configs, argv, 20, 60, cache_sim=args.cache_sim)
    shape_table("async: inference loop, one thread, cudaMallocAsync/cudaFreeAsync, %d layers of 10 µs, "
                "2 GiB held, %d frames" % (SHAPE_LAYERS, SHAPE_DEPTH), smp, instr, "request", args,
                "work loop %d iterations per layer; %d requests a run" % (iters, args.requests))


SHAPES = {"train": shape_train, "train-py": shape_train_py, "xfree": shape_xfree, "ranks": shape_ranks,
          "async": shape_async, "cache": shape_cache}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--py-pairs", type=int, default=200_000)
    ap.add_argument("--live-blocks", type=int, default=1_000_000)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--baseline-lib", help="a libcudaleak.so built before a change, run side by side with "
                    "target/release/libcudaleak.so (e.g. the per-call-site counters of the timeline)")
    ap.add_argument("--only-baseline", action="store_true", help="run only the --baseline-lib comparison")
    ap.add_argument("--cpu-time", action="store_true", help="time single-thread pairs by the thread's CPU time, "
                    "not wall time (a loaded machine: the wait for a CPU is not the hooks' cost)")
    ap.add_argument("--lib", help="the libcudaleak.so to measure (default: target/release/libcudaleak.so), "
                    "e.g. an older build for instruction counts before and after a change")
    ap.add_argument("--fresh-pairs", type=int, default=10_000_000, help="pairs of the long fresh-stacks run")
    ap.add_argument("--exit-leaks", type=int, default=1_000_000, help="leaks of the large exit report")
    ap.add_argument("--only", choices=["old-driver", "oom", "instructions", "fresh", "threads", "exit", "trace",
                                       "ratios", "shapes"] + list(SHAPES),
                    help="run one section only; \"shapes\": every real shape (train, train-py, "
                    "xfree, ranks, async, cache), which run only when named")
    ap.add_argument("--variant", action="append", metavar="NAME=PATH[,VAR=VALUE...]",
                    help="real shapes: a libcudaleak.so to measure, by name, with settings of its own "
                    "(base=lib.so,CUDALEAK_METRICS_DIR=/tmp/m); repeat it. The first is the "
                    "reference the others' overhead is compared with (e.g. base=...). BENCH_VIEWED=1 among the "
                    "settings has each run watched by `cudaleak top PID`. Default: --lib as \"cudaleak\"")
    ap.add_argument("--rounds", type=int, default=7, help="real shapes: interleaved rounds (default 7)")
    ap.add_argument("--steps", type=int, default=200, help="real shapes: training steps a run")
    # (200,000 pairs made a one-thread run of 12 ms, which read with a 74 %
    # spread on a 2-vCPU VM; 4M pairs, 0.4 s, with 9 to 13 %)
    ap.add_argument("--xfree-pairs", type=int, default=4_000_000, help="real shapes: pairs a cross-thread run")
    ap.add_argument("--requests", type=int, default=1000, help="real shapes: inference requests a run")
    ap.add_argument("--ranks", type=int, default=8, help="real shapes: processes at once")
    ap.add_argument("--work-iters", type=int, help="real shapes: iterations of the C work loop per 10 µs "
                    "(default: calibrated at start, without the library)")
    ap.add_argument("--py-work-iters", type=int, help="real shapes: the same for the Python loop")
    ap.add_argument("--no-instructions", action="store_true", help="real shapes: CPU time only, no callgrind")
    ap.add_argument("--cache-sim", action="store_true",
                    help="real shapes: also the cache misses per pair, in callgrind's simulated caches")
    ap.add_argument("--no-tools", action="store_true", help="real shapes: no heaptrack or memray in the rounds "
                    "(many rounds of the libraries alone)")
    args = ap.parse_args()
    global CPU_TIME, LIB
    CPU_TIME = args.cpu_time
    if args.lib:
        LIB = os.path.abspath(args.lib)
    if not os.path.exists(LIB):
        sys.exit("build first: cargo build --release")
    heaptrack, memray = have("heaptrack"), have_memray()
    if not heaptrack:
        print("heaptrack not found (apt-get install heaptrack): its rows are skipped", file=sys.stderr)
    if not memray:
        print("memray not found (python3 -m pip install memray): its rows are skipped", file=sys.stderr)
    work = tempfile.mkdtemp(prefix="cudaleak-bench-")
    reports = os.path.join(work, "reports")
    os.makedirs(reports)
    build(work)
    pairs = os.path.join(work, "pairs")

    if args.only == "shapes" or args.only in SHAPES:
        print("cudaleak benchmarks, real shapes, %s, %s, %d CPUs, %d interleaved rounds each" % (
            date.today().isoformat(), platform.processor() or platform.machine(), os.cpu_count(), args.rounds))
        print("GLIBC_TUNABLES=%s, SIMCUDA_BACKING=threaded; libraries: %s" % (
            SHAPE_TUNABLES, ", ".join("%s=%s" % v for v in shape_libs(args))))
        for name, fn in SHAPES.items():
            if args.only in ("shapes", name):
                fn(work, reports, pairs, args)
                sys.stdout.flush()
        shape_verdicts()
        shutil.rmtree(work, ignore_errors=True)
        return
    print("cudaleak benchmarks, %s, %s, %d CPUs, %s runs each (median)" % (
        date.today().isoformat(), platform.processor() or platform.machine(), os.cpu_count(), args.runs))
    print()
    print("| %-58s | %12s | %-6s | %s" % ("measurement", "value", "unit", "note"))
    print("|%s|%s|%s|%s" % ("-" * 60, "-" * 14, "-" * 8, "-" * 20))
    if args.baseline_lib:
        compare_baseline(work, reports, pairs, args)
        if args.only_baseline:
            shutil.rmtree(work, ignore_errors=True)
            return
    sections = {"oom": oom_delay, "instructions": instructions, "fresh": fresh_stacks,
                "threads": threads_cpu, "exit": exit_reports, "trace": trace_ring, "ratios": ratios}
    if args.only in sections:
        sections[args.only](work, reports, pairs, args)
        shutil.rmtree(work, ignore_errors=True)
        return
    old_driver(work, reports, pairs, args)
    if args.only:
        shutil.rmtree(work, ignore_errors=True)
        return
    ratios(work, reports, pairs, args)

    # Memory per live block: our RSS growth over the program's own.
    env = base_env(work, reports)
    hold = [pairs, "hold", str(args.live_blocks), "20"]
    mem = side_by_side({"no library": (None, env), "cudaleak": (None, dict(env, LD_PRELOAD=LIB))}, hold,
                       max(1, args.runs // 2))
    row("memory per live block (%d live)" % args.live_blocks, "%.1f" % (mem["cudaleak"] - mem["no library"]),
        "bytes", "goal <= 64 + interned stacks")

    # Time to write a dump: 1M live blocks over 1024 distinct stacks.
    dump = [pairs, "dump", str(args.live_blocks), "20"]
    d = side_by_side({"cudaleak": (None, dict(env, LD_PRELOAD=LIB))}, dump, max(1, args.runs // 2))
    row("dump with %d live blocks, 1024 stacks, symbolized" % args.live_blocks, "%.0f" % d["cudaleak"], "ms",
        "goal <= 2000")

    oom_delay(work, reports, pairs, args)
    trace_ring(work, reports, pairs, args)

    # Throughput with several allocating threads.
    for t in [int(x) for x in args.threads.split(",")]:
        n = max(10_000, args.pairs // (2 * t))
        th = side_by_side({"no library": (None, env), "cudaleak": (None, dict(env, LD_PRELOAD=LIB))},
                          [pairs, "runtime", str(n), "20", str(t)], args.runs)
        for name, v in th.items():
            row("throughput, %d thread(s), 20 frames: %s" % (t, name), "%.2f" % (1e3 / v * t), "M pairs/s",
                "%.0f ns per pair per thread" % v)
    threads_cpu(work, reports, pairs, args)
    fresh_stacks(work, reports, pairs, args)
    exit_reports(work, reports, pairs, args)
    instructions(work, reports, pairs, args)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
