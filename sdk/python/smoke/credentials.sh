#!/usr/bin/env bash
# End-to-end test of sonde_sdk.credentials: builds smoke/credentials/app.py
# with componentize-py and runs it with `sonde check --secret NAME=FILE`
# against real servers on 127.0.0.1 (credentials-lib.sh): redis_login
# against redis-server (requirepass, and an ACL user), postgres_login
# against a throwaway PostgreSQL cluster, client_certificate against a TLS
# server that requires one; right and wrong secrets, secrets not granted,
# malformed handles. Needs $SONDE_BIN, $COMPONENTIZE_PY (or componentize-py
# on PATH), redis-server, PostgreSQL and openssl (scripts/test installs them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sdk="$(cd "$here/../.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() {
  stop_postgres 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
: "${SONDE_BIN:?set SONDE_BIN to the sonde binary}"

echo "== build smoke/credentials/app.py (componentize-py)"
PYTHONPATH="$sdk/python/src" python3 -m sonde_sdk build app --app-dir "$here/credentials" -o "$work/credentials.wasm"
wasm="$work/credentials.wasm"
. "$sdk/python/smoke/credentials-lib.sh"
run_credentials
