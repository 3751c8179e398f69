#!/usr/bin/env python3
"""Fails when a crate's modules do not form floors (issue 16).

usage: scripts/check-floors.py [CRATE_SRC_DIR ...]
       (default: crates/*/src and src/ under the repository root)

A module is a file directly under a crate's src/ (or a src/NAME/mod.rs);
it uses another when its text names `crate::OTHER` (or `super::OTHER`
from a file directly under src/), comments left out. Two checks:

1. No circle: no set of modules reaches itself through such uses. Each
   circle is printed with the names that tie it.
2. Declared floors: when the crate's lib.rs (or main.rs) lists its floors
   in its top doc comment, one line per floor, bottom up, as
       //! 3. per-thread state: `thread`
   every module is on exactly one floor, and none uses a module on a
   higher floor (modules on one floor may use each other one way).

Exit status 1 on any finding, else 0. ../shared/tools/module-cycles draws
the same map for people; this is the verdict CI needs (that tool always
exits 0, and users' clones do not have it).
"""
import glob
import os
import re
import sys

USE = re.compile(r"\b(?:crate|super)::([a-z_][a-z0-9_]*)(?:::\{?([A-Za-z_][A-Za-z0-9_]*))?")
GROUP = re.compile(r"\buse crate::\{([^;]*)\};", re.S)
FLOOR_LINE = re.compile(r"^//!\s*(\d+)\.\s[^`\n]*?:\s*((?:`[a-z_][a-z0-9_]*`[,\s]*)+)\s*$")


def modules_of(src):
    mods = {}
    paths = glob.glob(os.path.join(src, "*.rs")) + glob.glob(os.path.join(src, "*", "mod.rs"))
    for path in sorted(paths):
        name = os.path.basename(path)[:-3]
        if name == "mod":
            name = os.path.basename(os.path.dirname(path))
        if name not in ("lib", "main"):
            mods[name] = path
    return mods


def without_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def group_heads(body):
    """Top-level items of a `use crate::{...}` group: `a::X`, `b`."""
    depth, start, out = 0, 0, []
    for i, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(body[start:i].strip())
            start = i + 1
    return out


def uses_of(mods):
    graph = {}
    for name, path in mods.items():
        with open(path, encoding="utf-8", errors="replace") as f:
            text = without_comments(f.read())
        uses = {}
        for m in USE.finditer(text):
            target = m.group(1)
            if target in mods and target != name:
                uses.setdefault(target, set()).add(m.group(2) or "*")
        for g in GROUP.finditer(text):
            for part in group_heads(g.group(1)):
                head = re.match(r"([a-z_][a-z0-9_]*)(?:::(.*))?$", part, re.S)
                if head and head.group(1) in mods and head.group(1) != name:
                    uses.setdefault(head.group(1), set()).add((head.group(2) or "self").strip()[:40])
        graph[name] = uses
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan),
    iterative so that a deep chain cannot exhaust Python's stack."""
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def declared_floors(src):
    """{module: floor} from the crate root's doc comment; {} if none."""
    for root in ("lib.rs", "main.rs"):
        path = os.path.join(src, root)
        if not os.path.exists(path):
            continue
        floors = {}
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = FLOOR_LINE.match(line.rstrip("\n"))
                if m:
                    for name in re.findall(r"`([a-z_][a-z0-9_]*)`", m.group(2)):
                        floors.setdefault(name, []).append(int(m.group(1)))
        return floors
    return {}


def check(src):
    """Problems found in one crate's src directory, as lines."""
    mods = modules_of(src)
    graph = uses_of(mods)
    problems = []
    for comp in circles(graph):
        problems.append(f"{src}: circle of {len(comp)}: {', '.join(comp)}")
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    problems.append(f"    {a} -> {b}: {', '.join(sorted(graph[a][b]))}")
    floors = declared_floors(src)
    if floors:
        for name in sorted(mods):
            if name not in floors:
                problems.append(f"{src}: module `{name}` is on no floor of the crate's doc comment")
            elif len(floors[name]) > 1:
                problems.append(f"{src}: module `{name}` is on floors {floors[name]}")
        for name in sorted(floors):
            if name not in mods:
                problems.append(f"{src}: the floors name `{name}`, which is no module")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                fa, fb = floors.get(a, [0])[0], floors.get(b, [0])[0]
                if a in floors and b in floors and fb > fa:
                    names = ", ".join(sorted(graph[a][b]))
                    problems.append(f"{src}: `{a}` (floor {fa}) reaches up to `{b}` (floor {fb}): {names}")
    return problems


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = argv or sorted(glob.glob(os.path.join(root, "crates", "*", "src")))
    if not argv and os.path.isdir(os.path.join(root, "src")):
        dirs.append(os.path.join(root, "src"))
    problems = []
    for d in dirs:
        problems.extend(check(d))
    for p in problems:
        print(p)
    if problems:
        print("modules must form floors: each uses only those on its floor or below (see the crate's lib.rs)")
        return 1
    print(f"floors: {len(dirs)} crate(s), no circle, no module reaching up")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
