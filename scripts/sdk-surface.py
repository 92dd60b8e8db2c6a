#!/usr/bin/env python3
"""Each host interface of the WIT world, wrapped by each SDK.

Usage: scripts/sdk-surface.py

Reads the interfaces the `plugin` world imports (sdk/wit/probe.wit) and
checks that each SDK has the module that wraps it: Rust `sdk/src/NAME.rs`,
Python `sdk/python/src/sonde_sdk/NAME.py`, JavaScript `sdk/js/src/NAME.js`.
An interface an SDK leaves out is listed in EXCLUDED with why, and
docs/sdk-languages.md names it in its table ("host interfaces"); the check
fails on a missing module that is not listed, on a listed one that now
exists (the list only shrinks), and on a listed one the docs do not name.
Exits 1 when it fails.
"""

import os
import re
import sys

WIT = "sdk/wit/probe.wit"
DOCS = "docs/sdk-languages.md"
SDKS = {
    "Rust": "sdk/src/{}.rs",
    "Python": "sdk/python/src/sonde_sdk/{}.py",
    "JavaScript": "sdk/js/src/{}.js",
}

# (SDK, interface): why it has no wrapper yet.
EXCLUDED = {
    ("Python", "icmp"): "not wrapped yet: an ICMP echo check is written with the Rust SDK",
    ("Python", "udp"): "not wrapped yet: a UDP exchange is written with the Rust SDK",
    ("JavaScript", "icmp"): "not wrapped yet: an ICMP echo check is written with the Rust SDK",
    ("JavaScript", "udp"): "not wrapped yet: a UDP exchange is written with the Rust SDK",
}


def imports():
    text = open(WIT, encoding="utf-8").read()
    world = re.search(r"world\s+plugin\s*\{(.*?)\n\}", text, re.S).group(1)
    return re.findall(r"^\s*import\s+([\w-]+)\s*;", world, re.M)


def main():
    docs = open(DOCS, encoding="utf-8").read()
    problems = []
    for name in imports():
        for sdk, pattern in SDKS.items():
            path = pattern.format(name.replace("-", "_"))
            has = os.path.exists(path)
            excluded = (sdk, name) in EXCLUDED
            if not has and not excluded:
                problems.append(f"{sdk} SDK: no {path} wrapping the WIT interface `{name}`")
            elif has and excluded:
                problems.append(
                    f"scripts/sdk-surface.py: EXCLUDED lists {sdk}'s `{name}`, which {path} now wraps: remove it"
                )
            elif excluded and not re.search(rf"{sdk}[^\n]*`{name}`|`{name}`[^\n]*{sdk}", docs):
                problems.append(f"{DOCS}: the {sdk} SDK leaves out `{name}`, and the docs do not say so")
    for p in problems:
        print(p)
    if not problems:
        print(f"every host interface of {WIT} is wrapped by each SDK, but the {len(EXCLUDED)} documented exclusions")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
