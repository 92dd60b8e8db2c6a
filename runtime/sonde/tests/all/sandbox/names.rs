//! issue 26: a name reaches nothing an address would not, and a tenant's
//! probe is never the operator.
//!
//! The names come from an `/etc/hosts` of the test's own, bind-mounted in a
//! mount namespace of the `sonde` process alone (as a tenant controlling its
//! own DNS would answer): `lo.acme.test` is 127.0.0.1, `meta.acme.test` the
//! cloud metadata address, and so on. Every way a plugin can make the host
//! connect — the host's `tcp`, `tls`, `http` (new and pooled connections)
//! and `grpc`, `wasi:http`, and the plugin's own `wasi:sockets` — is tried
//! against a real server that counts what reached it.

use crate::support::{accepted_before_now, call, secret, sonde_with_mounts};
use sonde_tests::{HttpServer, guests};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the test's names lead: each somewhere a name must never lead by
/// itself.
const HOSTS: &str = "\
127.0.0.1 localhost
::1 localhost
127.0.0.1 lo.acme.test api.acme.test svc.acme.test
::1 lo6.acme.test
0.0.0.0 zero.acme.test
::ffff:127.0.0.1 mapped.acme.test
169.254.169.254 meta.acme.test
224.0.0.1 mc.acme.test
10.11.12.13 private.acme.test
192.0.2.7 public.acme.test
127.7.7.7 seven.acme.test
";

/// A directory with the test's hosts file in it.
fn hosts_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, HOSTS).unwrap();
    (dir, hosts)
}

/// `sonde check PLUGIN --target TARGET --config CONFIG [extra]`, resolving
/// names through `hosts`: the result as JSON.
async fn check(
    hosts: &Path,
    plugin: &str,
    target: &str,
    config: serde_json::Value,
    extra: &[&str],
) -> serde_json::Value {
    let mut command = tokio::process::Command::from(sonde_with_mounts(&[(hosts, "/etc/hosts")]));
    command
        .args([
            "check",
            plugin,
            "--target",
            target,
            "--timeout",
            "3s",
            "-o",
            "json",
            "--config",
        ])
        .arg(config.to_string())
        .args(extra);
    let out = command.output().await.expect("unshare");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{plugin} {target}: stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn assert_denied(v: &serde_json::Value, starts: &str, why: &str) {
    assert_eq!(v["reason"], "denied", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.starts_with(&format!("denied: {starts}")), "{message}");
    assert!(message.contains(why), "{message}\nexpected: {why}");
}

/// Each path a plugin can make the host connect by, given a granted name
/// that resolves to loopback: the run is `denied`, naming the name, the
/// address and the rule, and nothing reached the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_path_reaches_loopback_through_a_name() {
    let (_dir, hosts) = hosts_dir();
    let server = HttpServer::start().await;
    let port = server.addr.port();
    let target = format!("lo.acme.test:{port}");
    let url = format!("http://lo.acme.test:{port}/ok");
    let why = "lo.acme.test resolved to 127.0.0.1: loopback is not reachable through a name; grant the address";
    let cases = [
        (
            guests::TCP_ELSEWHERE,
            serde_json::json!({"host": "lo.acme.test", "port": port}),
            format!("TCP connection to {target}"),
        ),
        (
            guests::HTTP_ELSEWHERE,
            serde_json::json!({"url": url}),
            format!("HTTP request to {target}"),
        ),
        (
            guests::HTTP_ELSEWHERE,
            serde_json::json!({"url": url, "keep": ["server"]}),
            format!("HTTP request to {target}"),
        ),
        (
            guests::TLS_ELSEWHERE,
            serde_json::json!({"host": "lo.acme.test", "port": port, "url": format!("https://{target}/ok")}),
            format!("TLS handshake with {target}"),
        ),
        (
            guests::GRPC_ELSEWHERE,
            serde_json::json!({"authority": target}),
            format!("gRPC call to {target}"),
        ),
        (
            guests::WASI_HTTP_ELSEWHERE,
            serde_json::json!({"authority": target}),
            format!("HTTP request to {target}"),
        ),
        (
            guests::CONNECT_ELSEWHERE,
            serde_json::json!({"addr": target}),
            "look up \"lo.acme.test\"".to_string(),
        ),
        ("tcp", serde_json::json!({}), format!("TCP connection to {target}")),
        (
            "http",
            serde_json::json!({"path": "/ok"}),
            format!("HTTP request to {target}"),
        ),
        (
            "http",
            serde_json::json!({"path": "/ok", "keepalive": true}),
            format!("HTTP request to {target}"),
        ),
    ];
    for (plugin, config, starts) in cases {
        let v = check(&hosts, plugin, &target, config.clone(), &[]).await;
        assert_denied(&v, &starts, why);
    }
    assert_eq!(accepted_before_now(server.addr, || server.accepted()).await, 0);
}

/// Every other class a name must not lead to, in either family and any
/// spelling, by the host's connection and by the plugin's own socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_special_address_is_reached_through_a_name_in_any_spelling() {
    let (_dir, hosts) = hosts_dir();
    let server = HttpServer::start().await;
    let port = server.addr.port();
    for (name, why) in [
        ("lo6.acme.test", "resolved to ::1: loopback is not reachable"),
        ("mapped.acme.test", "resolved to 127.0.0.1: loopback is not reachable"),
        ("zero.acme.test", "resolved to 0.0.0.0: the unspecified address"),
        ("meta.acme.test", "resolved to 169.254.169.254: link-local"),
        ("mc.acme.test", "resolved to 224.0.0.1: multicast is not reachable"),
    ] {
        let target = format!("{name}:{port}");
        let v = check(
            &hosts,
            guests::TCP_ELSEWHERE,
            &target,
            serde_json::json!({"host": name, "port": port}),
            &[],
        )
        .await;
        assert_denied(&v, &format!("TCP connection to {target}"), why);
        let v = check(
            &hosts,
            guests::CONNECT_ELSEWHERE,
            &target,
            serde_json::json!({"addr": target}),
            &[],
        )
        .await;
        assert_denied(&v, &format!("look up \"{name}\""), why);
    }
    assert_eq!(accepted_before_now(server.addr, || server.accepted()).await, 0);
}

/// What must keep working: an address target, `localhost` (loopback by
/// definition), and a name whose address is granted as an address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_granted_as_addresses_and_localhost_still_reach_loopback() {
    let (_dir, hosts) = hosts_dir();
    let server = HttpServer::start().await;
    let port = server.addr.port();
    let by_address = format!("127.0.0.1:{port}");
    let granted = ["--allow-net", by_address.as_str()];
    for (target, host, extra) in [
        (by_address.clone(), "127.0.0.1", &[][..]),
        (format!("localhost:{port}"), "localhost", &[][..]),
        (format!("lo.acme.test:{port}"), "lo.acme.test", &granted[..]),
    ] {
        let v = check(
            &hosts,
            guests::TCP_ELSEWHERE,
            &target,
            serde_json::json!({"host": host, "port": port}),
            extra,
        )
        .await;
        assert_eq!(
            (&v["status"], &v["message"]),
            (&"success".into(), &"sent: true".into()),
            "{target}: {v}"
        );
        let v = check(&hosts, "http", &target, serde_json::json!({"path": "/ok"}), extra).await;
        assert_eq!(v["status"], "success", "{target}: {v}");
    }
    assert!(server.accepted() >= 6);
}

/// A running agent, resolving through the test's hosts file: the child and
/// its API address.
async fn agent(hosts: &Path, config: &Path) -> (tokio::process::Child, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::from(sonde_with_mounts(&[(hosts, "/etc/hosts")]));
    command
        .args(["run", "--no-jitter", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("unshare");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let Ok(Some(line)) = lines.next_line().await else {
            panic!("sonde run ended before its start line:\n{}", seen.join("\n"));
        };
        if let Some(at) = line.find(" api=http://") {
            let api = line[at + 12..].split(' ').next().unwrap().parse().unwrap();
            // Keep reading stderr, so the agent never blocks on it.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return (child, api);
        }
        seen.push(line);
    }
}

const OP: &str = "operator-secret";

/// The probes' last results, once every one of `names` has one.
async fn results(api: SocketAddr, names: &[&str]) -> serde_json::Map<String, serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut found = serde_json::Map::new();
        for name in names {
            let (status, body) = call(api, "GET", &format!("/v1/probes/{name}"), Some(OP), b"").await;
            if status == 200 {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                if !v["last"].is_null() {
                    found.insert(name.to_string(), v["last"].clone());
                }
            }
        }
        if found.len() == names.len() {
            return found;
        }
        assert!(Instant::now() < deadline, "not every probe ran: {found:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The escalation the issue found, with tokens configured: a tenant whose
/// name resolves to the agent's API cannot call it (nor store a probe in
/// the operator's tenant, nor run a shell); a tenant granted loopback by
/// address still cannot reach the agent's own listener; a pooled
/// connection opened by a probe granted the address does not serve a
/// probe of the same tenant granted only the name; the operator's own
/// probe of the API, by address, still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_probe_never_reaches_the_agent_or_acts_as_the_operator() {
    let (dir, hosts) = hosts_dir();
    let server = HttpServer::start().await;
    let api_port = sonde_tests::closed_port().port();
    let svc = server.addr.port();
    secret(dir.path(), "op.token", OP);
    secret(dir.path(), "acme.token", "acme-secret");
    secret(dir.path(), "loop.token", "loop-secret");
    let pwned = dir.path().join("PWNED");
    let body = serde_json::json!({
        "address": "127.0.0.1:9", "kind": "readiness", "plugin": "exec", "period": "1s",
        "config": {"command": ["/bin/sh", "-c", format!("id > {}", pwned.display())]},
        "grants": {"exec": ["/bin/sh"]}
    })
    .to_string();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            r#"api: 127.0.0.1:{api_port}
operator_token_file: {dir}/op.token
tenants:
  - id: acme
    token_file: {dir}/acme.token
    ceiling: {{ net: ["*.acme.test:*", "127.0.0.1:{svc}"] }}
  - id: loop
    token_file: {dir}/loop.token
    ceiling: {{ net: ["127.0.0.0/8:*"] }}
targets:
  - name: api
    tenant: acme
    address: api.acme.test:{api_port}
    probes:
      - name: sneaky
        kind: readiness
        plugin: http
        period: 1s
        config: {{ path: /v1/probes/pwn, method: PUT, expected_status: [200, 201], body: '{body}' }}
  - name: api-by-address
    tenant: loop
    address: 127.0.0.1:{api_port}
    probes:
      - {{ name: by-address, plugin: tcp, period: 1s }}
  - name: svc
    tenant: acme
    address: svc.acme.test:{svc}
    probes:
      - {{ name: pooled-first, plugin: http, period: 1s, config: {{ path: /ok, keepalive: true }}, grants: {{ net: ["127.0.0.1:{svc}"] }} }}
      - {{ name: pooled-second, plugin: http, period: 1s, initial_delay: 2s, config: {{ path: /ok, keepalive: true }} }}
  - name: own
    address: 127.0.0.1:{api_port}
    probes:
      - {{ name: operator-api, plugin: tcp, period: 1s }}
"#,
            dir = dir.path().display()
        ),
    )
    .unwrap();
    let (mut child, api) = agent(&hosts, &config).await;
    let last = results(
        api,
        &["sneaky", "by-address", "pooled-first", "pooled-second", "operator-api"],
    )
    .await;
    let (pwn, _) = call(api, "GET", "/v1/probes/pwn", Some(OP), b"").await;
    let _ = child.kill().await;

    let denied = |name: &str, why: &str| {
        let r = &last[name];
        assert_eq!(r["reason"], "denied", "{name}: {r}");
        let message = r["message"].as_str().unwrap();
        assert!(message.contains(why), "{name}: {message}\nexpected: {why}");
    };
    denied(
        "sneaky",
        &format!(
            "api.acme.test resolved to 127.0.0.1: 127.0.0.1:{api_port} reaches the agent's own listener 127.0.0.1:{api_port}, which no tenant's probe may reach"
        ),
    );
    denied(
        "by-address",
        &format!(
            "127.0.0.1:{api_port} reaches the agent's own listener 127.0.0.1:{api_port}, which no tenant's probe may reach"
        ),
    );
    denied(
        "pooled-second",
        "svc.acme.test resolved to 127.0.0.1: loopback is not reachable through a name",
    );
    assert_eq!(last["pooled-first"]["status"], "success", "{:?}", last["pooled-first"]);
    assert_eq!(last["operator-api"]["status"], "success", "{:?}", last["operator-api"]);
    assert_eq!(pwn, 404, "the tenant's request stored a probe in the operator's tenant");
    assert!(!pwned.exists(), "the tenant's request ran a shell");
    // pooled-first kept its connection in the pool, where pooled-second
    // found it and gave it back: one connection, or two if the two probes
    // ran at the same moment.
    assert!(server.accepted() <= 2, "{} connections", server.accepted());
}

/// `ceiling.names_may_reach`, as a config sets it: by default a tenant's
/// name leads to public addresses only (a private one is refused), and
/// `[]` refuses public ones too. Both refusals happen before any
/// connection, so nothing here leaves loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_may_reach_decides_where_a_tenant_s_name_leads() {
    let (dir, hosts) = hosts_dir();
    secret(dir.path(), "op.token", OP);
    let api_port = sonde_tests::closed_port().port();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            r#"api: 127.0.0.1:{api_port}
operator_token_file: {dir}/op.token
tenants:
  - id: acme
    ceiling: {{ net: ["*.acme.test:*"] }}
  - id: closed
    ceiling: {{ net: ["*.acme.test:*"], names_may_reach: [] }}
targets:
  - name: inside
    tenant: acme
    address: private.acme.test:80
    probes: [{{ name: by-default, plugin: tcp, period: 1s }}]
  - name: outside
    tenant: closed
    address: public.acme.test:80
    probes: [{{ name: reaches-nothing, plugin: tcp, period: 1s }}]
  - name: inside-ping
    tenant: acme
    address: private.acme.test
    probes: [{{ name: ping-by-default, plugin: icmp, period: 1s }}]
  - name: outside-ping
    tenant: closed
    address: public.acme.test
    probes: [{{ name: ping-nothing, plugin: icmp, period: 1s }}]
"#,
            dir = dir.path().display()
        ),
    )
    .unwrap();
    let (mut child, api) = agent(&hosts, &config).await;
    let last = results(
        api,
        &["by-default", "reaches-nothing", "ping-by-default", "ping-nothing"],
    )
    .await;
    let _ = child.kill().await;
    for (name, why) in [
        (
            "by-default",
            "private.acme.test resolved to 10.11.12.13: a private address (10.0.0.0/8) is not reachable through a name for this tenant",
        ),
        (
            "reaches-nothing",
            "public.acme.test resolved to 192.0.2.7: a public address is not reachable through a name for this tenant",
        ),
        (
            "ping-by-default",
            "ICMP echo to private.acme.test: private.acme.test resolved to 10.11.12.13: a private address (10.0.0.0/8) is not reachable through a name for this tenant",
        ),
        (
            "ping-nothing",
            "ICMP echo to public.acme.test: public.acme.test resolved to 192.0.2.7: a public address is not reachable",
        ),
    ] {
        let r = &last[name];
        assert_eq!(r["reason"], "denied", "{name}: {r}");
        assert!(r["message"].as_str().unwrap().contains(why), "{name}: {r}");
    }
}

/// The issue's config as found (tenants, and an API without tokens, so
/// every local caller would be the operator) is refused at start, by
/// `sonde validate` as by `sonde run`.
#[test]
fn tenants_with_an_api_without_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        "api: 127.0.0.1:0\ntenants:\n  - id: acme\n    ceiling: { net: [\"*.acme.test:*\"] }\ntargets:\n  - name: api\n    tenant: acme\n    address: api.acme.test:80\n    probes:\n      - { name: sneaky, plugin: tcp }\n",
    )
    .unwrap();
    let path = config.to_str().unwrap();
    for args in [&["validate", path][..], &["run", "--config", path]] {
        let command = args[0];
        let out = crate::support::sonde(args);
        assert!(!out.status.success(), "{command}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("would answer without a token while tenants are configured"),
            "{command}: {stderr}"
        );
    }
}

/// `sonde check icmp`: a granted name that resolves to a class no name may
/// lead to is denied before a ping socket is opened, naming the name, the
/// address and the rule; the same name granted by its address (with any
/// port, as ICMP has none) is pinged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn icmp_through_a_name_obeys_the_same_rules() {
    let (_dir, hosts) = hosts_dir();
    for (name, why) in [
        (
            "lo.acme.test",
            "resolved to 127.0.0.1: loopback is not reachable through a name",
        ),
        ("lo6.acme.test", "resolved to ::1: loopback is not reachable"),
        ("mapped.acme.test", "resolved to 127.0.0.1: loopback is not reachable"),
        ("meta.acme.test", "resolved to 169.254.169.254: link-local"),
    ] {
        let v = check(&hosts, "icmp", name, serde_json::json!({}), &[]).await;
        assert_denied(&v, &format!("ICMP echo to {name}"), why);
    }
    // A grant of the address with one port is no grant for ICMP.
    let v = check(
        &hosts,
        "icmp",
        "lo.acme.test",
        serde_json::json!({}),
        &["--allow-net", "127.0.0.1:80"],
    )
    .await;
    assert_denied(
        &v,
        "ICMP echo to lo.acme.test",
        "loopback is not reachable through a name",
    );
    if ping_sockets_open() {
        let v = check(
            &hosts,
            "icmp",
            "lo.acme.test",
            serde_json::json!({}),
            &["--allow-net", "127.0.0.1:*"],
        )
        .await;
        assert_eq!(v["status"], "success", "{v}");
        assert!(v["message"].as_str().unwrap().contains("127.0.0.1"), "{v}");
    }
}

/// Counts the ICMP echo requests this machine sends to `dest` while it
/// lives, on a raw socket (root only).
struct EchoCounter {
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl EchoCounter {
    fn start(dest: std::net::Ipv4Addr) -> Option<Self> {
        use socket2::{Domain, Protocol, Socket, Type};
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let mut socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).ok()?;
        socket.set_read_timeout(Some(Duration::from_millis(20))).ok()?;
        let counter = Self {
            count: Default::default(),
            stop: Default::default(),
        };
        let (count, stop) = (counter.count.clone(), counter.stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                let Ok(n) = socket.read(&mut buf) else { continue };
                let header = usize::from(buf[0] & 0x0f) * 4;
                // An IPv4 header, then ICMP type 8 (echo request) to `dest`.
                if n > header && buf[16..20] == dest.octets() && buf[header] == 8 {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Some(counter)
    }

    /// The echo requests seen so far, once those in flight have arrived.
    async fn seen(&self) -> usize {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for EchoCounter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A denied echo sends nothing: no packet to the address, however the
/// plugin or the target names it, while a granted one is seen by the same
/// counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_icmp_echo_sends_nothing() {
    let seven = std::net::Ipv4Addr::new(127, 7, 7, 7);
    let Some(counter) = EchoCounter::start(seven) else {
        eprintln!("skipped: counting echo requests needs a raw socket (root)");
        return;
    };
    let (_dir, hosts) = hosts_dir();
    let v = check(&hosts, "icmp", "seven.acme.test", serde_json::json!({}), &[]).await;
    assert_denied(
        &v,
        "ICMP echo to seven.acme.test",
        "resolved to 127.7.7.7: loopback is not reachable",
    );
    let config = serde_json::json!({"hosts": ["127.7.7.7", "0x7f.7.7.7", "2139031303", "seven.acme.test"]});
    let v = check(&hosts, guests::ICMP_ABUSE, "192.0.2.1", config, &[]).await;
    assert_denied(&v, "ICMP echo to 127.7.7.7", "not the target");
    assert!(v["message"].as_str().unwrap().ends_with("(and 3 more)"), "{v}");
    let config = serde_json::json!({"hosts": ["127.7.7.7"]});
    let v = check(
        &hosts,
        guests::ICMP_ABUSE,
        "192.0.2.1",
        config,
        &["--allow-net", "127.7.7.7:80"],
    )
    .await;
    assert_denied(&v, "ICMP echo to 127.7.7.7", "with any port");
    assert_eq!(counter.seen().await, 0);
    // The counter sees a granted echo (when ping sockets are open).
    if ping_sockets_open() {
        let pinged = check(&hosts, "icmp", "127.7.7.7", serde_json::json!({}), &[]).await;
        assert_eq!(pinged["status"], "success", "{pinged}");
        assert!(counter.seen().await >= 1, "the counter saw no echo: {pinged}");
    }
}

/// Whether `net.ipv4.ping_group_range` admits some group (scripts/test
/// opens it; the tests of `probes::icmp` say when it is closed).
fn ping_sockets_open() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/ping_group_range").is_ok_and(|r| {
        let mut parts = r.split_whitespace().map(|p| p.parse::<i64>().unwrap_or(0));
        parts.next() <= parts.next()
    })
}
