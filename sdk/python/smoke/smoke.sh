#!/usr/bin/env bash
# Smoke test of sonde_sdk's glue to every interface of probe.wit: builds
# smoke/app.py with componentize-py and runs each mode with sonde against
# local servers (a TLS echo server with a throwaway self-signed certificate,
# on 127.0.0.1). Needs $SONDE_BIN, $COMPONENTIZE_PY (or componentize-py on
# PATH) and openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sdk="$(cd "$here/../.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

PYTHONPATH="$sdk/python/src" python3 -m sonde_sdk build app --app-dir "$here" -o "$work/smoke.wasm"
wasm="$work/smoke.wasm"
. "$sdk/python/smoke/servers.sh"
run_smoke
