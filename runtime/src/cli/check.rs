//! `sonde check`: run one probe once.

use super::{CliError, Output, load_plugin};
use crate::engine::{Call, Engine, EngineConfig, Limits, limits};
use crate::host::{Grants, NetPattern};
use crate::verdict::RunResult;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `sonde check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A built-in plugin name (`tcp`), the path to a `.wasm` component, or oci://HOST/REPO:TAG or @sha256:DIGEST.
    #[arg(required_unless_present = "group")]
    pub plugin: Option<String>,

    /// Instead of running a plugin, ask a running agent whether this group is ready (exit 0 ready, 2 not ready, 3 unknown group or agent unreachable) — for a kubelet `exec` probe.
    #[arg(long, value_name = "GROUP", conflicts_with = "plugin")]
    pub group: Option<String>,

    /// With --group: ask whether the group is live (its liveness probes) instead of ready.
    #[arg(long, requires = "group")]
    pub live: bool,

    /// With --group: the agent's API.
    #[arg(long, default_value = super::run::DEFAULT_API_URL, value_name = "URL", requires = "group")]
    pub api: String,

    /// What to probe: HOST:PORT or a URL. The plugin may connect to it and to nothing else not granted.
    #[arg(long, short, default_value = "")]
    pub target: String,

    /// The plugin config, as JSON.
    #[arg(long, short, default_value = "{}", value_name = "JSON")]
    pub config: String,

    /// The call's deadline, such as 500ms or 2s; past it the run is a failure with reason `timeout`.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Fuel budget (about one unit per wasm instruction); spending it is an error with reason `fuel`.
    #[arg(long, default_value_t = limits::DEFAULT_FUEL, value_name = "N")]
    pub fuel: u64,

    /// Memory cap, such as 64MiB (at most 1GiB); growing past it is an error with reason `memory`.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    pub memory: u64,

    /// Also allow connections to HOST:PORT (a name, `*.domain`, an IP, a CIDR or `*`; PORT a number or `*`). Repeatable.
    #[arg(long = "allow-net", value_name = "HOST:PORT")]
    pub allow_net: Vec<String>,

    /// Allow reading this host path (mounted read-only at the same path). Repeatable.
    #[arg(long = "allow-file", value_name = "PATH")]
    pub allow_file: Vec<PathBuf>,

    /// Allow the plugin to run this program (an absolute path; no shell unless you name one). Repeatable.
    #[arg(long = "allow-exec", value_name = "PATH")]
    pub allow_exec: Vec<PathBuf>,

    /// Set NAME=VALUE in the environment of programs the plugin runs (empty by default). Repeatable.
    #[arg(long = "exec-env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub exec_env: Vec<(String, String)>,

    /// Run a plugin file only if FILE.wasm.sig is a valid signature by this public key (from `sonde plugin keygen`). Repeatable; built-ins need none.
    #[arg(long = "trust", value_name = "KEYFILE.pub")]
    pub trust: Vec<PathBuf>,

    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// How to reach the registry of an oci:// plugin.
    #[command(flatten)]
    pub registry: super::plugin::RegistryArgs,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration such as 500ms or 2s: {e}"))?;
    if d.is_zero() {
        return Err("the timeout must be more than zero".into());
    }
    Ok(d)
}

fn parse_size(s: &str) -> Result<u64, String> {
    let size: bytesize::ByteSize = s
        .parse()
        .map_err(|e| format!("{s:?} is not a size such as 64MiB: {e}"))?;
    if size.as_u64() > limits::MAX_MEMORY {
        return Err(format!("{s} is more than the 1GiB ceiling"));
    }
    Ok(size.as_u64())
}

/// `sonde check --group G`: asks the agent at `--api` and exits 0 when the
/// group passes, 2 when it does not, 3 when that cannot be known.
pub(super) async fn group(args: &CheckArgs, group: &str) -> Result<i32, CliError> {
    let kind = if args.live { "live" } else { "ready" };
    let path = format!(
        "/v1/{kind}/{}",
        percent_encoding::utf8_percent_encode(group, percent_encoding::NON_ALPHANUMERIC)
    );
    let (status, body) = super::client::get(&args.api, &path).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    match status.as_u16() {
        200 => {
            if args.output == Output::Text {
                println!("group {group}: {kind} ({} probes)", v["probes"].as_u64().unwrap_or(0));
            }
            Ok(0)
        }
        503 => {
            if args.output == Output::Text {
                println!("group {group}: not {kind}");
                for f in v["failing"].as_array().into_iter().flatten() {
                    println!(
                        "  {} ({}{}): {}",
                        f["probe"].as_str().unwrap_or("?"),
                        f["state"].as_str().unwrap_or("?"),
                        if f["stale"].as_bool() == Some(true) {
                            ", stale"
                        } else {
                            ""
                        },
                        f["message"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(2)
        }
        _ => {
            let why = v["error"].as_str().map_or_else(|| status.to_string(), str::to_string);
            eprintln!("sonde: group {group}: {why}");
            Ok(3)
        }
    }
}

pub(super) async fn run(config: EngineConfig, args: CheckArgs) -> Result<i32, CliError> {
    if let Some(g) = &args.group {
        return group(&args, g).await;
    }
    let Some(plugin_name) = args.plugin.clone() else {
        return Err(CliError("give a plugin to run, or --group".into()));
    };
    serde_json::from_str::<serde_json::Value>(&args.config)
        .map_err(|e| CliError(format!("--config is not valid JSON: {e}")))?;
    if !args.target.is_empty() {
        NetPattern::for_target(&args.target)?;
    }
    let grants = Arc::new(Grants {
        net: args.allow_net.iter().map(|s| s.parse()).collect::<Result<_, _>>()?,
        files: args.allow_file.clone(),
        exec: args.allow_exec.clone(),
        env: args.exec_env.clone(),
    });
    for p in &grants.exec {
        if !p.is_absolute() || !p.is_file() {
            return Err(CliError(format!(
                "--allow-exec {}: must be an absolute path to a program",
                p.display()
            )));
        }
    }
    for f in &grants.files {
        if !f.is_absolute() || !f.is_dir() {
            return Err(CliError(format!(
                "--allow-file {}: must be an absolute path to a directory",
                f.display()
            )));
        }
    }
    let engine = Engine::new(config.clone())?;
    let plugin = if crate::oci::Reference::is_oci(&plugin_name) {
        let trusted = args
            .trust
            .iter()
            .map(|k| crate::signing::PublicKey::read(k))
            .collect::<Result<Vec<_>, _>>()?;
        super::plugin::load_oci(&engine, &config, &args.registry, &plugin_name, &trusted).await?
    } else if !args.trust.is_empty() && crate::builtins::get(&plugin_name).is_none() {
        // Verify and load the same bytes, so the file cannot change in between.
        let trusted = args
            .trust
            .iter()
            .map(|k| crate::signing::PublicKey::read(k))
            .collect::<Result<Vec<_>, _>>()?;
        let path = std::path::Path::new(&plugin_name);
        let wasm = std::fs::read(path).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
        let sig_path = crate::signing::signature_path(path);
        let sig = crate::signing::read_signature(path)?;
        let signer = crate::signing::verify(
            &plugin_name,
            &wasm,
            &sig_path.display().to_string(),
            sig.as_deref(),
            &trusted,
        )
        .map_err(|e| CliError(format!("refusing to run {e}")))?;
        tracing::info!(plugin = %plugin_name, signer = %signer.name, key_id = %signer.key_id, "signature verified");
        engine.load(&plugin_name, &wasm).await?
    } else {
        load_plugin(&engine, &plugin_name).await?
    };
    let call = Call {
        probe: &plugin_name,
        target: &args.target,
        config: &args.config,
        limits: Limits {
            timeout: args.timeout,
            fuel: args.fuel,
            memory: args.memory,
        },
        grants: &grants,
        attempt: 1,
    };
    let result = engine.run(&plugin, &call).await;
    print(&result, args.output);
    Ok(result.status.exit_code())
}

fn print(result: &RunResult, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string(result).unwrap_or_default()),
        Output::Text => {
            let reason = result.reason.map(|r| format!(" ({r})")).unwrap_or_default();
            println!(
                "{}{reason}: {} [{:.1}ms, fuel {}]",
                result.status.as_str().to_uppercase(),
                result.message,
                result.duration.as_secs_f64() * 1000.0,
                result.fuel_consumed
            );
            for m in &result.metrics {
                println!("  {} = {} {}", m.name, m.value, m.unit);
            }
            if let Some(d) = &result.detail {
                println!("  detail: {d}");
            }
        }
    }
}
