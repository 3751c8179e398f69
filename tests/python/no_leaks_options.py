"""cudaleak.no_leaks(limit=, warmups=, filter=, framework=) under the
library; prints one line per check."""

import os
import sys

import cudaleak
import sim

KEPT = []


def leak(nbytes):
    KEPT.append(sim.malloc(nbytes))  # LEAK options


def outcome(fn):
    try:
        fn()
        return "ok"
    except cudaleak.LeakError as e:
        return str(e).splitlines()[0]


def under_limit():
    with cudaleak.no_leaks(limit="1 MiB"):
        leak(4096)


def over_limit():
    with cudaleak.no_leaks(limit=1024):
        leak(4096)


def filtered():
    with cudaleak.no_leaks(filter=lambda g: g["bytes"] != 4096):
        leak(4096)


WS = {}


@cudaleak.no_leaks(warmups=1)
def warmed():
    if "ws" not in WS:
        WS["ws"] = sim.malloc(1 << 20)


def torch_not_imported():
    with cudaleak.no_leaks(framework="torch"):
        sim.free(sim.malloc(64))
    return "torch" in sys.modules


print("under limit: " + outcome(under_limit))
print("over limit: " + outcome(over_limit))
print("filtered: " + outcome(filtered))
print("warmups: " + outcome(warmed))
print("torch imported by the check: %s" % torch_not_imported())
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_limits"))
import torch  # noqa: E402  the stand-in

with cudaleak.no_leaks(framework="torch"):
    torch.tensor_freed_into_the_cache(8192)
start, end = torch.CALLS.index("synchronize"), torch.CALLS.index("empty_cache")
print("torch synchronized, collected, emptied: %s" % (start < end and "gc" in torch.CALLS[start:end]))
