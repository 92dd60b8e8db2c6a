//! Containment as the agent and `sonde` run it: the agent keeps no token
//! in its environment, and stuck name lookups hold a bounded number of
//! its threads. The sandbox's own containment is in sonde-sandbox's tests.

use crate::support::{cache_dir, sonde_with_mounts};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_agent_keeps_no_token_in_its_environment_and_says_how_it_contains() {
    const SECRET: &str = "tok-3f9a1c0d5e7b2468-secret";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        "operator_token_env: SONDE_TEST_OPERATOR_TOKEN\ntargets:\n  - name: web\n    address: 127.0.0.1:9\n    probes:\n      - {name: web-port, kind: readiness, plugin: tcp, period: 10s}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["run", "--api", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env("SONDE_TEST_OPERATOR_TOKEN", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut start = None;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("sonde started") {
            start = Some(line);
            break;
        }
    }
    let environ = std::fs::read(format!("/proc/{}/environ", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    let start = start.unwrap_or_else(|| panic!("no start line:\n{}", seen.join("\n")));
    assert!(start.contains("exec_containment="), "{start}");
    let environ = String::from_utf8_lossy(&environ.unwrap()).into_owned();
    assert!(!environ.contains(SECRET), "the token is in /proc/<pid>/environ");
}

/// `GET path` on the agent's API: the status code.
fn get_status(api: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// A resolver that never answers — a UDP socket on `ip`:53 nobody reads —
/// and a `sonde` command that sees it as its only name server (a
/// resolv.conf bind-mounted in a mount namespace of its own): the socket,
/// to keep, and the command.
fn sonde_with_silent_resolver(dir: &Path, ip: &str) -> (std::net::UdpSocket, Command) {
    let resolver = std::net::UdpSocket::bind((ip, 53)).expect("bind the silent resolver");
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {ip}\noptions timeout:30 attempts:2\n")).unwrap();
    (resolver, sonde_with_mounts(&[(&resolv, "/etc/resolv.conf")]))
}

/// `sonde run` on `config` behind [`sonde_with_silent_resolver`] on `ip`:
/// the resolver (to keep), the agent, the rest of its stderr (kept open)
/// and its API address, read from its start line.
pub(crate) fn agent_with_silent_resolver(
    dir: &Path,
    ip: &str,
    config: &Path,
) -> (
    std::net::UdpSocket,
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStderr>>,
    String,
) {
    let (resolver, mut command) = sonde_with_silent_resolver(dir, ip);
    let mut child = command
        .args(["run", "--api", "127.0.0.1:0", "--no-jitter", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let api = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("no start line:\n{}", seen.join("\n"));
        };
        seen.push(line.clone());
        if let Some(at) = line.find(" api=") {
            break line[at + 5..].split(' ').next().unwrap().to_string();
        }
    };
    (resolver, child, lines, api)
}

#[test]
fn lookups_hold_a_bounded_number_of_threads() {
    use sonde_sandbox::host::blocking::MAX_LOOKUPS_IN_FLIGHT;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "health_timeout: 1s\ntargets:\n  - name: slow\n    address: slow.sonde-test:80\n    probes:\n      - {{name: flood, kind: readiness, plugin: {}, period: 1s, timeout: 3s}}\n",
            sonde_tests::guests::FLOOD_LOOKUPS
        ),
    )
    .unwrap();
    let (resolver, mut child, _stderr, api) = agent_with_silent_resolver(dir.path(), "127.0.0.77", &config);
    // /livez notices once every lookup slot has been stuck for longer than
    // health_timeout…
    let waited = Instant::now();
    let mut livez = get_status(&api, "/livez");
    while livez == 200 && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        livez = get_status(&api, "/livez");
    }
    // …and the flood held no more threads than the lookup slots (plus the
    // agent's own: workers, the API, the epoch ticker).
    let threads = threads_of(child.id());
    let _ = child.kill();
    let _ = child.wait();
    drop(resolver);
    assert_eq!(livez, 503, "/livez never noticed the stuck lookups");
    assert!(
        threads < MAX_LOOKUPS_IN_FLIGHT + 40,
        "{threads} threads: blocked lookups are not bounded"
    );
}

#[test]
fn sonde_check_exits_with_its_answer_while_lookups_are_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let (resolver, mut command) = sonde_with_silent_resolver(dir.path(), "127.0.0.78");
    let started = Instant::now();
    let out = command
        .args([
            "check",
            sonde_tests::guests::FLOOD_LOOKUPS,
            "--target",
            "slow.sonde-test:80",
        ])
        .args(["--timeout", "2s", "-o", "json"])
        .output()
        .expect("unshare");
    let took = started.elapsed();
    drop(resolver);
    // The flood outlasts the call: a timeout, printed.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "timeout", "{v}");
    // The stuck lookups last a minute (2 attempts of 30 s); the command
    // waits for none of them.
    assert!(took < Duration::from_secs(25), "sonde check took {took:?}");
}

/// `GET path` on the agent's API: the whole response, as text.
pub(crate) fn get_text(api: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// issue 16, finding 4: `wasi:sockets` name lookups against a resolver
/// that never answers hold at most the agent's lookup slots (32 threads,
/// whatever the plugins start); once they are all stuck, `/livez` fails
/// and a call that waits for one until its deadline ends `unknown`,
/// reason `host-limit`, naming the bound.
#[test]
fn wasi_lookups_hold_a_bounded_number_of_threads_and_a_starved_call_is_host_limit() {
    use sonde_sandbox::host::blocking::MAX_LOOKUPS_IN_FLIGHT;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    let probes: String = (0..6)
        .map(|i| {
            format!(
                "      - {{name: flood{i}, kind: readiness, plugin: {}, config: {{wait: true}}, period: 1s, timeout: 2s}}\n",
                sonde_tests::guests::FLOOD_WASI_LOOKUPS
            )
        })
        .collect();
    std::fs::write(
        &config,
        format!("health_timeout: 1s\ntargets:\n  - name: slow\n    address: slow.sonde-test:80\n    probes:\n{probes}"),
    )
    .unwrap();
    let (resolver, mut child, _stderr, api) = agent_with_silent_resolver(dir.path(), "127.0.0.79", &config);
    // A run cut off waiting for a lookup slot is reported as such…
    let waited = Instant::now();
    let mut probes = get_text(&api, "/v1/probes");
    while !probes.contains("name-lookup slots") && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        probes = get_text(&api, "/v1/probes");
    }
    // …while /livez says the sandbox is out of lookups…
    let livez = get_status(&api, "/livez");
    // …and the lookups held no more threads than the slots (plus the
    // agent's own: workers, the API, the epoch ticker).
    let threads = threads_of(child.id());
    let _ = child.kill();
    let _ = child.wait();
    drop(resolver);
    assert!(
        probes.contains(&format!(
            "cut off waiting for one of the agent's {MAX_LOOKUPS_IN_FLIGHT} name-lookup slots"
        )),
        "no run reported the starved lookups: {probes}"
    );
    assert!(probes.contains("host-limit"), "{probes}");
    assert_eq!(livez, 503, "/livez never noticed the stuck lookups");
    assert!(
        threads < MAX_LOOKUPS_IN_FLIGHT + 40,
        "{threads} threads: blocked lookups are not bounded"
    );
}
