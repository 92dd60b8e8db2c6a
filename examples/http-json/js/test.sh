#!/usr/bin/env bash
# The JavaScript http-json check: the SDK's and the check's unit tests
# (node's test runner, the SDK's fake host), then the component built with
# componentize-js and run by `sonde check` against a local HTTP server
# (examples/http-json/serve.py on 127.0.0.1). Uses $SONDE_BIN when set,
# else $CARGO_TARGET_DIR/debug/sonde, else builds sonde. Installs the
# pinned npm packages (npm ci) when missing. SONDE_BENCH=N adds `sonde bench`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
. "$repo/examples/http-json/lib.sh"

if [ ! -d "$repo/sdk/js/node_modules/@bytecodealliance/componentize-js" ]; then
  echo "== npm ci (sdk/js)"
  (cd "$repo/sdk/js" && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ ! -e "$here/node_modules/@sonde/sdk" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== unit tests (node, fake host)"
(cd "$repo/sdk/js" && node --test test/)
(cd "$here" && node --test)

find_sonde
echo "== build the component"
wasm="$work/http-json-js.wasm"
"$here/build.sh" "$wasm"
start_server
run_checks
finish
