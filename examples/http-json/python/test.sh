#!/usr/bin/env bash
# The Python http-json check: its unit tests (CPython, the SDK's fake host),
# then the component built with componentize-py and run by `sonde check`
# against a local HTTP server (examples/http-json/serve.py on 127.0.0.1).
# Uses $SONDE_BIN when set, else $CARGO_TARGET_DIR/debug/sonde, else builds
# sonde. componentize-py: $COMPONENTIZE_PY, or on PATH at the pinned
# version, else installed into a venv ($SONDE_PY_VENV, default
# ~/.cache/sonde-ci/componentize-py-VERSION). SONDE_BENCH=N adds `sonde bench`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
. "$repo/examples/http-json/lib.sh"

ensure_componentize_py

echo "== unit tests (CPython, fake host)"
PYTHONPATH="$repo/sdk/python/src" python3 -m unittest discover -s "$repo/sdk/python/tests" -t "$repo/sdk/python/tests"
(cd "$here" && PYTHONPATH="$repo/sdk/python/src" python3 -m unittest test_app)

find_sonde
echo "== build the component"
wasm="$work/http-json-py.wasm"
"$here/build.sh" "$wasm"
start_server
run_checks
finish
