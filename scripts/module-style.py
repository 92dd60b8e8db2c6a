#!/usr/bin/env python3
"""One module-file style: a module with submodules is `NAME/mod.rs`.

Usage: scripts/module-style.py

Reads the crates' source trees (runtime/*/src, plugins/*/src, sdk/src,
sdk/build/src, sdk/regex/src, tests/src) and fails on any `NAME.rs` beside
a folder `NAME/` of Rust files: the module and its submodules then live in
two places, where the rest of the tree keeps them in one folder. Exits 1
when it finds one.
"""

import glob
import os
import sys


def main():
    roots = glob.glob("runtime/*/src") + glob.glob("plugins/*/src")
    roots += ["sdk/src", "sdk/build/src", "sdk/regex/src", "tests/src"]
    found = []
    for root in roots:
        for dirpath, dirnames, names in os.walk(root):
            for n in names:
                sub = os.path.join(dirpath, n[:-3])
                if n.endswith(".rs") and n != "mod.rs" and os.path.isdir(sub):
                    if any(f.endswith(".rs") for f in os.listdir(sub)):
                        found.append(os.path.join(dirpath, n))
    for f in sorted(found):
        print(f"{f}: beside the folder of its submodules; move it to {f[:-3]}/mod.rs")
    if not found:
        print("every module with submodules is NAME/mod.rs")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
