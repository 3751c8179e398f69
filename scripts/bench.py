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
"""

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target", "release", "libcudaleak.so")
CPU_TIME = False  # --cpu-time


def sh(cmd, env=None, cwd=None):
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr))
    return out.stdout


def build(work):
    """The simulated driver and runtime, and the benchmark program."""
    inc = "-I" + os.path.join(ROOT, "sim", "include")
    sim = os.path.join(ROOT, "sim")
    sh(["cc", "-O2", "-g", "-fPIC", "-shared", inc, "-Wl,-soname,libcuda.so.1", "-o",
        os.path.join(work, "libcuda.so.1"), os.path.join(sim, "driver.c"), "-lpthread"])
    sh(["cc", "-O2", "-g", "-fPIC", "-shared", inc, "-Wl,-soname,libcudart.so.12", "-Wl,-rpath,$ORIGIN", "-o",
        os.path.join(work, "libcudart.so.12"), os.path.join(sim, "runtime.c"), "-ldl", "-lpthread"])
    # The same driver without cuCtxGetCurrent/cuCtxGetDevice, as an old or
    # partial driver may be (issue 11): the library must not pay a failed
    # lookup per call on it.
    os.makedirs(os.path.join(work, "no-ctx-queries"), exist_ok=True)
    sh(["cc", "-O2", "-g", "-fPIC", "-shared", inc, "-DSIMCUDA_NO_CTX_QUERIES", "-Wl,-soname,libcuda.so.1", "-o",
        os.path.join(work, "no-ctx-queries", "libcuda.so.1"), os.path.join(sim, "driver.c"), "-lpthread"])
    sh(["cc", "-O2", "-g", inc, "-o", os.path.join(work, "pairs"), os.path.join(ROOT, "bench", "pairs.c"),
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
                "" if name == "baseline" else "%+.1f ns vs baseline (goal <= +5: the peak's counters, issue 21)" % (v - base))


def old_driver(work, reports, pairs, args):
    """Per-pair overhead on a driver without cuCtxGetCurrent/cuCtxGetDevice
    against the full driver's: goal within 1.5x (issue 11)."""
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
    snapshot of an out-of-memory report (issue 21), by live blocks (over
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


def callgrind_instructions(env, argv):
    """Instructions the program executed under callgrind (valgrind's
    "Collected" count)."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
                         env=env, capture_output=True, text=True)
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split()[-1])
    raise RuntimeError("callgrind gave no count:\n" + out.stderr)


def trace_ring(work, reports, pairs, args):
    """The allocation-event ring (CUDALEAK_TRACE, issue 26): what a pair
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
        n = [callgrind_instructions(e, [pairs, "runtime", str(k), "20"]) for k in (10_000, 30_000)]
        counts[name] = (n[1] - n[0]) / 20_000
    off = counts["cudaleak, CUDALEAK_TRACE=0 (off)"]
    for name, v in counts.items():
        row("instructions per pair, 20 frames: %s" % name, "%.0f" % v, "",
            "+%.0f per event" % ((v - off) / 2) if "4096" in name else "")


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
    ap.add_argument("--only", choices=["old-driver", "oom", "trace"], help="run one section only")
    args = ap.parse_args()
    global CPU_TIME
    CPU_TIME = args.cpu_time
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
    if args.only == "oom":
        oom_delay(work, reports, pairs, args)
        shutil.rmtree(work, ignore_errors=True)
        return
    if args.only == "trace":
        trace_ring(work, reports, pairs, args)
        shutil.rmtree(work, ignore_errors=True)
        return
    old_driver(work, reports, pairs, args)
    if args.only:
        shutil.rmtree(work, ignore_errors=True)
        return
    for depth in (20, 60):
        med = side_by_side(configs_native(work, reports, heaptrack),
                           [pairs, "runtime", str(args.pairs), str(depth)], args.runs)
        base = med["no library"]
        for name, v in med.items():
            row("alloc/free pair, %d frames deep: %s" % (depth, name), "%.0f" % v, "ns",
                "" if name == "no library" else "+%.0f ns" % (v - base))
        if heaptrack:
            ratio = (med["cudaleak, stacks"] - base) / (med["heaptrack"] - base)
            row("overhead ratio cudaleak / heaptrack, %d frames" % depth, "%.2f" % ratio, "", "goal <= 0.5")

    # The same pair from 1024 different call stacks in turn (30 frames):
    # no two consecutive captures alike, so no replay (unwind.rs).
    med = side_by_side(configs_native(work, reports, heaptrack), [pairs, "mixed", str(args.pairs), "20"], args.runs)
    base = med["no library"]
    for name, v in med.items():
        row("alloc/free pair, 1024 stacks in turn, 30 frames: %s" % name, "%.0f" % v, "ns",
            "" if name == "no library" else "+%.0f ns" % (v - base))
    if heaptrack:
        ratio = (med["cudaleak, stacks"] - base) / (med["heaptrack"] - base)
        row("overhead ratio cudaleak / heaptrack, 1024 stacks in turn", "%.2f" % ratio, "", "no replay possible")

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
        row("overhead ratio cudaleak / memray --native", "%.2f" % ratio, "", "goal <= 0.5")

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
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
