//! The `sonde` command line. Exit codes follow the Nagios convention:
//! 0 success, 1 warning, 2 failure, 3 unknown or error.

mod args;
mod bench;
mod check;
pub mod client;
mod plugin;
mod run;
mod scaffold;

use crate::engine::{Engine, EngineConfig, Plugin};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;

/// sonde: health probes as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "sonde", version, about)]
pub struct Cli {
    /// Directory for compiled plugins [default: $SONDE_CACHE_DIR, $XDG_CACHE_HOME/sonde or ~/.cache/sonde].
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Compile plugins afresh and keep nothing on disk.
    #[arg(long, global = true)]
    pub no_cache: bool,

    /// Log filter, as RUST_LOG (`info`, `sonde=debug`) [default: $RUST_LOG or `warn`].
    #[arg(long, global = true, value_name = "FILTER")]
    pub log: Option<String>,

    #[command(subcommand)]
    /// What to do.
    pub command: Command,
}

/// The `sonde` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one probe once and exit with its status (0 success, 1 warning, 2 failure, 3 unknown).
    Check(check::CheckArgs),
    /// Inspect, list, sign, verify and create plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run the agent: probe every target of the config on schedule (the embedded default config without --config).
    Run(run::RunArgs),
    /// Check a config file without running it (exit 0 valid, 2 invalid).
    Validate(run::ValidateArgs),
    /// Show a running agent's probes.
    Status(run::StatusArgs),
    /// Measure what a plugin costs per run (against a native baseline with --baseline), or the scheduler at scale (--scheduler).
    Bench(bench::BenchArgs),
}

/// How results are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line for a person, then the metrics.
    #[default]
    Text,
    /// One JSON object.
    Json,
}

/// A command-line error: printed as one line, exit code 3.
#[derive(Debug)]
pub struct CliError(pub String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        Self(e.to_string())
    }
}

/// Runs the command and returns the process exit code.
pub fn main(cli: Cli) -> i32 {
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sonde: cannot start the async runtime: {e}");
            return 3;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(CliError(message)) => {
            eprintln!("sonde: {message}");
            3
        }
    }
}

async fn dispatch(cli: Cli) -> Result<i32, CliError> {
    let config = EngineConfig {
        cache_dir: if cli.no_cache {
            None
        } else {
            cli.cache_dir.clone().or_else(crate::engine::cache::default_dir)
        },
        ..EngineConfig::default()
    };
    match cli.command {
        Command::Check(args) => check::run(config, args).await,
        Command::Plugin(cmd) => plugin::run(config, cmd).await,
        Command::Run(args) => run::run(config, args).await,
        Command::Validate(args) => run::validate(config, args).await,
        Command::Status(args) => run::status(args).await,
        Command::Bench(args) => bench::run(config, args).await,
    }
}

/// Loads a plugin named on the command line: a built-in name, or a path to
/// a `.wasm` component.
pub(crate) async fn load_plugin(engine: &Engine, name: &str) -> Result<Arc<Plugin>, CliError> {
    let looks_like_path = name.contains('/') || name.ends_with(".wasm");
    if looks_like_path {
        return Ok(engine.load_file(std::path::Path::new(name)).await?);
    }
    match crate::builtins::get(name) {
        Some(bytes) => Ok(engine.load(name, bytes).await?),
        None => Err(CliError(format!(
            "unknown built-in plugin {name:?} (built-ins: {}); to run a file, give its path, such as ./{name}.wasm",
            crate::builtins::names().collect::<Vec<_>>().join(", ")
        ))),
    }
}
