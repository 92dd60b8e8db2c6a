# Programs the tests compare sonde with that Debian does not package at
# the version wanted, built from the Go module proxy with `go install`
# into a cache kept between runs. Sourced by scripts/test (which CI runs);
# run alone, it builds them and prints the lines to export:
#
#   eval "$(scripts/tools.sh)"   # then cargo test as usual
#
# The cache is ${SONDE_TOOLS_CACHE:-$HOME/.cache/sonde/tools}: bin/ holds
# each binary under a name carrying its pinned version, go/ the Go module
# and build caches. A binary already there is not built again.

# blackbox_exporter's current release, compared with sonde's /probe
# beside Debian's 0.23 (runtime/sonde/tests/all/blackbox/).
BLACKBOX_028_VERSION=0.28.0
# The OpenTelemetry Collector the OTLP export is sent to
# (runtime/sonde/tests/all/otlp.rs): scripts/otelcol/main.go, the OTLP
# receiver and the contrib file exporter at one release. 0.161.0 is the
# newest whose file exporter the Go module proxy serves with all it needs.
OTELCOL_VERSION=0.161.0
# Prometheus 3, whose OTLP receiver takes the export too
# (runtime/sonde/tests/all/otlp.rs). Built from its Go module (v0.305.1 is
# 3.5.1): Debian forky's 3.5 package is built without the OTLP receiver,
# and bookworm's Prometheus 2 stays installed (other tests use its
# promtool).
PROMETHEUS3_VERSION=3.5.1

# Puts a Go toolchain (1.24 or later) on PATH: Go's own archive in
# /usr/local/go when there is one, else Debian 13's golang-go, installed
# alone (scripts/setup.sh). The tests use it to build the tools below and
# to compare sonde's regex dialect with Go's regexp (sdk/regex).
ensure_go() {
  command -v go >/dev/null 2>&1 || [ ! -x /usr/local/go/bin/go ] || PATH="$PATH:/usr/local/go/bin"
  if ! command -v go >/dev/null 2>&1; then
    ensure_trixie_packages golang-go >&2
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "sonde: go is not installed and Debian 13's golang-go did not install; install Go 1.24 or later" >&2
    return 1
  fi
  export PATH
}

# Builds blackbox_exporter $BLACKBOX_028_VERSION when it is not in the
# cache, checks what its --version says, and exports SONDE_BLACKBOX_028
# (its path) for the tests.
ensure_blackbox_028() {
  local cache=${SONDE_TOOLS_CACHE:-$HOME/.cache/sonde/tools}
  local bin="$cache/bin/blackbox_exporter-$BLACKBOX_028_VERSION"
  local module=github.com/prometheus/blackbox_exporter
  if [ ! -x "$bin" ]; then
    ensure_go || return 1
    echo "== building blackbox_exporter $BLACKBOX_028_VERSION with go install (once, into $cache)" >&2
    go_install "$cache" "$module@v$BLACKBOX_028_VERSION" \
      "-X github.com/prometheus/common/version.Version=$BLACKBOX_028_VERSION" || return 1
    mv "$cache/go/bin/blackbox_exporter" "$bin"
  fi
  check_version "$bin" "^blackbox_exporter, version $BLACKBOX_028_VERSION " \
    "blackbox_exporter $BLACKBOX_028_VERSION" || return 1
  export SONDE_BLACKBOX_028="$bin"
}

# Builds the Collector of scripts/otelcol/main.go at $OTELCOL_VERSION
# when it is not in the cache, checks its --version, and exports
# SONDE_OTELCOL (its path) for the tests.
ensure_otelcol() {
  local cache=${SONDE_TOOLS_CACHE:-$HOME/.cache/sonde/tools}
  local bin="$cache/bin/otelcol-sonde-$OTELCOL_VERSION" src="$cache/src/otelcol-$OTELCOL_VERSION"
  if [ ! -x "$bin" ]; then
    ensure_go || return 1
    echo "== building the OpenTelemetry Collector $OTELCOL_VERSION (OTLP receiver, file exporter) from the Go module proxy (once, into $cache; a few minutes)" >&2
    mkdir -p "$src" "$cache/bin"
    cp scripts/otelcol/main.go "$src/main.go"
    printf '%s\n' "module sonde.invalid/otelcol" "" "go 1.24" "" "require (" \
      "	github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter v$OTELCOL_VERSION" \
      "	go.opentelemetry.io/collector/otelcol v$OTELCOL_VERSION" \
      "	go.opentelemetry.io/collector/receiver/otlpreceiver v$OTELCOL_VERSION" ")" >"$src/go.mod"
    go_build "$cache" "$src" "$bin" "-X main.version=$OTELCOL_VERSION" . "the Collector $OTELCOL_VERSION" || return 1
  fi
  check_version "$bin" "version $OTELCOL_VERSION\$" "version $OTELCOL_VERSION" || return 1
  export SONDE_OTELCOL="$bin"
}

# Builds Prometheus $PROMETHEUS3_VERSION's server from the Go module proxy
# when it is not in the cache (a module requiring it, as for the
# Collector: `go install` refuses its go.mod), checks its --version, and
# exports SONDE_PROMETHEUS3 (its path).
ensure_prometheus3() {
  local cache=${SONDE_TOOLS_CACHE:-$HOME/.cache/sonde/tools}
  local bin="$cache/bin/prometheus-$PROMETHEUS3_VERSION" src="$cache/src/prometheus-$PROMETHEUS3_VERSION"
  # Prometheus 3.x is the module's v0.3xx.y.
  local module_version
  module_version="v0.$((300 + $(echo "$PROMETHEUS3_VERSION" | cut -d. -f2))).$(echo "$PROMETHEUS3_VERSION" | cut -d. -f3)"
  if [ ! -x "$bin" ]; then
    ensure_go || return 1
    echo "== building Prometheus $PROMETHEUS3_VERSION ($module_version) from the Go module proxy (once, into $cache; a few minutes)" >&2
    mkdir -p "$src" "$cache/bin"
    printf '%s\n' "module sonde.invalid/prometheus" "" "go 1.24" "" \
      "require github.com/prometheus/prometheus $module_version" >"$src/go.mod"
    printf '%s\n' "//go:build tools" "" "package tools" "" \
      'import _ "github.com/prometheus/prometheus/cmd/prometheus"' >"$src/tools.go"
    go_build "$cache" "$src" "$bin" "-X github.com/prometheus/common/version.Version=$PROMETHEUS3_VERSION" \
      github.com/prometheus/prometheus/cmd/prometheus "Prometheus $PROMETHEUS3_VERSION" || return 1
  fi
  check_version "$bin" "^prometheus, version $PROMETHEUS3_VERSION " "Prometheus $PROMETHEUS3_VERSION" || return 1
  export SONDE_PROMETHEUS3="$bin"
}

# `go build` of package $5 in the module whose go.mod is in $2, into $3,
# with the Go caches under $1 and $4 as the linker's flags (the module's
# requirements resolved by `go mod tidy` first). Says what failed ($6
# names it), and go's words, when a module was not served or it did not
# build.
go_build() {
  local cache=$1 src=$2 bin=$3 ldflags=$4 package=$5 what=$6 log
  log=$(mktemp)
  local env=(env GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOPATH="$cache/go/path"
    GOTOOLCHAIN=local GOFLAGS=-modcacherw)
  if ! (cd "$src" && "${env[@]}" go mod tidy && "${env[@]}" go build -trimpath \
    -ldflags "$ldflags" -o "$bin" "$package") >"$log" 2>&1; then
    echo "sonde: building $what failed (GOPROXY=$(go env GOPROXY)): a module was not served or it did not build. go said:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# Whether `$1 --version` matches the grep pattern $2; if not, says that
# it is not $3 and how to rebuild it.
check_version() {
  local bin=$1 pattern=$2 what=$3
  if ! "$bin" --version 2>&1 | grep -q "$pattern"; then
    echo "sonde: $bin does not say it is $what; its --version says:" >&2
    "$bin" --version >&2 || true
    echo "remove it and run this again to rebuild it" >&2
    return 1
  fi
}

# `go install` of module $2 (path@version) with the Go caches under
# $1/go, the binary in $1/go/bin, and $3 as the linker's -X flags. The
# module is downloaded first, then installed from its own directory: `go
# install path@version` also asks the proxy for the module's list of
# versions (to warn of a deprecation), which a proxy may refuse while it
# serves the version itself. Says what failed, and go's words, when the
# proxy cannot serve it or it does not build.
go_install() {
  local cache=$1 module=$2 ldflags=$3 log dir
  mkdir -p "$cache/bin" "$cache/go/bin"
  log=$(mktemp)
  local env=(env GOBIN="$cache/go/bin" GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
    GOPATH="$cache/go/path" GOTOOLCHAIN=local GOFLAGS=-modcacherw)
  # With -json, go writes a failure to stdout as the "Error" field.
  "${env[@]}" go mod download -json "$module" >"$log" 2>&1
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' "$log")
  if [ -z "$dir" ] || grep -q '"Error"' "$log"; then
    echo "sonde: go mod download $module failed (GOPROXY=$(go env GOPROXY)): the Go module proxy did not serve it. go said:" >&2
  elif ! (cd "$dir" && "${env[@]}" go install -trimpath -ldflags "$ldflags" .) >"$log" 2>&1; then
    echo "sonde: go install of $module failed (GOPROXY=$(go env GOPROXY)): a dependency could not be fetched or it did not build. go said:" >&2
  else
    rm -f "$log"
    return 0
  fi
  cat "$log" >&2
  rm -f "$log"
  return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  . "$(dirname "$0")/setup.sh"
  ensure_go
  ensure_blackbox_028
  ensure_otelcol
  ensure_prometheus3
  echo "export PATH=\"$PATH\" SONDE_BLACKBOX_028=$SONDE_BLACKBOX_028 SONDE_OTELCOL=$SONDE_OTELCOL SONDE_PROMETHEUS3=$SONDE_PROMETHEUS3"
fi
