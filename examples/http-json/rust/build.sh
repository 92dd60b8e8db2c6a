#!/usr/bin/env bash
# Builds the Rust http-json check for wasm32-wasip2 (its own crate, not a
# member of the sonde workspace; sonde-sdk by path).
#   examples/http-json/rust/build.sh [OUT.wasm]   (default: http-json.wasm here)
# The first build takes the workspace's Cargo.lock, so it resolves the same
# dependency versions as sonde itself.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${1:-$here/http-json.wasm}"
[ -f "$here/Cargo.lock" ] || cp "$repo/Cargo.lock" "$here/Cargo.lock"
cd "$here"
cargo build --quiet --release --target wasm32-wasip2
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
cp "$target_dir/wasm32-wasip2/release/http_json.wasm" "$out"
