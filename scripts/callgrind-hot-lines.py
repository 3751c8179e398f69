#!/usr/bin/env python3
"""The code one object runs for each unit of work: its distinct 64-byte
lines of instructions, per function and in all, from two callgrind runs
of the same program at two lengths.

usage: scripts/callgrind-hot-lines.py SHORT LONG UNITS OBJECT

SHORT and LONG are callgrind output files recorded with
`--dump-instr=yes`, of the same program run for two numbers of units
(pairs, steps); UNITS is the difference between them. An instruction
counts when it ran at least UNITS times more in LONG than in SHORT (at
least once a unit); OBJECT is a path or part of one, such as
libcudaleak.so. A line of code is what the instruction cache holds: on a
shape where the program's own code fills that cache (the Python
interpreter's), each of these lines can miss on every unit
(docs/performance.md, "why train-py pays more than its instructions
say").

The runs, for example:

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.short \\
        env LD_PRELOAD=$PWD/target/release/libcudaleak.so PROGRAM ... 4
    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.long \\
        env LD_PRELOAD=$PWD/target/release/libcudaleak.so PROGRAM ... 12
"""
import collections
import re
import sys

LINE = 64


def per_instruction(path, object_part):
    """Instructions (Ir) per instruction address of the object, and the
    function each address is in."""
    names = {"ob": {}, "fn": {}}

    def name(kind, text):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?", text)
        if not m:
            return text
        if m.group(2):
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), text)

    counts, function = collections.Counter(), {}
    ob = fn = ""
    npos, last, skip_next = 2, 0, False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
            elif line.startswith("ob="):
                ob = name("ob", line[3:])
            elif line.startswith("fn="):
                fn = name("fn", line[3:])
            elif line.startswith("cob="):
                name("ob", line[4:])
            elif line.startswith("cfn="):
                name("fn", line[4:])
            elif line.startswith("calls="):
                # the next cost line is the call's, not this function's own
                skip_next = True
            elif line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                a = parts[0]
                try:
                    if a.startswith("+"):
                        addr = last + int(a[1:], 0)
                    elif a.startswith("-"):
                        addr = last - int(a[1:], 0)
                    elif a == "*":
                        addr = last
                    else:
                        addr = int(a, 0)
                except ValueError:
                    continue
                last = addr
                if skip_next:
                    skip_next = False
                    continue
                if object_part in ob and len(parts) > npos:
                    counts[addr] += int(parts[npos])
                    function[addr] = fn
    return counts, function


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    short_path, long_path, units, object_part = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    long_counts, function = per_instruction(long_path, object_part)
    short_counts, _ = per_instruction(short_path, object_part)
    hot = [a for a, c in long_counts.items() if c - short_counts.get(a, 0) >= units]
    if not hot:
        sys.exit("no instruction of %s ran once a unit (recorded with --dump-instr=yes?)" % object_part)
    by_function = collections.defaultdict(list)
    for a in hot:
        by_function[function[a]].append(a)
    print("%6s %6s  function" % ("lines", "instr"))
    for fn, addrs in sorted(by_function.items(), key=lambda kv: -len({a // LINE for a in kv[1]})):
        print("%6d %6d  %s" % (len({a // LINE for a in addrs}), len(addrs), fn))
    print("%6d %6d  total" % (len({a // LINE for a in hot}), len(hot)))


if __name__ == "__main__":
    main()
