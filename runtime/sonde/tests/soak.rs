//! The soak (`scripts/soak.sh`): the real `sonde run` for `SOAK_SECONDS`
//! (600 by default; CI runs 60) with ~1,000 probes, hostile ones among
//! them, while clients churn plugins and probes through the API, 50 watch
//! clients come and go with `Last-Event-ID`, the config is reloaded with
//! SIGHUP and the probes' target goes up and down.
//!
//! It fails if, after the warm-up (the first third, at least 40 s: until
//! every bounded history is full), the agent's resident
//! memory grows more than 5 %, its file descriptors or threads grow, a
//! watcher misses a state change, or `/livez` fails. Memory, descriptors
//! and threads are sampled every second; a window's *floor* (its minimum)
//! is what the agent holds between bursts, and the last window's floor is
//! compared with the highest reading of the window right after warm-up, so
//! the bursts of work in flight do not count as growth but a leak, which
//! raises the floor past every earlier reading, does.
//!
//! It is `#[ignore]`d in `cargo test` (it takes minutes on purpose); run it
//! with `scripts/soak.sh`.

// The `all` suite's helpers (tokens, requests), of which the soak uses a few.
#[allow(
    dead_code,
    unused_imports,
    unused_macros,
    reason = "the soak uses a few of the all suite's helpers"
)]
#[path = "all/support/mod.rs"]
mod support;

use sonde_tests::guests;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const OP: &str = "soak-operator";
const CHURN: &str = "soak-churn";
const WATCHERS: usize = 50;

/// The probes' target: an HTTP server that goes up and down.
struct Flapping {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
}

impl Flapping {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let state = up.clone();
        tokio::spawn(async move {
            let mut listener = Some(listener);
            loop {
                match &listener {
                    Some(l) if state.load(Ordering::Relaxed) => {
                        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
                        if let Ok(Ok((s, _))) = accepted {
                            tokio::spawn(answer(s));
                        }
                    }
                    Some(_) => listener = None, // down: the port is closed
                    None if state.load(Ordering::Relaxed) => {
                        listener = TcpListener::bind(addr).await.ok();
                        if listener.is_none() {
                            // The port is not free yet: try again shortly.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Self { addr, up }
    }
}

async fn answer(mut s: TcpStream) {
    let mut buf = vec![0u8; 4096];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let _ = s
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        .await;
}

/// ~1,000 probes: 900 tcp and http probes of the flapping target every
/// second (so bounded histories fill within the warm-up), and ten
/// of each hostile guest in a tenant of its own. `generation` changes one
/// probe's period, so each SIGHUP reload is a real change.
fn config(dir: &Path, target: SocketAddr, generation: u32) -> PathBuf {
    let hostile = [
        guests::SPIN_FOREVER,
        guests::BURN_FUEL,
        guests::ALLOC_FOREVER,
        guests::PANIC_IN_CHECK,
        guests::CONNECT_ELSEWHERE,
        guests::HOARD_TLS_SESSIONS,
        guests::LOG_FLOOD,
        guests::HUGE_MESSAGE,
        guests::SLEEP_IN_HOST,
        guests::LOOKUP_ELSEWHERE,
    ];
    let mut yaml = format!(
        "operator_token_file: op.token
tenants:
  - id: churn
    token_file: churn.token
    quotas: {{ max_probes: 50, max_concurrent_runs: 2 }}
    ceiling: {{ net: [\"127.0.0.1:*\"] }}
  - id: hostile
    quotas: {{ max_probes: 200, max_concurrent_runs: 1, timeout: 300ms }}
    ceiling: {{ net: [\"127.0.0.1:*\"] }}
targets:
  - name: flapping
    address: {target}
    probes:
      - {{name: reloaded, plugin: tcp, period: {}ms}}
",
        1000 + generation % 2 * 100
    );
    for i in 0..900 {
        let plugin = if i % 3 == 0 { "http" } else { "tcp" };
        yaml.push_str(&format!(
            "      - {{name: p{i}, plugin: {plugin}, period: 1s, failure_threshold: 1, groups: [g{}]}}\n",
            i % 10
        ));
    }
    yaml.push_str(&format!(
        "  - name: hostile\n    tenant: hostile\n    address: {target}\n    probes:\n"
    ));
    for (g, path) in hostile.iter().enumerate() {
        let path = private_copy(dir, Path::new(path));
        let path = path.display();
        for i in 0..10 {
            yaml.push_str(&format!(
                "      - {{name: h{g}-{i}, plugin: {path}, period: 5s, timeout: 300ms}}\n"
            ));
        }
    }
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `file` copied into `dir` (once), and the copy's path. The soak runs
/// for minutes on a target directory that other builds may rewrite: the
/// agent, the compiler child it starts and every reload must see the same
/// binary and guests from start to end.
fn private_copy(dir: &Path, file: &Path) -> PathBuf {
    let copy = dir.join(file.file_name().unwrap());
    if !copy.exists() {
        std::fs::copy(file, &copy).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    }
    copy
}

/// The value of the unlabelled series `name` in a `/metrics` text.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// One request; the status and body, or `None` if it failed or took
/// more than 10 s.
async fn call(api: SocketAddr, method: &str, path: &str, token: &str, body: &[u8]) -> Option<(u16, String)> {
    let go = support::try_call(api, method, path, Some(token), body);
    tokio::time::timeout(Duration::from_secs(10), go).await.ok().flatten()
}

/// What a watcher saw: state-change sequence numbers, gaps and resets.
#[derive(Default)]
struct Seen {
    seqs: BTreeSet<u64>,
    resets: u64,
    reconnects: u64,
}

/// A watch client: follows `/v1/watch`, drops the connection at random
/// moments and comes back with the last id it saw.
async fn watcher(api: SocketAddr, seed: u64, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, reconnect: bool) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut last: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(api).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let resume = last
            .as_ref()
            .map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
        let head = format!("GET /v1/watch HTTP/1.1\r\nHost: sonde\r\nAuthorization: Bearer {OP}\r\n{resume}\r\n");
        if s.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let stay = if reconnect {
            Duration::from_millis(rng.u64(1000..8000))
        } else {
            Duration::from_secs(86_400)
        };
        let until = tokio::time::Instant::now() + stay;
        let mut lines = BufReader::new(s).lines();
        let (mut id, mut event) = (None, None);
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let line = tokio::select! {
                l = lines.next_line() => l,
                () = tokio::time::sleep_until(until) => break,
                () = tokio::time::sleep(Duration::from_millis(500)) => continue,
            };
            let Ok(Some(line)) = line else { break };
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if line.is_empty()
                && let (Some(i), Some(e)) = (id.take(), event.take())
            {
                {
                    let mut seen = seen.lock().unwrap();
                    match e.as_str() {
                        "change" => {
                            if let Some(seq) = i.rsplit_once('-').and_then(|(_, n)| n.parse().ok()) {
                                seen.seqs.insert(seq);
                            }
                        }
                        "reset" => seen.resets += 1,
                        _ => {}
                    }
                    last = Some(i);
                }
            }
        }
        seen.lock().unwrap().reconnects += 1;
    }
}

/// The agent's resident memory (bytes), open descriptors and threads.
fn sample(pid: u32) -> Option<(u64, usize, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    let rss = field("VmRSS:")? * 1024;
    let threads = field("Threads:")? as usize;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds, threads))
}

/// The total of `sonde_probe_runs_total` in a `/metrics` text.
fn runs(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("sonde_probe_runs_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "takes SOAK_SECONDS (10 minutes by default): run it with scripts/soak.sh"]
async fn soak() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let total = Duration::from_secs(seconds);
    // Warm-up ends once every bounded store is full: each probe's history
    // keeps its last 32 runs (32 s at these periods), the event logs fill
    // sooner. Memory that grows before that is the bounds filling.
    let warmup = (total / 3).max(Duration::from_secs(40)).min(total * 2 / 3);
    let window = Duration::from_secs((seconds / 6).clamp(5, 60));
    let dir = tempfile::tempdir().unwrap();
    support::secret(dir.path(), "op.token", OP);
    support::secret(dir.path(), "churn.token", CHURN);
    let target = Flapping::start().await;
    let mut generation = 0;
    let config = config(dir.path(), target.addr, generation);
    let api: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let sonde = private_copy(dir.path(), Path::new(env!("CARGO_BIN_EXE_sonde")));
    let mut child = std::process::Command::new(&sonde)
        .arg("--cache-dir")
        .arg(dir.path().join("compile-cache"))
        .args(["run", "--grace", "1s", "--api", &api.to_string(), "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start sonde run");
    let pid = child.id();
    let started = Instant::now();
    while call(api, "GET", "/livez", OP, b"").await.map(|r| r.0) != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the agent never answered /livez"
        );
        assert!(child.try_wait().unwrap().is_none(), "the agent exited at start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();

    // 50 watchers that come and go, and one that stays: the reference.
    let reference = Arc::new(Mutex::new(Seen::default()));
    tasks.push(tokio::spawn(watcher(api, 0, stop.clone(), reference.clone(), false)));
    let mut watchers = Vec::new();
    for w in 0..WATCHERS {
        let seen = Arc::new(Mutex::new(Seen::default()));
        watchers.push(seen.clone());
        tasks.push(tokio::spawn(watcher(api, w as u64 + 1, stop.clone(), seen, true)));
    }

    // API churn: a tenant uploads a plugin, adds probes using it, removes
    // them and the plugin, again and again.
    let churned = Arc::new(AtomicU64::new(0));
    {
        let (stop, churned) = (stop.clone(), churned.clone());
        let plugin = std::fs::read(guests::ALWAYS_UP).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("churn{}", i % 5);
                let mut ok = true;
                ok &= matches!(
                    call(api, "PUT", &format!("/v1/plugins/{name}"), CHURN, &plugin).await,
                    Some((200 | 201, _))
                );
                // The churned probes check the API's own port: a listener that stays up.
                let spec = format!("address: {api}\nplugin: {name}\nperiod: 1s\n");
                for p in 0..3 {
                    ok &= matches!(
                        call(api, "PUT", &format!("/v1/probes/{name}-{p}"), CHURN, spec.as_bytes()).await,
                        Some((200 | 201, _))
                    );
                }
                for p in 0..3 {
                    ok &= matches!(
                        call(api, "DELETE", &format!("/v1/probes/{name}-{p}"), CHURN, b"").await,
                        Some((200, _))
                    );
                }
                ok &= matches!(
                    call(api, "DELETE", &format!("/v1/plugins/{name}"), CHURN, b"").await,
                    Some((200, _))
                );
                assert!(ok, "an API churn round failed");
                churned.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }

    // The loop: flap the target every 15 s, reload every 10 s, check
    // /livez and sample every second.
    let mut samples: Vec<(Duration, (u64, usize, usize))> = Vec::new();
    let mut livez_failures = Vec::new();
    let mut reloads = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() < total {
        tick.tick().await;
        let t = started.elapsed();
        assert!(child.try_wait().unwrap().is_none(), "the agent died at {t:?}");
        target.up.store((t.as_secs() / 15).is_multiple_of(2), Ordering::Relaxed);
        if t.as_secs() % 10 == 5 {
            generation += 1;
            let _ = self::config(dir.path(), target.addr, generation);
            let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
            reloads += 1;
        }
        match call(api, "GET", "/livez", OP, b"").await {
            Some((200, _)) => {}
            other => livez_failures.push(format!("{t:?}: {other:?}")),
        }
        if let Some(s) = sample(pid) {
            samples.push((t, s));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let metrics = call(api, "GET", "/metrics", OP, b"")
        .await
        .map(|r| r.1)
        .unwrap_or_default();
    for t in tasks {
        t.abort();
    }
    let _ = child.kill();
    let _ = child.wait();

    // The figures.
    let in_window = |from: Duration, to: Duration| -> Vec<(u64, usize, usize)> {
        samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, s)| *s)
            .collect()
    };
    let base = in_window(warmup, warmup + window);
    let last = in_window(total.saturating_sub(window), total);
    assert!(
        !base.is_empty() && !last.is_empty(),
        "too few samples ({} in all, over {:?}): was the soak stopped or starved?",
        samples.len(),
        samples.last().map(|(t, _)| *t)
    );
    let max = |v: &[(u64, usize, usize)]| {
        (
            v.iter().map(|s| s.0).max().unwrap(),
            v.iter().map(|s| s.1).max().unwrap(),
            v.iter().map(|s| s.2).max().unwrap(),
        )
    };
    let min = |v: &[(u64, usize, usize)]| {
        (
            v.iter().map(|s| s.0).min().unwrap(),
            v.iter().map(|s| s.1).min().unwrap(),
            v.iter().map(|s| s.2).min().unwrap(),
        )
    };
    let (base_max, base_min, last_min, last_max) = (max(&base), min(&base), min(&last), max(&last));
    let reference = reference.lock().unwrap();
    let changes = reference.seqs.len();
    let mut missed = 0;
    let mut resets = 0;
    let mut reconnects = 0;
    for w in &watchers {
        let w = w.lock().unwrap();
        resets += w.resets;
        reconnects += w.reconnects;
        // Every change the reference saw while this watcher was following.
        if let (Some(first), Some(last)) = (w.seqs.first(), w.seqs.last()) {
            missed += reference
                .seqs
                .range(first..=last)
                .filter(|s| !w.seqs.contains(s))
                .count();
        }
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "soak: {seconds} s, {} probes' runs: {}, reloads {reloads}, API churn rounds {}\n\
         soak: RSS after warm-up {:.1}-{:.1} MiB, at the end {:.1}-{:.1} MiB ({:+.1} % floor over peak)\n\
         soak: fds after warm-up {}-{}, at the end {}-{}; threads {}-{}, at the end {}-{}\n\
         soak: changes {changes}, watchers {WATCHERS} with {reconnects} reconnects, missed {missed}, resets {resets}\n\
         soak: /livez failures {}\n\
         soak: instance pool at the end: {} memories in use, {} idle holding {:.1} MiB",
        901 + 100,
        runs(&metrics),
        churned.load(Ordering::Relaxed),
        mib(base_min.0),
        mib(base_max.0),
        mib(last_min.0),
        mib(last_max.0),
        (last_min.0 as f64 / base_max.0 as f64 - 1.0) * 100.0,
        base_min.1,
        base_max.1,
        last_min.1,
        last_max.1,
        base_min.2,
        base_max.2,
        last_min.2,
        last_max.2,
        livez_failures.len(),
        gauge(&metrics, "sonde_pool_memories_in_use").unwrap_or(f64::NAN),
        gauge(&metrics, "sonde_pool_idle_memories").unwrap_or(f64::NAN),
        gauge(&metrics, "sonde_pool_idle_resident_bytes").map_or(f64::NAN, |b| mib(b as u64)),
    );
    assert!(livez_failures.is_empty(), "/livez failed: {livez_failures:?}");
    assert!(
        last_min.0 as f64 <= base_max.0 as f64 * 1.05,
        "resident memory grew more than 5 % after warm-up"
    );
    assert!(last_min.1 <= base_max.1, "file descriptors grew after warm-up");
    assert!(last_min.2 <= base_max.2, "threads grew after warm-up");
    assert!(changes > 0, "the flapping target changed no state");
    assert_eq!((missed, resets), (0, 0), "watchers missed changes");
    assert!(runs(&metrics) > 0);
}
