# Shared by sdk/python/smoke/smoke.sh and sdk/js/smoke/smoke.sh (sourced
# with $work, $wasm, $SONDE_BIN and the pids array set): starts a TLS echo
# server and runs every mode of the smoke plugin, checking each outcome.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
  -keyout "$work/key.pem" -out "$work/cert.pem" -days 2 2>/dev/null
python3 - "$work" <<'PY' &
import socket, ssl, sys, threading
work = sys.argv[1]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{work}/cert.pem", f"{work}/key.pem")
tls = socket.create_server(("127.0.0.1", 0))
plain = socket.create_server(("127.0.0.1", 0))
open(f"{work}/ports", "w").write(f"{tls.getsockname()[1]} {plain.getsockname()[1]}")
def echo(conn):
    try:
        with ctx.wrap_socket(conn, server_side=True) as s:
            s.sendall(s.recv(100))
    except OSError:
        pass
def silent(conn):
    try:
        conn.recv(100)
    except OSError:
        pass
threading.Thread(target=lambda: [threading.Thread(target=silent, args=(plain.accept()[0],)).start() for _ in iter(int, 1)], daemon=True).start()
while True:
    threading.Thread(target=echo, args=(tls.accept()[0],)).start()
PY
pids+=($!)
for _ in $(seq 100); do [ -s "$work/ports" ] && break; sleep 0.05; done
read -r tls_port plain_port < "$work/ports" || true  # no newline at its end

failures=0
smoke() {
  local want="$1" pattern="$2" mode="$3" target="$4"; shift 4
  local out got
  set +e
  out="$("$SONDE_BIN" --cache-dir "$work/cache" check "$wasm" --timeout 5s \
    --target "$target" --config "{\"mode\": \"$mode\"}" "$@" 2>&1)"
  got=$?
  set -e
  if [ "$got" = "$want" ] && grep -q -- "$pattern" <<<"$out"; then
    echo "ok   $mode: ${out%%$'\n'*}"
  else
    echo "FAIL $mode: expected exit $want and /$pattern/, got $got: $out"
    failures=$((failures + 1))
  fi
}

run_smoke() {
  smoke 0 "logged; unix" log "127.0.0.1:$plain_port"
  smoke 0 'exit 0 timed_out no stdout "hi' exec "127.0.0.1:$plain_port" --allow-exec /bin/echo
  smoke 3 "denied" exec "127.0.0.1:$plain_port"
  smoke 0 'TLSv1.3 CN=localhost days [12] echo "ping.n" error none' tls "127.0.0.1:$tls_port"
  smoke 0 "read: timed-out timed out" tcp-timeout "127.0.0.1:$plain_port"
  smoke 0 "grpc NetError protocol" grpc "127.0.0.1:$tls_port"
  smoke 0 "https NetError tls" https "127.0.0.1:$tls_port"
  smoke 3 "denied" denied "127.0.0.1:$plain_port"
  smoke 3 "internal" bug "127.0.0.1:$plain_port"
  smoke 3 "invalid-config" nonsense "127.0.0.1:$plain_port"
  if [ "$failures" -gt 0 ]; then echo "$failures smoke check(s) failed"; exit 1; fi
  echo "all smoke checks passed"
}
