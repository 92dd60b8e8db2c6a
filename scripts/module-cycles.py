#!/usr/bin/env python3
"""Import cycles between the modules of a crate's src/ directory.

Usage: scripts/module-cycles.py [SRC_DIR] [--depth N|all]

Reads every .rs file under SRC_DIR (default: every runtime/*/src), maps it to its
module path (engine/store.rs -> engine::store), and draws an edge A -> B for
every `crate::B...` path in A's code (comments and doc comments skipped,
`use crate::{a, b}` groups expanded, `super::` resolved). Modules are cut to
their first N path segments (default 1: engine, host, registry...; `all`:
every depth from 1 to the deepest module). Prints each group of modules
that import each other (a strongly connected component of more than one
module) and exits 1 if there is any.
"""

import os
import re
import sys


def module_of(src, path, depth):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        rel = []
    return rel


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def targets(code, here):
    """Module paths (lists of segments) named by crate:: and super:: paths."""
    found = []
    # `crate::{a::b, c}` and `crate::a::{b, c}` groups, one level deep.
    for m in re.finditer(r"\b(crate|super)((?:::\w+)*)::\{([^{}]*)\}", code):
        base = resolve(m.group(1), m.group(2), here)
        for item in m.group(3).split(","):
            item = item.strip().split(" as ")[0]
            if item and item != "self":
                found.append(base + [s for s in item.split("::") if s])
            elif item == "self":
                found.append(base)
    for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", code):
        found.append(resolve(m.group(1), m.group(2), here))
    return found


def resolve(root, rest, here):
    segs = [s for s in rest.split("::") if s]
    if root == "crate":
        return segs
    base = here[:-1]
    while segs and segs[0] == "super":
        base, segs = base[:-1], segs[1:]
    return base + segs


def main():
    args = sys.argv[1:]
    depth = "1"
    if "--depth" in args:
        i = args.index("--depth")
        depth = args[i + 1]
        del args[i : i + 2]
    src = args[0] if args else "runtime/src"
    files = []
    for dirpath, _, names in os.walk(src):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".rs")]
    if depth == "all":
        deepest = max(len(module_of(src, f, 0)) for f in files)
        depths = range(1, max(deepest, 1) + 1)
    else:
        depths = [int(depth)]
    found = [check(src, files, d) for d in depths]
    sys.exit(1 if any(found) else 0)


def cycles(edges):
    """The groups of nodes of `edges` (node -> set of nodes) that reach
    each other: Tarjan's strongly connected components of more than one
    node."""
    index, low, stack, on, sccs, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sccs


def check(src, files, depth):
    """Prints the cycles between the modules cut to `depth` segments, or
    that there is none; whether there is any."""
    modules = {tuple(module_of(src, f, depth)) for f in files}
    edges = {}
    for f in files:
        here = module_of(src, f, depth)
        code = strip_comments(open(f, encoding="utf-8").read())
        # Test code may reach anywhere; it is not part of the layering.
        code = code.split("#[cfg(test)]", 1)[0]
        a = tuple(here[:depth])
        if not a:
            continue
        for t in targets(code, here):
            # The longest known module the path starts with.
            while t and tuple(t) not in modules:
                t = t[:-1]
            b = tuple(t[:depth])
            if b and b != a and b[: len(a)] != a and a[: len(b)] != b:
                edges.setdefault(a, set()).add(b)
    sccs = cycles(edges)
    name = lambda m: "::".join(m)
    for comp in sccs:
        members = set(comp)
        print("cycle: " + ", ".join(sorted(map(name, comp))))
        for a in sorted(comp):
            for b in sorted(edges.get(a, ())):
                if b in members:
                    print(f"    {name(a)} -> {name(b)}")
    if not sccs:
        print(f"no import cycle between the modules of {src} (depth {depth})")
    return bool(sccs)


if __name__ == "__main__":
    main()
