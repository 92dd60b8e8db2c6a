#!/usr/bin/env bash
# The vendor path of docs/oci.md, end to end on one machine:
#   new -> build -> sign -> push -> an agent pulls, verifies and runs it
#   -> the registry stops -> it still runs, from the agent's cache.
#
# Needs: a built `sonde` (SONDE=path, default: target/release/sonde or `sonde` on PATH),
# the wasm32-wasip2 target (rust-toolchain.toml lists it), and a registry: by
# default Debian's `docker-registry` is started on a free loopback port; set
# REGISTRY=host:port (and REGISTRY_FLAGS, such as "--registry-user U
# --registry-password-file F") to use another one.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
registry_pid=
cleanup() {
  [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

sonde=${SONDE:-}
if [ -z "$sonde" ]; then
  if [ -x "${CARGO_TARGET_DIR:-$repo/target}/release/sonde" ]; then
    sonde="${CARGO_TARGET_DIR:-$repo/target}/release/sonde"
  else
    sonde=sonde
  fi
fi
step() { printf '\n== %s\n' "$*"; }

start_registry() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  REGISTRY="127.0.0.1:$port"
  cat > "$work/registry.yml" <<YAML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: $REGISTRY
YAML
  docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "the registry did not start: $(cat "$work/registry.log")" >&2
  exit 1
}

if [ -z "${REGISTRY:-}" ]; then
  step "start a local registry (docker-registry)"
  start_registry
  REGISTRY_FLAGS="--insecure-registry"
fi
flags=(${REGISTRY_FLAGS:-})
echo "registry: $REGISTRY"

step "vendor: new plugin"
"$sonde" plugin new acme-port --dir "$work/acme-port" --vendor "ACME" --sdk "$repo/sdk"

step "vendor: build"
(cd "$work/acme-port" && CARGO_TARGET_DIR="$work/target" cargo build --target wasm32-wasip2 --release --quiet)
wasm="$work/target/wasm32-wasip2/release/acme_port.wasm"
ls -l "$wasm"

step "vendor: a key (cosign's format: acme.key, acme.pub) and a signed file"
"$sonde" plugin keygen "$work/acme.key"
"$sonde" plugin sign --key "$work/acme.key" "$wasm"

step "vendor: push and sign in the registry (as cosign sign does)"
ref="oci://$REGISTRY/acme/port-check:1.0"
out=$("$sonde" plugin push "$wasm" "$ref" --key "$work/acme.key" "${flags[@]}")
echo "$out"
pinned=$(echo "$out" | sed -n 's/^pushed \(oci:[^ ]*\) .*/\1/p')
echo "pinned: $pinned"

step "operator: pull, verify and run (the registry itself is the TCP target)"
agent=(--oci-cache "$work/agent-cache" "${flags[@]}")
# Whole, then its first lines: `| head` would close the pipe on sonde mid-write.
inspected=$("$sonde" plugin inspect "$pinned" "${agent[@]}")
sed -n 1,5p <<<"$inspected"
"$sonde" check "$pinned" --trust "$work/acme.pub" --target "$REGISTRY" "${agent[@]}"

step "operator: an untrusted key is refused"
"$sonde" plugin keygen "$work/other.key" >/dev/null
if "$sonde" check "$pinned" --trust "$work/other.pub" --target "$REGISTRY" "${agent[@]}"; then
  echo "expected a refusal" >&2
  exit 1
fi

if [ -n "$registry_pid" ]; then
  step "the registry stops; the agent runs from its cache"
  kill "$registry_pid"
  wait "$registry_pid" 2>/dev/null || true
  registry_pid=
  python3 -m http.server --bind 127.0.0.1 "${REGISTRY##*:}" >/dev/null 2>&1 &
  registry_pid=$!  # a TCP target on the same port, so the probe has something to reach
  sleep 0.5
  "$sonde" check "$pinned" --trust "$work/acme.pub" --target "$REGISTRY" "${agent[@]}"
fi
echo
echo "vendor flow: OK"
