#!/usr/bin/env bash
# `sonde plugin new --lang rust|python|js`, end to end: for each language,
# creates a plugin, builds its component, runs the plugin's own tests (its
# fake-host unit tests, then the component through sonde), and runs
# `sonde check` on the component against a local TCP server, expecting a
# success, a failure (a closed port) and a refused config.
#   scripts/scaffolds.sh [rust] [python] [js]      (default: all three)
# Uses $SONDE_BIN when set, else $CARGO_TARGET_DIR/debug/sonde (building it
# when missing). componentize-py: $COMPONENTIZE_PY, or on PATH at the
# version sdk/python pins, else installed into a venv ($SONDE_PY_VENV,
# default ~/.cache/sonde-ci/componentize-py-VERSION). node and npm: on PATH;
# sdk/js's pinned tools are installed (npm ci) when missing.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -gt 0 ]; then langs=("$@"); else langs=(rust python js); fi

# The sonde binary, componentize-py, $work and its cleanup: as the
# http-json examples find them.
. "$repo/examples/http-json/lib.sh"
find_sonde
export SONDE_BIN

# The plugins' own component tests compile into this cache too.
export SONDE_TEST_CACHE_DIR="$work/cache"

# A TCP server answering +PONG to any line, as the templates' tests do.
python3 - "$work/port" <<'PY' &
import socketserver, sys
class Pong(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            if self.rfile.readline():
                self.wfile.write(b"+PONG\r\n")
        except OSError:
            pass  # sonde closes its connections with a reset
server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Pong)
open(sys.argv[1] + ".tmp", "w").write(str(server.server_address[1]))
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
PY
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
port="$(cat "$work/port")"
closed="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

# build_and_test LANG DIR: builds DIR's component, runs its own tests and
# prints the component's path last.
build_and_test() {
  local lang="$1" dir="$2"
  case "$lang" in
    rust)
      # The workspace's lock file: the versions sonde itself was built with.
      cp "$repo/Cargo.lock" "$dir/Cargo.lock"
      (cd "$dir" && cargo build --quiet --target wasm32-wasip2 --release && cargo test --quiet) >&2
      local target_dir
      target_dir="$(cd "$dir" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
      echo "$target_dir/wasm32-wasip2/release/demo_rust.wasm"
      ;;
    python)
      ensure_componentize_py
      (cd "$dir" && ./build.sh && ./test.sh) >&2
      echo "$dir/demo-python.wasm"
      ;;
    js)
      if [ ! -d "$repo/sdk/js/node_modules/@bytecodealliance/componentize-js" ]; then
        (cd "$repo/sdk/js" && npm ci --no-audit --no-fund --loglevel=error) >&2
      fi
      (cd "$dir" && npm install --no-audit --no-fund --loglevel=error && npm run --silent build && npm test) >&2
      echo "$dir/demo-js.wasm"
      ;;
  esac
}

failures=0
# `expect EXIT CONFIG [TARGET]` (lib.sh) checks $wasm against the server.
for lang in "${langs[@]}"; do
  case "$lang" in rust | python | js) ;; *) echo "unknown language $lang (rust, python, js)" >&2; exit 2 ;; esac
  echo "== $lang: sonde plugin new --lang $lang demo-$lang"
  dir="$work/demo-$lang"
  "$SONDE_BIN" plugin new --lang "$lang" "demo-$lang" --dir "$dir" --vendor "sonde CI"
  echo "== $lang: build, then the plugin's own tests"
  start=$(date +%s)
  wasm="$(build_and_test "$lang" "$dir" | tail -n 1)"
  echo "   ($(($(date +%s) - start)) s; $(stat -c %s "$wasm") bytes)"
  echo "== $lang: sonde check"
  expect 0 '{"send": "PING\r\n", "expect": "PONG"}'
  expect 2 '{}' "127.0.0.1:$closed"
  expect 3 '{"sned": "x"}'
done

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all scaffolds passed: ${langs[*]}"
