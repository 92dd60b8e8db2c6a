#!/usr/bin/env python3
"""Errors that are free text: `Result<_, String>`, and error fields of text.

Usage: scripts/string-errors.py

Reads every .rs file of the crates (runtime/*/src, sdk/src, sdk/build/src,
sdk/regex/src, plugins/*/src), skipping test modules (from `#[cfg(test)]`
on) and files named tests.rs, and lists each function that returns
`Result<..., String>`. An error is a type (a `thiserror` enum, or one with
its own `Display` where a plugin keeps its code small) so that a caller can
match on it and its sources stay attached; text is for the message, made
at the edge.

None is left: ALLOWED is empty and stays so unless a function's text is
truly its data (say why beside it); the check fails on any other, and on
an entry of ALLOWED that no longer matches.

It also reads every error type (`#[derive(..., Error)]`) for a field of
type `String` named as text (`detail`, `message`, `reason`, `why`, `error`,
`cause`, `text`): such a field is where a cause's type gets lost. Each one
left is in ALLOWED_TEXT with why its text *is* the data (a peer's words,
the text a user gave, a message made for people); a new one fails, as does
a stale entry. Exits 1 when either check fails.
"""

import glob
import os
import re
import sys

# (file, function): why it is still free text.
ALLOWED: dict[tuple[str, str], str] = {}

# (file, type, field): why the field's text is the data.
ALLOWED_TEXT = {
    ("runtime/oci/src/error.rs", "OciError", "detail"): (
        "InvalidReference: what the parser found wrong in the text given; "
        "Unreachable: the HTTP client's chain flattened on purpose so the password is scrubbed from it; "
        "Auth and Registry: the registry's own words"
    ),
    ("runtime/oci/src/signing/mod.rs", "SignatureError", "detail"): (
        "what is wrong in a key or signature file, read by people; several parsers' words joined"
    ),
    ("runtime/oci/src/signing/mod.rs", "SignatureError", "why"): "the notes gathered while reading signatures, for people",
    ("runtime/policy/src/identity.rs", "DigestError", "text"): "the text given, which is not a digest",
    ("runtime/policy/src/secrets/cell.rs", "SecretError", "why"): (
        "the I/O error's words: the error is Clone and Eq (a cell's state is compared and shared), which io::Error is not"
    ),
    ("runtime/core/src/catalog/problem.rs", "ConfigProblem", "error"): "a secret's reading error, as SecretError says it (Clone)",
    ("runtime/core/src/catalog/problem.rs", "ConfigProblem", "message"): "the JSON Schema validator's words",
    ("runtime/core/src/config/npd/mod.rs", "DurationError", "text"): "the text given, which is not a duration",
    ("runtime/core/src/config/npd/gotime.rs", "TimeError", "text"): "the time as a log line writes it, which the layout does not read",
    ("runtime/sonde/src/cli/client.rs", "ClientError", "message"): "the agent's own words, its JSON error or its body",
    ("runtime/core/src/config/mod.rs", "ConfigError", "message"): "the message itself: a config error is a place and its words",
}

TEXT_FIELDS = {"detail", "message", "reason", "why", "error", "cause", "text"}

PATTERN = re.compile(r"fn\s+(\w+)\s*(?:<[^>]*>)?\s*\([^{;]*?\)\s*->\s*Result<[^{;]*,\s*String\s*>", re.S)


def files():
    roots = glob.glob("runtime/*/src") + glob.glob("plugins/*/src") + ["sdk/src", "sdk/build/src", "sdk/regex/src"]
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                if n.endswith(".rs") and n != "tests.rs" and "/tests/" not in dirpath + "/":
                    yield os.path.join(dirpath, n)


def error_types(code):
    """(type name, body) of each `#[derive(..., Error)]` enum or struct."""
    for m in re.finditer(r"#\[derive\([^)]*\bError\b[^)]*\)\]", code):
        head = re.search(r"\b(?:enum|struct)\s+(\w+)[^{;(]*([{(;])", code[m.end():])
        if not head or head.group(2) != "{":
            continue
        start = m.end() + head.end() - 1
        depth = 0
        for i in range(start, len(code)):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                yield head.group(1), code[start:i]
                break


def text_fields():
    found = set()
    for path in sorted(files()):
        code = open(path, encoding="utf-8").read().split("#[cfg(test)]", 1)[0]
        code = re.sub(r"//[^\n]*", "", code)
        for name, body in error_types(code):
            for f in re.finditer(r"\b(\w+)\s*:\s*String\b", body):
                if f.group(1) in TEXT_FIELDS:
                    found.add((path, name, f.group(1)))
    return found


def check_text_fields():
    found = text_fields()
    new = sorted(found - ALLOWED_TEXT.keys())
    stale = sorted(ALLOWED_TEXT.keys() - found)
    for path, name, field in new:
        print(f"{path}: {name}'s field {field}: String is free text: keep the cause typed (#[source]), or say in ALLOWED_TEXT why the text is the data")
    for path, name, field in stale:
        print(f"scripts/string-errors.py: ALLOWED_TEXT lists {path} {name}.{field}, which is no longer text: remove it")
    if not new and not stale:
        print(f"no error field is free text but the {len(ALLOWED_TEXT)} whose text is the data")
    return bool(new or stale)


def main():
    failed = check_text_fields()
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
    sys.exit(1 if new or stale or failed else 0)


if __name__ == "__main__":
    main()
