//! `sonde run`, `sonde validate` and `sonde status`.

use super::client::{self, DEFAULT_API_URL, get_json};
use super::error::CliError;
use super::output::Output;
use crate::agent::{self, AgentError, AgentOptions};
use sonde_sandbox::engine::{Engine, EngineConfig};

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Arguments of `sonde run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The config file (YAML). Without it, sonde runs its embedded default config, which probes sonde's own API.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Serve the API on this address (overrides the file's `api`), such as 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,

    /// Keep probe state here across restarts (overrides the file's `state_dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// At SIGTERM, how long runs in flight may take to finish (0s: not at all).
    #[arg(long, default_value = "10s", value_parser = super::args::parse_duration, value_name = "DURATION")]
    pub grace: Duration,

    /// Start every probe at once instead of at a random offset within its first period.
    #[arg(long)]
    pub no_jitter: bool,

    /// Whether API callers need a bearer token: `token`, `none` (only on a loopback address), or `auto` (token when any token is configured).
    #[arg(long, value_enum, default_value_t = crate::api::ApiAuth::Auto)]
    pub api_auth: crate::api::ApiAuth,

    /// Serve Kubernetes readiness gates `sonde.dev/<check>` of this node's Pods, and the SondeNodeChecks that select this node (node from $NODE_NAME, its address from $NODE_IP; the config's `kubernetes:` block turns it on too). See docs/kubernetes.md.
    #[arg(long)]
    pub kubernetes: bool,
}

/// Arguments of `sonde validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The config file to check (plugins are loaded, configs checked against their schemas).
    pub config: PathBuf,

    /// As `sonde run --api`: check the API as it would be served there.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,

    /// As `sonde run --api-auth`.
    #[arg(long, value_enum, default_value_t = crate::api::ApiAuth::Auto)]
    pub api_auth: crate::api::ApiAuth,

    /// As `sonde run --kubernetes`: check the readiness-gate settings even without a `kubernetes:` block (the node name is the running node's, so it is not asked for).
    #[arg(long)]
    pub kubernetes: bool,

    /// `json`: print the effective config, every key with its value after defaults and normalisation.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Arguments of `sonde status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's API.
    #[arg(long, default_value = DEFAULT_API_URL, value_name = "URL")]
    pub api: String,

    /// Keep watching: on a terminal, the table redrawn live; otherwise one line per state change.
    #[arg(long, short)]
    pub watch: bool,

    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

pub(super) async fn run(config: EngineConfig, args: RunArgs) -> Result<i32, CliError> {
    let engine = Engine::new(config)?;
    let options = AgentOptions {
        config: args.config,
        api: args.api,
        state_dir: args.state_dir,
        grace: args.grace,
        jitter: !args.no_jitter,
        api_auth: args.api_auth,
    };
    match agent::run_with(engine, options, args.kubernetes).await {
        Ok(()) => Ok(0),
        Err(e @ (AgentError::Config(_) | AgentError::Refused(_))) => {
            eprintln!("{e}");
            eprintln!(
                "sonde: the config was refused; fix what is listed above (`sonde validate FILE` checks a file without running it)"
            );
            Ok(2)
        }
        Err(e) => Err(CliError::Message(e.to_string())),
    }
}

pub(super) async fn validate(config: EngineConfig, args: ValidateArgs) -> Result<i32, CliError> {
    let engine = Engine::new(config)?;
    let catalog = match sonde_core::catalog::Catalog::load_file(&engine, &args.config).await {
        Ok(catalog) => catalog,
        Err(e) => {
            eprintln!("{e}");
            return Ok(2);
        }
    };
    for w in &catalog.warnings {
        eprintln!("warning: {w}");
    }
    // What `sonde run` would refuse at start, by the very rules it uses.
    let problems = agent::start_problems(
        &catalog,
        &agent::StartOptions {
            api: args.api,
            api_auth: args.api_auth,
            kubernetes: Some(agent::KubernetesStart {
                forced: args.kubernetes,
                // The node the agent will run on names itself; a stand-in
                // here, so only the block's own settings are checked.
                node_name: Some(std::env::var("NODE_NAME").unwrap_or_else(|_| "validate".into())),
            }),
        },
    );
    if !problems.is_empty() {
        eprintln!("{}", agent::StartProblem::list(&problems));
        return Ok(2);
    }
    match args.output {
        Output::Json => {
            let mut effective = super::effective::effective(&catalog);
            // As `sonde run --api` would serve it.
            if let Some(addr) = args.api {
                effective["api"]["listen"] = addr.to_string().into();
            }
            out!("{}", serde_json::to_string_pretty(&effective).unwrap_or_default());
        }
        Output::Text => out!(
            "{}: ok ({} targets, {} probes)",
            args.config.display(),
            catalog.targets().len(),
            catalog.probes().len()
        ),
    }
    Ok(0)
}

fn age(at: Option<&str>) -> String {
    let Some(t) = at.and_then(|s| humantime::parse_rfc3339(s).ok()) else {
        return "-".into();
    };
    let secs = SystemTime::now().duration_since(t).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

/// Whether to colour output: a terminal, and `NO_COLOR` unset.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn paint(state: &str, text: &str, colour: bool) -> String {
    let code = match state {
        "success" => "32",
        "warning" => "33",
        "failure" => "31",
        _ => "90",
    };
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// A plugin as the table shows it: an `oci://` reference without its
/// scheme and with its digest cut to 12 hex digits (`-o json` has it whole).
fn short_plugin(plugin: &str) -> String {
    let plugin = plugin.strip_prefix("oci://").unwrap_or(plugin);
    match plugin.split_once("@sha256:") {
        Some((name, hex)) => format!("{name}@sha256:{}", &hex[..hex.len().min(12)]),
        None => plugin.to_string(),
    }
}

/// The probes as a table.
fn table(probes: &[serde_json::Value], agent: &serde_json::Value, colour: bool) -> String {
    use std::fmt::Write;
    let width = probes
        .iter()
        .filter_map(|p| p["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(4)
        .max(5);
    let plugins: Vec<String> = probes
        .iter()
        .map(|p| short_plugin(p["plugin"].as_str().unwrap_or("?")))
        .collect();
    let plugin_width = plugins.iter().map(|p| p.chars().count()).max().unwrap_or(6).max(6);
    let mut out = format!(
        "{:<width$}  {:<12} {:<9}  {:<plugin_width$}  {:<8} {:>5}  {:>4}  MESSAGE\n",
        "PROBE", "TARGET", "KIND", "PLUGIN", "STATE", "CONS", "AGE"
    );
    for (p, plugin) in probes.iter().zip(&plugins) {
        let stale = if p["stale"].as_bool() == Some(true) { "*" } else { "" };
        let pulling = &p["pulling"];
        let raw = if pulling.is_object() {
            "pulling"
        } else {
            p["state"].as_str().unwrap_or("?")
        };
        let state = paint(raw, &format!("{:<8}", format!("{raw}{stale}")), colour);
        let last = &p["last"];
        let message = match pulling["since"].as_str() {
            Some(since) => format!("its plugin is being pulled (since {since}); it runs when the pull lands"),
            None => last["message"].as_str().unwrap_or("").replace('\n', " "),
        };
        let reason = last["reason"].as_str().map(|r| format!("({r}) ")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<width$}  {:<12} {:<9}  {:<plugin_width$}  {} {:>5}  {:>4}  {reason}{}",
            p["name"].as_str().unwrap_or("?"),
            p["target"].as_str().unwrap_or("?"),
            p["kind"].as_str().unwrap_or("?"),
            plugin,
            state,
            p["consecutive"].as_u64().unwrap_or(0),
            age(last["at"].as_str()),
            message.chars().take(100).collect::<String>(),
        );
    }
    if probes.iter().any(|p| p["stale"].as_bool() == Some(true)) {
        out.push_str("* restored from disk, not run since the agent started\n");
    }
    if let Some(e) = agent["reload_error"].as_str() {
        let _ = write!(
            out,
            "\nthe last config reload was refused (the previous config keeps running):\n{e}\n"
        );
    }
    out
}

async fn fetch(api: &str) -> Result<(Vec<serde_json::Value>, serde_json::Value), CliError> {
    let probes: serde_json::Value = get_json(api, "/v1/probes").await?;
    let agent: serde_json::Value = get_json(api, "/v1/status").await?;
    Ok((probes.as_array().cloned().unwrap_or_default(), agent))
}

pub(super) async fn status(args: StatusArgs) -> Result<i32, CliError> {
    if args.watch {
        return watch(args).await;
    }
    let (probes, agent) = fetch(&args.api).await?;
    let healthy = client::healthy(&probes);
    if args.output == Output::Json {
        let all = serde_json::json!({ "healthy": healthy, "agent": agent, "probes": probes });
        out!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
    } else {
        out_part!("{}", table(&probes, &agent, colour()));
    }
    Ok(if healthy { 0 } else { 2 })
}

/// `sonde status --watch`: on a terminal, the table redrawn as outcomes
/// arrive (at most twice a second); otherwise (or with `-o json`) one line
/// per state change. Reconnects with `Last-Event-ID` when the stream drops.
async fn watch(args: StatusArgs) -> Result<i32, CliError> {
    use http_body_util::BodyExt;
    use std::io::IsTerminal;
    let live = std::io::stdout().is_terminal() && args.output == Output::Text;
    let colour = colour();
    let path = if live { "/v1/watch?all=1" } else { "/v1/watch" };
    let mut last_id = String::new();
    let mut connected_once = false;
    loop {
        let headers: Vec<(&str, &str)> = if last_id.is_empty() {
            Vec::new()
        } else {
            vec![("last-event-id", last_id.as_str())]
        };
        let resp = match client::open(&args.api, path, &headers).await {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                return Err(CliError::Message(format!(
                    "{path}: {}; check that --api points at a sonde agent of the same version, and $SONDE_TOKEN",
                    r.status()
                )));
            }
            Err(e) if !connected_once => return Err(e.into()),
            Err(e) => {
                eprintln!("{e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        connected_once = true;
        let mut body = resp.into_body();
        let mut parser = client::EventParser::default();
        let mut dirty = live;
        let mut redraw = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                frame = body.frame() => {
                    let Some(Ok(frame)) = frame else { break };
                    let Ok(data) = frame.into_data() else { continue };
                    for ev in parser.feed(&data) {
                        if !ev.id.is_empty() {
                            last_id = ev.id.clone();
                        }
                        if live {
                            dirty = true;
                        } else if ev.event == "change" && args.output == Output::Json {
                            out!("{}", ev.data);
                        } else if ev.event == "change" {
                            let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap_or_default();
                            let to = v["to"].as_str().unwrap_or("?");
                            out!(
                                "{}  {}  {} -> {}  {}",
                                v["at"].as_str().unwrap_or(""),
                                v["probe"].as_str().unwrap_or("?"),
                                v["from"].as_str().unwrap_or("?"),
                                paint(to, to, colour),
                                v["message"].as_str().unwrap_or("").replace('\n', " ")
                            );
                        } else if ev.event == "reset" {
                            eprintln!("(events were missed; the stream starts again from now)");
                        }
                    }
                }
                _ = redraw.tick(), if live => {
                    if dirty {
                        dirty = false;
                        let (probes, agent) = fetch(&args.api).await?;
                        out_part!("\x1b[H\x1b[2J{}\n(watching {}; Ctrl-C to stop)\n", table(&probes, &agent, colour), args.api);
                    }
                }
            }
        }
        eprintln!("the watch stream ended; reconnecting");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_the_plugin_with_a_short_digest() {
        let digest = "0123456789abcdef".repeat(4);
        let probes = vec![
            serde_json::json!({"name": "db", "target": "pg", "kind": "readiness", "state": "success",
                "plugin": format!("oci://registry.acme.io/acme/pg-check@sha256:{digest}"),
                "consecutive": 3, "last": {"message": "ok", "at": null}}),
            serde_json::json!({"name": "web", "target": "web", "kind": "liveness", "state": "failure",
                "plugin": "http", "consecutive": 1, "last": {"message": "down", "at": null}}),
        ];
        let text = table(&probes, &serde_json::json!({}), false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("PLUGIN"), "{text}");
        assert!(
            lines[1].contains("registry.acme.io/acme/pg-check@sha256:0123456789ab ") && !lines[1].contains("oci://"),
            "{text}"
        );
        assert!(lines[2].contains(" http "), "{text}");
        // Columns line up: STATE starts at the same place in every row.
        let at = lines[0].find("STATE").unwrap();
        assert_eq!(&lines[1][at..at + 7], "success", "{text}");
        assert_eq!(&lines[2][at..at + 7], "failure", "{text}");
    }
}
