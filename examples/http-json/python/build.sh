#!/usr/bin/env bash
# Builds the Python http-json check into a component with componentize-py,
# against sdk/wit (the bindings are generated inside the build, never kept).
#   examples/http-json/python/build.sh [OUT.wasm]   (default: http-json.wasm here)
# componentize-py: $COMPONENTIZE_PY or on PATH (the version sdk/python pins).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${1:-$here/http-json.wasm}"
PYTHONPATH="$repo/sdk/python/src${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m sonde_sdk build app --app-dir "$here" -o "$out"
