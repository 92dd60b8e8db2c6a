//! `sonde run` end to end: the real engine and the built-in http plugin
//! against a real HTTP server that flips between 200 and 500, in process
//! and through the binary (signals, reload, state across restarts, config
//! errors).

use crate::support::{cache_dir, engine, sonde};
use sonde::agent::{Agent, AgentOptions};
use sonde_sandbox::verdict::Status;
use sonde_tests::{HttpServer, closed_port};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn options(config: &Path) -> AgentOptions {
    AgentOptions {
        config: Some(config.to_path_buf()),
        api: None,
        state_dir: None,
        grace: Duration::from_secs(2),
        jitter: false,
        api_auth: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_follows_a_flipping_server_with_thresholds() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "targets:\n  - name: web\n    address: {}\n    probes:\n      - name: web-ready\n        plugin: http\n        config: {{path: /health}}\n        period: 200ms\n        failure_threshold: 3\n        success_threshold: 2\n",
            server.addr
        ),
    )
    .unwrap();
    let agent = Agent::start(engine(), options(&config)).await.unwrap();
    let mut changes = agent.results().subscribe();
    let next_change = async |changes: &mut tokio::sync::broadcast::Receiver<_>| {
        tokio::time::timeout(Duration::from_secs(10), changes.recv())
            .await
            .expect("a state change within 10s")
            .expect("the change stream")
    };
    let c: sonde_core::results::StateChange = next_change(&mut changes).await;
    assert_eq!((c.from, c.to), (Status::Failure, Status::Success));
    let history = agent.results().get("web-ready").unwrap().history.unwrap();
    let statuses: Vec<Status> = history.iter().map(|h| h.status).collect();
    assert_eq!(statuses, [Status::Success, Status::Success], "two passes, not one");

    server.set_healthy(false);
    let c = next_change(&mut changes).await;
    assert_eq!((c.from, c.to), (Status::Success, Status::Failure));
    assert!(c.message.contains("500"), "{}", c.message);
    let p = agent.results().get("web-ready").unwrap();
    assert_eq!(p.consecutive, 3);
    let statuses: Vec<Status> = p.history.unwrap().iter().rev().take(4).map(|h| h.status).collect();
    assert_eq!(
        statuses,
        [Status::Failure, Status::Failure, Status::Failure, Status::Success],
        "the state turns on the third failure, not before"
    );

    server.set_healthy(true);
    let c = next_change(&mut changes).await;
    assert_eq!((c.from, c.to), (Status::Failure, Status::Success));
    let statuses: Vec<Status> = agent
        .results()
        .get("web-ready")
        .unwrap()
        .history
        .unwrap()
        .iter()
        .rev()
        .take(3)
        .map(|h| h.status)
        .collect();
    assert_eq!(statuses, [Status::Success, Status::Success, Status::Failure]);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_reload_keeps_the_old_config_running() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    let good = format!(
        "targets:\n  - name: web\n    address: {}\n    probes:\n      - {{name: up, plugin: http, config: {{path: /ok}}, period: 100ms}}\n",
        server.addr
    );
    std::fs::write(&config, &good).unwrap();
    let agent = Agent::start(engine(), options(&config)).await.unwrap();
    std::fs::write(&config, good.replace("period: 100ms", "period: 100ms, colour: red")).unwrap();
    let e = agent.reload().await.unwrap_err().to_string();
    assert!(e.contains("sonde.yaml:5:") && e.contains("colour"), "{e}");
    let status = agent.status();
    assert_eq!(status.reload_error.as_deref(), Some(e.as_str()));
    assert_eq!(agent.results().list().len(), 1, "the old probe is still there");
    std::fs::write(&config, good.replace("/ok", "/health")).unwrap();
    let summary = agent.reload().await.unwrap();
    assert_eq!(summary.changed, ["up"]);
    assert!(agent.status().reload_error.is_none());
    agent.stop().await;
}

// The binary, as an operator runs it.

struct Running {
    child: std::cell::RefCell<Child>,
    api: SocketAddr,
}

impl Running {
    fn start(config: &Path, state_dir: &Path) -> Self {
        let api = closed_port();
        let child = Command::new(env!("CARGO_BIN_EXE_sonde"))
            .arg("--cache-dir")
            .arg(cache_dir())
            .args([
                "run",
                "--no-jitter",
                "--grace",
                "2s",
                "--api",
                &api.to_string(),
                "--config",
            ])
            .arg(config)
            .arg("--state-dir")
            .arg(state_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sonde run");
        let agent = Self {
            child: child.into(),
            api,
        };
        // A machine loaded by the rest of the suite may take long to start
        // it; the patience is an upper bound only, and an agent that exits
        // (its port taken meanwhile, say) is told at once, with its stderr.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(api).is_err() {
            if let Ok(Some(status)) = agent.child.borrow_mut().try_wait() {
                agent.fail(&format!("sonde run exited ({status}) before serving its API on {api}"));
            }
            if Instant::now() >= deadline {
                agent.fail(&format!("sonde run did not serve its API on {api}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// Stops the agent and panics with `why` and everything it printed.
    fn fail(&self, why: &str) -> ! {
        let mut child = self.child.borrow_mut();
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        panic!("{why}\n--- the agent's stderr ---\n{err}");
    }

    fn get(&self, path: &str) -> serde_json::Value {
        let mut s = std::net::TcpStream::connect(self.api).unwrap_or_else(|e| self.fail(&format!("connect: {e}")));
        write!(s, "GET {path} HTTP/1.0\r\nHost: sonde\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body).unwrap_or_else(|e| self.fail(&format!("GET {path}: {e}: {text}")))
    }

    fn probe(&self, name: &str) -> serde_json::Value {
        self.get(&format!("/v1/probes/{name}"))
    }

    /// Polls until `probe` has state `state` and at least `consecutive`.
    fn wait_for(&self, name: &str, state: &str, consecutive: u64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = self.probe(name);
            if p["state"] == state && p["consecutive"].as_u64() >= Some(consecutive) {
                return p;
            }
            if Instant::now() >= deadline {
                self.fail(&format!("{name} never reached {state}: {p}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.borrow().id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// SIGTERM, then the exit status and stderr.
    fn stop(self) -> (i32, String) {
        self.signal(rustix::process::Signal::TERM);
        let mut child = self.child.borrow_mut();
        let status = child.wait().unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (status.code().unwrap_or(-1), err)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Two probes of one target. Their `timeout` is far above a run's time
/// on a loaded machine: a run that fails only because the machine is
/// busy would reset the counts this test compares.
fn two_probes(server: SocketAddr, second_period: &str, initial_delay: &str) -> String {
    format!(
        "targets:\n  - name: web\n    address: {server}\n    probes:\n      - {{name: steady, plugin: http, config: {{path: /ok}}, period: 100ms, timeout: 10s, initial_delay: {initial_delay}}}\n      - {{name: edited, plugin: tcp, period: {second_period}, timeout: 10s, initial_delay: {initial_delay}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reload_keeps_unchanged_counts_and_state_survives_a_restart() {
    let server = HttpServer::start().await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("sonde.yaml");
        let state = dir.path().join("state");
        std::fs::write(&config, two_probes(addr, "100ms", "0s")).unwrap();
        let agent = Running::start(&config, &state);
        agent.wait_for("steady", "success", 5);
        agent.wait_for("edited", "success", 5);

        // Change one probe; SIGHUP. The other keeps counting.
        std::fs::write(&config, two_probes(addr, "150ms", "0s")).unwrap();
        let before = agent.probe("steady")["consecutive"].as_u64().unwrap();
        agent.signal(rustix::process::Signal::HUP);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let edited = agent.probe("edited")["consecutive"].as_u64().unwrap();
            let steady = agent.probe("steady")["consecutive"].as_u64().unwrap();
            if edited < 5 {
                if steady < before {
                    agent.fail(&format!("the unchanged probe was reset: {steady} < {before}"));
                }
                break;
            }
            if Instant::now() >= deadline {
                agent.fail("the changed probe never restarted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Both ready again before the stop: the restart below reads the
        // state this agent wrote (a loaded machine may stop it before the
        // restarted probe's first run).
        agent.wait_for("edited", "success", 1);
        let (code, stderr) = agent.stop();
        assert_eq!(code, 0, "SIGTERM is a clean exit: {stderr}");

        // Restart with the same state_dir: the state is there at once,
        // marked stale, before any run (the initial delay is long).
        std::fs::write(&config, two_probes(addr, "150ms", "1h")).unwrap();
        let agent = Running::start(&config, &state);
        let p = agent.probe("steady");
        assert_eq!(p["state"], "success", "{p}");
        assert_eq!(p["stale"], true, "{p}");
        assert!(p["last"]["message"].as_str().unwrap().contains("200"), "{p}");
        let status = agent.get("/v1/targets");
        assert_eq!(status[0]["ready"], true, "{status}");
        let (code, _) = agent.stop();
        assert_eq!(code, 0);
    })
    .await
    .unwrap();
}

#[test]
fn a_typo_in_a_key_names_file_line_column_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("typo.yaml");
    std::fs::write(
        &config,
        "targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - plugin: http\n        perod: 5s\n",
    )
    .unwrap();
    for cmd in ["run", "validate"] {
        let out = if cmd == "run" {
            sonde(&["run", "--config", config.to_str().unwrap()])
        } else {
            sonde(&["validate", config.to_str().unwrap()])
        };
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}:6:9:", config.display())) && err.contains("perod"),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn validate_reports_every_semantic_error_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - {name: a, kind: liveness, plugin: http, success_threshold: 2}\n      - {name: a, plugin: tcp}\n      - {name: b, plugin: nosuch}\n      - {name: c, plugin: http, config: {path: 5}}\n      - {name: d, plugin: tcp, period: 50ms, grants: {net: [\"db:x\"]}}\n",
    )
    .unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = config.display().to_string();
    for (line, text) in [
        (5, "success_threshold: must be 1 for a liveness probe"),
        (6, "probe \"a\" is already defined at"),
        (7, "unknown built-in \"nosuch\""),
        (8, "config at /path"),
        (9, "below the 100ms minimum"),
        (9, "grants.net: net grant \"db:x\""),
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("{file}:{line}:")) && l.contains(text)),
            "no line {line} error containing {text:?} in:\n{err}"
        );
    }

    std::fs::write(
        &config,
        "targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - {plugin: http, config: {path: /healthz}}\n",
    )
    .unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 targets, 1 probes"));
}

#[test]
fn the_embedded_default_config_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("default.yaml");
    std::fs::write(&config, sonde::agent::DEFAULT_CONFIG).unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}
