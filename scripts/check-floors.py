#!/usr/bin/env python3
"""Fails when a crate's modules do not form floors (docs/decisions.md,
"Modules form floors, and the floors are the folders").

usage: scripts/check-floors.py [CRATE_SRC_DIR ...]
       (default: crates/*/src and src/ under the repository root)

A module is a file directly under a crate's src/ (or a src/NAME/mod.rs),
together with every file under src/NAME/. It uses another when its code
(comments, string and character literals left out) names
`crate::OTHER`, or reaches OTHER through `super::` (`super::OTHER` from a
file directly under src/, `super::super::OTHER` from a module nested one
deeper, and so on). A module that is a folder (src/NAME/) is checked the
same way one level down: its files are the modules, `crate::NAME::X` and
`super::X` the uses; and so on down.

Two checks, at every level:
1. No circle: no set of modules reaches itself through such uses. Each
   circle is printed with the names that tie it.
2. Declared floors: when a crate's lib.rs (or main.rs) lists its floors in
   its top doc comment, one line per floor, bottom up, as
       //! 3. stack capture: `capture`
   every module is on exactly one floor, and none uses a module on a
   higher floor (modules on one floor may use each other one way). A
   module that is a folder lists the floors of its own modules the same
   way, in its mod.rs (or NAME.rs), and is checked the same way; in a
   crate that declares floors, every folder module of two modules or more
   must (the floors are the folders, and each folder says how its files
   stand).

Names a macro receives as tokens and pastes elsewhere (a table of items
handed to a macro) are not uses of the module holding the table; a crate
that has such a table says so in its doc.

Exit status 1 on any finding, else 0. ../shared/tools/module-cycles draws
the top level's map for people; this is the verdict CI needs (that tool
always exits 0, and users' clones do not have it).
"""
import glob
import os
import re
import sys

NAME = r"[a-z_][a-z0-9_]*"
ITEM = r"(?:::\{?([A-Za-z_][A-Za-z0-9_]*))?"
SUPERS = re.compile(r"\b((?:super::)+)(" + NAME + r")" + ITEM)
SUPER_GROUP = re.compile(r"\buse ((?:super::)+)\{([^;]*)\};", re.S)
FLOOR_LINE = re.compile(r"^//!\s*(\d+)\.\s[^`\n]*?:\s*((?:`" + NAME + r"`[,\s]*)+)\s*$")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"b?'(?:\\(?:u\{[0-9a-fA-F]{1,6}\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def code_only(text):
    """`text` without comments and string or character literals (each
    replaced by a space): a `//` inside a string starts no comment, and a
    path inside a string or a comment is no use."""
    out, i, n = [], 0, len(text)

    def ident_before(i):
        return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif c in "rb" and not ident_before(i) and RAW_STRING.match(text, i):
            m = RAW_STRING.match(text, i)
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append(" ")
        elif c == '"' or (c == "b" and text.startswith('b"', i) and not ident_before(i)):
            i += 2 if c == "b" else 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append(" ")
        elif (c == "'" or (c == "b" and not ident_before(i))) and CHAR.match(text, i):
            i = CHAR.match(text, i).end()
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules_in(folder):
    """{name: [(file, depth)]} for the modules of one folder: NAME.rs or
    NAME/mod.rs, plus every file under NAME/ (depth: how many module
    levels below NAME the file's module sits)."""
    mods = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.rs"))):
        name = os.path.basename(path)[:-3]
        if name not in ("lib", "main", "mod"):
            mods.setdefault(name, []).append((path, 0))
    for sub in sorted(glob.glob(os.path.join(folder, "*", ""))):
        name = os.path.basename(os.path.dirname(sub))
        if name not in mods and not os.path.exists(os.path.join(sub, "mod.rs")):
            continue
        for path in sorted(glob.glob(os.path.join(sub, "**", "*.rs"), recursive=True)):
            rel = os.path.relpath(path, sub).split(os.sep)
            depth = len(rel) - (1 if rel[-1] == "mod.rs" else 0)
            mods.setdefault(name, []).append((path, depth))
    return mods


def group_heads(body):
    """Top-level items of a `use x::{...}` group: `a::X`, `b`."""
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


def uses_of(mods, parent_path):
    """{module: {used module: {names}}} among the modules of one folder,
    whose parent module's path is `parent_path` (`crate`, `crate::cli`)."""
    by_path = re.compile(r"\b" + re.escape(parent_path) + r"::(" + NAME + r")" + ITEM)
    path_group = re.compile(r"\buse " + re.escape(parent_path) + r"::\{([^;]*)\};", re.S)
    graph = {}
    for name, files in mods.items():
        uses = {}

        def note(target, item):
            if target in mods and target != name:
                uses.setdefault(target, set()).add(item)

        def note_group(body):
            for part in group_heads(body):
                head = re.match(r"(" + NAME + r")(?:::(.*))?$", part, re.S)
                if head:
                    note(head.group(1), (head.group(2) or "self").strip()[:40])

        for path, depth in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = code_only(f.read())
            for m in by_path.finditer(text):
                note(m.group(1), m.group(2) or "*")
            for g in path_group.finditer(text):
                note_group(g.group(1))
            # From a file `depth` levels below the module, the parent is
            # `depth + 1` supers up (one more from an inline `mod tests`).
            for m in SUPERS.finditer(text):
                if m.group(1).count("super") in (depth + 1, depth + 2):
                    note(m.group(2), m.group(3) or "*")
            for g in SUPER_GROUP.finditer(text):
                if g.group(1).count("super") in (depth + 1, depth + 2):
                    note_group(g.group(2))
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


def floors_in(path):
    """{module: [floors]} from the floor lines of one file's doc comment;
    {} if it has none."""
    floors = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = FLOOR_LINE.match(line.rstrip("\n"))
            if m:
                for name in re.findall(r"`(" + NAME + r")`", m.group(2)):
                    floors.setdefault(name, []).append(int(m.group(1)))
    return floors


def declared_floors(src):
    """{module: [floors]} from the crate root's doc comment; {} if none."""
    for root in ("lib.rs", "main.rs"):
        path = os.path.join(src, root)
        if os.path.exists(path):
            return floors_in(path)
    return {}


def folder_floors(folder):
    """{module: [floors]} declared by a folder module's own file (NAME/mod.rs
    or NAME.rs beside the folder); {} if none."""
    for path in (os.path.join(folder, "mod.rs"), folder.rstrip(os.sep) + ".rs"):
        if os.path.exists(path):
            return floors_in(path)
    return {}


def circle_problems(where, graph):
    problems = []
    for comp in circles(graph):
        problems.append(f"{where}: circle of {len(comp)}: {', '.join(comp)}")
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    problems.append(f"    {a} -> {b}: {', '.join(sorted(graph[a][b]))}")
    return problems


def floor_problems(where, mods, graph, floors):
    problems = []
    for name in sorted(mods):
        if name not in floors:
            problems.append(f"{where}: module `{name}` is on no floor of the crate's doc comment")
        elif len(floors[name]) > 1:
            problems.append(f"{where}: module `{name}` is on floors {floors[name]}")
    for name in sorted(floors):
        if name not in mods:
            problems.append(f"{where}: the floors name `{name}`, which is no module")
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if a in floors and b in floors and floors[b][0] > floors[a][0]:
                names = ", ".join(sorted(graph[a][b]))
                problems.append(f"{where}: `{a}` (floor {floors[a][0]}) reaches up to `{b}` (floor {floors[b][0]}): {names}")
    return problems


def check_folder(folder, parent_path, floors, floors_required):
    """Problems among the modules of `folder`, then inside each module
    that is a folder itself (with the floors its own file declares)."""
    mods = modules_in(folder)
    graph = uses_of(mods, parent_path)
    problems = circle_problems(folder, graph)
    if floors:
        problems += floor_problems(folder, mods, graph, floors)
    elif floors_required and len(mods) > 1:
        problems.append(f"{folder}: a folder of {len(mods)} modules lists no floors in its mod.rs")
    for name in sorted(mods):
        sub = os.path.join(folder, name)
        if os.path.isdir(sub):
            problems += check_folder(sub, parent_path + "::" + name, folder_floors(sub), floors_required)
    return problems


def check(src):
    """Problems found in one crate's src directory, as lines."""
    floors = declared_floors(src)
    return check_folder(src, "crate", floors, bool(floors))


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
