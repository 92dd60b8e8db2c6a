# Shared by scripts/run, scripts/test and .ci/run (sourced, not run):
# install what sonde needs before the first compile, so a missing piece
# fails in seconds with the command that fixes it, not ten minutes into
# a build script.

# The Rust toolchain rust-toolchain.toml pins, with the wasm target the
# built-in plugins are compiled for. rustup installs a missing toolchain
# with the file's targets, but never adds a target to a toolchain that is
# already installed; with RUSTUP_AUTO_INSTALL=0 it installs nothing.
ensure_toolchain() {
  local channel target=wasm32-wasip2 sysroot
  channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  if command -v rustup >/dev/null 2>&1; then
    if ! rustup toolchain list | grep -q "^$channel"; then
      echo "== installing Rust $channel (rust-toolchain.toml) with the $target target"
      rustup toolchain install "$channel" --profile minimal --component rustfmt,clippy --target "$target"
    fi
    if ! rustup target list --installed --toolchain "$channel" | grep -qx "$target"; then
      echo "== installing the $target target (sonde's plugins are compiled for it)"
      rustup target add --toolchain "$channel" "$target"
    fi
  fi
  # Whatever installed Rust, check the target is really there.
  sysroot=$(rustc --print sysroot 2>/dev/null || true)
  if [ -z "$sysroot" ] || [ ! -d "$sysroot/lib/rustlib/$target" ]; then
    echo "sonde: the $target target is not installed for rustc ${sysroot:-(not found)}." >&2
    echo "Install it with: rustup target add $target   (no rustup? install it from https://rustup.rs, then run this again)" >&2
    exit 1
  fi
}

# Debian packages, installed with apt-get when missing (as root, else
# through sudo).
ensure_packages() {
  local missing=() sudo
  mapfile -t missing < <(missing_packages "$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  sudo=$(root_or_sudo "${missing[*]}") || exit 1
  sudo=(${sudo})
  echo "== installing Debian packages: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Which of the packages named are not installed, one per line.
missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# `sudo` when not root (nothing when root), one word per line; exits with
# what to install by hand when neither apt-get nor sudo can be used.
root_or_sudo() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "sonde: the tests need these programs' Debian packages: $1; install their equivalents with your package manager, then run this again." >&2
    exit 1
  fi
  [ "$(id -u)" -eq 0 ] && return 0
  if command -v sudo >/dev/null 2>&1; then
    echo sudo
  else
    echo "sonde: missing Debian packages: $1; run as root: apt-get install $1" >&2
    exit 1
  fi
}

# Debian 13 ("trixie") packages on an older Debian, installed alone: a
# trixie source is added with a low pin (nothing else is upgraded from
# it) when there is none, and the packages come from it with -t trixie.
ensure_trixie_packages() {
  local missing=() sudo
  mapfile -t missing < <(missing_packages "$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  sudo=$(root_or_sudo "${missing[*]}") || exit 1
  sudo=(${sudo})
  if ! grep -rqs "trixie" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "== adding Debian trixie as a second apt source (pinned low: only what is asked for comes from it)"
    echo "deb http://deb.debian.org/debian trixie main" | "${sudo[@]}" tee /etc/apt/sources.list.d/sonde-trixie.list >/dev/null
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' | "${sudo[@]}" tee /etc/apt/preferences.d/sonde-trixie >/dev/null
  fi
  echo "== installing Debian trixie packages: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t trixie "${missing[@]}"
}

# Keeps a long-lived cargo target directory from filling the disk: drops
# incremental state, and the whole debug build when the directory is over
# SONDE_TARGET_MAX_GIB (default 30) or the disk has less than
# SONDE_MIN_FREE_GIB (default 15) free. A full disk fails the build
# halfway (the linker dies with SIGBUS on a truncated mmap), so a cold
# rebuild is the cheaper outcome.
prune_target_dir() {
  local dir=$1 max=${SONDE_TARGET_MAX_GIB:-30} min_free=${SONDE_MIN_FREE_GIB:-15} used free
  rm -rf "$dir"/debug/incremental "$dir"/release/incremental
  used=$(( $(du -sk "$dir" | cut -f1) / 1048576 ))
  free=$(( $(df -Pk "$dir" | awk 'NR == 2 { print $4 }') / 1048576 ))
  echo "== target directory $dir: ${used} GiB, ${free} GiB free on its disk"
  if [ "$used" -gt "$max" ] || [ "$free" -lt "$min_free" ]; then
    echo "== pruning $dir/debug (over ${max} GiB, or under ${min_free} GiB free): the next build is a cold one"
    rm -rf "$dir/debug"
    free=$(( $(df -Pk "$dir" | awk 'NR == 2 { print $4 }') / 1048576 ))
  fi
  if [ "$free" -lt 5 ]; then
    echo "sonde: only ${free} GiB free on the disk holding $dir; a build needs about 10 GiB. Free some space and run this again." >&2
    exit 1
  fi
}

# Opens unprivileged ICMP echo sockets (the `icmp` capability's ping
# sockets) to every group when the `net.ipv4.ping_group_range` sysctl
# leaves them closed (`1 0`, some distributions' default): as root, else
# through sudo. The sysctl governs IPv4 and IPv6 alike.
ensure_ping_sockets() {
  local range=/proc/sys/net/ipv4/ping_group_range sudo=()
  [ -r "$range" ] || return 0
  read -r low high <"$range"
  [ "$low" -le "$high" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "sonde: ping sockets are closed (net.ipv4.ping_group_range is '$low $high'); the icmp tests need: sysctl -w net.ipv4.ping_group_range='0 2147483647'" >&2
      return 0
    fi
  fi
  echo "== opening ping sockets: net.ipv4.ping_group_range was '$low $high'"
  if ! echo "0 2147483647" | "${sudo[@]}" tee "$range" >/dev/null; then
    echo "sonde: could not open ping sockets (is /proc/sys read-only here?); the icmp tests will fail under SONDE_REQUIRE_TOOLS" >&2
  fi
}
