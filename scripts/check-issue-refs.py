#!/usr/bin/env python3
"""Fails when the tree cites more issue numbers than it did.

usage: scripts/check-issue-refs.py [--list]

A comment or a page that says "issue 23" sends its reader to a tracker
they cannot open: the reason belongs in the text itself, or, for a
decision worth keeping, in docs/decisions.md with a pointer to its
heading. The tree still holds a few such citations; this check keeps new
ones out. It counts the lines that cite an issue ("issue 23", "Issue 23",
"issues 12 and 15", or "issue" at the end of a line and its number at
the start of the next) in the files git tracks, code and pages apart, and
fails when either count is above its ceiling below. Lower a ceiling when
you remove citations (the check says so), never raise it.

--list prints every citing line.
"""
import re
import subprocess
import sys

CITE = re.compile(r"\bissues? [0-9]+", re.IGNORECASE)
# "issue" ending a line, its number opening the next (after comment marks).
CITE_END = re.compile(r"\bissues?\s*\(?$", re.IGNORECASE)
CITE_NEXT = re.compile(r"""^[\s/#*!"']*[0-9]""")
CODE = re.compile(r"(\.(rs|py|sh|js|c|h|cu|html|css|toml)|^\.ci/run)$")
# Data the tests compare with, kept as captured.
DATA = ("tests/snapshots/", "tests/data/", "sim/traces/")

# Ceilings: none is left (2026-11-29); keep it so.
CEILING = {"code": 0, "pages": 0}


def main():
    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    files = subprocess.check_output(["git", "ls-files"], cwd=root, text=True).split("\n")
    found = {"code": [], "pages": []}
    for f in files:
        if not f or f.startswith(DATA) or f == "scripts/check-issue-refs.py":
            continue
        kind = "code" if CODE.search(f) else "pages" if f.endswith(".md") else None
        if kind is None:
            continue
        try:
            with open(f"{root}/{f}", encoding="utf-8") as fh:
                text = fh.read().split("\n")
            for n, line in enumerate(text, 1):
                wrapped = n < len(text) and CITE_END.search(line) and CITE_NEXT.match(text[n])
                if CITE.search(line) or wrapped:
                    found[kind].append(f"{f}:{n}: {line.strip()}")
        except (OSError, UnicodeDecodeError):
            continue
    if "--list" in sys.argv:
        for kind in found:
            print("\n".join(found[kind]))
    bad = False
    for kind, lines in found.items():
        ceiling = CEILING[kind]
        if len(lines) > ceiling:
            bad = True
            print(
                f"check-issue-refs: {len(lines)} lines of {kind} cite an issue number, "
                f"more than the {ceiling} allowed: say the reason itself "
                f"(scripts/check-issue-refs.py --list shows them)",
                file=sys.stderr,
            )
        elif len(lines) < ceiling:
            print(f"check-issue-refs: {kind}: {len(lines)} citations, below the ceiling of {ceiling}: lower it")
    print(f"check-issue-refs: {len(found['code'])} in code, {len(found['pages'])} in pages")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
