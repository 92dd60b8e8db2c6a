//! `sonde run`, `sonde validate` and `sonde status`.

use super::CliError;
use crate::agent::{self, AgentError, AgentOptions};
use crate::engine::{Engine, EngineConfig};

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default address of the agent's API, as `sonde status` looks for it.
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:9464";

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

    /// At SIGTERM, how long runs in flight may take to finish.
    #[arg(long, default_value = "10s", value_parser = super::check::parse_duration, value_name = "DURATION")]
    pub grace: Duration,

    /// Start every probe at once instead of at a random offset within its first period.
    #[arg(long)]
    pub no_jitter: bool,
}

/// Arguments of `sonde validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The config file to check (plugins are loaded, configs checked against their schemas).
    pub config: PathBuf,
}

/// Arguments of `sonde status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's API.
    #[arg(long, default_value = DEFAULT_API_URL, value_name = "URL")]
    pub api: String,

    /// Output format.
    #[arg(long, short, value_enum, default_value_t = super::Output::Text)]
    pub output: super::Output,
}

pub(super) async fn run(config: EngineConfig, args: RunArgs) -> Result<i32, CliError> {
    let engine = Engine::new(config)?;
    let options = AgentOptions {
        config: args.config,
        api: args.api,
        state_dir: args.state_dir,
        grace: args.grace,
        jitter: !args.no_jitter,
    };
    match agent::run(engine, options).await {
        Ok(()) => Ok(0),
        Err(AgentError::Config(e)) => {
            eprintln!("{e}");
            Ok(2)
        }
        Err(e) => Err(CliError(e.to_string())),
    }
}

pub(super) async fn validate(config: EngineConfig, args: ValidateArgs) -> Result<i32, CliError> {
    let engine = Engine::new(config)?;
    match crate::registry::Registry::load_file(&engine, &args.config).await {
        Ok(reg) => {
            println!(
                "{}: ok ({} targets, {} probes)",
                args.config.display(),
                reg.targets.len(),
                reg.probes.len()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(2)
        }
    }
}

/// GETs `path` from the agent at `base` and parses the JSON body.
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(base: &str, path: &str) -> Result<T, CliError> {
    use http_body_util::BodyExt;
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: http::Uri = url.parse().map_err(|e| CliError(format!("--api {base}: {e}")))?;
    let authority = uri
        .authority()
        .ok_or_else(|| CliError(format!("--api {base}: expected http://HOST:PORT")))?
        .clone();
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let unreachable = |e: &dyn std::fmt::Display| CliError(format!("cannot reach the agent at {base}: {e}"));
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(conn);
    let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, authority.as_str())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| CliError(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| unreachable(&e))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(&e))?
        .to_bytes();
    if !status.is_success() {
        return Err(CliError(format!(
            "{url}: {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    serde_json::from_slice(&body).map_err(|e| CliError(format!("{url}: unexpected answer: {e}")))
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

pub(super) async fn status(args: StatusArgs) -> Result<i32, CliError> {
    let probes: serde_json::Value = get_json(&args.api, "/v1/probes").await?;
    let agent: serde_json::Value = get_json(&args.api, "/v1/status").await?;
    if args.output == super::Output::Json {
        println!("{}", serde_json::to_string_pretty(&probes).unwrap_or_default());
        return Ok(0);
    }
    let probes: Vec<serde_json::Value> = probes.as_array().cloned().unwrap_or_default();
    let width = probes
        .iter()
        .filter_map(|p| p["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(4)
        .max(5);
    println!(
        "{:<width$}  {:<12} {:<9}  {:<8} {:>5}  {:>4}  MESSAGE",
        "PROBE", "TARGET", "KIND", "STATE", "CONS", "AGE"
    );
    for p in &probes {
        let stale = if p["stale"].as_bool() == Some(true) { "*" } else { "" };
        let state = format!("{}{stale}", p["state"].as_str().unwrap_or("?"));
        let last = &p["last"];
        let message = last["message"].as_str().unwrap_or("").replace('\n', " ");
        let reason = last["reason"].as_str().map(|r| format!("({r}) ")).unwrap_or_default();
        println!(
            "{:<width$}  {:<12} {:<9}  {:<8} {:>5}  {:>4}  {reason}{}",
            p["name"].as_str().unwrap_or("?"),
            p["target"].as_str().unwrap_or("?"),
            p["kind"].as_str().unwrap_or("?"),
            state,
            p["consecutive"].as_u64().unwrap_or(0),
            age(last["at"].as_str()),
            message.chars().take(100).collect::<String>(),
        );
    }
    if probes.iter().any(|p| p["stale"].as_bool() == Some(true)) {
        println!("* restored from disk, not run since the agent started");
    }
    if let Some(e) = agent["reload_error"].as_str() {
        println!("\nthe last config reload was refused (the previous config keeps running):\n{e}");
    }
    Ok(0)
}
