#!/usr/bin/env python3
"""Functions whose error is free text: `Result<_, String>` outside tests.

Usage: scripts/string-errors.py

Reads every .rs file of the crates (runtime/*/src, sdk/src, sdk/build/src,
sdk/regex/src, plugins/*/src), skipping test modules (from `#[cfg(test)]`
on) and files named tests.rs, and lists each function that returns
`Result<..., String>`. An error is a type (a `thiserror` enum, or one with
its own `Display` where a plugin keeps its code small) so that a caller can
match on it and its sources stay attached; text is for the message, made
at the edge.

The few left to convert are listed in ALLOWED, each with why it waits;
the check fails on any other, and on an entry of ALLOWED that no longer
matches (so the list only shrinks). Exits 1 when it fails.
"""

import glob
import os
import re
import sys

# (file, function): why it is still free text.
ALLOWED = {
    ("plugins/dns/src/lib.rs", "parse_reply"): "a plugin: its reasons become the run's message as they are",
    ("plugins/grpc/src/lib.rs", "decode_response"): "a plugin: its reasons become the run's message as they are",
    ("plugins/postgres/src/scram.rs", "new"): "the plugin's SCRAM, twin of the host's typed one",
    ("plugins/postgres/src/scram.rs", "client_final"): "the plugin's SCRAM, twin of the host's typed one",
    ("plugins/postgres/src/scram.rs", "verify_server"): "the plugin's SCRAM, twin of the host's typed one",
}

PATTERN = re.compile(r"fn\s+(\w+)\s*(?:<[^>]*>)?\s*\([^{;]*?\)\s*->\s*Result<[^{;]*,\s*String\s*>", re.S)


def files():
    roots = glob.glob("runtime/*/src") + glob.glob("plugins/*/src") + ["sdk/src", "sdk/build/src", "sdk/regex/src"]
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                if n.endswith(".rs") and n != "tests.rs" and "/tests/" not in dirpath + "/":
                    yield os.path.join(dirpath, n)


def main():
    found = set()
    for path in sorted(files()):
        code = open(path, encoding="utf-8").read().split("#[cfg(test)]", 1)[0]
        code = re.sub(r"//[^\n]*", "", code)
        for m in PATTERN.finditer(code):
            found.add((path, m.group(1)))
    new = sorted(found - ALLOWED.keys())
    stale = sorted(ALLOWED.keys() - found)
    for path, name in new:
        print(f"{path}: fn {name} returns Result<_, String>: give its error a type")
    for path, name in stale:
        print(f"scripts/string-errors.py: ALLOWED lists {path} fn {name}, which no longer returns a String error: remove it")
    if not new and not stale:
        print(f"no function returns Result<_, String> but the {len(ALLOWED)} listed to convert")
    sys.exit(1 if new or stale else 0)


if __name__ == "__main__":
    main()
