//! `sonde check`: run one probe once.

use super::args::SandboxArgs;
use super::error::CliError;
use super::load::load_plugin;
use super::output::Output;
use clap::Args;
use sonde_sandbox::engine::{Call, Engine, EngineConfig};
use sonde_sandbox::host::NetPattern;
use sonde_sandbox::verdict::RunResult;
use std::path::PathBuf;
use std::sync::Arc;

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
    #[arg(long, default_value = super::client::DEFAULT_API_URL, value_name = "URL", requires = "group")]
    pub api: String,

    /// What to probe: HOST:PORT or a URL. The plugin may connect to it and to nothing else not granted.
    #[arg(long, short, default_value = "")]
    pub target: String,

    /// The plugin config, as JSON.
    #[arg(long, short, default_value = "{}", value_name = "JSON")]
    pub config: String,

    /// The call's deadline, fuel, memory and grants.
    #[command(flatten)]
    pub sandbox: SandboxArgs,

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
        out!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    match status.as_u16() {
        200 => {
            if args.output == Output::Text {
                out!("group {group}: {kind} ({} probes)", v["probes"].as_u64().unwrap_or(0));
            }
            Ok(0)
        }
        503 => {
            if args.output == Output::Text {
                out!("group {group}: not {kind}");
                for f in v["failing"].as_array().into_iter().flatten() {
                    out!(
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
        return Err(CliError::Message("give a plugin to run, or --group".into()));
    };
    serde_json::from_str::<serde_json::Value>(&args.config)
        .map_err(|e| CliError::Message(format!("--config is not valid JSON: {e}")))?;
    if !args.target.is_empty() {
        NetPattern::for_target(&args.target)?;
    }
    let grants = Arc::new(args.sandbox.grants()?);
    let engine = Engine::new(config.clone())?;
    let plugin = if sonde_oci::Reference::is_oci(&plugin_name) {
        let trusted = args
            .trust
            .iter()
            .map(|k| sonde_oci::signing::PublicKey::read(k))
            .collect::<Result<Vec<_>, _>>()?;
        super::plugin::load_oci(&engine, &config, &args.registry, &plugin_name, &trusted).await?
    } else if !args.trust.is_empty() && sonde_builtins::get(&plugin_name).is_none() {
        // Verify and load the same bytes, so the file cannot change in between.
        let trusted = args
            .trust
            .iter()
            .map(|k| sonde_oci::signing::PublicKey::read(k))
            .collect::<Result<Vec<_>, _>>()?;
        let path = std::path::Path::new(&plugin_name);
        let wasm = sonde_sandbox::engine::read_plugin_file(path).await?;
        let (sig_path, sig) = match sonde_oci::signing::read_signature(path)? {
            Some((p, s)) => (p, Some(s)),
            None => (sonde_oci::signing::bundle_path(path), None),
        };
        let signer = sonde_oci::signing::verify(
            &plugin_name,
            &wasm,
            &sig_path.display().to_string(),
            sig.as_deref(),
            &trusted,
        )
        .map_err(|e| CliError::Message(format!("refusing to run {e}")))?;
        tracing::info!(plugin = %plugin_name, signer = %signer.name, key_id = %signer.key_id, "signature verified");
        engine.load(&plugin_name, &wasm).await?
    } else {
        load_plugin(&engine, &plugin_name).await?
    };
    let call = Call {
        probe: &plugin_name,
        target: &args.target,
        config: &args.config,
        limits: args.sandbox.limits(),
        grants: &grants,
        attempt: 1,
        observe: true,
    };
    let result = engine.run(&plugin, &call).await;
    print(&result, args.output);
    Ok(result.status.exit_code())
}

fn print(result: &RunResult, output: Output) {
    match output {
        Output::Json => out!("{}", serde_json::to_string(result).unwrap_or_default()),
        Output::Text => {
            let reason = result.reason.map(|r| format!(" ({r})")).unwrap_or_default();
            out!(
                "{}{reason}: {} [{:.1}ms, fuel {}]",
                result.status.as_str().to_uppercase(),
                result.message,
                result.duration.as_secs_f64() * 1000.0,
                result.fuel_consumed
            );
            for m in &result.metrics {
                out!("  {} = {} {}", m.name, m.value, m.unit);
            }
            if let Some(d) = &result.detail {
                out!("  detail: {d}");
            }
        }
    }
}
