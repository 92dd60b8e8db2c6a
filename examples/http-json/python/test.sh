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

version="$(sed -n 's/^REQUIRED_COMPONENTIZE_PY = "\(.*\)"/\1/p' "$repo/sdk/python/src/sonde_sdk/build.py")"
if [ -z "${COMPONENTIZE_PY:-}" ]; then
  if [ "$(componentize-py --version 2>/dev/null)" = "componentize-py $version" ]; then
    COMPONENTIZE_PY="$(command -v componentize-py)"
  else
    venv="${SONDE_PY_VENV:-$HOME/.cache/sonde-ci/componentize-py-$version}"
    if [ "$("$venv/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $version" ]; then
      echo "== install componentize-py $version into $venv"
      python3 -m venv --clear "$venv"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "componentize-py==$version"
    fi
    COMPONENTIZE_PY="$venv/bin/componentize-py"
  fi
fi
export COMPONENTIZE_PY

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
