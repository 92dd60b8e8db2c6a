#!/usr/bin/env bash
# Builds the JavaScript http-json check into a component: rolldown bundles
# app.js with @sonde/sdk, componentize-js binds it to sdk/wit (at build
# time, nothing generated is kept) and snapshots it.
#   examples/http-json/js/build.sh [OUT.wasm]   (default: http-json.wasm here)
# Installs sdk/js's pinned tools (npm ci) when they are missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${1:-$here/http-json.wasm}"
if [ ! -d "$repo/sdk/js/node_modules/@bytecodealliance/componentize-js" ]; then
  (cd "$repo/sdk/js" && npm ci --no-audit --no-fund --loglevel=error)
fi
node "$repo/sdk/js/bin/sonde-js-build.js" "$here/app.js" -o "$out"
