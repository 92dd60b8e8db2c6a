#!/usr/bin/env python3
"""Functions longer than a bound in a crate's non-test code.

Usage: scripts/long-functions.py [SRC_DIR] [--max N]

Reads every .rs file under SRC_DIR (default: every runtime/*/src) and measures each
function, from the line of its `fn` to the line of its closing brace
(comments, strings and character literals are blanked first, so a brace in
them does not count). Items under `#[cfg(test)]` are left out. Prints each
function over N lines (default 100) as `LINES path:line name` and exits 1
if any is not in ALLOWED below.

A long function is allowed only when it is a flat table: one entry per
line, nothing to extract that would read better as a named step. Each
entry says why. An entry that no longer matches a long function is
reported (it should be removed) but does not fail the check.
"""

import os
import re
import sys

# "path relative to SRC_DIR::function name": why it may stay long.
ALLOWED = {}

FN = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?(?:default[ \t]+)?(?:const[ \t]+)?"
    r"(?:async[ \t]+)?(?:unsafe[ \t]+)?(?:extern[ \t]+\"[^\"]*\"[ \t]+)?"
    r"fn[ \t]+(\w+)",
    re.M,
)


def blank(text):
    """`text` with comments, strings and char literals replaced by spaces
    (newlines kept, so offsets and line numbers stay)."""
    out = []
    i, n = 0, len(text)

    def keep_lines(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_lines(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(keep_lines(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{7f}'), else a lifetime.
            m = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'").match(text, i)
            if m:
                out.append(" " * len(m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(code, start):
    """The offset just past the item that starts at `start`: its matching
    closing brace, or its `;` when it has no body."""
    depth, i, n = 0, start, len(code)
    while i < n:
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0:
            braces = 0
            while i < n:
                if code[i] == "{":
                    braces += 1
                elif code[i] == "}":
                    braces -= 1
                    if braces == 0:
                        return i + 1
                i += 1
            return n
        i += 1
    return n


def test_spans(code):
    """Offsets covered by items under `#[cfg(test)]`."""
    spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        spans.append((m.start(), item_end(code, m.end())))
    return spans


def long_functions(path, limit):
    code = blank(open(path, encoding="utf-8").read())
    tests = test_spans(code)
    found = []
    for m in FN.finditer(code):
        at = m.start(1)
        if any(a <= at < b for a, b in tests):
            continue
        end = item_end(code, m.end())
        if code[end - 1] != "}":
            continue  # a declaration without a body
        first = code.count("\n", 0, at) + 1
        last = code.count("\n", 0, end - 1) + 1
        if last - first + 1 > limit:
            found.append((last - first + 1, first, m.group(1)))
    return found


def main():
    args = sys.argv[1:]
    limit = 100
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i : i + 2]
    src = args[0] if args else "runtime/src"
    failed, seen = False, set()
    for dirpath, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)
            for lines, line, fn in long_functions(path, limit):
                key = f"{rel}::{fn}"
                if key in ALLOWED:
                    seen.add(key)
                    print(f"{lines:4d} {path}:{line} {fn} (allowed: {ALLOWED[key]})")
                else:
                    failed = True
                    print(f"{lines:4d} {path}:{line} {fn}")
    for key in sorted(set(ALLOWED) - seen):
        print(f"note: {key} is allowed but no longer over {limit} lines: remove it from ALLOWED")
    if failed:
        print(f"functions over {limit} lines in {src}: split them into named steps")
    else:
        print(f"no function over {limit} lines in {src} (outside the allowed tables)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
