//! Plugins from OCI registries as the `sonde` command and the agent use
//! them, against a real registry (sonde-oci's `support/registry.rs`:
//! Debian's `docker-registry`, never a mock). The client's own contract is
//! in sonde-oci's tests, pulling and running in sonde-core's.

mod hostile;
mod signing;

use crate::support::registry::{Options, Registry, info, registry, tcp_component};
use crate::support::{self, sonde};
use sonde_policy::identity::Digest;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod cosign;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run_cli(args: &[&str], flags: &[String]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(flags.iter().map(String::as_str));
    sonde(&all)
}

#[test]
fn the_cli_signs_pushes_pulls_checks_and_inspects() {
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let flags = reg.cli_flags(&dir.path().join("oci-cache"));
    let wasm = dir.path().join("tcp.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let key = dir.path().join("acme.key");
    let out = sonde(&["plugin", "keygen", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let public = dir.path().join("acme.pub").display().to_string();
    let reference = format!("oci://{}/acme/tcp-check:1.0", reg.addr);

    let out = run_cli(&["plugin", "push", wasm.to_str().unwrap(), &reference], &flags);
    assert!(out.status.success(), "{}", stderr(&out));
    let pushed = stdout(&out);
    let digest = pushed
        .split('@')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(Digest::parse(&digest).is_ok(), "{pushed}");

    // Unsigned: a check that requires a trusted signature refuses it.
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target_addr = target.local_addr().unwrap().to_string();
    let out = run_cli(
        &["check", &reference, "--target", &target_addr, "--trust", &public],
        &flags,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(stderr(&out).contains("unsigned"), "{}", stderr(&out));

    let out = run_cli(
        &[
            "plugin",
            "sign",
            "--key",
            key.to_str().unwrap(),
            wasm.to_str().unwrap(),
            "--push",
            &reference,
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(".sig"), "cosign's tag: {}", stdout(&out));

    let pinned = format!("oci://{}/acme/tcp-check@{digest}", reg.addr);
    let out = run_cli(
        &["check", &pinned, "--target", &target_addr, "--trust", &public],
        &flags,
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));

    let pulled = dir.path().join("pulled.wasm");
    let out = run_cli(
        &[
            "plugin",
            "pull",
            &reference,
            "-o",
            pulled.to_str().unwrap(),
            "--trust",
            &public,
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&pulled).unwrap(), tcp_component());
    let out = sonde(&["plugin", "verify", "--key", &public, pulled.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "the pulled signature verifies as a file: {}",
        stdout(&out)
    );

    let out = run_cli(&["plugin", "inspect", &pinned, "-o", "json"], &flags);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = support::json(&out);
    assert_eq!(v["plugin"], pinned.as_str());
    assert_eq!(v["digest"], Digest::of(tcp_component()).to_string().as_str());
    drop(target);
}

#[test]
fn the_cli_refuses_a_pull_whose_signature_is_untrusted() {
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let flags = reg.cli_flags(&dir.path().join("oci-cache"));
    let wasm = dir.path().join("tcp.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let mallory = dir.path().join("mallory.key");
    let acme = dir.path().join("acme.key");
    for k in [&mallory, &acme] {
        assert!(sonde(&["plugin", "keygen", k.to_str().unwrap()]).status.success());
    }
    let out = sonde(&[
        "plugin",
        "sign",
        "--key",
        mallory.to_str().unwrap(),
        wasm.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = format!("oci://{}/acme/tcp-check:1.0", reg.addr);
    // push --key signs the artifact in the registry.
    let out = run_cli(
        &[
            "plugin",
            "push",
            wasm.to_str().unwrap(),
            &reference,
            "--key",
            mallory.to_str().unwrap(),
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("attached"), "{}", stdout(&out));

    let pulled = dir.path().join("pulled.wasm");
    let public = dir.path().join("acme.pub").display().to_string();
    let out = run_cli(
        &[
            "plugin",
            "pull",
            &reference,
            "-o",
            pulled.to_str().unwrap(),
            "--trust",
            &public,
        ],
        &flags,
    );
    assert_eq!(out.status.code(), Some(2), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("untrusted"), "{}", stdout(&out));
    assert!(!pulled.exists(), "nothing written");
}

#[test]
fn a_registry_reference_is_checked_before_anything_is_asked() {
    let out = sonde(&["check", "oci://registry.example.com/acme/pg-check"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stderr(&out).contains("sonde does not assume :latest"),
        "{}",
        stderr(&out)
    );
}

/// An agent whose config names its plugins by `oci://` reference (one
/// pinned to a digest, one by tag) with its cache in `state_dir/oci`.
fn oci_agent_config(dir: &Path, reg: &Registry, target: &str, plugins: &[(&str, &str)]) -> PathBuf {
    let mut yaml = format!(
        "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\n  timeout: 5s\ntargets:\n  - name: svc\n    address: {target}\n    probes:\n",
        state = dir.join("state").display(),
        addr = reg.addr,
    );
    for (name, plugin) in plugins {
        yaml.push_str(&format!(
            "      - {{ name: {name}, plugin: \"{plugin}\", period: 200ms }}\n"
        ));
    }
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `GET path` on the agent's API: the body.
async fn api_get(api: std::net::SocketAddr, path: &str) -> String {
    support::call(api, "GET", path, None, b"").await.1
}

/// Waits until every probe in `names` has succeeded once, and returns
/// `/v1/probes`.
async fn wait_all_succeed(api: std::net::SocketAddr, names: &[&str]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probes: serde_json::Value = serde_json::from_str(&api_get(api, "/v1/probes").await).unwrap();
        let ok = |n: &str| {
            probes
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == n && p["last"]["status"] == "success")
        };
        if names.iter().all(|n| ok(n)) {
            return probes;
        }
        assert!(
            Instant::now() < deadline,
            "not every probe of {names:?} succeeded: {probes:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The acceptance: `sonde run` with plugins that are all `oci://`
/// references runs them, shows the digest that runs, and after a restart
/// with the registry stopped runs them from its cache; a reference it never
/// pulled leaves only its own probe out.
#[tokio::test]
async fn an_agent_runs_oci_plugins_and_restarts_from_its_cache_with_the_registry_down() {
    let mut reg = registry!(Options::default());
    let pusher_cache = tempfile::tempdir().unwrap();
    let tag = reg.reference("acme/tcp-check:1.0");
    let pushed = reg
        .client(pusher_cache.path())
        .push(&tag, tcp_component(), &info())
        .await
        .unwrap();
    let pinned = pushed.reference.to_string();
    assert!(pinned.contains("@sha256:"), "{pinned}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let accepting = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let by_tag = tag.to_string();
    let config = oci_agent_config(dir.path(), &reg, &target, &[("pinned", &pinned), ("tagged", &by_tag)]);
    let (agent, api) = support::start_agent(&config).await;
    let probes = wait_all_succeed(api, &["pinned", "tagged"]).await;
    // Both show the digest that runs, the tag resolved at load.
    for p in probes.as_array().unwrap() {
        assert_eq!(p["plugin"], pinned.as_str(), "{p:#}");
    }
    let metrics = api_get(api, "/metrics").await;
    assert!(
        metrics.contains(&format!("plugin=\"{pinned}\"")),
        "the metrics do not label runs with the pinned reference:\n{metrics}"
    );
    // The pulls counted against the tenant that named the plugins: at
    // least the component's bytes.
    let pulled = agent.executor().tenant_stats("default").unwrap().pull_bytes;
    assert!(pulled >= tcp_component().len() as u64, "{pulled} bytes charged");
    assert!(
        metrics.contains("sonde_tenant_oci_pull_bytes_total{tenant=\"default\"}"),
        "{metrics}"
    );
    agent.stop().await;

    // The registry goes away; the agent restarts with one more probe whose
    // plugin it never pulled.
    reg.stop();
    let never = reg.reference("acme/never-pulled:2.0").to_string();
    let config = oci_agent_config(
        dir.path(),
        &reg,
        &target,
        &[("pinned", &pinned), ("tagged", &by_tag), ("never", &never)],
    );
    let (agent, api) = support::start_agent(&config).await;
    let probes = wait_all_succeed(api, &["pinned", "tagged"]).await;
    // From the cache: nothing came from a registry.
    assert_eq!(agent.executor().tenant_stats("default").unwrap().pull_bytes, 0);
    assert!(
        !probes.as_array().unwrap().iter().any(|p| p["name"] == "never"),
        "{probes:#}"
    );
    // Its pull fails in the background (the registry is gone): the probe is
    // left out once it has, with the reason.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status: serde_json::Value = serde_json::from_str(&api_get(api, "/v1/status").await).unwrap();
        if status["left_out"].as_array().is_some_and(|l| !l.is_empty()) {
            break status;
        }
        assert!(Instant::now() < deadline, "{status:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let left_out = status["left_out"].as_array().unwrap_or_else(|| panic!("{status:#}"));
    assert_eq!(left_out.len(), 1, "{status:#}");
    let reason = left_out[0].as_str().unwrap();
    assert!(
        reason.starts_with("probe \"never\" of tenant \"default\": ")
            && reason.contains(&never)
            && reason.contains("not in the local cache"),
        "{reason}"
    );
    agent.stop().await;
    accepting.abort();
}
