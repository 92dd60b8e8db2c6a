//! What a person meets first: `sonde run`'s start, state-change, reload and
//! shutdown lines (text and JSON), its systemd readiness notifications,
//! `sonde status` exit codes, the systemd unit, completions, man pages and
//! `--version`.

use crate::support::{cache_dir, sonde};
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long any one expected line or notification may take.
const WAIT: Duration = Duration::from_secs(30);

/// A `sonde run` process whose stderr lines arrive on a channel.
struct Agent {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    /// Lines seen that no `expect` has taken yet.
    skipped: Vec<String>,
}

impl Agent {
    fn start(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sonde"));
        cmd.arg("--cache-dir")
            .arg(cache_dir())
            .args(["run", "--api", "127.0.0.1:0", "--grace", "2s", "--config"])
            .arg(config)
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start sonde run");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Returns the first line that `matches` and no earlier `expect`
    /// took, waiting for it if it has not come yet. Lines of different
    /// tasks (the start line, a first run's state change) may come in
    /// either order.
    fn expect(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        if let Some(i) = self.skipped.iter().position(|l| matches(l)) {
            return self.skipped.remove(i);
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return line;
                    }
                    self.skipped.push(line);
                }
                Err(_) => panic!("no line with {what} on stderr; it said:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// Waits for the process to exit and returns its code.
    fn wait(&mut self) -> i32 {
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP server on the async runtime; `stop` closes its port.
struct Server {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let _ = listener.accept().await;
            }
        });
        Self { addr, task }
    }

    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn one_probe(dir: &Path, server: std::net::SocketAddr) -> std::path::PathBuf {
    let config = dir.join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "targets:\n  - name: web\n    address: {server}\n    probes:\n      - {{name: web-port, kind: readiness, plugin: tcp, period: 100ms, failure_threshold: 1}}\n"
        ),
    )
    .unwrap();
    config
}

/// The value of `key=` in a text log line (up to the next space).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let at = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line}"));
    let rest = &line[at + key.len() + 2..];
    rest.split(' ').next().unwrap_or("")
}

fn notification(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification from sonde");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_says_what_it_does_and_tells_systemd() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = one_probe(dir.path(), server.addr);
    let socket_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).unwrap();
    notify.set_read_timeout(Some(WAIT)).unwrap();
    let state_dir = dir.path().join("state");
    let mut agent = Agent::start(
        &config,
        &["--state-dir", state_dir.to_str().unwrap()],
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())],
    );

    // Ready once the API is up, after the start line.
    let agent = tokio::task::spawn_blocking(move || {
        assert_eq!(notification(&notify), "READY=1\n");
        let start = agent.expect("the start line", |l| l.contains("sonde started"));
        assert!(start.contains("INFO"), "{start}");
        assert!(start.contains("first runs spread over their periods"), "{start}");
        assert_eq!(field(&start, "version"), env!("CARGO_PKG_VERSION"));
        assert_ne!(field(&start, "commit"), "");
        assert_eq!(field(&start, "config"), config.display().to_string());
        assert_eq!(
            [
                field(&start, "targets"),
                field(&start, "probes"),
                field(&start, "tenants")
            ],
            ["1", "1", "1"]
        );
        assert!(field(&start, "api").starts_with("http://127.0.0.1:"), "{start}");
        assert_eq!(field(&start, "state_dir"), state_dir.display().to_string());
        let up = agent.expect("the probe going up", |l| {
            l.contains("state changed") && l.contains("to=success")
        });
        assert!(up.contains(" probe=web-port target=web "), "{up}");
        assert!(up.contains(" from=failure to=success reason="), "{up}");
        (agent, notify)
    })
    .await
    .unwrap();

    // The target goes away: one greppable line says so, and why.
    server.stop().await;
    tokio::task::spawn_blocking(move || {
        let (mut agent, notify) = agent;
        let down = agent.expect("the probe going down", |l| l.contains("to=failure"));
        assert!(
            down.contains(" probe=web-port target=web kind=readiness from=success to=failure reason="),
            "{down}"
        );
        assert!(down.contains("refused"), "the reason says what happened: {down}");

        // A reload: systemd hears RELOADING=1 then READY=1; one line.
        agent.signal(rustix::process::Signal::HUP);
        let reloading = notification(&notify);
        assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading}");
        assert_eq!(notification(&notify), "READY=1\n");
        let reloaded = agent.expect("the reload line", |l| l.contains("config reloaded"));
        assert_eq!(field(&reloaded, "probes"), "1", "{reloaded}");
        assert_eq!(field(&reloaded, "kept"), "1", "{reloaded}");

        // Shutdown: STOPPING=1, a line when it starts and one when done.
        agent.signal(rustix::process::Signal::TERM);
        assert_eq!(notification(&notify), "STOPPING=1\n");
        let stopping = agent.expect("the stopping line", |l| l.contains("stopping"));
        assert!(stopping.contains("SIGTERM"), "{stopping}");
        agent.expect("the stopped line", |l| l.contains("sonde stopped"));
        assert_eq!(agent.wait(), 0);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_for_shippers_and_the_flag_beats_rust_log() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = one_probe(dir.path(), server.addr);
    // RUST_LOG alone would hide the start line; --log-level wins.
    let mut agent = Agent::start(
        &config,
        &["--no-jitter", "--log-format", "json", "--log-level", "info"],
        &[("RUST_LOG", "error")],
    );
    tokio::task::spawn_blocking(move || {
        let parse = |line: &str| -> serde_json::Value {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        };
        let start = parse(&agent.expect("the start line", |l| l.contains("sonde started")));
        assert_eq!(start["level"], "INFO");
        assert!(
            start["message"].as_str().unwrap().contains("every probe runs now"),
            "{start}"
        );
        assert_eq!(start["probes"], 1);
        assert_eq!(start["targets"], 1);
        assert!(
            start["api"].as_str().unwrap().starts_with("http://127.0.0.1:"),
            "{start}"
        );
        let up = parse(&agent.expect("a state change", |l| l.contains("state changed")));
        assert_eq!(
            (&up["probe"], &up["target"], &up["from"], &up["to"]),
            (&"web-port".into(), &"web".into(), &"failure".into(), &"success".into())
        );
        agent.signal(rustix::process::Signal::TERM);
        assert_eq!(agent.wait(), 0);
        for line in agent.lines.try_iter() {
            parse(&line);
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_0_when_healthy_2_when_not_3_when_unreachable() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = one_probe(dir.path(), server.addr);
    let mut agent = Agent::start(&config, &["--no-jitter"], &[]);
    let (agent, api) = tokio::task::spawn_blocking(move || {
        let start = agent.expect("the start line", |l| l.contains("sonde started"));
        let api = field(&start, "api").to_string();
        (agent, api)
    })
    .await
    .unwrap();
    // Polls `sonde status -o json` until its exit code is `code`.
    let until = |code: i32, api: String| {
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + WAIT;
            loop {
                let out = sonde(&["status", "--api", &api, "-o", "json"]);
                if out.status.code() == Some(code) {
                    return serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
                }
                assert!(
                    Instant::now() < deadline,
                    "sonde status never exited {code}: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let healthy = until(0, api.clone()).await.unwrap();
    assert_eq!(healthy["healthy"], true);
    assert_eq!(healthy["probes"][0]["name"], "web-port");
    assert_eq!(healthy["agent"]["config"], config.display().to_string());

    server.stop().await;
    let sick = until(2, api.clone()).await.unwrap();
    assert_eq!(sick["healthy"], false);
    assert_eq!(sick["probes"][0]["state"], "failure");
    let text = sonde(&["status", "--api", &api]);
    assert_eq!(text.status.code(), Some(2), "the table exits by health too");

    drop(agent);
    let gone = sonde(&["status", "--api", &api]);
    assert_eq!(gone.status.code(), Some(3));
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("cannot reach the agent"), "{err}");
    assert!(
        err.contains("is `sonde run` running there?"),
        "the error says what to do: {err}"
    );
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(crate::support::repo().join("deploy/systemd/sonde.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DynamicUser=yes",
        "StateDirectory=sonde",
        "ProtectSystem=strict",
        "Delegate=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }
    let Ok(analyze) = which("systemd-analyze") else {
        eprintln!("systemd-analyze is not installed (Debian: systemd); skipping `systemd-analyze verify`");
        return;
    };
    // verify refuses a unit whose ExecStart program does not exist: check a
    // copy that runs the binary these tests built, with its man pages
    // (the unit's Documentation=) where `man` finds them.
    let dir = tempfile::tempdir().unwrap();
    let installed = "ExecStart=/usr/local/bin/sonde ";
    assert_eq!(unit.matches(installed).count(), 1, "one ExecStart");
    let copy = unit.replace(installed, &format!("ExecStart={} ", env!("CARGO_BIN_EXE_sonde")));
    let path = dir.path().join("sonde.service");
    std::fs::write(&path, copy).unwrap();
    let man = dir.path().join("man");
    let out = sonde(&["man", "--dir", man.join("man1").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut cmd = Command::new(analyze);
    cmd.arg("verify").env("MANPATH", &man).env("SYSTEMD_LOG_COLOR", "0");
    if which("man").is_err() {
        eprintln!("`man` is not installed: verifying without checking Documentation=");
        cmd.arg("--man=no");
    }
    let out = cmd.arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    assert!(
        !err.contains("sonde.service"),
        "systemd-analyze warns about the unit: {err}"
    );
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or(())
}

#[test]
fn completions_man_page_and_version_come_from_the_cli() {
    let bash = sonde(&["completions", "bash"]);
    assert_eq!(bash.status.code(), Some(0));
    let bash = String::from_utf8_lossy(&bash.stdout);
    assert!(bash.contains("_sonde()"), "{bash}");
    assert!(bash.contains("--log-format"), "completions know the flags");
    let zsh = sonde(&["completions", "zsh"]);
    assert!(String::from_utf8_lossy(&zsh.stdout).starts_with("#compdef sonde"));

    let man = sonde(&["man"]);
    assert_eq!(man.status.code(), Some(0));
    let man = String::from_utf8_lossy(&man.stdout);
    assert!(man.contains(".TH sonde 1"), "{man}");
    assert!(man.contains("completions"), "the page lists the subcommands");
    let dir = tempfile::tempdir().unwrap();
    let out = sonde(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    for page in ["sonde.1", "sonde-run.1", "sonde-status.1", "sonde-plugin-keygen.1"] {
        assert!(dir.path().join(page).is_file(), "{page}");
    }

    let version = sonde(&["--version"]);
    let version = String::from_utf8_lossy(&version.stdout);
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(crate::support::repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("unknown".into(), |o| {
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        });
    assert_eq!(
        version.trim(),
        format!("sonde {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
}

/// `--log-level sonde=debug` turns on the debug lines of every crate of
/// sonde's (a directive's target matches every target it begins: the
/// sandbox's lines are `sonde_sandbox::…`), as the CHANGELOG's log-targets
/// entry tells users; the agent's default filter shows no debug line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sonde_debug_reaches_every_crate_and_the_default_shows_no_debug_line() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = one_probe(dir.path(), server.addr);
    tokio::task::spawn_blocking(move || {
        let mut debug = Agent::start(&config, &["--no-jitter", "--log-level", "sonde=debug"], &[]);
        debug.expect("a debug line of the sandbox crate", |l| {
            l.contains("DEBUG") && l.contains("sonde_sandbox::")
        });
        debug.expect("the start line", |l| l.contains("sonde started"));
        drop(debug);
        let mut default = Agent::start(&config, &["--no-jitter"], &[]);
        default.expect("the start line", |l| l.contains("sonde started"));
        default.expect("a state change", |l| l.contains("state changed"));
        let debug_lines: Vec<&String> = default.seen.iter().filter(|l| l.contains("DEBUG")).collect();
        assert!(
            debug_lines.is_empty(),
            "the default filter let debug lines through: {debug_lines:#?}"
        );
    })
    .await
    .unwrap();
}
