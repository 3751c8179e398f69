#!/usr/bin/env python3
"""Checks the `file:name` anchors of docs/architecture.md: each
file must exist, and each name must be defined in it (a fn, struct, enum,
trait, macro, static or const of that name). Exits 1 naming each anchor
that no longer holds, so the walk-through cannot drift from the code.

    python3 scripts/check-architecture.py [--root DIR] [--doc FILE]
"""

import argparse
import os
import re
import sys

ANCHOR = re.compile(r"`((?:crates|src)/[\w/.-]+\.rs)(?::([A-Za-z_][A-Za-z0-9_]*))?`")


def defines(text, name):
    pattern = (r"\b(?:fn|struct|enum|trait|static|const|type|macro_rules!)\s+" + re.escape(name) + r"\b"
               r"|\bmacro_rules!\s*" + re.escape(name) + r"\b")
    return re.search(pattern, text) is not None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root_default = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--root", default=root_default)
    ap.add_argument("--doc", default=None)
    args = ap.parse_args()
    doc = args.doc or os.path.join(args.root, "docs", "architecture.md")
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    anchors = ANCHOR.findall(text)
    if not anchors:
        print("check-architecture: no anchors in %s" % doc, file=sys.stderr)
        return 1
    bad = []
    for path, name in anchors:
        full = os.path.join(args.root, path)
        if not os.path.isfile(full):
            bad.append("%s: no such file" % path)
            continue
        if name:
            with open(full, encoding="utf-8") as f:
                if not defines(f.read(), name):
                    bad.append("%s:%s: not defined there" % (path, name))
    for b in bad:
        print("check-architecture: " + b, file=sys.stderr)
    if bad:
        return 1
    print("architecture: %d anchors, all defined" % len(anchors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
