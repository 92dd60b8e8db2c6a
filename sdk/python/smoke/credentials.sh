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
# Its work directory, its servers' cleanup and the SONDE_BIN check.
. "$sdk/python/smoke/credentials-lib.sh"

echo "== build smoke/credentials/app.py (componentize-py)"
PYTHONPATH="$sdk/python/src" python3 -m sonde_sdk build app --app-dir "$here/credentials" -o "$work/credentials.wasm"
wasm="$work/credentials.wasm"
run_credentials
