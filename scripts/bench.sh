#!/usr/bin/env bash
# Reproduces the figures of BENCHMARKS.md on a 2-core Linux machine:
# the prober (sonde, or the peer being measured) on core 0, the target
# (nginx) on core 1, loopback only.
#
#   apt-get install nginx-light prometheus-blackbox-exporter monitoring-plugins-standard
#   cargo build --release -p sonde-runtime -p sonde-tests   # sonde, and the test guests (always_up)
#   scripts/bench.sh            # everything but the scheduler scale runs
#   scripts/bench.sh scale      # also the 100,000 and 1,000,000 probe runs (~2 min)
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir="${CARGO_TARGET_DIR:-target}"
sonde="$target_dir/release/sonde"
always_up=$(find "$target_dir" -name always_up.wasm -path '*/guests/*' ! -path '*/deps/*' | head -n 1)
if [ -z "$always_up" ]; then
  # The test guests are built with the tests.
  cargo build --release -p sonde-tests >/dev/null
  always_up=$(find "$target_dir" -name always_up.wasm -path '*/guests/*' ! -path '*/deps/*' | head -n 1)
fi
n="${N:-20000}"
work=$(mktemp -d)
trap 'kill $(cat "$work"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT

# The target: nginx, one worker, on core 1.
mkdir -p "$work/logs"
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
daemon on;
pid $work/nginx.pid;
error_log $work/logs/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_requests 10000000;
    server {
        listen 127.0.0.1:8081 backlog=4096;
        location / { return 200 "ok\n"; }
    }
}
EOF
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work"
sleep 0.5

run() { echo "\$ $*"; taskset -c 0 "$@"; echo; }

# Sandbox overhead: a trivial plugin, instantiate + call + drop, one at a time.
run "$sonde" bench "$always_up" -n 100000 -j 1
# TCP connect probe, and HTTP GET on a new connection per probe, 16 in flight.
run "$sonde" bench tcp --target 127.0.0.1:8081 -n "$n" -j 16 --baseline
run "$sonde" bench http --target 127.0.0.1:8081 -n "$n" -j 16 --baseline
# HTTP GET over the host's keep-alive pool.
run "$sonde" bench http --target 127.0.0.1:8081 -n $((n * 5)) -j 16 --keepalive --baseline
# Exec: the floor (/bin/true), and a Nagios plugin.
run "$sonde" bench exec --config '{"command": ["/bin/true"]}' --allow-exec /bin/true -n 5000 -j 16 --baseline
if [ -x /usr/lib/nagios/plugins/check_http ]; then
  check_http=/usr/lib/nagios/plugins/check_http
  run "$sonde" bench exec --config "{\"command\": [\"$check_http\", \"-H\", \"127.0.0.1\", \"-p\", \"8081\"]}" \
    --allow-exec "$check_http" -n 3000 -j 16 --baseline
fi

# blackbox_exporter on core 0, driven over keep-alive from core 1; its own
# CPU is read from /proc.
if command -v prometheus-blackbox-exporter >/dev/null; then
  cat >"$work/blackbox.yml" <<EOF
modules:
  http_2xx:
    prober: http
    timeout: 5s
    http:
      preferred_ip_protocol: ip4
EOF
  taskset -c 0 prometheus-blackbox-exporter --config.file="$work/blackbox.yml" \
    --web.listen-address=127.0.0.1:9115 >"$work/logs/blackbox.log" 2>&1 &
  echo $! >"$work/blackbox.pid"
  sleep 1
  pid=$(cat "$work/blackbox.pid")
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  before=$(ticks)
  echo "\$ blackbox_exporter http_2xx, driven by: sonde bench http --target 127.0.0.1:9115 (keep-alive, 16 in flight)"
  taskset -c 1 "$sonde" bench http --target 127.0.0.1:9115 -n 20000 -j 16 --keepalive \
    --config '{"path": "/probe?module=http_2xx&target=http://127.0.0.1:8081/", "body_regex": "probe_success 1"}'
  after=$(ticks)
  hz=$(getconf CLK_TCK)
  echo "blackbox_exporter CPU per probe: $(( (after - before) * 1000000 / hz / 20000 ))µs"
  echo
fi

if [ "${1:-}" = scale ]; then
  run "$sonde" bench "$always_up" --scheduler --probes 100000 --period 10s --duration 60s
  run "$sonde" bench "$always_up" --scheduler --probes 1000000 --period 1h --duration 10s
fi
