#!/usr/bin/env bash
# End-to-end test of @sonde/sdk's credentials: builds smoke/credentials/app.js
# with componentize-js and runs it with `sonde check --secret NAME=FILE`
# against real servers on 127.0.0.1 (the same servers and checks as
# sdk/python/smoke/credentials.sh, whose credentials-lib.sh it shares).
# Needs $SONDE_BIN, npm ci in sdk/js, redis-server, PostgreSQL and openssl
# (scripts/test installs them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sdk="$(cd "$here/../.." && pwd)"
# Its work directory, its servers' cleanup and the SONDE_BIN check.
. "$sdk/python/smoke/credentials-lib.sh"

echo "== build smoke/credentials/app.js (componentize-js)"
node "$sdk/js/bin/sonde-js-build.js" "$here/credentials/app.js" -o "$work/credentials.wasm"
wasm="$work/credentials.wasm"
run_credentials
