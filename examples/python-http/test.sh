#!/usr/bin/env bash
# Builds the Python example plugin with componentize-py and checks it through
# `sonde check` against a real HTTP server (Python's http.server on loopback).
# Run from anywhere: examples/python-http/test.sh
# Uses $SONDE_BIN when set, else builds sonde with cargo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version=0.25.1

if ! command -v componentize-py >/dev/null || [ "$(componentize-py --version | awk '{print $2}')" != "$version" ]; then
  python3 -m pip install --quiet "componentize-py==$version"
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== build the component"
(cd "$here" && componentize-py -d "$repo/sdk/wit" -w plugin componentize app -o "$work/python-http.wasm")

if [ -z "${SONDE_BIN:-}" ]; then
  echo "== build sonde"
  (cd "$repo" && cargo build --quiet --bin sonde)
  target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  SONDE_BIN="$target_dir/debug/sonde"
fi

echo "== start a loopback HTTP server"
mkdir "$work/site"
echo "all good" > "$work/site/healthz"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/site" >/dev/null 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.1)" 2>/dev/null && break
  sleep 0.05
done
closed="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

failures=0
expect() {
  local want="$1" target="$2" config="$3"
  set +e
  # The 18 MB component takes sonde 20-30 s to compile on a busy 2-core
  # machine, past the default budget of one compile (20s); later checks
  # load it from the cache.
  out="$("$SONDE_BIN" --cache-dir "$work/cache" check "$work/python-http.wasm" --timeout 10s --target "$target" --config "$config" 2>&1)"
  got=$?
  set -e
  if [ "$got" = "$want" ]; then
    echo "ok   exit $got  $config -> ${out%%$'\n'*}"
  else
    echo "FAIL expected exit $want, got $got: $config -> $out"
    failures=$((failures + 1))
  fi
}

echo "== checks"
expect 0 "127.0.0.1:$port" '{"path": "/healthz"}'
expect 0 "127.0.0.1:$port" '{"path": "/healthz", "contains": "good"}'
expect 2 "127.0.0.1:$port" '{"path": "/healthz", "contains": "bad"}'
expect 2 "127.0.0.1:$port" '{"path": "/missing"}'
expect 2 "127.0.0.1:$closed" '{}'
expect 3 "127.0.0.1:$port" '{"pth": "/healthz"}'

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
