//! Crash safety: `sonde run` (the real binary) is killed with SIGKILL at
//! random moments while clients upload and delete plugins and probes and
//! its probes change state, then restarted on the same `state_dir`, many
//! times. After each restart the state opens (nothing moved aside as
//! corrupt), no upload is half there, and everything acknowledged with a
//! 2xx is there (or was replaced by the one request in flight at the kill),
//! a batch of probes (`PUT /v1/probes`) is there whole or not at all, and
//! no temporary file of an interrupted write is left behind.
//! `SONDE_CRASH_KILLS` sets the number of kills (default 20).

use crate::abuse::{ACME, config};
use crate::support::cache_dir;
use sonde_tests::{HttpServer, guests};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A `sonde run` process and the address its API is on.
struct Process {
    child: Child,
    api: SocketAddr,
}

impl Process {
    fn start(config: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sonde"))
            .arg("--cache-dir")
            .arg(cache_dir())
            .args(["run", "--api", "127.0.0.1:0", "--grace", "0s", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sonde run");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            let mut seen = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("sonde started") {
                    let api = line
                        .split_once("api=http://")
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        .and_then(|a| a.parse::<SocketAddr>().ok());
                    let _ = tx.send(api.ok_or(line.clone()));
                    sent = true;
                } else if !sent {
                    seen.push(line);
                    if seen.len() > 200 {
                        let _ = tx.send(Err(seen.join("\n")));
                        sent = true;
                    }
                }
            }
            if !sent {
                let _ = tx.send(Err(format!("sonde run ended before it started:\n{}", seen.join("\n"))));
            }
        });
        let api = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("sonde run never said it started")
            .unwrap_or_else(|e| panic!("no API address in the start line: {e}"));
        Self { child, api }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One request as tenant acme; `None` when the agent went away before
/// answering.
async fn try_call(api: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    crate::support::try_call(api, method, path, Some(ACME), body).await
}

/// What one name should hold: the last acknowledged content (`None`:
/// absent), and the content of a request in flight when the agent died.
#[derive(Clone, Debug, Default)]
struct Expect {
    acked: Option<Vec<u8>>,
    in_flight: Option<Option<Vec<u8>>>,
}

/// The two plugins uploads alternate between, so a stored file is
/// recognisably one whole upload.
fn plugins() -> [Vec<u8>; 2] {
    [
        std::fs::read(guests::ALWAYS_UP).unwrap(),
        std::fs::read(guests::PANIC_IN_CHECK).unwrap(),
    ]
}

fn probe_spec(server: SocketAddr, version: u32) -> Vec<u8> {
    format!("address: {server}\nplugin: tcp\nperiod: 100ms\ngroups: [v{version}]\n").into_bytes()
}

/// What a stored file holds, for comparing with what was sent: plugins
/// byte for byte, probes by their `groups` (the version).
fn stored(state: &Path, kind: &str, name: &str) -> Option<Vec<u8>> {
    let ext = if kind == "plugins" { "wasm" } else { "json" };
    let bytes = std::fs::read(state.join(format!("managed/{kind}/acme/{name}.{ext}"))).ok()?;
    if kind == "plugins" {
        return Some(bytes);
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "probe {name} is stored half-written ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Some(v["groups"].to_string().into_bytes())
}

fn sent(kind: &str, body: &[u8]) -> Vec<u8> {
    if kind == "plugins" {
        return body.to_vec();
    }
    // The specs this test writes end with `groups: [vN]`.
    let text = String::from_utf8_lossy(body);
    let line = text.lines().find(|l| l.starts_with("groups: ")).unwrap();
    let v = line.trim_start_matches("groups: [").trim_end_matches(']');
    serde_json::json!([v]).to_string().into_bytes()
}

/// One client: PUTs and DELETEs on its own names until the agent dies,
/// keeping what each name should hold.
async fn writer(
    api: SocketAddr,
    server: SocketAddr,
    names: Vec<(&'static str, String)>,
    book: Arc<Mutex<HashMap<(String, String), Expect>>>,
    seed: u64,
) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed);
    let plugins = plugins();
    let mut acked = 0;
    loop {
        let (kind, name) = names[rng.usize(..names.len())].clone();
        let body = match (kind, rng.u8(..4)) {
            (_, 0) => None,
            ("plugins", _) => Some(plugins[rng.usize(..2)].clone()),
            _ => Some(probe_spec(server, rng.u32(..))),
        };
        let key = (kind.to_string(), name.clone());
        let content = body.as_ref().map(|b| sent(kind, b));
        book.lock().unwrap().entry(key.clone()).or_default().in_flight = Some(content.clone());
        let path = format!("/v1/{kind}/{name}");
        let answer = match &body {
            Some(b) => try_call(api, "PUT", &path, b).await,
            None => try_call(api, "DELETE", &path, b"").await,
        };
        let Some((status, text)) = answer else {
            // The agent died with this request in flight.
            return acked;
        };
        let mut book = book.lock().unwrap();
        let e = book.get_mut(&key).unwrap();
        e.in_flight = None;
        match status {
            200 | 201 => {
                e.acked = content;
                acked += 1;
            }
            // Deleting what is not there.
            404 if body.is_none() => e.acked = None,
            _ => panic!("{kind}/{name}: {status} {text}"),
        }
    }
}

/// The probes one batch writes, together.
const BATCH: [&str; 3] = ["b-probe0", "b-probe1", "b-probe2"];

/// One client PUTting the probes of [`BATCH`] together with one version,
/// again and again, until the agent dies.
async fn batch_writer(
    api: SocketAddr,
    server: SocketAddr,
    book: Arc<Mutex<HashMap<(String, String), Expect>>>,
    seed: u64,
) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut acked = 0;
    loop {
        let version = rng.u32(..);
        let mut body = String::new();
        for name in BATCH {
            let spec = String::from_utf8(probe_spec(server, version)).unwrap();
            body.push_str(&format!("- name: {name}\n"));
            for line in spec.lines() {
                body.push_str(&format!("  {line}\n"));
            }
        }
        let content = serde_json::json!([format!("v{version}")]).to_string().into_bytes();
        for name in BATCH {
            let key = ("probes".to_string(), name.to_string());
            book.lock().unwrap().entry(key).or_default().in_flight = Some(Some(content.clone()));
        }
        let Some((status, text)) = try_call(api, "PUT", "/v1/probes", body.as_bytes()).await else {
            return acked;
        };
        assert!(matches!(status, 200 | 201), "PUT /v1/probes: {status} {text}");
        let mut book = book.lock().unwrap();
        for name in BATCH {
            let e = book.get_mut(&("probes".to_string(), name.to_string())).unwrap();
            e.in_flight = None;
            e.acked = Some(content.clone());
        }
        acked += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_moments_the_agent_keeps_everything_it_acknowledged() {
    let kills: u32 = std::env::var("SONDE_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), server.addr, "{}");
    let state = dir.path().join("state");
    let book: Arc<Mutex<HashMap<(String, String), Expect>>> = Arc::default();
    let seed = fastrand::u64(..);
    eprintln!("crash: seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut total = 0;
    for round in 0..kills {
        let mut agent = Process::start(&config);
        let snapshot = book.lock().unwrap().clone();
        let settled = check(&state, snapshot, agent.api, round).await;
        *book.lock().unwrap() = settled;
        // Four writers on names of their own, so each name has at most one
        // request in flight.
        let mut writers = Vec::new();
        for w in 0..4 {
            let names = (0..3)
                .flat_map(|i| {
                    [
                        ("plugins", format!("w{w}-plug{i}")),
                        ("probes", format!("w{w}-probe{i}")),
                    ]
                })
                .collect();
            writers.push(tokio::spawn(writer(
                agent.api,
                server.addr,
                names,
                book.clone(),
                rng.u64(..),
            )));
        }
        writers.push(tokio::spawn(batch_writer(
            agent.api,
            server.addr,
            book.clone(),
            rng.u64(..),
        )));
        // A flapping target makes probe states change (and be persisted).
        server.set_healthy(round % 2 == 0);
        // A random moment: a random number of acknowledged writes in.
        tokio::time::sleep(Duration::from_millis(rng.u64(20..400))).await;
        agent.kill();
        for w in writers {
            total += w.await.unwrap();
        }
    }
    let agent = Process::start(&config);
    let snapshot = book.lock().unwrap().clone();
    check(&state, snapshot, agent.api, kills).await;
    eprintln!("crash: {kills} kills, {total} acknowledged writes, all there");
    assert!(total > 0, "no write was ever acknowledged");
}

/// The invariants after a restart; returns what each name now holds (the
/// request in flight at the kill settled one way or the other).
async fn check(
    state: &Path,
    mut book: HashMap<(String, String), Expect>,
    api: SocketAddr,
    round: u32,
) -> HashMap<(String, String), Expect> {
    let corrupt: Vec<PathBuf> = std::fs::read_dir(state)
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("corrupt"))
        .collect();
    assert!(corrupt.is_empty(), "round {round}: the state did not open: {corrupt:?}");
    assert_eq!(try_call(api, "GET", "/livez", b"").await.map(|a| a.0), Some(200));
    // The agent has opened the store: no interrupted write's temporary
    // file is left.
    let leftovers: Vec<PathBuf> = walk(&state.join("managed"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    assert!(
        leftovers.is_empty(),
        "round {round}: temporary files left: {leftovers:?}"
    );
    // A batch is there whole or not at all.
    let batch: Vec<Option<Vec<u8>>> = BATCH.iter().map(|n| stored(state, "probes", n)).collect();
    assert!(
        batch.iter().all(|b| *b == batch[0]),
        "round {round}: a batch of probes is half there: {:?}",
        batch
            .iter()
            .map(|b| b.as_ref().map(|b| String::from_utf8_lossy(b).to_string()))
            .collect::<Vec<_>>()
    );
    for ((kind, name), e) in &mut book {
        let now = stored(state, kind, name);
        let ok = now == e.acked || e.in_flight.as_ref().is_some_and(|f| *f == now);
        assert!(
            ok,
            "round {round}: {kind}/{name} holds {:?}, acknowledged {:?}, in flight {:?}",
            now.as_ref().map(|b| b.len()),
            e.acked.as_ref().map(|b| b.len()),
            e.in_flight.as_ref().map(|f| f.as_ref().map(|b| b.len()))
        );
        // What is stored is what the agent serves.
        if kind == "probes" {
            let status = try_call(api, "GET", &format!("/v1/probes/{name}"), b"")
                .await
                .unwrap()
                .0;
            assert_eq!(
                status == 200,
                now.is_some(),
                "round {round}: probe {name} is served: {status}"
            );
        }
        *e = Expect {
            acked: now,
            in_flight: None,
        };
    }
    book
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
