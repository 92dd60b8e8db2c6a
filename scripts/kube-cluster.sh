#!/usr/bin/env bash
# A Kubernetes control plane for the e2e suites, from the binaries
# scripts/kube.sh builds: etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler of one version (driven by its kubectl), on free
# loopback ports, with everything they need generated in a directory (a
# CA, the server's and the admin's certificates, the service-account key
# pair). No kubelet: the suites create their Nodes and play the kubelet
# (the two controllers that judge a kubelet do not run). With --node, a
# real node too (scripts/kube-node.sh: containerd, runc, the CNI bridge,
# the kubelet and kube-proxy, as root): then the API server listens on
# the node's address as well, authorizes the kubelet by the Node
# authorizer, and every controller runs.
#
#   eval "$(scripts/kube.sh)"                          # builds them once
#   scripts/kube-cluster.sh start VERSION DIR [--node] # then DIR/kubeconfig
#   scripts/kube-cluster.sh stop DIR
#
# `start` waits until the API server is ready (/readyz) and a controller-
# manager holds its leader Lease, then installs sonde's CRDs
# (deploy/kubernetes/crd.yaml) and creates its namespace sonde-system.
# The admin of DIR/kubeconfig is in system:masters; authorization is
# RBAC. Logs are DIR/*.log;
# SONDE_KUBE_APISERVER_FLAGS adds flags to kube-apiserver's (an audit log
# to see what a suite sent: --audit-policy-file=... --audit-log-path=...).
# VERSION is one of $SONDE_KUBE_VERSIONS; SONDE_KUBE_BIN and
# SONDE_ETCD_VERSION come from scripts/kube.sh.
set -euo pipefail
# shellcheck source=scripts/kube-node.sh
. "$(dirname "$0")/kube-node.sh"

# $1 free TCP ports on the loopback.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# A CA, the API server's serving certificate (127.0.0.1, localhost, the
# `kubernetes` Service's address and $2 when given), the admin's client
# certificate and the service-account key pair, in $1.
certificates() {
  local dir=$1 also=${2:+,IP:$2}
  (
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -keyout ca.key -out ca.crt -subj "/CN=sonde-e2e-ca" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
      -out server.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out server.crt \
      -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.96.0.1%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' "$also") 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout admin.key \
      -out admin.csr -subj "/O=system:masters/CN=sonde-e2e-admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out admin.crt \
      -extfile <(printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n') 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ca.srl
  )
}

# A kubeconfig at $1 for the server at 127.0.0.1:$2, as the admin (or as
# the user whose certificate and key are $3.crt and $3.key in the
# cluster's directory).
kubeconfig() {
  local path=$1 port=$2 user=${3:-admin}
  cat >"$path" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sonde-e2e
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 "$dir/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$dir/$user.crt")
    client-key-data: $(base64 -w0 "$dir/$user.key")
contexts:
- name: sonde-e2e
  context: {cluster: sonde-e2e, user: $user}
current-context: sonde-e2e
EOF
}

# What kube-apiserver $1 needs for the APIs the suites test: on 1.24 the
# CRDs' CEL rules (beta, off by default), on 1.34 and 1.35
# MutatingAdmissionPolicy (beta, off by default; GA from 1.36).
version_flags() {
  local minor=${1#*.}
  minor=${minor%%.*}
  if [ "$minor" -lt 25 ]; then
    echo "--feature-gates=CustomResourceValidationExpressions=true"
  elif [ "$minor" -lt 36 ] && [ "$minor" -ge 34 ]; then
    echo "--feature-gates=MutatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true"
  fi
}

# The controllers kube-controller-manager $1 runs: all but the two that
# judge the kubelet, which the suites play. The pod garbage collector
# deletes, 40 s in, a Pod bound to a Node that does not exist (the
# suites' Pods are, on purpose); the node lifecycle controller marks a
# Node without a kubelet's heartbeat unreachable, 40 s in, and taints it.
# Their names end in -controller from 1.28.
controllers() {
  local minor=${1#*.}
  minor=${minor%%.*}
  if [ -n "$node" ]; then
    echo "*"
  elif [ "$minor" -lt 28 ]; then
    echo "*,-podgc,-nodelifecycle"
  else
    echo "*,-pod-garbage-collector-controller,-node-lifecycle-controller"
  fi
}

# Starts $2... in the background with its output in $1, its pid in pids.
run() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  echo $! >>"$dir/pids"
}

# Waits up to $2 seconds until command $3... succeeds; else prints the
# last lines of log $1 and fails.
until_ok() {
  local log=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "sonde: $* did not succeed in ${seconds}s; the end of $log:" >&2
      tail -n 30 "$log" >&2
      return 1
    fi
    sleep 0.5
  done
}

# The kubectl of the cluster's version, as its admin.
kc() {
  "$bin/kubectl-$version" --kubeconfig "$dir/kubeconfig" "$@"
}

start() {
  local version=$1 node=${2:-} bin=${SONDE_KUBE_BIN:?run scripts/kube.sh first (it sets SONDE_KUBE_BIN)}
  local etcd_version=${SONDE_ETCD_VERSION:?run scripts/kube.sh first (it sets SONDE_ETCD_VERSION)}
  local etcd_port peer_port api_port start=$SECONDS listen=127.0.0.1 advertise=127.0.0.1
  local authorization=RBAC reconciler=none
  [ -x "$bin/kube-apiserver-$version" ] || { echo "sonde: no $bin/kube-apiserver-$version (scripts/kube.sh builds it)" >&2; return 1; }
  mkdir -p "$dir"
  : >"$dir/pids"
  echo "$version" >"$dir/version"
  read -r etcd_port peer_port api_port < <(free_ports 3)
  if [ -n "$node" ]; then
    # The node's Pods reach the API server through the `kubernetes`
    # Service, whose endpoint is the advertised address.
    listen=0.0.0.0 advertise=$(node_ip) authorization=Node,RBAC reconciler=lease
    [ -n "$advertise" ] || { echo "sonde: the node has no address to advertise (ip route)" >&2; return 1; }
  fi
  certificates "$dir" "${node:+$advertise}"
  kubeconfig "$dir/kubeconfig" "$api_port"
  run "$dir/etcd.log" "$bin/etcd-$etcd_version" --name sonde-e2e --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "sonde-e2e=http://127.0.0.1:$peer_port" --unsafe-no-fsync
  # shellcheck disable=SC2046,SC2086 # the flags are words
  run "$dir/kube-apiserver.log" "$bin/kube-apiserver-$version" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$listen" --advertise-address "$advertise" --secure-port "$api_port" \
    --tls-cert-file "$dir/server.crt" --tls-private-key-file "$dir/server.key" \
    --client-ca-file "$dir/ca.crt" --authorization-mode "$authorization" \
    --kubelet-client-certificate "$dir/admin.crt" --kubelet-client-key "$dir/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-key-file "$dir/sa.pub" --service-account-signing-key-file "$dir/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --endpoint-reconciler-type "$reconciler" \
    --profiling=false $(version_flags "$version") ${SONDE_KUBE_APISERVER_FLAGS:-}
  until_ok "$dir/kube-apiserver.log" 120 kc get --raw /readyz
  run "$dir/kube-controller-manager.log" "$bin/kube-controller-manager-$version" \
    --kubeconfig "$dir/kubeconfig" --bind-address 127.0.0.1 --secure-port 0 \
    --service-account-private-key-file "$dir/sa.key" --root-ca-file "$dir/ca.crt" \
    --cluster-name sonde-e2e --controllers "$(controllers "$version")" --profiling=false
  run "$dir/kube-scheduler.log" "$bin/kube-scheduler-$version" \
    --kubeconfig "$dir/kubeconfig" --bind-address 127.0.0.1 --secure-port 0 --profiling=false
  until_ok "$dir/kube-controller-manager.log" 60 \
    kc -n kube-system get lease kube-controller-manager
  # The suites run one after another and share the CRDs: installed here,
  # none of them deletes them.
  kc apply -f deploy/kubernetes/crd.yaml >/dev/null
  # The agent's namespace, as an install has it: an agent that finds none
  # retries its status Lease 30 to 50 s later, which the first suite waited.
  kc create namespace sonde-system >/dev/null
  until_ok "$dir/kube-apiserver.log" 30 kc wait --for condition=established \
    crd/sondechecks.sonde.dev crd/sondenodechecks.sonde.dev
  [ -z "$node" ] || node_start
  echo "== Kubernetes $version (etcd $etcd_version) ready at $(sed -n 's/^    server: //p' "$dir/kubeconfig") in $((SECONDS - start)) s: $dir/kubeconfig" >&2
}

stop() {
  local pid deadline
  [ -f "$dir/pids" ] || return 0
  # The last started first, each gone before the next is stopped: the API
  # server shuts down slowly without its etcd. One still there after 30 s
  # is killed.
  for pid in $(tac "$dir/pids"); do
    kill "$pid" 2>/dev/null || continue
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || kill -KILL "$pid" 2>/dev/null || true
      sleep 0.1
    done
  done
  rm -f "$dir/pids"
  node_clean
}

cd "$(dirname "$0")/.."
case "${1:-}" in
start)
  [ $# -eq 3 ] || { [ $# -eq 4 ] && [ "$4" = --node ]; } || { echo "usage: $0 start VERSION DIR [--node]" >&2; exit 2; }
  dir=$(realpath -m "$3")
  start "$2" "${4:+node}" || { stop; exit 1; }
  ;;
stop)
  [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }
  dir=$(realpath -m "$2")
  stop
  ;;
*)
  echo "usage: $0 start VERSION DIR [--node] | stop DIR" >&2
  exit 2
  ;;
esac
