#!/usr/bin/env python3
"""Files longer than a bound in a crate's non-test code.

Usage: scripts/long-files.py [SRC_DIR ...] [--max N]

Reads every .rs file under each SRC_DIR (default: every runtime/*/src) and
counts its lines outside items under `#[cfg(test)]` (a file's unit tests
sit beside the code they test and do not make it harder to read). Prints
each file over N lines (default 600) as `LINES path` and exits 1 if any is
not in ALLOWED below.

A long file is allowed only when it is one job that does not split along a
seam: a flat table, or one state machine. Each entry says why. An entry
that no longer matches a long file is reported (it should be removed) but
does not fail the check.
"""

import glob
import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "long_functions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "long-functions.py")
)
_lf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lf)

# "path relative to the repository": why it may stay long (a flat table, one
# state machine). None is today.
ALLOWED: dict[str, str] = {}


def code_lines(path):
    """Lines of `path` outside `#[cfg(test)]` items."""
    text = open(path, encoding="utf-8").read()
    code = _lf.blank(text)
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    for a, b in _lf.test_spans(code):
        lines -= code.count("\n", a, b) + 1
    return lines


def main():
    args = sys.argv[1:]
    limit = 600
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i : i + 2]
    srcs = args or sorted(glob.glob("runtime/*/src"))
    failed, seen = False, set()
    for src in srcs:
        for dirpath, _, names in sorted(os.walk(src)):
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                n = code_lines(path)
                if n <= limit:
                    continue
                if path in ALLOWED:
                    seen.add(path)
                    print(f"{n:5d} {path} (allowed: {ALLOWED[path]})")
                else:
                    failed = True
                    print(f"{n:5d} {path}")
    for key in sorted(set(ALLOWED) - seen):
        print(f"note: {key} is allowed but no longer over {limit} lines: remove it from ALLOWED")
    if failed:
        print(f"files over {limit} lines outside their tests: split them along their seams")
    else:
        print(f"no file over {limit} lines outside its tests (and the allowed ones)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
