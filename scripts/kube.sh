# The Kubernetes servers the e2e suites run against
# (runtime/sonde/tests/all/kubernetes/e2e*.rs), built from the Go module
# proxy at pinned versions into a cache kept between runs: etcd, and
# the control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler), kubectl, kubelet and kube-proxy of the oldest
# Kubernetes docs/kubernetes.md supports and of the newest release.
# Sourced by scripts/test (which CI runs); run alone, it builds them and
# prints the lines to export:
#
#   eval "$(scripts/kube.sh)"   # then scripts/kube-cluster.sh start ...
#
# The cache is ${SONDE_KUBE_CACHE:-$HOME/.cache/sonde/kube}: bin/ holds
# each binary under a name carrying its version, src/ the small module
# each is built through, go/ the Go module and build caches while it
# builds. A binary already there is not built again.

# The oldest Kubernetes docs/kubernetes.md supports (its last patch
# release) and the newest release the Go module proxy serves.
KUBE_OLDEST_VERSION=1.24.17
KUBE_NEWEST_VERSION=1.37.2
# The etcd both API servers store in (a 3.6 server serves 1.24's 3.5
# client: the gRPC API is the same).
ETCD_VERSION=3.6.16
# What is built of each version: the control plane scripts/kube-cluster.sh
# runs, with the kubectl it drives it with, and a node's kubelet and
# kube-proxy.
KUBE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

# node-problem-detector, run beside sonde on the same monitor files by
# runtime/sonde/tests/all/kubernetes/e2e_npd_side.rs: the newest release
# the Go module proxy serves (v1.36.0; it answers 403 for v1.35.3 and
# v1.34.4, and serves no version list).
NPD_VERSION=1.36.0

# Builds etcd and the Kubernetes components of both versions when they
# are not in the cache, checks what each says its version is, and
# exports SONDE_KUBE_BIN (the cache's bin/), SONDE_KUBE_VERSIONS (both
# versions) and SONDE_ETCD_VERSION.
ensure_kube() {
  local cache=${SONDE_KUBE_CACHE:-$HOME/.cache/sonde/kube} version
  ensure_etcd "$cache" || return 1
  for version in "$KUBE_OLDEST_VERSION" "$KUBE_NEWEST_VERSION"; do
    ensure_kubernetes "$cache" "$version" || return 1
  done
  # Go's module and build caches hold about 9 GB once both versions are
  # built, for binaries of 1.1 GB: they go once the binaries are there (a
  # new pinned version downloads and compiles again).
  rm -rf "$cache/go"
  export SONDE_KUBE_BIN="$cache/bin" SONDE_KUBE_VERSIONS="$KUBE_OLDEST_VERSION $KUBE_NEWEST_VERSION"
  export SONDE_ETCD_VERSION="$ETCD_VERSION"
  ensure_npd || return 1
}

# node-problem-detector $NPD_VERSION as bin/node-problem-detector-$NPD_VERSION,
# its journald monitor in (build tag `journald`, cgo against libsystemd:
# Debian's libsystemd-dev), and its module's files (config/, its example
# monitors and their scripts) kept as src/node-problem-detector-$NPD_VERSION.
# Exports SONDE_NPD_BIN (the binary) and SONDE_NPD_DIR (the module's files).
ensure_npd() {
  local cache=${SONDE_KUBE_CACHE:-$HOME/.cache/sonde/kube}
  local bin="$cache/bin/node-problem-detector-$NPD_VERSION" dir="$cache/src/node-problem-detector-$NPD_VERSION"
  local src="$cache/src/npd-build-$NPD_VERSION" log
  if [ ! -x "$bin" ] || [ ! -f "$dir/config/kernel-monitor.json" ]; then
    ensure_go || return 1
    echo "== building node-problem-detector $NPD_VERSION from the Go module proxy (once, into $cache; about five minutes with 2 cores)" >&2
    mkdir -p "$src"
    cat >"$src/go.mod" <<EOF
module sonde.invalid/npd

go 1.26

require k8s.io/node-problem-detector v$NPD_VERSION
EOF
    log=$(mktemp)
    if ! (cd "$src" && go_env "$cache" go mod download -json "k8s.io/node-problem-detector@v$NPD_VERSION") >"$log" 2>&1 ||
      grep -q '"Error"' "$log"; then
      echo "sonde: go mod download k8s.io/node-problem-detector@v$NPD_VERSION failed (GOPROXY=$(go env GOPROXY)): the Go module proxy did not serve it. go said:" >&2
      cat "$log" >&2
      rm -f "$log"
      return 1
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    cp -r "$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' "$log")/." "$dir/"
    # A module zip keeps no file modes: NPD's example plugins are programs.
    chmod -R u+w "$dir"
    chmod +x "$dir"/config/plugin/*.sh
    rm -f "$log"
    CGO_ENABLED=1 GO_BUILD_TAGS=journald go_build_in "$cache" "$src" "$bin" \
      "-X k8s.io/node-problem-detector/pkg/version.version=v$NPD_VERSION" \
      k8s.io/node-problem-detector/cmd/nodeproblemdetector || return 1
    rm -rf "$cache/go" "$src"
  fi
  if ! [[ $("$bin" --version 2>&1) == *"v$NPD_VERSION"* ]]; then
    echo "sonde: $bin does not say it is node-problem-detector v$NPD_VERSION; its --version says:" >&2
    "$bin" --version >&2 || true
    echo "remove it and run this again to rebuild it" >&2
    return 1
  fi
  export SONDE_NPD_BIN="$bin" SONDE_NPD_DIR="$dir"
}

# etcd $ETCD_VERSION as bin/etcd-$ETCD_VERSION: etcd's own main, a call
# of etcdmain.Main, in a module that requires go.etcd.io/etcd/server/v3.
ensure_etcd() {
  local cache=$1 bin="$1/bin/etcd-$ETCD_VERSION" src="$1/src/etcd-$ETCD_VERSION"
  if [ ! -x "$bin" ]; then
    ensure_go || return 1
    echo "== building etcd $ETCD_VERSION from the Go module proxy (once, into $cache; about a minute)" >&2
    mkdir -p "$src"
    cat >"$src/go.mod" <<EOF
module sonde.invalid/etcd

go 1.24

require go.etcd.io/etcd/server/v3 v$ETCD_VERSION
EOF
    cat >"$src/main.go" <<'EOF'
// etcd's own main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    go_build_in "$cache" "$src" "$bin" "" . || return 1
  fi
  # Read whole: grep -q would stop reading and, under pipefail, fail.
  if ! [[ $("$bin" --version 2>/dev/null) =~ (^|$'\n')"etcd Version: $ETCD_VERSION"($'\n'|$) ]]; then
    echo "sonde: $bin does not say it is etcd $ETCD_VERSION; its --version says:" >&2
    "$bin" --version >&2 || true
    echo "remove it and run this again to rebuild it" >&2
    return 1
  fi
}

# The components of Kubernetes $2 as bin/<component>-$2. k8s.io/kubernetes
# cannot be built as a dependency as it is: its go.mod replaces each
# k8s.io/ staging module (k8s.io/api, k8s.io/client-go...) with a
# directory its module zip does not hold, and go ignores a dependency's
# replacements anyway. So it is built through a module of its own whose
# go.mod requires it and carries its replacements, each staging module
# replaced with its published release (v0.Y.Z for v1.Y.Z).
ensure_kubernetes() {
  local cache=$1 version=$2 src="$1/src/kubernetes-$2" component missing=() minor
  minor=${version#*.}
  minor=${minor%%.*}
  for component in "${KUBE_COMPONENTS[@]}"; do
    [ -x "$cache/bin/$component-$version" ] || missing+=("$component")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    ensure_go || return 1
    echo "== building ${missing[*]} $version from the Go module proxy (once, into $cache; 6 to 10 minutes with 2 cores)" >&2
    kubernetes_module "$cache" "$version" "$src" || return 1
    local ldflags="" package
    # What the binaries say their version is, in both packages that hold
    # it (the API server's /version reads client-go's; newer servers also
    # derive their compatibility version from it).
    for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $package.gitVersion=v$version -X $package.gitMajor=1 -X $package.gitMinor=$minor"
      ldflags+=" -X $package.gitTreeState=clean"
    done
    for component in "${missing[@]}"; do
      go_build_in "$cache" "$src" "$cache/bin/$component-$version" "$ldflags" "k8s.io/kubernetes/cmd/$component" || return 1
    done
  fi
  for component in "${KUBE_COMPONENTS[@]}"; do
    if [ "$(kubernetes_version "$cache/bin/$component-$version")" != "1 $minor v$version" ]; then
      echo "sonde: $cache/bin/$component-$version does not say it is Kubernetes v$version (major 1, minor $minor); it says:" >&2
      kubernetes_version "$cache/bin/$component-$version" >&2 || true
      echo "remove it and run this again to rebuild it" >&2
      return 1
    fi
  done
}

# The major and minor version and the git version Kubernetes binary $1
# says it is, on one line.
kubernetes_version() {
  local raw
  case $1 in
  */kubectl-*) raw=$("$1" version --client --output=json 2>/dev/null) ;;
  *) raw=$("$1" --version=raw 2>/dev/null) ;;
  esac
  # Major, not EmulationMajor: the field's name follows "{" or ",".
  printf '%s' "$raw" | tr -d ' \n' |
    sed -n 's/.*[{,]"\{0,1\}[Mm]ajor"\{0,1\}:"\([^"]*\)".*[{,]"\{0,1\}[Mm]inor"\{0,1\}:"\([^"]*\)".*[{,]"\{0,1\}[Gg]itVersion"\{0,1\}:"\([^"]*\)".*/\1 \2 \3\n/p'
}

# Writes $3/go.mod: a module requiring k8s.io/kubernetes v$2 with its
# go.mod's replacements, those of staging modules by their releases.
kubernetes_module() {
  local cache=$1 version=$2 src=$3 log gomod
  mkdir -p "$src"
  log=$(mktemp)
  go_env "$cache" go mod download -json "k8s.io/kubernetes@v$version" >"$log" 2>&1
  gomod=$(sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p' "$log")
  if [ -z "$gomod" ] || grep -q '"Error"' "$log"; then
    echo "sonde: go mod download k8s.io/kubernetes@v$version failed (GOPROXY=$(go env GOPROXY)): the Go module proxy did not serve it. go said:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
  {
    echo "module sonde.invalid/kubernetes"
    echo
    grep -m1 '^go ' "$gomod"
    echo
    echo "require k8s.io/kubernetes v$version"
    echo
    # The replace block, its staging directories turned into releases.
    awk '/^replace \($/ { on = 1 } on { print } on && /^\)$/ { on = 0 }' "$gomod" |
      sed "s#=> \./staging/src/\(k8s\.io/[^ ]*\)\$#=> \1 v0.${version#*.}#"
  } >"$src/go.mod"
}

# `go build -o $3 -ldflags $4 $5` in module directory $2 (with -tags
# $GO_BUILD_TAGS when set), with the Go
# caches under $1/go; -mod=mod lets go write the module's go.sum from
# what it downloads (checked against the checksum database). Says what
# failed, and go's words, when it does not build.
go_build_in() {
  local cache=$1 src=$2 out=$3 ldflags=$4 package=$5 log start=$SECONDS
  mkdir -p "$cache/bin"
  log=$(mktemp)
  if ! (cd "$src" && go_env "$cache" go build -mod=mod -trimpath ${GO_BUILD_TAGS:+-tags "$GO_BUILD_TAGS"} -ldflags "-s -w $ldflags" -o "$out.tmp" "$package") >"$log" 2>&1; then
    echo "sonde: go build of $package in $src failed (GOPROXY=$(go env GOPROXY), $(go version)): a module could not be fetched or it did not build. go said:" >&2
    cat "$log" >&2
    rm -f "$log" "$out.tmp"
    return 1
  fi
  rm -f "$log"
  mv "$out.tmp" "$out"
  echo "   built $(basename "$out") in $((SECONDS - start)) s" >&2
}

# Runs $2... with Go's caches under $1/go and the local toolchain.
go_env() {
  local cache=$1
  shift
  env GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOPATH="$cache/go/path" \
    GOTOOLCHAIN="$(go_toolchain)" GOFLAGS=-modcacherw "$@"
}

# The Go toolchain builds use: the local one when it is at least
# $GO_NEEDED (what k8s.io/kubernetes $KUBE_NEWEST_VERSION's go.mod asks
# for), else $GO_FETCHED, which go fetches from the module proxy once (a
# machine with Debian 13's Go 1.24, say).
GO_NEEDED=1.26.0
GO_FETCHED=go1.27.3
go_toolchain() {
  local have
  have=$(go env GOVERSION)
  have=${have#go}
  if [ "$(printf '%s\n' "$GO_NEEDED" "$have" | sort -V | head -n1)" = "$GO_NEEDED" ]; then
    echo local
  else
    echo "$GO_FETCHED"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  . "$(dirname "$0")/setup.sh"
  . "$(dirname "$0")/tools.sh"
  ensure_go
  ensure_kube
  echo "export PATH=\"$PATH\" SONDE_KUBE_BIN=$SONDE_KUBE_BIN SONDE_KUBE_VERSIONS=\"$SONDE_KUBE_VERSIONS\" SONDE_ETCD_VERSION=$SONDE_ETCD_VERSION SONDE_NPD_BIN=$SONDE_NPD_BIN SONDE_NPD_DIR=$SONDE_NPD_DIR"
fi
