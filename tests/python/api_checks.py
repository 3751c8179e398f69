"""The cudaleak module, preloaded or not.

    python3 api_checks.py preloaded|bare
"""

import sys

import cudaleak
import sim

KEPT = []


def leaky_block():
    KEPT.append(sim.malloc(4096))  # LEAK no_leaks


def preloaded():
    assert cudaleak.available()
    with cudaleak.no_leaks():
        sim.free(sim.malloc(10))
    print("clean block: ok")

    cp = cudaleak.checkpoint()
    a, b, c = sim.malloc(100), sim.malloc(200), sim.malloc(400)
    sim.free(c)
    print("live_since: %d %d" % cudaleak.live_since(cp))
    sim.free(a)
    sim.free(b)

    try:
        with cudaleak.no_leaks():
            leaky_block()
    except cudaleak.LeakError as e:
        print("leak error: %d bytes" % e.report["leaks"][0]["bytes"])
        print(e)

    try:
        with cudaleak.no_leaks():
            KEPT.append(sim.malloc(8))
            raise ValueError("from the body")
    except ValueError:
        print("body error propagates: ValueError")

    print("dump written: %s" % cudaleak.dump("from python"))


def bare():
    print("available: %s" % cudaleak.available())
    with cudaleak.no_leaks():
        KEPT.append(sim.malloc(10))
    with cudaleak.no_leaks():
        pass
    print("no error")


if __name__ == "__main__":
    {"preloaded": preloaded, "bare": bare}[sys.argv[1]]()
