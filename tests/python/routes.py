"""Call paths taken in turn, each a route through two functions that call
each other, 40 frames deep: the shape of a model's layers calling the
allocator through their own functions, which the Python walk replays from
a log per call path (crates/cudaleak-preload/src/capture/python/).

    python3 routes.py PATHS ROUNDS [skip]

Path p routes its call through route_a or route_b at each of 6 levels, as
the bits of p say (level k: bit k), then `leaf`. Each round takes the
paths in turn on the main thread, and in reverse on a second, lasting
thread at the same time; on each, every path allocates two blocks of
(p + 1) KiB (main) or (p + 1) KiB + 512 bytes (worker) from one line, and
frees one: so each path leaks ROUNDS blocks per thread, each of its own
size; with "skip", each odd round r leaves out path r % PATHS. One
allocation before the threads start, freed. Prints "held N".
"""

import sys
import threading

import sim

LEVELS = 6
KEEP = []


def leaf(nbytes, keep):
    p = sim.malloc(nbytes)  # ALLOC
    if keep:
        KEEP.append(p)
    else:
        sim.free(p)


def route_a(path, level, nbytes, keep):
    if level == LEVELS:
        return leaf(nbytes, keep)
    return (route_b if path >> level & 1 else route_a)(path, level + 1, nbytes, keep)


def route_b(path, level, nbytes, keep):
    if level == LEVELS:
        return leaf(nbytes, keep)
    return (route_b if path >> level & 1 else route_a)(path, level + 1, nbytes, keep)


def deep(depth, fn):
    if depth > 0:
        return deep(depth - 1, fn)
    return fn()


def take(paths, extra):
    for p in paths:
        # one freed, one kept
        route_a(p, 0, (p + 1) * 1024 + extra, False)
        route_a(p, 0, (p + 1) * 1024 + extra, True)


def rounds_of(n, rounds, order, extra, skip):
    for r in range(rounds):
        # With "skip", each odd round leaves out path r % n: the path
        # after it is not the one that followed the path before it.
        take([p for p in order(range(n)) if not (skip and r % 2 == 1 and p == r % n)], extra)


def main():
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    skip = sys.argv[3:] == ["skip"]
    # One allocation first, alone: the first capture probes the
    # interpreter, and a capture on another thread meanwhile has no Python
    # frames (the library does not wait for the probe). Freed, so only the
    # allocation count shows it.
    sim.free(sim.malloc(64))
    worker = threading.Thread(target=deep, args=(30, lambda: rounds_of(n, rounds, reversed, 512, skip)))
    worker.start()
    deep(30, lambda: rounds_of(n, rounds, list, 0, skip))
    worker.join()
    print("held %d" % len(KEEP))


main()
