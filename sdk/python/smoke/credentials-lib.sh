# Shared by sdk/python/smoke/credentials.sh and sdk/js/smoke/credentials.sh
# (sourced first; $wasm is set before run_credentials): makes $work, stops
# every server it started on exit, checks $SONDE_BIN, then starts
# real servers on 127.0.0.1 — Debian's redis-server with requirepass and an
# ACL user, a throwaway PostgreSQL cluster (SCRAM-SHA-256), and a TLS server
# that requires a client certificate — writes the secrets into files only
# their owner may read, and runs the credentials plugin through
# `sonde check --secret NAME=FILE`, checking each outcome. The plugin gets
# only handles ($(secret:NAME)); no output may hold a secret's bytes.

work="$(mktemp -d)"
pids=()
cleanup() {
  stop_postgres 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
: "${SONDE_BIN:?set SONDE_BIN to the sonde binary}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# secret NAME VALUE: a secret file, mode 600 (sonde refuses one every user may read).
secret() {
  (umask 077 && printf '%s' "$2" > "$work/secrets/$1")
}

wait_port() {
  local port="$1" what="$2"
  for _ in $(seq 200); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "FAIL $what did not start on 127.0.0.1:$port" >&2
  return 1
}

start_redis() {
  command -v redis-server >/dev/null || { echo "redis-server is not installed (scripts/test installs it)" >&2; exit 1; }
  redis_port="$(free_port)"
  # A config file keeps the password off the command line.
  (umask 077 && cat > "$work/redis.conf" <<EOF
port $redis_port
bind 127.0.0.1
save ""
appendonly no
dir $work
requirepass $redis_password
user probe on >$redis_password ~* &* +@all
EOF
  )
  redis-server "$work/redis.conf" >"$work/redis.log" 2>&1 &
  pids+=($!)
  wait_port "$redis_port" redis-server
}

# The superuser `postgres` with $pg_password, SCRAM-SHA-256 over TCP. As
# root (CI), PostgreSQL's programs run as the `postgres` system user.
start_postgres() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -x "$bin/initdb" ] || { echo "PostgreSQL is not installed (scripts/test installs postgresql)" >&2; exit 1; }
  pg_dir="$(mktemp -d)"
  local as=()
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$pg_dir"
    as=(runuser -u postgres --)
  fi
  pg_port="$(free_port)"
  (umask 077 && printf '%s\n' "$pg_password" > "$pg_dir/pwfile")
  [ "$(id -u)" != 0 ] || chown postgres: "$pg_dir/pwfile"
  (cd "$pg_dir" && "${as[@]}" "$bin/initdb" -D "$pg_dir/data" -U postgres -E UTF8 --no-sync \
    --auth-local=trust --auth-host=scram-sha-256 --pwfile="$pg_dir/pwfile" >"$work/initdb.log" 2>&1) ||
    { cat "$work/initdb.log" >&2; exit 1; }
  (cd "$pg_dir" && "${as[@]}" "$bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w -t 30 \
    -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c fsync=off -c password_encryption=scram-sha-256" start >/dev/null) ||
    { cat "$pg_dir/postgres.log" >&2; exit 1; }
  pg_stop=("${as[@]}" "$bin/pg_ctl" -D "$pg_dir/data" -m immediate stop)
}

stop_postgres() {
  if [ -n "${pg_dir:-}" ]; then
    "${pg_stop[@]}" >/dev/null 2>&1 || true
    rm -rf "$pg_dir"
  fi
}

# A CA, a server certificate, and a client certificate (CN=probe-client)
# whose PEM files are secrets; the server answers `who` with the client's CN.
start_mtls() {
  local c="$work/certs"
  mkdir -p "$c"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${ec[@]}" -subj /CN=sonde-test-ca -keyout "$c/ca.key" -out "$c/ca.pem" -days 2 2>/dev/null
  # X.509 v3 (rustls refuses v1 certificates, even unverified).
  printf 'basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$c/localhost.ext"
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' > "$c/probe-client.ext"
  for who in localhost probe-client; do
    openssl req "${ec[@]}" -subj "/CN=$who" -keyout "$c/$who.key" -out "$c/$who.csr" 2>/dev/null
    openssl x509 -req -in "$c/$who.csr" -CA "$c/ca.pem" -CAkey "$c/ca.key" -CAcreateserial \
      -extfile "$c/$who.ext" -out "$c/$who.pem" -days 2 2>/dev/null
  done
  secret client-crt "$(cat "$c/probe-client.pem")"
  secret client-key "$(cat "$c/probe-client.key")"
  python3 - "$c" <<'PY' &
import socket, ssl, sys, threading
c = sys.argv[1]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{c}/localhost.pem", f"{c}/localhost.key")
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(f"{c}/ca.pem")
server = socket.create_server(("127.0.0.1", 0))
open(f"{c}/port", "w").write(str(server.getsockname()[1]))
def serve(conn):
    try:
        with ctx.wrap_socket(conn, server_side=True) as s:
            s.recv(100)
            cn = dict(x[0] for x in s.getpeercert()["subject"])["commonName"]
            s.sendall(f"CN={cn}\n".encode())
    except (OSError, ssl.SSLError):
        conn.close()
while True:
    threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
PY
  pids+=($!)
  for _ in $(seq 100); do [ -s "$c/port" ] && break; sleep 0.05; done
  mtls_port="$(cat "$c/port")"
}

failures=0
# cred EXIT PATTERN TARGET CONFIG [SONDE ARGS...]: one `sonde check`; its
# exit code (0 success, 2 failure, 3 unknown) and output must match, and
# the output must hold no secret.
cred() {
  local want="$1" pattern="$2" target="$3" config="$4"; shift 4
  local out got leak="" value
  set +e
  out="$("$SONDE_BIN" --cache-dir "$work/cache" check "$wasm" --timeout 10s \
    --target "$target" --config "$config" "$@" 2>&1)"
  got=$?
  set -e
  for value in "$redis_password" "$pg_password" "$wrong_password" "$(sed -n 2p "$work/certs/probe-client.key")"; do
    if [ -n "$value" ] && grep -qF -- "$value" <<<"$out"; then leak="a secret's bytes"; fi
  done
  if [ "$got" = "$want" ] && grep -q -- "$pattern" <<<"$out" && [ -z "$leak" ]; then
    echo "ok   exit $got  $config -> ${out%%$'\n'*}"
  else
    echo "FAIL expected exit $want and /$pattern/${leak:+ and no secret (found $leak)}, got $got: $config $* -> $out"
    failures=$((failures + 1))
  fi
}

run_credentials() {
  mkdir -p "$work/secrets"
  redis_password="redis-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
  pg_password="pg-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
  wrong_password="wrong-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
  secret pw "$redis_password"
  secret pg "$pg_password"
  secret wrong "$wrong_password"
  start_redis
  start_postgres
  start_mtls
  local r="127.0.0.1:$redis_port" p="127.0.0.1:$pg_port" m="127.0.0.1:$mtls_port" s="$work/secrets"

  echo "== redis_login ($(redis-server --version | awk '{print $3}'))"
  cred 0 'PONG after AUTH (auth); requirepass reads \[withheld: the peer reflected a secret\]' "$r" '{"mode": "redis", "password": "$(secret:pw)"}' --secret "pw=$s/pw"
  cred 0 'PONG after AUTH (auth)' "$r" '{"mode": "redis", "username": "probe", "password": "$(secret:pw)"}' --secret "pw=$s/pw"
  cred 2 'AUTH refused: WRONGPASS' "$r" '{"mode": "redis", "password": "$(secret:pw)"}' --secret "pw=$s/wrong"
  cred 2 'AUTH refused: WRONGPASS' "$r" '{"mode": "redis", "username": "probe", "password": "$(secret:pw)"}' --secret "pw=$s/wrong"
  cred 3 'denied: use secret' "$r" '{"mode": "redis", "password": "$(secret:pw)"}'
  cred 3 'invalid-config' "$r" '{"mode": "redis", "password": "$(secret:pw"}' --secret "pw=$s/pw"
  # A secret file every user may read is refused before the plugin runs.
  cp "$s/pw" "$s/pw-open" && chmod 644 "$s/pw-open"
  cred 3 'readable or writable by every user' "$r" '{"mode": "redis", "password": "$(secret:pw)"}' --secret "pw=$s/pw-open"
  # A server that is not Redis (the mTLS server drops what is not TLS): LoginError.
  cred 2 'login: i/o error: connect: ' "$m" '{"mode": "redis", "password": "$(secret:pw)"}' --secret "pw=$s/pw"

  echo "== postgres_login"
  cred 0 'logged in (scram-sha-256) as postgres' "$p" '{"mode": "postgres", "password": "$(secret:pg)"}' --secret "pg=$s/pg"
  cred 2 'login refused: FATAL 28P01' "$p" '{"mode": "postgres", "password": "$(secret:pg)"}' --secret "pg=$s/wrong"
  cred 3 'denied: use secret' "$p" '{"mode": "postgres", "password": "$(secret:other)"}' --secret "pg=$s/pg"
  # A server that is not PostgreSQL (the mTLS server): LoginError.
  cred 2 'login: i/o error: ' "$m" '{"mode": "postgres", "password": "$(secret:pg)"}' --secret "pg=$s/pg"

  echo "== client_certificate"
  local cc='"client_cert": {"cert": "$(secret:client-crt)", "key": "$(secret:client-key)"}'
  cred 0 'the server saw CN=probe-client' "$m" "{\"mode\": \"mtls\", $cc}" \
    --secret "client-crt=$s/client-crt" --secret "client-key=$s/client-key"
  cred 2 'the server sent nothing\|TLS:' "$m" '{"mode": "mtls"}'
  cred 3 'denied: use secret' "$m" "{\"mode\": \"mtls\", $cc}" --secret "client-crt=$s/client-crt"
  cred 3 'invalid-config' "$m" '{"mode": "mtls", "client_cert": {"cert": "not PEM", "key": "not PEM"}}'

  stop_postgres
  if [ "$failures" -gt 0 ]; then echo "$failures credentials check(s) failed"; exit 1; fi
  echo "all credentials checks passed"
}
