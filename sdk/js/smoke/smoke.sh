#!/usr/bin/env bash
# Smoke test of @sonde/sdk's glue to every interface of probe.wit: builds
# smoke/app.js with componentize-js and runs each mode with sonde against
# local servers (the same modes and servers as sdk/python/smoke, whose
# servers.sh it shares). Needs $SONDE_BIN, npm ci in sdk/js, and openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sdk="$(cd "$here/../.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

node "$sdk/js/bin/sonde-js-build.js" "$here/app.js" -o "$work/smoke.wasm"
wasm="$work/smoke.wasm"
. "$sdk/python/smoke/servers.sh"
run_smoke
