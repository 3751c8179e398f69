"""The driver's cuGetProcAddress answered with the library's hooks
(scripts/gpu-validate.sh, section `procaddr`).

    python3 procaddr_checks.py LIBRARY PROBE [--version V]

PROBE is gpu/procaddr_probe.c, built. The queries: every driver line of the
library's hook table (crates/cudaleak-preload/src/cuda/hook_table.rs: the
name and version by which cuGetProcAddress hands each hook out, `ptsz`
lines with the per-thread default-stream flag), each hooked name again at
version V (default 13000, what a CUDA 13 runtime asks), and a few
entry points the library does not wrap. The probe runs twice: plainly
(the ground truth: what the driver itself hands out) and under
LD_PRELOAD=LIBRARY. Checks, one CHECK line each (gpu/check_report.py):

- `procaddr probe`: both runs answered every query;
- `procaddr hooks`: every hooked query the driver answers is answered,
  under the library, by an address in the library;
- `procaddr variants`: that address is the library's hook of the variant
  the driver hands out for that version (the same symbol name);
- `procaddr others`: the entry points the library does not wrap are
  answered as without it.

It prints the table of what was handed out, e.g. which cuIpcOpenMemHandle
variant a version reaches. Exits 1 when a check failed.
"""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402

HOOK_TABLE = os.path.join(cr.ROOT, "crates", "cudaleak-preload", "src", "cuda", "hook_table.rs")
PER_THREAD_STREAM = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
# Entry points the library does not wrap: its answer must be the driver's.
NOT_WRAPPED = ("cuMemsetD8", "cuLaunchKernel", "cuCtxGetCurrent", "cuMemcpyHtoD", "cuStreamSynchronize",
               "cuMemGetInfo", "cuModuleLoadData")
_ROW = re.compile(r"Driver fn (\w+)\((?:[^()]|\([^()]*\))*\)\s*->\s*\w+\s*as\s+(\w+)\s*@\s*(\d+)(\s+ptsz)?")


def table_rows(path=HOOK_TABLE):
    """(export, name, version, flags) of each driver line of the table."""
    with open(path) as f:
        text = f.read()
    return [(e, n, int(v), PER_THREAD_STREAM if p else 0) for e, n, v, p in _ROW.findall(text)]


def queries(rows, version):
    """The probe's queries: (name, version, flags, wrapped)."""
    out, seen = [], set()
    for _, name, v, flags in rows:
        for q in ((name, v, flags), (name, version, flags)):
            if q not in seen:
                seen.add(q)
                out.append(q + (True,))
    for name in NOT_WRAPPED:
        out.append((name, version, 0, False))
    return out


def parse(text):
    """{(name, version, flags): (result, status, module, symbol)}"""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 7:
            out[(f[0], int(f[1]), int(f[2]))] = (int(f[3]), int(f[4]), f[5], f[6])
    return out


def compare(plain, under, qs, library_name):
    """The checks, from the two runs' parsed answers."""
    answered = [q for q in qs if q[:3] in plain and q[:3] in under]
    cr.check("procaddr probe", len(answered) == len(qs),
             "%d of %d queries answered in both runs" % (len(answered), len(qs)), "all")
    hooked, driver_lacks, not_ours, wrong_variant, others_changed = 0, [], [], [], []
    for name, version, flags, wrapped in answered:
        p, u = plain[(name, version, flags)], under[(name, version, flags)]
        if not wrapped:
            if p != u:
                others_changed.append("%s@%d: %s/%s, without %s/%s" % (name, version, u[2], u[3], p[2], p[3]))
            continue
        if p[0] != 0 or p[2] == "-":
            driver_lacks.append("%s@%d%s" % (name, version, "/ptsz" if flags else ""))
            continue
        if u[0] != 0 or u[2] != library_name:
            not_ours.append("%s@%d%s -> %s/%s" % (name, version, "/ptsz" if flags else "", u[2], u[3]))
            continue
        hooked += 1
        if u[3] != p[3]:
            wrong_variant.append("%s@%d: hook %s, driver %s" % (name, version, u[3], p[3]))
    cr.check("procaddr hooks", hooked > 0 and not not_ours,
             "%d hooked queries answered with %s; %d not: %s; the driver answers none for %d: %s"
             % (hooked, library_name, len(not_ours), not_ours[:5], len(driver_lacks), driver_lacks[:8]),
             "every query the driver answers")
    cr.check("procaddr variants", hooked > 0 and not wrong_variant,
             "%d of %d hooks named as the driver's variant; differing: %s"
             % (hooked - len(wrong_variant), hooked, wrong_variant[:5]), "all")
    n_others = len([q for q in answered if not q[3]])
    cr.check("procaddr others", n_others > 0 and not others_changed,
             "%d of %d entry points the library does not wrap answered as without it; changed: %s"
             % (n_others - len(others_changed), n_others, others_changed[:5]), "all")


def run_probe(probe, qs, env):
    args = ["%s:%d:%d" % q[:3] for q in qs]
    p = subprocess.run([probe] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        sys.stderr.write(p.stderr.decode("utf-8", "replace"))
    return parse(p.stdout.decode("utf-8", "replace"))


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    library, probe = os.path.realpath(argv[0]), argv[1]
    version = int(argv[argv.index("--version") + 1]) if "--version" in argv else 13000

    @cr.guarded("procaddr")
    def run():
        qs = queries(table_rows(), version)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CUDALEAK_") and k != "LD_PRELOAD"}
        with tempfile.TemporaryDirectory(prefix="cudaleak-procaddr.") as d:
            plain = run_probe(probe, qs, base)
            under = run_probe(probe, qs, dict(base, LD_PRELOAD=library, CUDALEAK_DIR=d, CUDALEAK_SUMMARY="0"))
        print("what cuGetProcAddress_v2 hands out (NAME@VERSION[/ptsz]: driver's symbol -> under the library)")
        for name, v, flags, wrapped in qs:
            p, u = plain.get((name, v, flags)), under.get((name, v, flags))
            print("  %-44s %-34s -> %s %s" % ("%s@%d%s" % (name, v, "/ptsz" if flags else ""),
                                              p[3] if p and p[0] == 0 else "(none: result %s)" % (p[0] if p else "-",),
                                              u[2] if u else "-", u[3] if u else "-"))
        compare(plain, under, qs, os.path.basename(library))

    run()
    cr.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
