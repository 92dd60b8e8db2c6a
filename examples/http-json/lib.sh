# Shared by python/test.sh, js/test.sh, rust/test.sh and scripts/scaffolds.sh:
# the sonde binary, componentize-py, a scratch directory, the local server,
# and `expect EXIT CONFIG [TARGET]` runs of `sonde check`.
# Sourced with $here (the language folder) and $repo set.

http_json="$repo/examples/http-json"

# $SONDE_BIN, else the debug build in $CARGO_TARGET_DIR (CI's), else build it.
find_sonde() {
  if [ -n "${SONDE_BIN:-}" ]; then return; fi
  local target_dir="${CARGO_TARGET_DIR:-}"
  if [ -z "$target_dir" ]; then
    target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  fi
  if [ ! -x "$target_dir/debug/sonde" ]; then
    echo "== build sonde"
    (cd "$repo" && cargo build --quiet --bin sonde)
  fi
  SONDE_BIN="$target_dir/debug/sonde"
}

# $COMPONENTIZE_PY, else componentize-py on PATH at the version the Python
# SDK requires, else that version installed into a venv of CI's cache.
ensure_componentize_py() {
  local version venv
  if [ -n "${COMPONENTIZE_PY:-}" ]; then export COMPONENTIZE_PY; return; fi
  version="$(sed -n 's/^REQUIRED_COMPONENTIZE_PY = "\(.*\)"/\1/p' "$repo/sdk/python/src/sonde_sdk/build.py")"
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

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

start_server() {
  python3 "$http_json/serve.py" "$work/port" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
  port="$(cat "$work/port")"
  closed="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
}

failures=0
last_seconds=""
# expect EXIT CONFIG [TARGET]: runs `sonde check` on $wasm and compares the
# exit code (0 success, 1 warning, 2 failure, 3 unknown). A fresh cache
# ($work/cache): the first run compiles the component.
expect() {
  local want="$1" config="$2" target="${3:-127.0.0.1:$port}" start end out got
  start=$(date +%s.%N)
  set +e
  out="$("$SONDE_BIN" --cache-dir "$work/cache" check "$wasm" \
    --timeout 10s --target "$target" --config "$config" 2>&1)"
  got=$?
  set -e
  end=$(date +%s.%N)
  last_seconds="$(python3 -c "print(f'{$end - $start:.2f}')")"
  if [ "$got" = "$want" ]; then
    echo "ok   exit $got  ${last_seconds}s  $config -> ${out%%$'\n'*}"
  else
    echo "FAIL expected exit $want, got $got: $config -> $out"
    failures=$((failures + 1))
  fi
}

# The checks every language's component must pass, the same for each.
run_checks() {
  echo "== component: $(ls -l "$wasm" | awk '{print $5}') bytes"
  echo "== checks through sonde ($SONDE_BIN)"
  expect 0 '{"field": "status", "expected": "ok"}'
  echo "   first run (compiles the component): ${last_seconds}s"
  expect 0 '{"field": "checks.db", "expected": "up", "warn_after": "5s"}'
  echo "   second run (cached): ${last_seconds}s"
  expect 2 '{"path": "/degraded", "field": "status", "expected": "ok"}'
  expect 2 '{"path": "/down", "field": "status", "expected": "ok"}'
  expect 1 '{"path": "/slow", "field": "status", "expected": "ok", "warn_after": "100ms"}'
  expect 2 '{"path": "/notjson", "field": "status", "expected": "ok"}'
  expect 2 '{"field": "status", "expected": "ok"}' "127.0.0.1:$closed"
  expect 0 '{"field": "status", "expected": "ok"}' "http://127.0.0.1:$port/health"
  expect 3 '{"field": "status", "expected": "ok", "pth": "/x"}'
  expect 3 '{"field": "status"}'
  if [ -n "${SONDE_BENCH:-}" ]; then
    echo "== sonde bench (per-call cost; SONDE_BENCH=$SONDE_BENCH runs)"
    "$SONDE_BIN" --cache-dir "$work/cache" bench "$wasm" -n "$SONDE_BENCH" -j 2 \
      --target "127.0.0.1:$port" --config '{"field": "status", "expected": "ok"}' || failures=$((failures + 1))
  fi
}

finish() {
  if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
}
