#!/usr/bin/env bash
# The soak: the real `sonde run` for SOAK_SECONDS (600 by default; CI runs
# 60) with ~1,000 probes (hostile ones among them), API churn, 50 watch
# clients reconnecting with Last-Event-ID, SIGHUP reloads and a target that
# goes up and down. Fails if, after the warm-up, the agent's memory grows
# more than 5 %, its descriptors or threads grow, a watcher misses a state
# change or /livez fails; prints the figures either way.
#
#   scripts/soak.sh              # 10 minutes
#   SOAK_SECONDS=60 scripts/soak.sh
#
# The driver is the Rust test runtime/sonde/tests/soak.rs (ignored by a plain
# `cargo test`); this script builds and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
ensure_toolchain

export SOAK_SECONDS="${SOAK_SECONDS:-600}"
echo "== soak: ${SOAK_SECONDS} s"
# The whole workspace, narrowed by a filter: selecting one package (-p)
# would compile wasmtime a second time with other features.
exec cargo test --locked --workspace --test soak -- --ignored --nocapture --exact soak
