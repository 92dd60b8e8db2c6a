#!/usr/bin/env bash
# The Rust http-json check: its unit tests, then the component built for
# wasm32-wasip2 and run by `sonde check` against a local HTTP server
# (examples/http-json/serve.py on 127.0.0.1), the same runs as the Python
# and JavaScript versions. Uses $SONDE_BIN when set, else
# $CARGO_TARGET_DIR/debug/sonde, else builds sonde. SONDE_BENCH=N adds
# `sonde bench`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
. "$repo/examples/http-json/lib.sh"

[ -f "$here/Cargo.lock" ] || cp "$repo/Cargo.lock" "$here/Cargo.lock"
echo "== unit tests"
(cd "$here" && cargo test --quiet --lib)

find_sonde
echo "== build the component"
wasm="$work/http-json-rs.wasm"
"$here/build.sh" "$wasm"
start_server
run_checks
finish
