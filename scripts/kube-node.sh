# A real node for the control plane of scripts/kube-cluster.sh, sourced by
# it (`start VERSION DIR --node`): containerd (its own root, state and
# socket under DIR/node), runc, the CNI bridge, and the kubelet and
# kube-proxy of VERSION, registered as the Node $SONDE_NODE_NAME. The
# recipe of a machine with cgroup v1 and a root filesystem overlayfs
# cannot stack on:
#   - containerd's CRI with `restrict_oom_score_adj = true` (the kubelet
#     asks for OOM scores below the one this machine's processes start
#     with, which the kernel refuses to a process that is not privileged
#     enough) and the `native` snapshotter (plain copies, no overlay);
#   - the CNI bridge (Debian's containernetworking-plugins), Pods on
#     $SONDE_NODE_POD_CIDR behind cni-sonde0, masqueraded, their addresses
#     kept under DIR/node (so each start has the whole range);
#   - kube-proxy in iptables mode, so a Pod reaches the API server through
#     the `kubernetes` Service, as in a cluster;
#   - images imported into containerd, never pulled: the sandbox image is
#     scripts/pause.c built statically (sonde.invalid/pause), and a web
#     server for the suites' Pods is busybox's httpd (sonde.invalid/web,
#     serving DIR's www: /healthz answers 200).
# Everything it starts is in DIR/pids; `stop` removes the Pods' containers,
# mounts, network namespaces, iptables rules and the bridge as well.

SONDE_NODE_NAME=${SONDE_NODE_NAME:-sonde-node}
SONDE_NODE_POD_CIDR=${SONDE_NODE_POD_CIDR:-10.244.0.0/24}

# The address the node has on the network: its route's source.
node_ip() {
  ip -4 route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1
}

# The containerd client of the node's containerd.
node_ctr() {
  ctr --address "$dir/node/containerd.sock" --namespace k8s.io "$@"
}

# An image of the files under $1 (a directory), with entrypoint $3 (JSON),
# imported into the node's containerd as $2.
node_image() {
  local root=$1 tag=$2 entrypoint=$3 archive
  archive=$(mktemp -u "$dir/node/image-XXXXXX.tar")
  tar -C "$root" -cf - . | podman import --quiet --change "ENTRYPOINT $entrypoint" - "$tag" >/dev/null
  podman save --quiet --format docker-archive -o "$archive" "$tag"
  podman rmi --force "$tag" >/dev/null 2>&1 || true
  node_ctr images import --no-unpack "$archive" >/dev/null
  rm -f "$archive"
}

# The kubelet's client certificate: the Node authorizer's identity.
node_certificate() {
  (
    cd "$dir"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout node.key \
      -out node.csr -subj "/O=system:nodes/CN=system:node:$SONDE_NODE_NAME" 2>/dev/null
    openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out node.crt \
      -extfile <(printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n') 2>/dev/null
    rm -f node.csr ca.srl
  )
  kubeconfig "$dir/node/kubeconfig" "$api_port" node
}

node_containerd() {
  mkdir -p "$dir/node/cni" "$dir/node/www"
  cat >"$dir/node/containerd.toml" <<EOF
version = 2
root = "$dir/node/containerd"
state = "$dir/node/containerd-state"
[grpc]
  address = "$dir/node/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "sonde.invalid/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/node/cni"
EOF
  cat >"$dir/node/cni/10-sonde.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "sonde-e2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni-sonde0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$SONDE_NODE_POD_CIDR" }]], "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": "$dir/node/cni-ipam" }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
  run "$dir/node/containerd.log" containerd --config "$dir/node/containerd.toml"
  until_ok "$dir/node/containerd.log" 30 node_ctr version
  local root
  root=$(mktemp -d)
  gcc -static -Os -o "$root/pause" scripts/pause.c
  node_image "$root" sonde.invalid/pause:1 '["/pause"]'
  rm -rf "$root" && root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/www"
  cp /bin/busybox "$root/bin/busybox"
  echo ok >"$root/www/healthz"
  node_image "$root" sonde.invalid/web:1 '["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]'
  rm -rf "$root"
}

node_kubelet() {
  local ip=$1
  cat >"$dir/node/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
address: $ip
port: 0
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: { enabled: false }
  x509: { clientCAFile: $dir/ca.crt }
  webhook: { enabled: false }
authorization: { mode: AlwaysAllow }
resolvConf: /etc/resolv.conf
podCIDR: $SONDE_NODE_POD_CIDR
# This machine's disk is shared with everything else it builds: no
# eviction, and no image collection, for want of space.
evictionHard: { memory.available: "1Mi", nodefs.available: "0%", imagefs.available: "0%" }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  run "$dir/node/kubelet.log" "$bin/kubelet-$version" \
    --config "$dir/node/kubelet.yaml" --kubeconfig "$dir/node/kubeconfig" \
    --root-dir "$dir/node/kubelet" --cert-dir "$dir/node/kubelet-pki" \
    --container-runtime remote --container-runtime-endpoint "unix://$dir/node/containerd.sock" \
    --hostname-override "$SONDE_NODE_NAME" --node-ip "$ip"
  local metrics_port healthz_port
  read -r metrics_port healthz_port < <(free_ports 2)
  cat >"$dir/node/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: { kubeconfig: $dir/kubeconfig }
hostnameOverride: $SONDE_NODE_NAME
mode: iptables
clusterCIDR: $SONDE_NODE_POD_CIDR
metricsBindAddress: 127.0.0.1:$metrics_port
healthzBindAddress: 127.0.0.1:$healthz_port
EOF
  run "$dir/node/kube-proxy.log" "$bin/kube-proxy-$version" --config "$dir/node/kube-proxy.yaml"
  until_ok "$dir/node/kubelet.log" 120 kc wait --for condition=Ready "node/$SONDE_NODE_NAME" --timeout 1s
}

# Starts the node (after the control plane): containerd, the images, the
# kubelet and kube-proxy; returns once the Node is Ready.
node_start() {
  local ip
  ip=$(node_ip)
  sysctl -qw net.ipv4.ip_forward=1
  mkdir -p "$dir/node"
  find /var/log/pods /var/log/containers -mindepth 1 -maxdepth 1 2>/dev/null >"$dir/node/logs-before" || true
  node_certificate
  node_containerd
  node_kubelet "$ip"
  echo "$SONDE_NODE_NAME" >"$dir/node/name"
  echo "== node $SONDE_NODE_NAME ($ip, Pods on $SONDE_NODE_POD_CIDR) Ready" >&2
}

# Removes the iptables rules and chains the kubelet, kube-proxy and the
# CNI plugins made (named KUBE-… and CNI-…, and the jumps to them from the
# built-in chains): the kubelet's KUBE-FIREWALL drops packets to the
# loopback from other addresses, which other tests may send.
node_iptables_clean() {
  local table rule chain chains
  for table in filter nat mangle; do
    { iptables -t "$table" -S 2>/dev/null || true; } |
      { grep -E '^-A (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) .*-j (CNI|KUBE)-' || true; } |
      while read -r rule; do
        # The rule as -S prints it, comments quoted: the shell reads it back.
        eval "iptables -t $table -D ${rule#-A }" 2>/dev/null || true
      done
    chains=$({ iptables -t "$table" -S 2>/dev/null || true; } | awk '/^-N (CNI|KUBE)-/ { print $2 }')
    for chain in $chains; do iptables -t "$table" -F "$chain" 2>/dev/null || true; done
    for chain in $chains; do iptables -t "$table" -X "$chain" 2>/dev/null || true; done
  done
}

# Removes what the node's Pods leave behind once its processes are gone:
# their containers, mounts, network namespaces, logs, the bridge and the
# iptables rules.
node_clean() {
  local bin=${SONDE_KUBE_BIN:-} version mount ns log
  [ -d "$dir/node" ] || return 0
  version=$(cat "$dir/version" 2>/dev/null || true)
  # The shims outlive containerd: their containers are killed by cgroup.
  for pid in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io -id [0-9a-f]* -address $dir/node/containerd.sock" || true); do
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  { findmnt -rn -o TARGET | grep "^$dir/node/" || true; } | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
  for ns in $({ ip netns list 2>/dev/null || true; } | awk '/^cni-/ { print $1 }'); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  ip link delete cni-sonde0 2>/dev/null || true
  if [ -n "$bin" ] && [ -n "$version" ] && [ -x "$bin/kube-proxy-$version" ]; then
    "$bin/kube-proxy-$version" --cleanup >/dev/null 2>&1 || true
  fi
  node_iptables_clean
  # The kubelet of 1.24 writes Pods' logs under /var/log whatever its root
  # directory: what was not there before the node started goes.
  if [ -f "$dir/node/logs-before" ]; then
    for log in /var/log/pods/* /var/log/containers/*; do
      [ -e "$log" ] || [ -L "$log" ] || continue
      grep -qxF "$log" "$dir/node/logs-before" || rm -rf "$log"
    done
  fi
  rm -rf "$dir/node"
}
