#!/usr/bin/env python3
"""Import cycles between the files of the Python and JavaScript SDKs.

Usage: scripts/sdk-cycles.py [DIR...]   (default: sdk/python/src/sonde_sdk sdk/js/src)

Draws an edge A -> B for every import of one SDK file by another: Python's
`from . import b`, `from .b import x` and `import sonde_sdk.b` (at any
indentation: an import inside a function is an edge too), JavaScript's
`import ... from './b.js'` and `export ... from './b.js'`. Prints each group
of files that import each other (a strongly connected component of more
than one file) and exits 1 if there is any.
"""

import importlib.util
import os
import re
import sys

# Tarjan's components, from the crates' own check.
_spec = importlib.util.spec_from_file_location("module_cycles", os.path.join(os.path.dirname(__file__), "module-cycles.py"))
_module_cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module_cycles)
cycles = _module_cycles.cycles

PY = [
    re.compile(r"^[ \t]*from[ \t]+\.(\w*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M),
    re.compile(r"^[ \t]*import[ \t]+sonde_sdk\.(\w+)", re.M),
    re.compile(r"^[ \t]*from[ \t]+sonde_sdk\.(\w+)[ \t]+import", re.M),
]
JS = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s+['"]\./([\w.-]+)\.js['"]""", re.M | re.S)


def edges_of(directory):
    names = {f for f in os.listdir(directory) if f.endswith((".py", ".js"))}
    modules = {os.path.splitext(f)[0] for f in names}
    edges = {}
    for f in sorted(names):
        here = os.path.splitext(f)[0]
        text = open(os.path.join(directory, f), encoding="utf-8").read()
        targets = set()
        if f.endswith(".py"):
            for m in PY[0].finditer(text):
                if m.group(1):
                    targets.add(m.group(1))
                else:
                    items = m.group(2).replace("(", " ").replace(")", " ")
                    targets |= {i.strip().split(" as ")[0] for i in items.split(",")}
            for p in PY[1:]:
                targets |= {m.group(1) for m in p.finditer(text)}
        else:
            targets |= {m.group(1) for m in JS.finditer(text)}
        edges[here] = {t for t in targets if t in modules and t != here}
    return edges


def main():
    dirs = sys.argv[1:] or ["sdk/python/src/sonde_sdk", "sdk/js/src"]
    failed = False
    for d in dirs:
        edges = edges_of(d)
        found = cycles(edges)
        for comp in found:
            failed = True
            print(f"{d}: cycle: " + ", ".join(comp))
            for a in comp:
                for b in sorted(edges[a] & set(comp)):
                    print(f"    {a} -> {b}")
        if not found:
            print(f"no import cycle between the files of {d}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
