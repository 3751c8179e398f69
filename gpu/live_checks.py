"""The live view (`cudaleak top PID --once`) and the metrics file
(CUDALEAK_METRICS_DIR) on a real GPU, against PyTorch's own counters and
the driver's (scripts/gpu-validate.sh, section `live`).

    python3 live_checks.py run              (under cudaleak run --pytorch-no-cache)
    python3 live_checks.py verify TRUTH VIEW PROM

`run` holds 64 MiB at one line and grows another by 32 MiB four times,
then writes its ground truth to $GPU_CHECK_TRUTH (its pid,
torch.cuda.memory_allocated(), torch.cuda.mem_get_info() and the lines)
and waits, holding still, until the file $LIVE_GO exists; the script reads
the view and the metrics file meanwhile. Without PyTorch's cache each
tensor is one cudaMalloc, so memory_allocated() is what the process holds.

`verify` checks, one CHECK line each (gpu/check_report.py):
- `live view bytes`: the view's live bytes = memory_allocated();
- `live view sites`: the growing line holds 128 MiB and the steady one
  64 MiB, each labelled with its line;
- `live view driver total`: NVML's total memory of the device = the
  driver's total (mem_get_info), exactly;
- `live view driver free`: NVML's free memory within 64 MiB of the
  driver's free memory, both read while the program held still;
- `live metrics device bytes`: the metrics file's
  cudaleak_live_bytes{device="0"} = memory_allocated().
Exits 1 when a check failed.
"""

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402

MiB = 1 << 20
HERE = os.path.abspath(__file__)


def steady(torch):
    return torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")  # LIVE steady


def grow(torch):
    return torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")  # LIVE growing


def run():
    import torch

    held = [steady(torch)]
    for _ in range(4):
        held.append(grow(torch))
        time.sleep(0.3)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    cr.write_truth(
        {
            "pid": os.getpid(),
            "memory_allocated": torch.cuda.memory_allocated(),
            "free": free,
            "total": total,
            "steady_line": cr.marker_line(HERE, "LIVE steady"),
            "growing_line": cr.marker_line(HERE, "LIVE growing"),
        }
    )
    go = os.environ["LIVE_GO"]
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.1)
    return held


def prom_value(text, name, device):
    for line in text.splitlines():
        m = re.match(r"^%s\{(.*)\} (\d+)$" % re.escape(name), line)
        if m and ('device="%s"' % device) in m.group(1):
            return int(m.group(2))
    return None


@cr.guarded("live view")
def verify(truth_path, view_path, prom_path):
    truth = cr.read_truth(truth_path)
    with open(view_path) as f:
        view = json.load(f)
    allocated = truth["memory_allocated"]
    cr.check(
        "live view bytes",
        view["live_bytes"] == allocated,
        "view %s, memory_allocated() %s" % (cr.fmt_bytes(view["live_bytes"]), cr.fmt_bytes(allocated)),
        "exact",
    )
    base = os.path.basename(HERE)
    by_line = {}
    for s in view["sites"]:
        for kind in ("steady", "growing"):
            if "%s:%d" % (base, truth[kind + "_line"]) in s["label"]:
                by_line[kind] = s["live_bytes"]
    cr.check(
        "live view sites",
        by_line.get("growing") == 128 * MiB and by_line.get("steady") == 64 * MiB,
        "growing %s, steady %s" % (cr.fmt_bytes(by_line.get("growing")), cr.fmt_bytes(by_line.get("steady"))),
        "128 MiB and 64 MiB at their lines",
    )
    driver = view.get("driver_memory")
    d0 = next((d for d in driver if d["device"] == "0"), None) if isinstance(driver, list) else None
    cr.check(
        "live view driver total",
        d0 is not None and d0["total_bytes"] == truth["total"],
        "NVML %s, mem_get_info %s (%s)" % (cr.fmt_bytes(d0 and d0["total_bytes"]), cr.fmt_bytes(truth["total"]), driver),
        "exact",
    )
    cr.check(
        "live view driver free",
        d0 is not None and cr.within(d0["free_bytes"], truth["free"], abs_tol=64 * MiB),
        "NVML %s, mem_get_info %s" % (cr.fmt_bytes(d0 and d0["free_bytes"]), cr.fmt_bytes(truth["free"])),
        "64 MiB",
    )
    with open(prom_path) as f:
        prom = f.read()
    got = prom_value(prom, "cudaleak_live_bytes", "0")
    cr.check(
        "live metrics device bytes",
        got == allocated,
        "cudaleak_live_bytes{device=\"0\"} %s, memory_allocated() %s" % (cr.fmt_bytes(got), cr.fmt_bytes(allocated)),
        "exact",
    )


def main(argv):
    if argv[1:2] == ["run"]:
        run()
        return 0
    if len(argv) == 5 and argv[1] == "verify":
        verify(*argv[2:5])
        cr.finish()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
