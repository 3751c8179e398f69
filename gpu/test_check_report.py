"""Tests of gpu/check_report.py and of the checkers of gpu/torch_checks.py and
gpu/cupy_jax_checks.py, on fake reports, fake ground truths and fake
compute-sanitizer output: no GPU, no torch, no cudaleak build needed.

    python3 gpu/test_check_report.py

With GPU_CHECK_TEST_ARTIFACTS=DIR (a directory holding a built cudaleak and
libcudaleak.so, e.g. target/release) it also runs scripts/gpu-validate.sh's
`python` section, which needs no GPU (the simulated driver), end to end.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import check_report as cr  # noqa: E402
import cupy_jax_checks as fw  # noqa: E402
import torch_checks as tc  # noqa: E402
import untouched_checks as ut  # noqa: E402
import procaddr_checks as pa  # noqa: E402
import live_checks as lc  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def nframe(function, file=None, line=None, module="/bin/prog"):
    return {"address": "0x1000", "function": function, "file": file, "line": line, "module": module}


def pframe(function, file, line):
    return {"function": function, "file": file, "line": line}


def group(api, memory, nbytes, blocks=1, native=(), python=(), **extra):
    g = {"api": api, "memory": memory, "bytes": nbytes, "blocks": blocks,
         "native_stack": list(native), "python_stack": list(python)}
    g.update(extra)
    return g


def report(leaks, trigger="exit", seq=1, pid=4242, **extra):
    r = {"format": "cudaleak", "version": 1, "trigger": trigger, "sequence": seq, "pid": pid,
         "command": ["prog"], "timestamp_ms": 1700000000000 + seq,
         "totals": {"live_blocks": sum(g["blocks"] for g in leaks), "live_bytes": sum(g["bytes"] for g in leaks),
                    "peak_bytes": extra.pop("peak_bytes", 0), "allocations": 0, "frees": 0,
                    "failed_allocations": 0, "invalid_frees": 0},
         "leaks": leaks, "growth": []}
    r.update(extra)
    return r


def write_report(directory, r, host="gpu-node", suffix=""):
    os.makedirs(directory, exist_ok=True)
    name = "cudaleak.%s.%d.1700000000000-abcdef01.%d.%s%s.json" % (host, r["pid"], r["sequence"], r["trigger"], suffix)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump(r, f)
    return path


def write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f)
    return path


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check-report-test.")
        self.log = os.path.join(self.tmp, "checks.txt")
        self._env = {k: os.environ.get(k) for k in ("GPU_CHECK_LOG", "CUDALEAK_CLI", "GPU_CHECK_TRUTH")}
        os.environ["GPU_CHECK_LOG"] = self.log
        os.environ.pop("CUDALEAK_CLI", None)
        os.environ.pop("GPU_CHECK_TRUTH", None)
        del cr._failed[:]

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        del cr._failed[:]

    def run_checks(self, fn, *args):
        """Runs a checker; returns {name: (status, line)} of its CHECK lines."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            fn(*args)
        lines = [l for l in out.getvalue().splitlines() if l.startswith("CHECK ")]
        res = {}
        for line in lines:
            name, rest = line[len("CHECK "):].split(": ", 1)
            self.assertNotIn(name, res, "two checks named %r" % name)
            res[name] = (rest.split(" ", 1)[0], line)
        return res

    def assertAllPass(self, res):
        self.assertTrue(res, "no checks ran")
        bad = [l for s, l in res.values() if s != "PASS"]
        self.assertEqual(bad, [])


# --- The check line and its bookkeeping -------------------------------------


class CheckLine(Base):
    def test_format_log_and_failures(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertTrue(cr.check("a thing", True, "3 B", "exact"))
            self.assertFalse(cr.check("other: thing", False, "4\nB", "within 1%"))
        want = ["CHECK a thing: PASS 3 B (tolerance exact)", "CHECK other thing: FAIL 4 B (tolerance within 1%)"]
        self.assertEqual(out.getvalue().splitlines(), want)
        with open(self.log) as f:
            self.assertEqual(f.read().splitlines(), want)
        self.assertEqual(cr.failures(), ["other thing"])

    def test_finish_exit_status(self):
        with self.assertRaises(SystemExit) as e:
            cr.finish()
        self.assertEqual(e.exception.code, 0)
        with contextlib.redirect_stdout(io.StringIO()):
            cr.check("x", False, "1", "0")
        with self.assertRaises(SystemExit) as e:
            cr.finish()
        self.assertEqual(e.exception.code, 1)

    def test_guarded_turns_an_error_into_a_fail(self):
        @cr.guarded("torch leak no-cache")
        def boom():
            raise FileNotFoundError("no api report in /x")

        res = self.run_checks(boom)
        self.assertEqual(res["torch leak no-cache"][0], "FAIL")
        self.assertIn("FileNotFoundError", res["torch leak no-cache"][1])

    def test_within_and_round_up(self):
        self.assertTrue(cr.within(101, 100, rel_tol=0.01))
        self.assertFalse(cr.within(102, 100, rel_tol=0.01))
        self.assertTrue(cr.within(100 + MiB, 100, abs_tol=MiB))
        self.assertEqual(cr.round_up(1, 512), 512)
        self.assertEqual(cr.round_up(4 * MiB, 2 * MiB), 4 * MiB)


# --- Ground truth from sources -------------------------------------------------


class Markers(Base):
    def test_marker_line_is_exact_and_unique(self):
        p = os.path.join(self.tmp, "x.cu")
        with open(p, "w") as f:
            f.write("a\nCHECK(cudaMalloc(&p, n)); /* LEAK cudaMalloc */\nCHECK(x); /* LEAK cudaMallocAsync */\n// LEAK twice\n// LEAK twice\n")
        self.assertEqual(cr.marker_line(p, "LEAK cudaMalloc"), 2)
        self.assertEqual(cr.marker_line(p, "LEAK cudaMallocAsync"), 3)
        with self.assertRaises(ValueError):
            cr.marker_line(p, "LEAK twice")
        with self.assertRaises(ValueError):
            cr.marker_line(p, "LEAK nowhere")

    def test_markers_of_the_real_sources(self):
        # Each is on the allocation call itself.
        for api in ("cudaMalloc", "cudaMallocAsync", "cudaMallocHost", "cudaMallocManaged", "cuMemCreate"):
            line = cr.marker_line(cr.LEAKS_CU, "LEAK " + api)
            with open(cr.LEAKS_CU) as f:
                text = f.read().splitlines()[line - 1]
            self.assertIn(api + "(", text)
        for m in ("LEAK train_step", "LEAK phase", "CHURN phase", "OOM request", "PEAK activations"):
            cr.marker_line(tc.SRC, m)
        for m in ("LEAK cupy runtime", "LEAK cupy pool", "LEAK jax device_put", "LEAK jax compute"):
            cr.marker_line(fw.SRC, m)
        for m in cr.STACKS_ALL:
            cr.marker_line(cr.STACKS_PY, "# LEAK " + m)

    def test_planted_lines(self):
        text = "planted cudaMalloc device 1048576 leak_malloc\nnoise\nplanted cuMemCreate physical 2097152 leak_mem_create\ndone\n"
        self.assertEqual(cr.parse_planted(text), [
            {"api": "cudaMalloc", "memory": "device", "bytes": MiB, "function": "leak_malloc"},
            {"api": "cuMemCreate", "memory": "physical", "bytes": 2 * MiB, "function": "leak_mem_create"},
        ])

    def test_truth_round_trip(self):
        p = os.path.join(self.tmp, "t.json")
        os.environ["GPU_CHECK_TRUTH"] = p
        cr.write_truth({"a": 1})
        self.assertEqual(cr.read_truth(p), {"a": 1})
        os.environ.pop("GPU_CHECK_TRUTH")
        self.assertIsNone(cr.write_truth({"a": 2}))


# --- Reports -------------------------------------------------------------------


class Reports(Base):
    def test_report_files_order_and_trigger(self):
        d = os.path.join(self.tmp, "r")
        write_report(d, report([], "signal", seq=3))
        write_report(d, report([], "signal", seq=1))
        write_report(d, report([], "signal", seq=2), suffix=".0a1b2c3d")  # a taken name
        write_report(d, report([], "exit", seq=4))
        write_report(d, report([], "timeline", seq=5))
        write_report(d, report([], "api", seq=1), host="node.example.com")
        names = [cr.read_truth(p)["sequence"] for p in cr.report_files(d, "signal")]
        self.assertEqual(names, [1, 2, 3])
        self.assertEqual(len(cr.report_files(d, "exit")), 1)
        self.assertEqual(len(cr.report_files(d, "api")), 1)
        self.assertEqual(len(cr.report_files(d)), 5)  # not the timeline

    def test_load_report_without_cli_takes_the_newest(self):
        d = os.path.join(self.tmp, "r")
        write_report(d, report([], "signal", seq=1))
        write_report(d, report([], "exit", seq=2))
        self.assertEqual(cr.load_report(d)["trigger"], "exit")

    def test_load_report_through_a_cli(self):
        d = os.path.join(self.tmp, "r")
        path = write_report(d, report([group("cudaMalloc", "device", 7)]))
        cli = os.path.join(self.tmp, "cudaleak")
        with open(cli, "w") as f:
            f.write('#!/bin/sh\n[ "$1 $2 $3" = "report --format json" ] || exit 9\nexec cat "$4"\n')
        os.chmod(cli, 0o755)
        self.assertEqual(cr.load_report(path, cli=cli)["leaks"][0]["bytes"], 7)
        with open(cli, "w") as f:
            f.write("#!/bin/sh\necho broken >&2\nexit 3\n")
        with self.assertRaises(RuntimeError):
            cr.load_report(path, cli=cli)

    def test_groups_at(self):
        g1 = group("cudaMalloc", "device", 10, native=[nframe(None), nframe("leak_malloc()", "/src/leaks.cu", 42),
                                                       nframe("main", "/src/leaks.cu", 120)])
        g2 = group("cudaMalloc", "device", 20, native=[nframe("other()", "/src/leaks.cu", 50),
                                                       nframe("leak_malloc()", "/src/leaks.cu", 42)])
        g3 = group("cudaMalloc", "device", 30, python=[pframe("Model.step", "/x/stacks.py", 7), pframe("<module>", "/x/stacks.py", 99)])
        r = report([g1, g2, g3])
        self.assertEqual(cr.groups_at(r, 42, "leaks.cu", "leak_malloc", stack="native"), [g1, g2])
        self.assertEqual(cr.groups_at(r, 42, "leaks.cu", "leak_malloc", stack="native", innermost=True), [g1])
        self.assertEqual(cr.groups_at(r, 7, "stacks.py", "step"), [g3])
        self.assertEqual(cr.groups_at(r, 99, "stacks.py"), [g3])
        self.assertEqual(cr.groups_at(r, 8, "stacks.py"), [])
        peak = report([], peak={"bytes": 5, "timestamp_ms": 1, "groups": [g3]})
        self.assertEqual(cr.groups_at(peak, 7, "stacks.py", key="peak"), [g3])

    def test_block_sizes(self):
        gs = [group("a", "device", 30, 2, examples=[{"address": "0x1", "size": 10}, {"address": "0x2", "size": 20}]),
              group("b", "device", 7, 2)]
        self.assertEqual(cr.block_sizes(gs), [3, 4, 10, 20])


# --- compute-sanitizer and PyTorch's messages -----------------------------------

SANITIZER_OLD = """========= CUDA-MEMCHECK
========= Leaked 10 bytes at 0x1303d80000
=========     Saved host backtrace up to driver entry point at cudaMalloc time
=========     Host Frame:/lib64/libcuda.so.1 (cuMemAlloc_v2 + 0x1b7) [0x26ec97]
=========     Host Frame:./leak [0x2bab3]
=========
========= LEAK SUMMARY: 10 bytes leaked in 1 allocations
========= ERROR SUMMARY: 1 error
"""

SANITIZER_NEW = """========= COMPUTE-SANITIZER
planted cudaMalloc device 1048576 leak_malloc
done
========= Leaked 1,048,576 bytes at 0x7f26c3000000
=========     Saved host backtrace up to driver entry point at allocation time
=========         Host Frame: leak_malloc() [0x89bb] in leaks
=========
========= Leaked 2,097,152 bytes at 0x7f26c3200000 called My allocation
=========
========= Leaked 16 bytes at 0x4012ffff6 on the device heap
=========
========= Leaked 3145728 bytes at 0x7f26c3400000
========= Leaked 4194304 bytes at 0x7f26c3800000
=========
========= LEAK SUMMARY: 10485776 bytes leaked in 5 allocations
========= ERROR SUMMARY: 5 errors
"""


class Sanitizer(Base):
    def test_old_format(self):
        s = cr.parse_sanitizer(SANITIZER_OLD)
        self.assertEqual(s, {"sizes": [10], "device_heap": [], "summary": (10, 1)})

    def test_new_format(self):
        s = cr.parse_sanitizer(SANITIZER_NEW)
        self.assertEqual(s["sizes"], [MiB, 2 * MiB, 3 * MiB, 4 * MiB])
        self.assertEqual(s["device_heap"], [16])
        self.assertEqual(s["summary"], (10485776, 5))

    def test_no_leaks(self):
        s = cr.parse_sanitizer("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
        self.assertEqual(s, {"sizes": [], "device_heap": [], "summary": None})


class TorchMessages(Base):
    def test_sizes(self):
        self.assertEqual(cr.parse_torch_size("117.19 GiB"), (int(round(117.19 * GiB)), GiB * 0.005))
        self.assertEqual(cr.parse_torch_size("640.00 MiB")[0], 640 * MiB)
        self.assertEqual(cr.parse_torch_size("512 bytes"), (512, 0))
        with self.assertRaises(ValueError):
            cr.parse_torch_size("lots")

    def test_oom_messages(self):
        caching = ("CUDA out of memory. Tried to allocate 210.53 GiB. GPU 0 has a total capacity of 139.72 GiB of which "
                   "138.90 GiB is free. Of the allocated memory 3.05 MiB is allocated by PyTorch, and 18.95 MiB is "
                   "reserved by PyTorch but unallocated.")
        n, prec, which = cr.parse_oom_request(caching)
        self.assertEqual(which, "Tried to allocate")
        self.assertEqual(n, int(round(210.53 * GiB)))
        asyncm = ("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 3.05 MiB\n"
                  "Requested               : 210.53 GiB\nDevice limit            : 139.72 GiB\n")
        self.assertEqual(cr.parse_oom_request(asyncm)[2], "Requested")
        with self.assertRaises(ValueError):
            cr.parse_oom_request("CUDA error: out of memory")


# --- nvcc and python sections ---------------------------------------------------


def planted_text():
    return ("planted cudaMalloc device 1048576 leak_malloc\nplanted cudaMallocAsync device 2097152 leak_malloc_async\n"
            "planted cudaMallocHost host 3145728 leak_malloc_host\nplanted cudaMallocManaged managed 4194304 leak_malloc_managed\n"
            "planted cuMemCreate physical 2097152 leak_mem_create\ndone\n")


def nvcc_groups():
    out = []
    for p in cr.parse_planted(planted_text()):
        line = cr.marker_line(cr.LEAKS_CU, "LEAK " + p["api"])
        native = [nframe(None, None, None, "/tmp/leaks"),  # static cudart, no line information
                  nframe(p["function"] + "()", cr.LEAKS_CU, line, "/tmp/leaks"),
                  nframe("main", cr.LEAKS_CU, 200, "/tmp/leaks")]
        out.append(group(p["api"], p["memory"], p["bytes"], native=native,
                         examples=[{"address": "0x7f0000000000", "size": p["bytes"]}]))
    return out


class Nvcc(Base):
    def setUp(self):
        super().setUp()
        self.planted = os.path.join(self.tmp, "planted.txt")
        with open(self.planted, "w") as f:
            f.write(planted_text())
        self.d = os.path.join(self.tmp, "r")
        self.san = os.path.join(self.tmp, "sanitizer.txt")
        with open(self.san, "w") as f:
            f.write(SANITIZER_NEW.replace("========= Leaked 16 bytes at 0x4012ffff6 on the device heap\n", "")
                    .replace("10485776 bytes leaked in 5", "10485760 bytes leaked in 4"))

    def test_exact_match_passes(self):
        write_report(self.d, report(nvcc_groups()))
        res = self.run_checks(cr.check_nvcc, self.d, self.planted)
        self.assertAllPass(res)
        self.assertEqual(len(res), 7)  # list, 5 leaks, nothing else
        res = self.run_checks(cr.check_sanitizer, self.d, self.san)
        self.assertAllPass(res)

    def test_found_none_fails_every_leak(self):
        write_report(self.d, report([]))
        res = self.run_checks(cr.check_nvcc, self.d, self.planted)
        fails = sorted(n for n, (s, _) in res.items() if s == "FAIL")
        self.assertEqual(fails, ["nvcc cuMemCreate", "nvcc cudaMalloc", "nvcc cudaMallocAsync",
                                 "nvcc cudaMallocHost", "nvcc cudaMallocManaged"])
        res = self.run_checks(cr.check_sanitizer, self.d, self.san)
        self.assertEqual(res["nvcc sanitizer same leaks"][0], "FAIL")

    def test_wrong_line_size_or_extra_block_fails(self):
        gs = nvcc_groups()
        gs[0]["native_stack"][1]["line"] += 1  # cudaMalloc attributed to the next line
        gs[1]["bytes"] += 512  # cudaMallocAsync size off
        gs.append(group("cuMemAlloc_v2", "device", 64, native=[nframe("clean()", cr.LEAKS_CU, 90)]))
        write_report(self.d, report(gs))
        res = self.run_checks(cr.check_nvcc, self.d, self.planted)
        self.assertEqual(res["nvcc cudaMalloc"][0], "FAIL")
        self.assertEqual(res["nvcc cudaMallocAsync"][0], "FAIL")
        self.assertEqual(res["nvcc cudaMallocHost"][0], "PASS")
        self.assertEqual(res["nvcc nothing else"][0], "FAIL")

    def test_sanitizer_differs_or_unparsed(self):
        gs = [g for g in nvcc_groups() if g["api"] != "cudaMallocHost"]
        write_report(self.d, report(gs))
        res = self.run_checks(cr.check_sanitizer, self.d, self.san)
        self.assertEqual(res["nvcc sanitizer output parsed"][0], "PASS")
        self.assertEqual(res["nvcc sanitizer same leaks"][0], "FAIL")
        with open(self.san, "w") as f:
            f.write("========= Leaked 5 bytes at 0x1\n")  # no summary: a format the parser does not know
        res = self.run_checks(cr.check_sanitizer, self.d, self.san)
        self.assertEqual(res["nvcc sanitizer output parsed"][0], "FAIL")

    def test_cli_main(self):
        write_report(self.d, report(nvcc_groups()))
        p = subprocess.run([sys.executable, os.path.join(HERE, "check_report.py"), "nvcc", self.d, self.planted,
                            "--name", "nvcc reset", "--sanitizer", self.san], stdout=subprocess.PIPE, env=dict(os.environ))
        self.assertEqual(p.returncode, 0, p.stdout.decode())
        lines = p.stdout.decode().splitlines()
        self.assertEqual(len(lines), 9)
        self.assertTrue(all(l.startswith("CHECK nvcc reset ") for l in lines))
        write_report(self.d, report([], seq=2))
        p = subprocess.run([sys.executable, os.path.join(HERE, "check_report.py"), "nvcc", self.d, self.planted],
                           stdout=subprocess.PIPE, env=dict(os.environ))
        self.assertEqual(p.returncode, 1)
        p = subprocess.run([sys.executable, os.path.join(HERE, "check_report.py"), "nvcc", os.path.join(self.tmp, "none"),
                            self.planted], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        self.assertEqual(p.returncode, 1)
        self.assertIn("CHECK nvcc: FAIL checker error", p.stdout.decode())


def stacks_groups(mode="all"):
    want = cr.STACKS_ALL if mode == "all" else {"deadlock": (1, 1008)}
    out = []
    for m, (blocks, nbytes) in want.items():
        line = cr.marker_line(cr.STACKS_PY, "# LEAK " + m)
        out.append(group("cudaMalloc", "device", nbytes, blocks,
                         python=[pframe("malloc", "/r/tests/python/sim.py", 21), pframe(m, cr.STACKS_PY, line)]))
    return out


class Stacks(Base):
    def test_pass_and_fail(self):
        d = os.path.join(self.tmp, "all")
        write_report(d, report(stacks_groups(), python="CPython 3.12"))
        res = self.run_checks(cr.check_stacks, d, "all")
        self.assertAllPass(res)
        self.assertEqual(len(res), 12)
        gs = stacks_groups()
        gs[0]["python_stack"][1]["line"] -= 1
        write_report(d, report(gs, seq=2, python="CPython 3.12"))
        res = self.run_checks(cr.check_stacks, d, "all")
        self.assertEqual([n for n, (s, _) in res.items() if s == "FAIL"], ["python all cdll"])
        d = os.path.join(self.tmp, "deadlock")
        write_report(d, report(stacks_groups("deadlock"), python="off (CUDALEAK_PYTHON=0)"))
        res = self.run_checks(cr.check_stacks, d, "deadlock")
        self.assertEqual(res["python deadlock capture"][0], "FAIL")
        self.assertEqual(res["python deadlock deadlock"][0], "PASS")


# --- graphs section: gpu/graphs_resets.cu ---------------------------------------

GCU = cr.GRAPHS_CU
GBIN = "/tmp/cudaleak-gpu.x/graphs/graphs"


def graphs_account(mode):
    """What gpu/graphs_resets.cu MODE prints: its leak/clean/dump lines as
    GRAPH_MODES states them, with info lines and done."""
    spec = cr.GRAPH_MODES[mode]
    lines = ["info free at start 150000000000"]
    if "dump" in spec:
        lines.append("dump %s %d %d" % spec["dump"])
        lines.append("info cudaleak_dump rc 0 after 3 loads")
    for l in spec.get("leaks", []):
        lines.append("leak %s %s %d %d %s" % (l["marker"], l["api"], l["blocks"], l["bytes"], l["function"]))
    for c in spec.get("cleans", []):
        lines.append("clean %s %s %d %d %s" % (c["marker"], c["api"], c["bytes"], c["launches"], c["function"]))
    lines.append("done %s" % mode)
    return "\n".join(lines) + "\n"


def graphs_frames(function, marker, prefix="LEAK "):
    line = cr.marker_line(GCU, prefix + marker)
    return [nframe(None, None, None, GBIN),  # static cudart, no line information
            nframe(function + "()", GCU, line, GBIN), nframe("main", GCU, 300, GBIN)]


def graphs_group(l, blocks=None, nbytes=None):
    """The group a correct report has for the planted leak `l` (module
    bytes: the 1 MiB global of each block, plus some, as far as known)."""
    blocks = l["blocks"] if blocks is None else blocks
    nbytes = (l["bytes"] * blocks // l["blocks"] + (4096 if l["at_least"] else 0)) if nbytes is None else nbytes
    extra = {}
    if l["kind"]:
        extra["memory_kind"] = l["kind"]
    if l["torn"]:
        extra["torn_down_blocks"] = l["torn"]
        extra["torn_down_bytes"] = nbytes
    return group(l["api"], l["memory"] or "device", nbytes, blocks, native=graphs_frames(l["function"], l["marker"]),
                 examples=[{"address": "0x7f0000000000", "size": nbytes // blocks}], **extra)


def graphs_report(mode, seq=2):
    """A correct exit report of MODE."""
    spec = cr.GRAPH_MODES[mode]
    gs = [graphs_group(l) for l in spec.get("leaks", [])]
    r = report(gs, seq=seq)
    t = r["totals"]
    if "min_allocations" in spec:
        t["allocations"] = spec["min_allocations"] + 1  # one paired runtime allocation besides
        t["frees"] = t["allocations"] - spec["net_blocks"]
    if "min_peak" in spec:
        t["peak_bytes"] = spec["min_peak"]
    t.update(spec.get("totals", {}))
    return r


class Graphs(Base):
    def setUp(self):
        super().setUp()
        self.d = os.path.join(self.tmp, "r")

    def write(self, mode, r=None, account=None, under=None, dump=True):
        """The run of MODE: its report(s), its account without and under
        the library. Returns the checker's arguments."""
        spec = cr.GRAPH_MODES[mode]
        write_report(self.d, graphs_report(mode) if r is None else r)
        if "dump" in spec and dump:
            marker, blocks, _ = spec["dump"]
            l = [x for x in spec["leaks"] if x["marker"] == marker][0]
            write_report(self.d, report([graphs_group(l, blocks)], "api", seq=1))
        acc = os.path.join(self.tmp, mode + ".planted.txt")
        with open(acc, "w") as f:
            f.write(graphs_account(mode) if account is None else account)
        run = os.path.join(self.tmp, mode + ".run.txt")
        with open(run, "w") as f:
            f.write(graphs_account(mode) if under is None else under)
        return self.d, mode, acc, None, GCU, run

    def check(self, *args):
        return self.run_checks(cr.check_graphs, *args)

    def fails(self, res):
        return sorted(n for n, (s, _) in res.items() if s == "FAIL")

    def test_markers_are_on_their_calls_in_their_functions(self):
        with open(GCU) as f:
            text = f.read().splitlines()
        for mode, spec in cr.GRAPH_MODES.items():
            for prefix, items in (("LEAK ", spec.get("leaks", [])), ("CLEAN ", spec.get("cleans", []))):
                for it in items:
                    line = cr.marker_line(GCU, prefix + it["marker"])
                    api = it["api"][:-len("_ptsz")] if it["api"].endswith("_ptsz") else it["api"]
                    self.assertIn(api + "(", text[line - 1], (mode, it["marker"]))
                    # The nearest function definition above is the one named.
                    defs = [l for l in text[:line] if l.startswith("void ")]
                    self.assertTrue(defs[-1].startswith("void %s(" % it["function"]), (mode, defs[-1]))

    def test_every_mode_passes(self):
        counts = {}
        for mode in cr.GRAPH_MODES:
            shutil.rmtree(self.d, ignore_errors=True)
            res = self.check(*self.write(mode))
            self.assertAllPass(res)
            counts[mode] = len(res)
        # account, account under cudaleak, exit report, one per leak and
        # clean, nothing else, then each mode's totals, modules and dump.
        self.assertEqual(counts, {"graph_leak": 7, "graph_paired": 7, "capture": 8, "auto_free": 7, "trim": 7,
                                  "reset_peak": 7, "thread_exit": 7, "pool": 5, "pool_ptsz": 5, "module": 6,
                                  "module_loop": 7})

    def test_graph_leak_wrong_kind_api_or_line(self):
        args = self.write("graph_leak")
        r = graphs_report("graph_leak", seq=3)
        del r["leaks"][0]["memory_kind"]  # reported as plain cudaMalloc-like device memory
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs graph_leak graph_node"])
        r = graphs_report("graph_leak", seq=4)
        r["leaks"][0]["api"] = "cuGraphAddMemAllocNode"  # the runtime call not recognized
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs graph_leak graph_node"])
        r = graphs_report("graph_leak", seq=5)
        r["leaks"][0]["native_stack"][1]["line"] += 1  # at the instantiate or launch line
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs graph_leak graph_node", "graphs graph_leak nothing else"])
        r = graphs_report("graph_leak", seq=6)
        r["leaks"][0]["blocks"] = 2  # recorded at the node's addition and at the launch
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs graph_leak graph_node"])

    def test_graph_leak_found_none(self):
        r = graphs_report("graph_leak")
        r["leaks"] = []
        r["totals"].update(allocations=0, frees=0, peak_bytes=0)
        res = self.check(*self.write("graph_leak", r))
        self.assertEqual(self.fails(res), ["graphs graph_leak allocations and frees", "graphs graph_leak graph_node",
                                           "graphs graph_leak peak"])

    def test_paired_graph_left_or_not_seen(self):
        # The free node missed: the block stays at the alloc node's line.
        spec = cr.GRAPH_MODES["graph_paired"]
        c = spec["cleans"][0]
        r = graphs_report("graph_paired")
        r["leaks"] = [group("cudaGraphAddMemAllocNode", "device", c["bytes"], 3, memory_kind="graph",
                            native=graphs_frames(c["function"], c["marker"], "CLEAN "))]
        r["totals"]["frees"] = 0
        res = self.check(*self.write("graph_paired", r))
        self.assertEqual(self.fails(res), ["graphs graph_paired allocations and frees", "graphs graph_paired graph_paired freed"])
        # The launches not seen at all: nothing left, but nothing counted.
        r = graphs_report("graph_paired", seq=3)
        r["totals"].update(allocations=1, frees=1, peak_bytes=4096)
        write_report(self.d, r)
        res = self.check(self.d, "graph_paired", os.path.join(self.tmp, "graph_paired.planted.txt"))
        self.assertEqual(self.fails(res), ["graphs graph_paired allocations and frees", "graphs graph_paired peak"])

    def test_capture_paired_part_not_in_the_peak(self):
        r = graphs_report("capture")
        r["totals"]["peak_bytes"] = 4 * MiB
        self.assertEqual(self.fails(self.check(*self.write("capture", r))), ["graphs capture peak"])

    def test_auto_free_not_followed(self):
        l = cr.GRAPH_MODES["auto_free"]["leaks"][0]
        r = graphs_report("auto_free")
        r["leaks"] = [graphs_group(l, 3)]  # every launch's block left
        r["totals"]["frees"] -= 2
        self.assertEqual(self.fails(self.check(*self.write("auto_free", r))),
                         ["graphs auto_free allocations and frees", "graphs auto_free auto_free"])

    def test_reset_peak_torn_down_missing(self):
        for mode in ("reset_peak", "thread_exit"):
            shutil.rmtree(self.d, ignore_errors=True)
            r = graphs_report(mode)
            g = r["leaks"][0]
            del g["torn_down_blocks"], g["torn_down_bytes"]
            for k in ("torn_down_blocks", "torn_down_bytes"):
                del r["totals"][k]
            r["totals"]["live_bytes"] = 128 * MiB  # the reset not seen: both blocks live
            r["totals"]["peak_bytes"] = 128 * MiB
            res = self.check(*self.write(mode, r))
            self.assertEqual(self.fails(res), ["graphs %s before_reset" % mode, "graphs %s totals" % mode])

    def test_reset_peak_counts_the_torn_down_block_twice(self):
        r = graphs_report("reset_peak")
        r["totals"]["peak_bytes"] = 128 * MiB
        res = self.check(*self.write("reset_peak", r))
        self.assertEqual(self.fails(res), ["graphs reset_peak totals"])
        self.assertIn("peak_bytes 134217728", res["graphs reset_peak totals"][1])

    def test_reset_torn_down_on_the_wrong_block(self):
        r = graphs_report("reset_peak")
        a, b = r["leaks"]
        b["torn_down_blocks"], b["torn_down_bytes"] = a.pop("torn_down_blocks"), a.pop("torn_down_bytes")
        self.assertEqual(self.fails(self.check(*self.write("reset_peak", r))),
                         ["graphs reset_peak after_reset", "graphs reset_peak before_reset"])

    def test_an_extra_leak_fails_nothing_else(self):
        for mode in ("graph_leak", "reset_peak", "module"):
            shutil.rmtree(self.d, ignore_errors=True)
            r = graphs_report(mode)
            r["leaks"].append(group("cudaMalloc", "device", 4096, native=[nframe("module_load()", GCU, 250, GBIN)]))
            res = self.check(*self.write(mode, r))
            self.assertEqual(self.fails(res), ["graphs %s nothing else" % mode])

    def test_pool_api_names(self):
        r = graphs_report("pool_ptsz")
        r["leaks"][0]["api"] = "cudaMallocFromPoolAsync"  # the _ptsz entry point not named
        self.assertEqual(self.fails(self.check(*self.write("pool_ptsz", r))), ["graphs pool_ptsz pool"])
        # The plain build run as pool_ptsz: the program's own account says so.
        acc = graphs_account("pool").replace("done pool", "done pool_ptsz")
        self.assertEqual(self.fails(self.check(*self.write("pool_ptsz", account=acc, under=acc))),
                         ["graphs pool_ptsz account"])
        shutil.rmtree(self.d, ignore_errors=True)
        r = graphs_report("pool")
        r["leaks"][0]["memory_kind"] = "graph"  # pool memory is no graph memory
        args = self.write("pool", r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs pool pool"])

    def test_module(self):
        l = cr.GRAPH_MODES["module"]["leaks"][0]
        # Bytes unknown (0) or the kind not set: fails.
        for change in ({"bytes": 0}, {"memory_kind": None}, {"api": "cuModuleLoadData"}):
            shutil.rmtree(self.d, ignore_errors=True)
            r = graphs_report("module")
            r["leaks"][0].update(change)
            self.assertEqual(self.fails(self.check(*self.write("module", r))), ["graphs module module"], change)
        # The runtime's own module reported: one check fails, not every mode's nothing else.
        r = graphs_report("module", seq=9)
        r["leaks"].append(group("cuLibraryLoadData", "device", 0, memory_kind="module",
                                native=[nframe("__cudaRegisterLinkedBinary", None, None, GBIN), nframe("main", GCU, 300, GBIN)]))
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*self.write("module", r))), ["graphs module modules only at the load"])
        # In another mode it is no extra leak, and its load, counted as an
        # allocation, is allowed for.
        shutil.rmtree(self.d, ignore_errors=True)
        r = graphs_report("graph_leak")
        r["leaks"].append(group("cuLibraryLoadData", "device", 0, memory_kind="module", native=[nframe("main", GCU, 300, GBIN)]))
        r["totals"]["allocations"] += 1
        self.assertAllPass(self.check(*self.write("graph_leak", r)))
        self.assertEqual(l["bytes"], MiB)

    def test_reset_with_the_runtimes_module_torn_down(self):
        # The runtime's own module (no globals: 0 B) loaded before the reset
        # and again after it: a module is no leak, so its torn-down block
        # is in no total (the library counts only leaks there).
        r = graphs_report("reset_peak")
        at_main = [nframe("__cudaRegisterLinkedBinary", None, None, GBIN), nframe("main", GCU, 300, GBIN)]
        r["leaks"].append(group("cuLibraryLoadData", "device", 0, 2, memory_kind="module", native=at_main,
                                torn_down_blocks=1))
        self.assertAllPass(self.check(*self.write("reset_peak", r)))
        r = graphs_report("reset_peak", seq=3)
        r["totals"]["torn_down_blocks"] = 2  # a second torn-down block nowhere in the leaks
        write_report(self.d, r)
        self.assertEqual(self.fails(self.check(*self.write("reset_peak", r))), ["graphs reset_peak totals"])

    def test_module_loop(self):
        l = cr.GRAPH_MODES["module_loop"]["leaks"][0]
        args = self.write("module_loop", dump=False)  # no live dump written
        self.assertEqual(self.fails(self.check(*args)), ["graphs module_loop live dump"])
        write_report(self.d, report([graphs_group(l, 5)], "api", seq=1))  # the dump saw all 5: it came late
        self.assertEqual(self.fails(self.check(*args)), ["graphs module_loop live dump"])
        shutil.rmtree(self.d, ignore_errors=True)
        r = graphs_report("module_loop")
        r["leaks"] = [graphs_group(l, 1)]  # one block per handle not kept: the loads merged
        self.assertEqual(self.fails(self.check(*self.write("module_loop", r))), ["graphs module_loop module"])

    def test_account_missing_or_different_under_the_library(self):
        res = self.check(*self.write("graph_leak", account="graphs_resets.cu:97: cudaGraphLaunch(exec, 0) = 801\n"))
        self.assertEqual(self.fails(res), ["graphs graph_leak account", "graphs graph_leak account under cudaleak"])
        under = graphs_account("trim").replace("done trim\n", "")  # exited early under the library
        self.assertEqual(self.fails(self.check(*self.write("trim", under=under))), ["graphs trim account under cudaleak"])
        acc = graphs_account("trim") + "leak trim cudaGraphAddMemAllocNode 1 16777216 trim_graph_pool\n"
        self.assertEqual(self.fails(self.check(*self.write("trim", account=acc, under=acc))), ["graphs trim account"])

    def test_no_exit_report(self):
        r = graphs_report("graph_leak")
        r["trigger"] = "signal"  # the program died before its exit report
        args = self.write("graph_leak", r)
        self.assertEqual(self.fails(self.check(*args)), ["graphs graph_leak exit report"])

    def test_parse_account(self):
        a = cr.parse_graphs_account("leak x cudaMalloc 1 5 f\nclean y api 7 3 g\ndump m 3 9\ninfo 1 2\nleak bad cudaMalloc one 5 f\ndone x\n")
        self.assertEqual(a, {"leaks": [("x", "cudaMalloc", 1, 5, "f")], "cleans": [("y", "api", 7, 3, "g")],
                             "dumps": [("m", 3, 9)], "done": ["x"]})

    def test_cli_main(self):
        d, mode, acc, _, _, run = self.write("capture")
        script = os.path.join(HERE, "check_report.py")
        p = subprocess.run([sys.executable, script, "graphs", d, mode, acc, "--under", run], stdout=subprocess.PIPE,
                           env=dict(os.environ))
        self.assertEqual(p.returncode, 0, p.stdout.decode())
        lines = p.stdout.decode().splitlines()
        self.assertEqual(len(lines), 8)
        self.assertTrue(all(l.startswith("CHECK graphs capture ") and ": PASS " in l for l in lines), lines)
        p = subprocess.run([sys.executable, script, "graphs", d, "reset_peak", acc], stdout=subprocess.PIPE,
                           env=dict(os.environ))
        self.assertEqual(p.returncode, 1)
        p = subprocess.run([sys.executable, script, "graphs", d, "bogus", acc], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=dict(os.environ))
        self.assertEqual(p.returncode, 2)
        p = subprocess.run([sys.executable, script, "graphs", os.path.join(self.tmp, "none"), mode, acc],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        self.assertEqual(p.returncode, 1)
        self.assertIn("CHECK graphs capture: FAIL checker error", p.stdout.decode())


# --- torch_checks.py verify -------------------------------------------------------

TORCH = os.path.basename(tc.SRC)


def tline(marker):
    return cr.marker_line(tc.SRC, marker)


def at_train_step():
    return [pframe("train_step", tc.SRC, tline("LEAK train_step")), pframe("leak", tc.SRC, 60), pframe("<module>", tc.SRC, 300)]


class TorchLeak(Base):
    def setUp(self):
        super().setUp()
        self.d = os.path.join(self.tmp, "leak")
        self.truth = {"kept": 5, "nbytes": [262144] * 5, "dumped": True}

    def test_no_cache_exact(self):
        g = group("cudaMalloc", "device", 5 * 262144, 5, python=at_train_step())
        noise = group("cudaMalloc", "device", 64 * MiB, 1, python=[])
        write_report(self.d, report([noise, g], "api"))
        write_report(self.d, report([noise], "exit", seq=2))
        self.assertAllPass(self.run_checks(tc.verify_leak, "no-cache", self.d, self.truth, "t"))

    def test_found_none_or_wrong(self):
        write_report(self.d, report([], "api"))
        res = self.run_checks(tc.verify_leak, "no-cache", self.d, self.truth, "t")
        self.assertEqual((res["t blocks"][0], res["t bytes"][0], res["t api"][0]), ("FAIL", "FAIL", "FAIL"))
        g = group("cudaMallocAsync", "device", 5 * 262144, 5, python=at_train_step())
        write_report(self.d, report([g], "api", seq=2))
        res = self.run_checks(tc.verify_leak, "no-cache", self.d, self.truth, "t")
        self.assertEqual(res["t api"][0], "FAIL")
        self.assertAllPass(self.run_checks(tc.verify_leak, "async", self.d, self.truth, "t"))

    def test_no_dump(self):
        os.makedirs(self.d)
        res = self.run_checks(cr.guarded("t")(tc.verify_leak), "no-cache", self.d, self.truth, "t")
        self.assertEqual(res["t api dumps"][0], "FAIL")
        self.assertEqual(res["t"][0], "FAIL")

    def test_expandable_lower_bound(self):
        write_report(self.d, report([group("cuMemCreate", "physical", 2 * MiB), group("cuMemAddressReserve", "reservation", 1 << 36)], "api"))
        self.assertAllPass(self.run_checks(tc.verify_leak, "expandable", self.d, self.truth, "t"))
        write_report(self.d, report([group("cuMemAddressReserve", "reservation", 1 << 36)], "api", seq=2))
        res = self.run_checks(tc.verify_leak, "expandable", self.d, self.truth, "t")
        self.assertEqual(res["t physical memory"][0], "FAIL")


class TorchClean(Base):
    def test_clean(self):
        rep = report([group("cudaMalloc", "device", 262144, python=at_train_step())], "api")
        truth = {"available": True, "clean_error": None, "leaky_report": rep, "kept": 1, "kept_nbytes": 262144}
        self.assertAllPass(self.run_checks(tc.verify_clean, self.tmp, truth, "t"))
        truth.update(clean_error="cudaleak: clean training steps leaked 2 MiB", leaky_report=None)
        res = self.run_checks(tc.verify_clean, self.tmp, truth, "t")
        self.assertEqual((res["t clean region"][0], res["t leaky region"][0]), ("FAIL", "FAIL"))


class TorchPhases(Base):
    def _phases(self, leaky, per_dump, trend):
        d = os.path.join(self.tmp, "phases" if leaky else "clean")
        fn, marker = ("grow_phase", "LEAK phase") if leaky else ("churn_phase", "CHURN phase")
        for k, nbytes in enumerate(per_dump, 1):
            g = group("cudaMalloc", "device", nbytes, nbytes // (20 * MiB), trend=trend if k == 3 else None,
                      pytorch_cache_segment=True, python=[pframe(fn, tc.SRC, tline(marker)), pframe("phases", tc.SRC, 130)])
            write_report(d, report([g], "signal", seq=k))
        truth = {"leaky": leaky, "phases": 3, "per_phase": 20, "nbytes_each": 4 * MiB, "kept": 60 if leaky else 0}
        return self.run_checks(tc.verify_phases, d, truth, "t")

    def test_growing(self):
        self.assertAllPass(self._phases(True, [80 * MiB, 160 * MiB, 240 * MiB], "growing"))
        res = self._phases(True, [80 * MiB, 80 * MiB, 80 * MiB], "bounded")
        self.assertEqual([n for n, (s, _) in sorted(res.items()) if s == "FAIL"], ["t dump 2", "t dump 3", "t trend"])

    def test_churn(self):
        self.assertAllPass(self._phases(False, [20 * MiB] * 3, "bounded"))
        res = self._phases(False, [20 * MiB, 40 * MiB, 60 * MiB], "growing")
        self.assertEqual([n for n, (s, _) in sorted(res.items()) if s == "FAIL"], ["t dump 2", "t dump 3", "t nothing growing"])


def oom_truth(message):
    return {"free_before": 139 * GiB, "total": 140 * GiB, "reserved_before": 22 * MiB, "allocated_before": 3 * MiB,
            "nbytes": 208 * GiB + 12345 * 4, "raised": True, "message": message}


class TorchOom(Base):
    def _oom(self, preset, oom, leaks, message):
        d = os.path.join(self.tmp, "oom-" + preset)
        shutil.rmtree(d, ignore_errors=True)
        write_report(d, report(leaks, "oom", oom=oom))
        write_report(d, report([], "exit", seq=2))
        return self.run_checks(tc.verify_oom, preset, d, oom_truth(message), "t")

    def test_default(self):
        truth = oom_truth("")
        seg = cr.round_up(truth["nbytes"], 2 * MiB)
        msg = "CUDA out of memory. Tried to allocate %.2f GiB. GPU 0 has a total capacity of 140.00 GiB" % (seg / GiB)
        oom = {"api": "cudaMalloc", "requested_bytes": seg, "device_free_bytes": 139 * GiB - 50 * MiB,
               "python_stack": [pframe("oom", tc.SRC, tline("OOM request")), pframe("<module>", tc.SRC, 300)]}
        leaks = [group("cudaMalloc", "device", 20 * MiB, pytorch_cache_segment=True),
                 group("cudaMalloc", "device", 2 * MiB, pytorch_cache_segment=True),
                 group("cuMemAlloc_v2", "device", 64 * MiB)]  # cuBLAS's handle: not PyTorch's cache
        self.assertAllPass(self._oom("default", oom, leaks, msg))
        oom2 = dict(oom, requested_bytes=truth["nbytes"], python_stack=[], device_free_bytes=None)
        res = self._oom("default", oom2, leaks[2:], msg)
        bad = sorted(n for n, (s, _) in res.items() if s == "FAIL")
        self.assertEqual(bad, ["t device free", "t holders", "t line", "t request vs tensor"])

    def test_pytorch(self):
        n = oom_truth("")["nbytes"]
        msg = ("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 3.00 MiB\n"
               "Requested               : %.2f GiB\n" % (n / GiB))
        oom = {"api": "cudaMallocAsync", "requested_bytes": n, "device_free_bytes": 139 * GiB,
               "python_stack": [pframe("oom", tc.SRC, tline("OOM request"))]}
        leaks = [group("cudaMallocAsync", "device", 3 * MiB, 40)]
        self.assertAllPass(self._oom("pytorch", oom, leaks, msg))
        res = self._oom("pytorch", dict(oom, api="cudaMalloc", requested_bytes=n + 4 * GiB), leaks, msg)
        bad = sorted(n for n, (s, _) in res.items() if s == "FAIL")
        self.assertEqual(bad, ["t api", "t request vs message", "t request vs tensor"])

    def test_default_suppressed_holders_and_stated_free(self):
        # cuBLAS's workspaces are suppressed by default; PyTorch counts them
        # in memory_reserved(), and so does the holders check. The free
        # memory is compared with the message's, read after the failure.
        truth = oom_truth("")
        seg = cr.round_up(truth["nbytes"], 2 * MiB)
        msg = ("CUDA out of memory. Tried to allocate %.2f GiB. GPU 0 has a total capacity of 140.00 GiB of which "
               "31.12 MiB is free." % (seg / GiB))
        oom = {"api": "cudaMalloc", "requested_bytes": seg, "device_free_bytes": 31 * MiB,
               "python_stack": [pframe("oom", tc.SRC, tline("OOM request"))]}
        leaks = [group("cudaMalloc", "device", 2 * MiB, pytorch_cache_segment=True)]
        d = os.path.join(self.tmp, "oom-suppressed")
        write_report(d, report(leaks, "oom", oom=oom, suppressed=[
            group("cudaMalloc", "device", 20 * MiB, pytorch_cache_segment=True),
            group("cuMemAlloc_v2", "device", 64 * MiB)]))
        self.assertAllPass(self.run_checks(tc.verify_oom, "default", d, oom_truth(msg), "t"))
        # The figure before the request (139 GiB) is not what is compared.
        d2 = os.path.join(self.tmp, "oom-free")
        write_report(d2, report(leaks, "oom", oom=dict(oom, device_free_bytes=139 * GiB)))
        res = self.run_checks(tc.verify_oom, "default", d2, oom_truth(msg), "t")
        self.assertEqual(sorted(n for n, (s, _) in res.items() if s == "FAIL"), ["t device free", "t holders"])

    def test_parse_oom_free(self):
        self.assertEqual(cr.parse_oom_free("... of which 139.00 GiB is free. Including")[0], 139 * GiB)
        self.assertEqual(cr.parse_oom_free("Free (according to CUDA): 31.12 MiB\n")[0], int(round(31.12 * MiB)))
        self.assertIsNone(cr.parse_oom_free("CUDA error: out of memory"))

    def test_expandable(self):
        truth = oom_truth("")
        seg = cr.round_up(truth["nbytes"], 2 * MiB)
        msg = "CUDA out of memory. Tried to allocate %.2f GiB. GPU 0 ... of which 139.00 GiB is free." % (seg / GiB)
        # The segment held 22 MiB; PyTorch mapped about all free memory for
        # the request in 20 MiB pages before the driver refused one.
        mapped = 139 * GiB - 100 * MiB
        oom = {"api": "cuMemCreate", "requested_bytes": 20 * MiB, "device_free_bytes": 100 * MiB,
               "python_stack": [pframe("oom", tc.SRC, tline("OOM request"))]}
        leaks = [group("cuMemCreate", "physical", 22 * MiB + mapped, 3 + mapped // (20 * MiB), pytorch_cache_segment=True),
                 group("cuMemAddressReserve", "reservation", 157 * GiB, pytorch_cache_segment=True)]
        d = os.path.join(self.tmp, "oom-expandable")
        write_report(d, report(leaks, "oom", oom=oom))
        self.assertAllPass(self.run_checks(tc.verify_oom, "expandable", d, oom_truth(msg), "t"))
        d2 = os.path.join(self.tmp, "oom-expandable-2")
        write_report(d2, report(leaks[1:], "oom", oom=dict(oom, api="cuMemAlloc_v2", requested_bytes=seg)))
        res = self.run_checks(tc.verify_oom, "expandable", d2, oom_truth(msg), "t")
        self.assertEqual(sorted(n for n, (s, _) in res.items() if s == "FAIL"),
                         ["t api", "t device free", "t holders", "t request vs tensor"])

    def test_no_error_no_report(self):
        d = os.path.join(self.tmp, "none")
        write_report(d, report([], "exit"))
        truth = dict(oom_truth(None), raised=False)
        res = self.run_checks(cr.guarded("t")(tc.verify_oom), "default", d, truth, "t")
        self.assertEqual((res["t OutOfMemoryError"][0], res["t oom dumps"][0], res["t"][0]), ("FAIL", "FAIL", "FAIL"))


class Untouched(Base):
    # libc.so.6 stands for the library: preloading it changes nothing.
    LIB = "libc.so.6"

    def _fails(self, res):
        return sorted(n for n, (s, _) in res.items() if s == "FAIL")

    def test_same_behaviour_passes(self):
        cmd = ["sh", "-c", "echo out; echo err >&2; exit 7"]
        self.assertAllPass(self.run_checks(ut.compare, self.LIB, "t", cmd))

    def test_changed_output_status_or_files_fail(self):
        cmd = ["sh", "-c", 'echo "$LD_PRELOAD"; [ -z "$LD_PRELOAD" ] || { echo x >&2; exit 9; }']
        self.assertEqual(self._fails(self.run_checks(ut.compare, self.LIB, "t", cmd)),
                         ["t status", "t stderr", "t stdout"])
        cmd = ["sh", "-c", '[ -z "$CUDALEAK_DIR" ] || echo "{}" >"$CUDALEAK_DIR/cudaleak.x.json"']
        self.assertEqual(self._fails(self.run_checks(ut.compare, self.LIB, "t", cmd)), ["t files"])

    def test_cuda_program_may_report_but_not_leak(self):
        quiet = ["sh", "-c", '[ -z "$CUDALEAK_DIR" ] || { echo \'{"leaks": []}\' >"$CUDALEAK_DIR/r.json"; '
                 'echo "cudaleak: no leaks" >&2; }']
        self.assertAllPass(self.run_checks(ut.compare, self.LIB, "t", quiet, True))
        leaky = ["sh", "-c", '[ -z "$CUDALEAK_DIR" ] || echo \'{"leaks": [{"bytes": 4}]}\' >"$CUDALEAK_DIR/r.json"']
        self.assertEqual(self._fails(self.run_checks(ut.compare, self.LIB, "t", leaky, True)), ["t files"])


class Live(Base):
    MiB = 1 << 20

    def _files(self, view_bytes=None, free=70 << 30, prom_bytes=None, growing=128 << 20):
        steady, grow = cr.marker_line(lc.HERE, "LIVE steady"), cr.marker_line(lc.HERE, "LIVE growing")
        allocated = 192 * self.MiB
        truth = {"pid": 1, "memory_allocated": allocated, "free": 70 << 30, "total": 80 << 30,
                 "steady_line": steady, "growing_line": grow}
        view = {"live_bytes": allocated if view_bytes is None else view_bytes,
                "sites": [{"label": "cudaMalloc (device memory) at grow live_checks.py:%d" % grow, "live_bytes": growing},
                          {"label": "cudaMalloc (device memory) at steady live_checks.py:%d" % steady,
                           "live_bytes": 64 * self.MiB}],
                "driver_memory": [{"device": "0", "free_bytes": free, "total_bytes": 80 << 30}]}
        prom = ('cudaleak_live_bytes{job="j",host="h",pid="1",device="0"} %d\n'
                % (allocated if prom_bytes is None else prom_bytes))
        paths = []
        for name, data in (("truth.json", json.dumps(truth)), ("view.json", json.dumps(view)), ("m.prom", prom)):
            paths.append(os.path.join(self.tmp, name))
            with open(paths[-1], "w") as f:
                f.write(data)
        return paths

    def _fails(self, res):
        return sorted(n for n, (s, _) in res.items() if s == "FAIL")

    def test_agreeing_figures_pass(self):
        self.assertAllPass(self.run_checks(lc.verify, *self._files()))

    def test_each_disagreement_fails_its_check(self):
        self.assertEqual(self._fails(self.run_checks(lc.verify, *self._files(view_bytes=1))), ["live view bytes"])
        del cr._failed[:]
        self.assertEqual(self._fails(self.run_checks(lc.verify, *self._files(growing=1))), ["live view sites"])
        del cr._failed[:]
        self.assertEqual(self._fails(self.run_checks(lc.verify, *self._files(free=60 << 30))),
                         ["live view driver free"])
        del cr._failed[:]
        self.assertEqual(self._fails(self.run_checks(lc.verify, *self._files(prom_bytes=2))),
                         ["live metrics device bytes"])

    def test_no_nvml_fails_the_driver_checks(self):
        paths = self._files()
        with open(paths[1]) as f:
            view = json.load(f)
        view["driver_memory"] = {"unknown": "no NVML"}
        with open(paths[1], "w") as f:
            json.dump(view, f)
        self.assertEqual(self._fails(self.run_checks(lc.verify, *paths)),
                         ["live view driver free", "live view driver total"])


class ProcAddr(Base):
    def test_table_rows_cover_the_versions_the_runtime_asks_for(self):
        rows = pa.table_rows()
        self.assertIn(("cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 4010, 0), rows)
        self.assertIn(("cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset", 11000, 0), rows)
        self.assertIn(("cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020, pa.PER_THREAD_STREAM), rows)
        self.assertGreater(len(rows), 60)

    def _answers(self):
        qs = [("cuMemAlloc", 3020, 0, True), ("cuIpcOpenMemHandle", 4010, 0, True),
              ("cuGreenCtxCreate", 12040, 0, True), ("cuMemsetD8", 13000, 0, False)]
        plain = {("cuMemAlloc", 3020, 0): (0, 0, "libcuda.so.1", "cuMemAlloc_v2"),
                 ("cuIpcOpenMemHandle", 4010, 0): (0, 0, "libcuda.so.1", "cuIpcOpenMemHandle"),
                 ("cuGreenCtxCreate", 12040, 0): (500, 1, "-", "-"),  # an older driver lacks it
                 ("cuMemsetD8", 13000, 0): (0, 0, "libcuda.so.1", "cuMemsetD8_v2")}
        return qs, plain

    def test_hooks_pass(self):
        qs, plain = self._answers()
        under = {k: ((0, 0, "libcudaleak.so", v[3]) if k[0] != "cuMemsetD8" and v[0] == 0 else v) for k, v in plain.items()}
        self.assertAllPass(self.run_checks(pa.compare, plain, under, qs, "libcudaleak.so"))

    def test_driver_answer_wrong_variant_or_wrapped_other_fail(self):
        qs, plain = self._answers()
        under = dict(plain)
        under[("cuIpcOpenMemHandle", 4010, 0)] = (0, 0, "libcudaleak.so", "cuIpcOpenMemHandle_v2")
        under[("cuMemsetD8", 13000, 0)] = (0, 0, "libcudaleak.so", "cuMemsetD8_v2")
        res = self.run_checks(pa.compare, plain, under, qs, "libcudaleak.so")
        self.assertEqual(sorted(n for n, (s, _) in res.items() if s == "FAIL"),
                         ["procaddr hooks", "procaddr others", "procaddr variants"])
        res = self.run_checks(pa.compare, plain, {}, qs, "libcudaleak.so")
        self.assertEqual(res["procaddr probe"][0], "FAIL")


class TorchRanks(Base):
    def _run(self, leaky, status, reports, truths):
        d = os.path.join(self.tmp, "ranks")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        truth = os.path.join(self.tmp, "ranks.truth.json")
        for t in truths:
            cr.write_truth(t, "%s.rank%d" % (truth, t["rank"]))
        with open(truth + ".status", "w") as f:
            f.write("%d\n" % status)
        for r in reports:
            write_report(d, r)
        return self.run_checks(tc.verify_ranks, leaky, d, truth, "t")

    def test_leaky_and_clean(self):
        line = tline("LEAK rank")
        truths = [{"rank": r, "pid": 100 + r, "kept": r + 1, "nbytes": [MiB] * (r + 1)} for r in (0, 1)]
        reports = [report([group("cudaMallocAsync", "device", (r + 1) * MiB, r + 1,
                                 python=[pframe("ranks", tc.SRC, line)])], pid=100 + r, rank=r) for r in (0, 1)]
        self.assertAllPass(self._run(True, 23, reports, truths))
        # The gate passed, torchrun's own process reported, rank 1 lost a block.
        reports[1]["leaks"][0]["blocks"] = 1
        res = self._run(True, 0, reports + [report([], pid=99)], truths)
        self.assertEqual(sorted(n for n, (s, _) in res.items() if s == "FAIL"), ["t exit reports", "t gate", "t rank 1"])
        clean = [dict(t, kept=0, nbytes=[]) for t in truths]
        self.assertAllPass(self._run(False, 0, [report([], pid=100 + r, rank=r) for r in (0, 1)], clean))


class TorchPeak(Base):
    def _peak(self, preset, groups, truth):
        d = os.path.join(self.tmp, "peak-" + preset)
        shutil.rmtree(d, ignore_errors=True)
        total = sum(g["bytes"] for g in groups)
        write_report(d, report([], "api", peak_bytes=total, peak={"bytes": total, "timestamp_ms": 1, "groups": groups}))
        return self.run_checks(tc.verify_peak, preset, d, truth, "t")

    def test_pytorch(self):
        fwd = [pframe("forward", "/torch/nn/modules/linear.py", 125), pframe("peak", tc.SRC, tline("PEAK activations"))]
        groups = [group("cudaMallocAsync", "device", 1000 * MiB, 8, python=fwd),
                  group("cudaMallocAsync", "device", 1100 * MiB, 30),
                  group("cuMemAlloc_v2", "device", 64 * MiB)]
        truth = {"max_allocated": 2100 * MiB + 5 * MiB, "max_reserved": 2200 * MiB}
        self.assertAllPass(self._peak("pytorch", groups, truth))
        res = self._peak("pytorch", groups[1:], truth)
        self.assertEqual(sorted(n for n, (s, _) in res.items() if s == "FAIL"), ["t bytes", "t line"])

    def test_default(self):
        fwd = [pframe("peak", tc.SRC, tline("PEAK activations"))]
        groups = [group("cudaMalloc", "device", 2000 * MiB, 20, python=fwd, pytorch_cache_segment=True),
                  group("cudaMalloc", "device", 200 * MiB, 5, pytorch_cache_segment=True),
                  group("cuMemAlloc_v2", "device", 64 * MiB)]
        self.assertAllPass(self._peak("default", groups, {"max_allocated": 2100 * MiB, "max_reserved": 2200 * MiB}))
        res = self._peak("default", groups, {"max_allocated": 2100 * MiB, "max_reserved": 2300 * MiB})
        self.assertEqual(res["t bytes"][0], "FAIL")


class TorchVerifyCli(Base):
    def test_verify_command_needs_no_torch(self):
        d = os.path.join(self.tmp, "leak")
        write_report(d, report([group("cudaMalloc", "device", 5 * 262144, 5, python=at_train_step())], "api"))
        truth = write_json(os.path.join(self.tmp, "leak.truth.json"), {"kept": 5, "nbytes": [262144] * 5, "dumped": True})
        env = dict(os.environ, PYTHONPATH="")
        p = subprocess.run([sys.executable, "-S", tc.SRC, "verify", "leak", "no-cache", d, truth], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 0, p.stdout.decode() + p.stderr.decode())
        self.assertEqual(len(p.stdout.decode().splitlines()), 4)
        p = subprocess.run([sys.executable, "-S", tc.SRC, "verify", "leak", "no-cache", d, truth + ".missing"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.assertEqual(p.returncode, 1)
        self.assertIn("CHECK torch leak no-cache: FAIL checker error", p.stdout.decode())


# --- cupy_jax_checks.py verify ------------------------------------------------------


class Frameworks(Base):
    def test_cupy(self):
        d = os.path.join(self.tmp, "cupy")
        rt = [pframe("cupy_check", fw.SRC, cr.marker_line(fw.SRC, "LEAK cupy runtime"))]
        pool = [pframe("empty", "/cupy/_creation/basic.py", 34), pframe("cupy_check", fw.SRC, cr.marker_line(fw.SRC, "LEAK cupy pool"))]
        write_report(d, report([group("cudaMalloc", "device", 3 * MiB, python=pool), group("cudaMalloc", "device", MiB, python=rt)], "api"))
        truth = {"runtime_nbytes": MiB, "pool_nbytes": 3 * MiB, "live_since": [2, 4 * MiB], "dumped": True}
        self.assertAllPass(self.run_checks(fw.verify_cupy, d, truth))
        truth["live_since"] = [3, 5 * MiB]
        res = self.run_checks(fw.verify_cupy, d, truth)
        self.assertEqual(res["cupy live_since"][0], "FAIL")

    def test_jax(self):
        d = os.path.join(self.tmp, "jax")
        leaks = []
        for marker in ("LEAK jax device_put", "LEAK jax compute"):
            py = [pframe("jax_check", fw.SRC, cr.marker_line(fw.SRC, marker))]
            leaks.append(group("cuMemCreate", "physical", 4 * MiB, python=py))
            leaks.append(group("cuMemAddressReserve", "reservation", 4 * MiB, python=py))
        write_report(d, report(leaks, "api"))
        truth = {"device_put_nbytes": 4 * MiB, "compute_nbytes": 4 * MiB, "dumped": True}
        self.assertAllPass(self.run_checks(fw.verify_jax, d, truth))
        write_report(d, report(leaks[2:], "api", seq=2))
        res = self.run_checks(fw.verify_jax, d, truth)
        self.assertEqual((res["jax device_put"][0], res["jax compute"][0]), ("FAIL", "PASS"))


# --- The workloads themselves, on fake modules -----------------------------------------
# Not a test of PyTorch or cudaleak: that the workload code runs to its end
# and writes every field its checker reads, before GPU time is spent on it.

FAKE_TORCH = """
class OutOfMemoryError(RuntimeError):
    pass


class Tensor:
    def __init__(self, numel, esize=4):
        self._n, self._e = numel, esize
    def numel(self):
        return self._n
    def element_size(self):
        return self._e
    @property
    def nbytes(self):
        return self._n * self._e
    def __mul__(self, other):
        return Tensor(self._n, self._e)
    def square(self):
        return self
    def mean(self):
        return Tensor(1)
    def backward(self):
        pass


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def randn(*shape, device=None):
    return Tensor(_numel(shape))


def empty(*shape, device=None, dtype=None):
    n = _numel(shape)
    if n * 4 > cuda.mem_get_info()[0]:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate %.2f GiB. GPU 0 has a total capacity of 80.00 GiB" % (n * 4 / 2.0 ** 30))
    return Tensor(n)


def ones(*shape, device=None):
    return Tensor(_numel(shape))


def manual_seed(s):
    pass


class _Module:
    def __init__(self, *a):
        pass
    def cuda(self):
        return self
    def parameters(self):
        return []
    def __call__(self, x):
        return x


class nn:
    Linear = ReLU = Sequential = _Module


class optim:
    class SGD:
        def __init__(self, params, lr):
            pass
        def zero_grad(self, set_to_none=False):
            pass
        def step(self):
            pass


class cuda:
    OutOfMemoryError = OutOfMemoryError
    synchronize = staticmethod(lambda: None)
    mem_get_info = staticmethod(lambda: (10 << 30, 80 << 30))
    memory_reserved = staticmethod(lambda: 22 << 20)
    memory_allocated = staticmethod(lambda: 3 << 20)
    max_memory_allocated = staticmethod(lambda: 3000 << 20)
    max_memory_reserved = staticmethod(lambda: 3100 << 20)
    reset_peak_memory_stats = staticmethod(lambda: None)
"""

FAKE_CUDALEAK = """
import os, signal
_n = [0]
def _on_dump_signal(sig, frame):
    _n[0] += 1
    with open(os.path.join(os.environ["CUDALEAK_DIR"], "cudaleak.h.%d.1-a.%d.signal.json" % (os.getpid(), _n[0])), "w") as f:
        f.write("{}")
signal.signal(signal.SIGUSR1, _on_dump_signal)
def available():
    return True
def checkpoint():
    return 1
def live_since(cp):
    return (2, 4 << 20)
def leaks_since(cp):
    return {"leaks": []}
def format_groups(report, **kw):
    return "(groups)"
def dump(reason="python"):
    return True
class LeakError(AssertionError):
    def __init__(self, report):
        self.report = report
        AssertionError.__init__(self, "cudaleak: leaked")
class no_leaks:
    def __init__(self, where="", **kw):
        self.where = where
    def __enter__(self):
        return self
    def __exit__(self, et, e, tb):
        if et is None and "leaky" in self.where:
            raise LeakError({"leaks": [{"blocks": 1, "bytes": 262144, "api": "cudaMalloc", "memory": "device",
                                        "native_stack": [], "python_stack": []}]})
        return False
"""

FAKE_CUPY = """
class _A:
    def __init__(self, n):
        self.nbytes = n
    def sum(self):
        return self
class _Ctx:
    def __enter__(self):
        return self
    def __exit__(self, *a):
        return False
uint8 = "uint8"
def ones(n):
    return _A(8 * n)
def empty(n, dtype=None):
    return _A(n)
class cuda:
    class runtime:
        malloc = staticmethod(lambda n: 0x7000)
        deviceSynchronize = staticmethod(lambda: None)
    class MemoryPool:
        def malloc(self, n):
            return n
    using_allocator = staticmethod(lambda f: _Ctx())
"""

FAKE_JAX = """
class Array:
    def __init__(self, n):
        self.nbytes = n
    def block_until_ready(self):
        return self
    def __mul__(self, o):
        return Array(self.nbytes)
def device_put(a):
    return Array(a.nbytes)
"""

FAKE_JNP = """
from jax import Array
def ones(n):
    return Array(4 * n)
def arange(n):
    return Array(4 * n)
"""

FAKE_NUMPY = """
float32 = "float32"
class _A:
    def __init__(self, n):
        self.nbytes = 4 * n
def ones(n, dtype=None):
    return _A(n)
"""


class WorkloadSmoke(Base):
    def setUp(self):
        super().setUp()
        fake = os.path.join(self.tmp, "fake")
        for rel, text in (("torch/__init__.py", FAKE_TORCH), ("cudaleak/__init__.py", FAKE_CUDALEAK),
                          ("cupy/__init__.py", FAKE_CUPY), ("jax/__init__.py", FAKE_JAX),
                          ("jax/numpy.py", FAKE_JNP), ("numpy/__init__.py", FAKE_NUMPY)):
            os.makedirs(os.path.dirname(os.path.join(fake, rel)), exist_ok=True)
            with open(os.path.join(fake, rel), "w") as f:
                f.write(text)
        self.env = dict(os.environ, PYTHONPATH=fake)

    def workload(self, script, mode, *keys):
        d = os.path.join(self.tmp, mode)
        os.makedirs(d)
        truth = d + ".truth.json"
        p = subprocess.run([sys.executable, script, mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=dict(self.env, GPU_CHECK_TRUTH=truth, CUDALEAK_DIR=d), timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout.decode())
        t = cr.read_truth(truth)
        for k in keys:
            self.assertIn(k, t)
        return t, d

    def test_torch(self):
        t, _ = self.workload(tc.SRC, "leak", "kept", "nbytes", "dumped")
        self.assertEqual((t["kept"], t["nbytes"]), (5, [262144] * 5))
        t, _ = self.workload(tc.SRC, "clean", "available", "clean_error", "leaky_report", "kept", "kept_nbytes")
        self.assertEqual((t["clean_error"], t["kept_nbytes"]), (None, 262144))
        res = self.run_checks(tc.verify_clean, self.tmp, t, "t")
        self.assertEqual((res["t clean region"][0], res["t leaky region"][0]), ("PASS", "PASS"))
        self.assertEqual(res["t leaky line"][0], "FAIL")  # the fake LeakError has no stack
        t, d = self.workload(tc.SRC, "phases", "leaky", "phases", "per_phase", "nbytes_each", "kept")
        self.assertEqual((t["kept"], t["nbytes_each"], len(cr.report_files(d, "signal"))), (60, 4 << 20, 3))
        t, _ = self.workload(tc.SRC, "phases-clean", "leaky", "phases", "per_phase", "nbytes_each")
        t, _ = self.workload(tc.SRC, "oom", "free_before", "total", "reserved_before", "allocated_before",
                             "nbytes", "raised", "message")
        self.assertTrue(t["raised"])
        self.assertEqual(t["nbytes"], int((10 << 30) * 1.5) // 4 * 4)
        self.assertEqual(cr.parse_oom_request(t["message"])[2], "Tried to allocate")
        t, _ = self.workload(tc.SRC, "peak", "max_allocated", "max_reserved", "dumped")

    def test_frameworks(self):
        t, _ = self.workload(fw.SRC, "cupy", "runtime_nbytes", "pool_nbytes", "live_since", "dumped")
        self.assertEqual((t["runtime_nbytes"], t["pool_nbytes"], t["live_since"]), (1 << 20, 3 << 20, [2, 4 << 20]))
        t, _ = self.workload(fw.SRC, "jax", "device_put_nbytes", "compute_nbytes", "dumped")
        self.assertEqual((t["device_put_nbytes"], t["compute_nbytes"]), (4 << 20, 4 << 20))


# --- scripts/gpu-validate.sh ----------------------------------------------------------

SCRIPT = os.path.join(ROOT, "scripts", "gpu-validate.sh")


class Script(Base):
    def _run(self, art, sections, extra_env=None):
        out = os.path.join(self.tmp, "out")
        env = dict(os.environ)
        env.pop("GPU_CHECK_LOG", None)
        env["TMPDIR"] = self.tmp  # the script's work directory goes away with the test's
        env.update(extra_env or {})
        p = subprocess.run(["bash", SCRIPT, art, out] + sections, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=env, timeout=300)
        return p.returncode, p.stdout.decode(), out

    def fake_artifacts(self):
        art = os.path.join(self.tmp, "art")
        os.makedirs(art)
        for name in ("cudaleak", "libcudaleak.so"):
            with open(os.path.join(art, name), "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(os.path.join(art, name), 0o755)
        return art

    def test_a_failure_makes_the_exit_status(self):
        rc, text, out = self._run(self.fake_artifacts(), ["bogus"])
        self.assertEqual(rc, 1, text)
        self.assertIn("CHECK setup section bogus: FAIL unknown section", text)
        self.assertIn("gpu-validate: 1 checks, 1 failed", text)
        self.assertIn("gpu-validate: rerun: scripts/gpu-validate.sh", text)
        self.assertTrue(text.rstrip().endswith("bogus"), text[-200:])
        with open(os.path.join(out, "checks.txt")) as f:
            self.assertEqual(len(f.read().splitlines()), 1)

    def test_missing_artifacts(self):
        rc, text, _ = self._run(os.path.join(self.tmp, "nothing"), ["env"])
        self.assertEqual(rc, 1, text)
        self.assertIn("FAIL", text)

    def test_budget_spent_steps_fail(self):
        rc, text, _ = self._run(self.fake_artifacts(), ["python"], {"GPU_VALIDATE_BUDGET_S": "0"})
        self.assertEqual(rc, 1, text)
        self.assertIn("CHECK python build: FAIL not run, the 0 s budget is spent", text)
        self.assertIn("gpu-validate: rerun: scripts/gpu-validate.sh", text)

    def test_usage(self):
        p = subprocess.run(["bash", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"gpu-validate.sh ARTIFACTS OUT", p.stderr)

    def test_graphs_section_plumbing(self):
        # The section end to end with a fake nvcc (its "programs" print each
        # mode's account) and a fake cudaleak (its runs leave a correct
        # report, its `report` prints it): every check passes, the gate's
        # flag goes to the module run only, and the reports are kept.
        art = self.fake_artifacts()
        acc, pre, log = (os.path.join(self.tmp, n) for n in ("acc", "pre", "cli.log"))
        os.makedirs(acc)
        for mode in cr.GRAPH_MODES:
            with open(os.path.join(acc, mode + ".txt"), "w") as f:
                f.write(graphs_account(mode))
            d = os.path.join(pre, mode)
            write_report(d, graphs_report(mode))
            spec = cr.GRAPH_MODES[mode]
            if "dump" in spec:
                write_report(d, report([graphs_group(spec["leaks"][0], spec["dump"][1])], "api", seq=1))
        fakebin = os.path.join(self.tmp, "bin")
        os.makedirs(fakebin)
        with open(os.path.join(fakebin, "nvcc"), "w") as f:
            f.write('#!/bin/sh\nout=; cubin=0\nwhile [ $# -gt 0 ]; do case $1 in -o) out=$2; shift ;; -cubin) cubin=1 ;; esac; shift; done\n'
                    'if [ $cubin = 1 ]; then echo cubin >"$out"; exit 0; fi\n'
                    'printf \'#!/bin/sh\\ncat "%s/$1.txt"\\n\' "$FAKE_ACC" >"$out"; chmod +x "$out"\n')
        with open(os.path.join(art, "cudaleak"), "w") as f:
            f.write("""#!%s
import glob, json, os, shutil, subprocess, sys
a = sys.argv[1:]
with open(os.environ["FAKE_CLI_LOG"], "a") as f:
    f.write(" ".join(a) + "\\n")
if a[0] == "report":
    path = a[-1]
    files = sorted(glob.glob(os.path.join(path, "cudaleak.*.json"))) if os.path.isdir(path) else [path]
    reports = [json.load(open(p)) for p in files]
    r = max(reports, key=lambda r: r["sequence"])
    print(json.dumps(r) if "--format" in a else "%%d leaks" %% len(r["leaks"]))
    sys.exit(0)
i = a.index("--")
d = a[a.index("--dir") + 1]
prog = a[i + 1:]
shutil.copytree(os.path.join(os.environ["FAKE_PRE"], prog[1]), d)
sys.exit(subprocess.call(prog))
""" % sys.executable)
        for p in (os.path.join(fakebin, "nvcc"), os.path.join(art, "cudaleak")):
            os.chmod(p, 0o755)
        rc, text, out = self._run(art, ["graphs"], {"PATH": fakebin + os.pathsep + os.environ["PATH"],
                                                    "FAKE_ACC": acc, "FAKE_PRE": pre, "FAKE_CLI_LOG": log})
        self.assertEqual(rc, 0, text)
        with open(os.path.join(out, "checks.txt")) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 2 + 11 + 73, lines)
        self.assertTrue(all(": PASS " in l for l in lines), lines)
        self.assertIn("CHECK graphs run --fail-on-leak module: PASS", text)
        self.assertIn("CHECK graphs module_loop live dump: PASS", text)
        with open(log) as f:
            runs = [l.split() for l in f if l.startswith("run ")]
        self.assertEqual(len(runs), 11)
        self.assertEqual([r[r.index("--") + 2] for r in runs if "--fail-on-leak" in r], ["module"])
        self.assertTrue(all(r[r.index("--") + 1].endswith("/graphs_ptsz") == (r[-1] == "pool_ptsz") for r in runs), runs)
        self.assertTrue(all(r[-1].endswith("globals.cubin") for r in runs if r[r.index("--") + 2].startswith("module")))
        names = subprocess.run(["tar", "tzf", os.path.join(out, "reports.tar.gz")], stdout=subprocess.PIPE).stdout.decode()
        self.assertIn("reset_peak.planted.txt", names)
        self.assertIn("module_loop.run.txt", names)

    @unittest.skipUnless(os.environ.get("GPU_CHECK_TEST_ARTIFACTS"), "GPU_CHECK_TEST_ARTIFACTS not set")
    def test_python_section_end_to_end(self):
        rc, text, out = self._run(os.environ["GPU_CHECK_TEST_ARTIFACTS"], ["python"])
        self.assertEqual(rc, 0, text)
        with open(os.path.join(out, "checks.txt")) as f:
            lines = f.read().splitlines()
        self.assertGreaterEqual(len(lines), 17, lines)
        self.assertTrue(all(": PASS " in l for l in lines), lines)
        self.assertIn("gpu-validate: %d checks, 0 failed" % len(lines), text)


if __name__ == "__main__":
    unittest.main(verbosity=1)
