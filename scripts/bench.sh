#!/usr/bin/env bash
# Reproduces the figures of BENCHMARKS.md on a 2-core Linux machine:
# the prober (sonde, or the peer being measured) on core 0, the target
# (nginx) on core 1, loopback only.
#
#   apt-get install nginx-light prometheus-blackbox-exporter monitoring-plugins-standard
#   cargo build --release -p sonde -p sonde-tests   # sonde, and the test guests (always_up)
#   scripts/bench.sh            # everything but the scheduler scale runs
#   scripts/bench.sh scale      # also the 100,000 and 1,000,000 probe runs (~2 min)
#   REPS=9 N=10000 scripts/bench.sh   # repetitions per row, runs per repetition
#   RESULTS=dir scripts/bench.sh      # keep each row's JSON lines in dir
#   ROWS="tcp http" scripts/bench.sh  # only these rows (trivial tcp http keepalive
#                                     # keepalive-1 exec-true check_http blackbox
#                                     # probe-endpoint otlp)
#   SONDE=path scripts/bench.sh       # another sonde binary (an A/B of two commits)
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir="${CARGO_TARGET_DIR:-target}"
sonde="${SONDE:-$target_dir/release/sonde}"
always_up=$(find "$target_dir" -name always_up.wasm -path '*/guests/*' ! -path '*/deps/*' | head -n 1)
if [ -z "$always_up" ]; then
  # The test guests are built with the tests.
  cargo build --release -p sonde-tests >/dev/null
  always_up=$(find "$target_dir" -name always_up.wasm -path '*/guests/*' ! -path '*/deps/*' | head -n 1)
fi
n="${N:-20000}"   # runs per repetition of the tcp and http rows
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

# Each row runs REPS times (default 5). One repetition is one `sonde bench
# --baseline` process: the sandboxed runs, then the same probes made
# natively, seconds apart; the row reports the median of each figure and its
# spread (min–max) over the repetitions, so a change can be told from noise
# on a shared machine. The load average is printed before and after.
reps="${REPS:-5}"
results="${RESULTS:-$work/results}"
mkdir -p "$results"
echo "load: $(uptime)"
want() { [ -z "${ROWS:-}" ] || [[ " $ROWS " == *" $1 "* ]]; }
row() {
  local name=$1
  shift
  want "$name" || return 0
  echo "\$ sonde bench $*   (× $reps)"
  : >"$results/$name.jsonl"
  for _ in $(seq "$reps"); do
    taskset -c 0 "$sonde" bench "$@" -o json >>"$results/$name.jsonl" || true
  done
  python3 - "$results/$name.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print("  no result"); sys.exit()
def fig(label, values, fmt):
    values = sorted(values)
    print(f"  {label:<14} median {fmt.format(statistics.median(values))}  ({fmt.format(values[0])}–{fmt.format(values[-1])})")
fig("wasm runs/s", [r["runs_per_sec"] for r in rows], "{:,.0f}")
fig("wasm cpu/run", [r["cpu_us_per_run"] for r in rows], "{:.1f}µs")
base = [r["baseline"] for r in rows if "baseline" in r]
if base:
    fig("native runs/s", [b["runs_per_sec"] for b in base], "{:,.0f}")
    fig("native cpu/run", [b["cpu_us_per_run"] for b in base], "{:.1f}µs")
    fig("ratio", [b["ratio"] for b in base], "{:.2f}")
    fig("cpu ratio", [b["cpu_us_per_run"] / max(r["cpu_us_per_run"], 1e-9) for r, b in zip(rows, base)], "{:.2f}")
errors = sum(r["errors"] + r.get("baseline", {}).get("errors", 0) for r in rows)
print(f"  {len(rows)} repetitions, fuel/run {rows[0]['fuel_per_run']:,.0f}, errors {errors}")
PY
  echo
}
run() { echo "\$ $*"; taskset -c 0 "$@"; echo; }

# Sandbox overhead: a trivial plugin, instantiate + call + drop, one at a time.
row trivial "$always_up" -n $((n * 5)) -j 1
# TCP connect probe, and HTTP GET on a new connection per probe, 16 in flight.
row tcp tcp --target 127.0.0.1:8081 -n "$n" -j 16 --baseline
row http http --target 127.0.0.1:8081 -n "$n" -j 16 --baseline
# HTTP GET over the host's keep-alive pool, 16 in flight and one at a time.
row keepalive http --target 127.0.0.1:8081 -n $((n * 5)) -j 16 --keepalive --baseline
row keepalive-1 http --target 127.0.0.1:8081 -n $((n * 2)) -j 1 --keepalive --baseline
# Exec: the floor (/bin/true), and a Nagios plugin.
row exec-true exec --config '{"command": ["/bin/true"]}' --allow-exec /bin/true -n $((n / 4)) -j 16 --baseline
if [ -x /usr/lib/nagios/plugins/check_http ]; then
  check_http=/usr/lib/nagios/plugins/check_http
  row check_http exec --config "{\"command\": [\"$check_http\", \"-H\", \"127.0.0.1\", \"-p\", \"8081\"]}" \
    --allow-exec "$check_http" -n $((n * 3 / 20)) -j 16 --baseline
fi

# blackbox_exporter on core 0, driven over keep-alive from core 1; its own
# CPU is read from /proc.
if want blackbox && command -v prometheus-blackbox-exporter >/dev/null; then
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

# GET /probe: blackbox_exporter's, then sonde's, each on core 0, driven
# the same way from core 1 (keep-alive, 16 in flight) against the same
# nginx target, with the modules both call http_2xx and tcp_connect.
# Throughput and latency are the driver's; CPU per probe is the
# exporter's own, read from /proc.
if want probe-endpoint && command -v prometheus-blackbox-exporter >/dev/null; then
  cat >"$work/blackbox-probe.yml" <<EOF
modules:
  http_2xx: {prober: http, timeout: 5s, http: {preferred_ip_protocol: ip4}}
  tcp_connect: {prober: tcp, timeout: 5s, tcp: {preferred_ip_protocol: ip4}}
EOF
  cat >"$work/sonde-probe.yaml" <<EOF
api: {listen: 127.0.0.1:9465, auth: none, max_probe_runs: 16, max_probe_queue: 64}
modules:
  http_2xx: {plugin: http, timeout: 5s, grants: {net: ["127.0.0.1:8081"]}}
  tcp_connect: {plugin: tcp, timeout: 5s, grants: {net: ["127.0.0.1:8081"]}}
EOF
  probe_n=$((n / 2))
  exporter_row() { # name pidfile address
    local name=$1 pid address=$3 before after hz module target
    pid=$(cat "$2")
    for module in http_2xx tcp_connect; do
      target=127.0.0.1:8081
      [ "$module" = http_2xx ] && target=http://127.0.0.1:8081/
      before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      echo "\$ $name /probe module=$module, driven by: sonde bench http --target $address (keep-alive, 16 in flight)"
      # A slow answer is counted as an error; it does not end the script.
      taskset -c 1 "$sonde" bench http --target "$address" -n "$probe_n" -j 16 --keepalive --timeout 5s \
        --config "{\"path\": \"/probe?module=$module&target=$target\", \"body_regex\": \"probe_success 1\"}" || true
      after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      hz=$(getconf CLK_TCK)
      echo "$name CPU per /probe ($module): $(((after - before) * 1000000 / hz / probe_n))µs"
      echo
    done
  }
  taskset -c 0 prometheus-blackbox-exporter --config.file="$work/blackbox-probe.yml" \
    --web.listen-address=127.0.0.1:9116 >"$work/logs/blackbox-probe.log" 2>&1 &
  echo $! >"$work/blackbox-probe.pid"
  taskset -c 0 "$sonde" run --config "$work/sonde-probe.yaml" >"$work/logs/sonde-probe.log" 2>&1 &
  echo $! >"$work/sonde-probe.pid"
  sleep 2
  exporter_row blackbox_exporter "$work/blackbox-probe.pid" 127.0.0.1:9116
  exporter_row sonde "$work/sonde-probe.pid" 127.0.0.1:9465
  # The empty /probe: a target outside the module's grant, answered
  # (probe_success 0, denied) without a run: the front door's own cost,
  # which the bound adds to the scheduled run (BENCHMARKS.md).
  pid=$(cat "$work/sonde-probe.pid")
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  echo "\$ sonde /probe of a target outside the grant (the empty /probe), driven the same way"
  taskset -c 1 "$sonde" bench http --target 127.0.0.1:9465 -n "$probe_n" -j 16 --keepalive --timeout 5s \
    --config '{"path": "/probe?module=tcp_connect&target=127.0.0.1:9", "body_regex": "probe_success 0"}' || true
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  echo "sonde CPU per empty /probe: $(((after - before) * 1000000 / $(getconf CLK_TCK) / probe_n))µs"
  echo
  kill "$(cat "$work/blackbox-probe.pid")" "$(cat "$work/sonde-probe.pid")" 2>/dev/null || true
  rm -f "$work/blackbox-probe.pid" "$work/sonde-probe.pid"
  # What the same plugins cost as scheduled probes, on the same core and
  # target, at about the rate the /probe rows reach (400 probes every
  # 100 ms): the figure a /probe is held to (BENCHMARKS.md: at most the
  # scheduled run, plus the empty /probe above, plus 15 µs).
  for plugin in http tcp; do
    echo "\$ sonde bench $plugin --scheduler (the /probe module's plugin as 400 scheduled probes every 100ms)"
    taskset -c 0 "$sonde" bench "$plugin" --target 127.0.0.1:8081 --scheduler --probes 400 --period 100ms \
      --duration 10s --warmup 3s | grep -E 'runs|CPU' || true
    echo
  done
fi

# The agent itself (`sonde run`, core 0): 400 tcp probes every 100 ms
# against nginx, without `otlp:` and, with the OpenTelemetry Collector
# ($SONDE_OTELCOL, scripts/tools.sh; core 1) taking the export, with
# traces of 1% and of every passing run. CPU per run is the agent's, from
# /proc over 10 s after 5 s of warm-up; the runs are its own count
# (sonde_probe_runs_total). A binary that predates `otlp:` (SONDE=...)
# runs the first variant only.
if want otlp; then
  {
    echo "api: {listen: 127.0.0.1:9466, auth: none}"
    echo "targets:"
    echo "  - name: nginx"
    echo "    address: 127.0.0.1:8081"
    echo "    probes:"
    for i in $(seq 400); do echo "      - {name: tcp-$i, plugin: tcp, period: 100ms}"; done
  } >"$work/agent-targets.yaml"
  runs_now() {
    curl -s http://127.0.0.1:9466/metrics |
      awk '/^sonde_probe_runs_total/ {s += $NF} END {printf "%d", s}'
  }
  agent_row() { # label, then the otlp: block (or nothing)
    local label=$1 block=$2 pid t0 t1 r0 r1 hz
    for _ in $(seq "$reps"); do
      { [ -z "$block" ] || printf '%s\n' "$block"; cat "$work/agent-targets.yaml"; } >"$work/agent.yaml"
      taskset -c 0 "$sonde" run --config "$work/agent.yaml" >"$work/logs/agent.log" 2>&1 &
      pid=$!
      echo $pid >"$work/agent.pid"
      sleep 5
      t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      r0=$(runs_now)
      sleep 10
      t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      r1=$(runs_now)
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      rm -f "$work/agent.pid"
      hz=$(getconf CLK_TCK)
      echo "$label: $((r1 - r0)) runs, agent CPU per run $(python3 -c "print(f'{($t1 - $t0) * 1e6 / $hz / max($r1 - $r0, 1):.1f}')")µs"
    done
    echo
  }
  echo "\$ sonde run: 400 tcp probes every 100ms (× $reps)"
  agent_row "otlp unset" ""
  otelcol=${SONDE_OTELCOL:-}
  if [ -n "$otelcol" ] &&
    printf 'otlp: {endpoint: "http://127.0.0.1:4317"}\ntargets: []\n' >"$work/probe-otlp.yaml" &&
    "$sonde" validate "$work/probe-otlp.yaml" >/dev/null 2>&1; then
    cat >"$work/otelcol.yaml" <<EOF
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "127.0.0.1:4317"}
exporters:
  file: {path: /dev/null}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    metrics: {receivers: [otlp], exporters: [file]}
    traces: {receivers: [otlp], exporters: [file]}
EOF
    taskset -c 1 "$otelcol" --config="$work/otelcol.yaml" >"$work/logs/otelcol.log" 2>&1 &
    echo $! >"$work/otelcol.pid"
    sleep 2
    for ratio in 0.01 1; do
      agent_row "otlp to the Collector, interval 10s, traces.success_ratio $ratio" \
        "otlp: {endpoint: \"http://127.0.0.1:4317\", interval: 10s, traces: {success_ratio: $ratio}}"
    done
    kill "$(cat "$work/otelcol.pid")" 2>/dev/null || true
    rm -f "$work/otelcol.pid"
  else
    echo "(no otlp variants: SONDE_OTELCOL is not set, or this sonde has no otlp:)"
  fi
fi

if [ "${1:-}" = scale ]; then
  run "$sonde" bench "$always_up" --scheduler --probes 100000 --period 10s --duration 60s
  run "$sonde" bench "$always_up" --scheduler --probes 1000000 --period 1h --duration 10s
fi
echo "load: $(uptime)"
