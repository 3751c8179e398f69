"""A program that allocates no GPU memory behaves the same under the
library (scripts/gpu-validate.sh, section `untouched`).

    python3 untouched_checks.py LIBRARY NAME [--cuda] -- CMD...

Runs CMD twice from the same directory: without the library (every
CUDALEAK_* variable and LD_PRELOAD removed) and with LD_PRELOAD=LIBRARY and
CUDALEAK_DIR set to a new empty directory. The ground truth is the plain
run. Checks, one CHECK line each (gpu/check_report.py):

- `NAME status`: the same exit status;
- `NAME stdout`: the same standard output, byte for byte;
- `NAME stderr`: the same standard error, byte for byte (without --cuda);
- `NAME files`: no file in CUDALEAK_DIR (without --cuda: a program that
  never calls CUDA gets no report), or, with --cuda (a program that calls
  the driver but allocates nothing), no report listing a leak.

With --cuda the library's own lines on stderr (its summary at exit) are
allowed: stderr is compared with the lines starting "cudaleak" removed.
Exits 1 when a check failed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402

TIMEOUT_S = 120


def _env(library=None, report_dir=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDALEAK_") and k != "LD_PRELOAD"}
    if library:
        env["LD_PRELOAD"] = library
        env["CUDALEAK_DIR"] = report_dir
    return env


def _run(cmd, env):
    p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=TIMEOUT_S)
    return p.returncode, p.stdout, p.stderr


def _short(data):
    text = data.decode("utf-8", "replace").strip().replace("\n", " | ")
    return repr(text[:100] + ("..." if len(text) > 100 else ""))


def _without_library_lines(data):
    return b"".join(l for l in data.splitlines(True) if not l.startswith(b"cudaleak"))


def compare(library, name, cmd, cuda=False):
    report_dir = tempfile.mkdtemp(prefix="cudaleak-untouched.")
    try:
        plain = _run(cmd, _env())
        under = _run(cmd, _env(library, report_dir))
        cr.check("%s status" % name, plain[0] == under[0], "exit %d under the library, %d without" % (under[0], plain[0]),
                 "equal")
        cr.check("%s stdout" % name, plain[1] == under[1],
                 "%d B under the library %s, %d B without %s" % (len(under[1]), _short(under[1]), len(plain[1]),
                                                                 _short(plain[1])), "byte for byte")
        err_plain, err_under = plain[2], under[2]
        if cuda:
            err_plain, err_under = _without_library_lines(err_plain), _without_library_lines(err_under)
        cr.check("%s stderr" % name, err_plain == err_under,
                 "%d B under the library %s, %d B without %s" % (len(err_under), _short(err_under), len(err_plain),
                                                                 _short(err_plain)),
                 "byte for byte" + (", the library's own 'cudaleak' lines aside" if cuda else ""))
        files = sorted(os.listdir(report_dir))
        if cuda:
            leaked = []
            for f in files:
                if f.endswith(".json"):
                    with open(os.path.join(report_dir, f)) as fh:
                        leaked += [(f, g["bytes"]) for g in json.load(fh).get("leaks", [])]
            cr.check("%s files" % name, not leaked,
                     "%d file(s), %d leak group(s) %s" % (len(files), len(leaked), leaked[:3]),
                     "no report lists a leak")
        else:
            cr.check("%s files" % name, not files, "%d file(s) in CUDALEAK_DIR %s" % (len(files), files[:3]),
                     "none: no CUDA call, no report")
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


def main(argv):
    if len(argv) < 4 or "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    sep = argv.index("--")
    library, name, flags, cmd = argv[0], argv[1], argv[2:sep], argv[sep + 1:]
    cr.guarded(name)(compare)(os.path.realpath(library), name, cmd, cuda="--cuda" in flags)
    cr.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
