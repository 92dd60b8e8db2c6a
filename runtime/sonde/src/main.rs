//! The `sonde` command: parses the command line, sets up logging and hands
//! over to the library.

use clap::Parser;
use sonde::cli::{Cli, Command, LogFormat};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// What the agent logs without `--log-level` or `RUST_LOG`: its start,
/// reload, state-change and shutdown lines; plugins' own records only from
/// warnings up (they log per call).
const AGENT_DEFAULT: &str = "warn,sonde=info,sonde_core=info,sonde_sandbox=info,sonde_oci=info,sonde_kubernetes=info,sonde_policy=info,sonde::plugin=warn";
/// The other commands print their results themselves: only problems.
const COMMAND_DEFAULT: &str = "warn";

/// jemalloc: cheaper than glibc's malloc for the host's per-call
/// allocations (runtime/Cargo.toml says by how much).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = Cli::parse();
    init_logging(&cli);
    std::process::exit(sonde::cli::main(cli));
}

/// Log lines go to stderr, filtered by `--log-level`, else `RUST_LOG`,
/// else the command's default.
fn init_logging(cli: &Cli) {
    let default = match cli.command {
        Command::Run(_) => AGENT_DEFAULT,
        _ => COMMAND_DEFAULT,
    };
    let given = cli
        .log_level
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty()));
    let filter = match given.as_deref().map(EnvFilter::try_new) {
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            eprintln!(
                "sonde: ignoring the log filter {:?} ({e}); give a level such as `debug` or a filter such as `warn,sonde_core=debug`",
                given.unwrap_or_default()
            );
            EnvFilter::new(default)
        }
        None => EnvFilter::new(default),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        // Without the module path: its key, `target`, would clash with the
        // probe's target in state-change lines.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_target(false)
            .init(),
    }
}
