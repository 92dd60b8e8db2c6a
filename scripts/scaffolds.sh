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

if [ -z "${SONDE_BIN:-}" ]; then
  target_dir="${CARGO_TARGET_DIR:-$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}"
  [ -x "$target_dir/debug/sonde" ] || (cd "$repo" && cargo build --quiet --bin sonde)
  SONDE_BIN="$target_dir/debug/sonde"
fi
export SONDE_BIN

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
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

componentize_py() {
  local version venv
  version="$(sed -n 's/^REQUIRED_COMPONENTIZE_PY = "\(.*\)"/\1/p' "$repo/sdk/python/src/sonde_sdk/build.py")"
  if [ -n "${COMPONENTIZE_PY:-}" ]; then return; fi
  if [ "$(componentize-py --version 2>/dev/null)" = "componentize-py $version" ]; then
    COMPONENTIZE_PY="$(command -v componentize-py)"
  else
    venv="${SONDE_PY_VENV:-$HOME/.cache/sonde-ci/componentize-py-$version}"
    if [ "$("$venv/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $version" ]; then
      echo "== install componentize-py $version into $venv"
      python3 -m venv --clear "$venv"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "componentize-py==$version"
    fi
    COMPONENTIZE_PY="$venv/bin/componentize-py"
  fi
  export COMPONENTIZE_PY
}

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
      componentize_py
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
# expect LANG EXIT WASM TARGET CONFIG: one `sonde check`, its exit code compared.
expect() {
  local lang="$1" want="$2" wasm="$3" target="$4" config="$5" out got
  set +e
  out="$("$SONDE_BIN" --cache-dir "$work/cache" check "$wasm" --timeout 10s --target "$target" --config "$config" 2>&1)"
  got=$?
  set -e
  if [ "$got" = "$want" ]; then
    echo "ok   $lang: exit $got  $config -> ${out%%$'\n'*}"
  else
    echo "FAIL $lang: expected exit $want, got $got: $config -> $out"
    failures=$((failures + 1))
  fi
}

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
  expect "$lang" 0 "$wasm" "127.0.0.1:$port" '{"send": "PING\r\n", "expect": "PONG"}'
  expect "$lang" 2 "$wasm" "127.0.0.1:$closed" '{}'
  expect "$lang" 3 "$wasm" "127.0.0.1:$port" '{"sned": "x"}'
done

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all scaffolds passed: ${langs[*]}"
