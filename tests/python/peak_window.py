"""Peak windows from Python (tests/budgets.rs): `cudaleak.peak_limit`.

    python3 peak_window.py over     # 8 MiB held for a moment under a 5 MiB limit: PeakLimitError
    python3 peak_window.py under    # the same under a 16 MiB limit: passes
    python3 peak_window.py thread   # another thread allocates 4 MiB while the window is open

Each prints what it saw, one line per fact, for the test to compare.
"""

import sys
import threading

import cudaleak
import sim

MIB = 1 << 20

# Held before every window: a window's peak is above what was live when
# it began.
base = sim.malloc(3 * MIB)


def burst():
    p = sim.malloc(8 * MIB)  # BURST
    sim.free(p)


mode = sys.argv[1]
def sites_in_this_file(err):
    """The lines of this file that the error's call sites name, largest first."""
    return [
        next((f["line"] for f in g["python_stack"] if f["file"] == __file__), None)
        for g in err.report["leaks"]
    ]


if mode == "over":
    # The window's peak is the process's: the sites at that moment.
    try:
        with cudaleak.peak_limit("5 MiB"):
            burst()
            kept = sim.malloc(1 * MIB)  # KEPT
    except cudaleak.PeakLimitError as e:
        print("raised: peak", e.peak, "limit", e.limit, "at the peak", e.at_peak)
        print(str(e).splitlines()[0])
        print("sites at lines", sites_in_this_file(e))
        sim.free(kept)
    # A higher process peak first: the window's is below it, and the
    # error names what the window still holds.
    big = sim.malloc(30 * MIB)
    sim.free(big)
    try:
        with cudaleak.peak_limit("5 MiB"):
            burst()
            kept = sim.malloc(2 * MIB)  # KEPT AGAIN
    except cudaleak.PeakLimitError as e:
        print("raised: peak", e.peak, "at the peak", e.at_peak)
        print("sites at lines", sites_in_this_file(e))
        sim.free(kept)
elif mode == "under":
    region = cudaleak.peak_limit("16 MiB")
    with region:
        burst()
    print("peak", region.peak)
elif mode == "thread":
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        p = sim.malloc(4 * MIB)
        sim.free(p)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    region = cudaleak.peak_limit("1 GiB")
    with region:
        started.set()
        done.wait()
    t.join()
    print("peak", region.peak)
sim.free(base)
