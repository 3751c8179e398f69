"""A Python program for `cudaleak top`: one call site that holds 1 MiB
steady and one that grows by 1 MiB every MS milliseconds, STEPS times,
printing "step N" after each. With "pause" it stops halfway, prints
"paused", and goes on after a line on stdin; with "wait" it waits for a
line on stdin before it frees what it grew and exits (the steady MiB
leaks).

    python3 top_grow.py STEPS MS [pause] [wait]
"""

import sys
import time

import sim

MIB = 1 << 20


def steady():
    return sim.malloc(MIB)  # SITE steady


def growing():
    return sim.malloc(MIB)  # SITE growing


def main():
    steps, ms = int(sys.argv[1]), int(sys.argv[2])
    pause = "pause" in sys.argv[3:]
    held = steady()
    kept = []
    for i in range(steps):
        if pause and i == steps // 2:
            print("paused", flush=True)
            sys.stdin.readline()
        kept.append(growing())
        print("step %d" % (i + 1), flush=True)
        time.sleep(ms / 1000)
    if sys.argv[-1] == "wait":
        sys.stdin.readline()
    for p in kept:
        sim.free(p)
    return held


if __name__ == "__main__":
    main()
