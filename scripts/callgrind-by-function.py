#!/usr/bin/env python3
"""Instructions per unit that each function of one object costs, from two
callgrind runs of the same program at two lengths.

usage: scripts/callgrind-by-function.py SHORT LONG UNITS OBJECT [--all]

SHORT and LONG are callgrind output files of the same program run for
two numbers of units (pairs, steps); UNITS is the difference between
them. Start-up and exit cancel out in the difference. OBJECT is the path
of the shared object whose functions are listed, such as
target/release/libcudaleak.so, and its functions' sum is printed last.
A function's figure includes the code inlined into it.
--all lists every object's functions, for a diff of the whole program.

The runs, for example:

    valgrind --tool=callgrind --callgrind-out-file=cg.short \\
        env LD_PRELOAD=$PWD/target/release/libcudaleak.so PROGRAM ... 20
    valgrind --tool=callgrind --callgrind-out-file=cg.long \\
        env LD_PRELOAD=$PWD/target/release/libcudaleak.so PROGRAM ... 60

Use the environment of `scripts/bench.py` for its shapes
(`GLIBC_TUNABLES`, `SIMCUDA_BACKING=threaded`, `PYTHONHASHSEED=0`). On
shapes with two threads the whole program's count moves with how the
threads interleave. The sum over the library's own functions does not
move, so it is the figure to read for changes of a few percent
(docs/performance.md, "Replays from other logs").
"""
import os
import re
import subprocess
import sys


def per_function(path):
    """Self cost per (function, object), read from the callgrind file
    itself: code inlined into a function counts as its own, and two
    objects' functions of one name (our hook and the driver's entry point
    it wraps) stay apart."""
    names = {"ob": {}, "fn": {}}
    costs = {}
    ob = fn = ""
    npos = 1
    skip_next = False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
                continue
            m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line)
            if m:
                called, kind, ident, name = m.groups()
                if name is not None:
                    names[kind][ident] = name
                if not called:
                    if kind == "ob":
                        ob = names["ob"][ident]
                    else:
                        fn = names["fn"][ident]
                continue
            if line.startswith("calls="):
                # the next line is the call's inclusive cost, not this
                # function's own
                skip_next = True
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > npos:
                    key = (fn, ob)
                    costs[key] = costs.get(key, 0) + int(parts[npos])
    return costs


def main(argv):
    args = [a for a in argv if a != "--all"]
    if len(args) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    short, long_, units, obj = args[0], args[1], float(args[2]), os.path.basename(args[3])
    a, b = per_function(short), per_function(long_)
    rows = []
    for key in set(a) | set(b):
        if "--all" not in argv and os.path.basename(key[1]) != obj:
            continue
        rows.append(((b.get(key, 0) - a.get(key, 0)) / units, key))
    rows.sort(reverse=True)
    for v, (name, o) in rows:
        if abs(v) >= 0.5:
            print("%9.1f  %s%s" % (v, name[:120], "" if o.endswith(obj) else "  [%s]" % os.path.basename(o)))
    # (the total counts the functions too small to list)
    print("%9.1f  total" % sum(v for v, _ in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
