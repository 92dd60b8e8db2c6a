//! The `sonde` command line. Exit codes follow the Nagios convention:
//! 0 success, 1 warning, 2 failure, 3 unknown or error.

/// `println!` for what a command prints on stdout ([`write_out`]).
macro_rules! out {
    () => {
        $crate::cli::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the same, without the newline.
macro_rules! out_part {
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!($($arg)*))
    };
}

mod args;
mod bench;
mod check;
pub mod client;
mod completions;
pub mod effective;
mod modules;
mod plugin;
mod run;
mod scaffold;

use clap::{Parser, Subcommand, ValueEnum};
use sonde_sandbox::engine::{Engine, EngineConfig, Plugin};
use std::path::PathBuf;
use std::sync::Arc;

/// sonde: health probes as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "sonde", version = VERSION, about)]
pub struct Cli {
    /// Directory for compiled plugins [default: $SONDE_CACHE_DIR, $XDG_CACHE_HOME/sonde or ~/.cache/sonde].
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Compile plugins afresh and keep nothing on disk.
    #[arg(long, global = true)]
    pub no_cache: bool,

    /// The time any plugin may take to compile, plus --compile-timeout-per-mib for each MiB of it, at most --compile-timeout-max; the compiler (a child process) is killed past it and the plugin refused.
    #[arg(long, global = true, default_value = "20s", value_parser = args::parse_positive_duration, value_name = "DURATION")]
    pub compile_timeout: std::time::Duration,

    /// The compile time added per MiB of component (a Python or JavaScript component carries its interpreter: 12-19 MB); 0s for a budget of --compile-timeout whatever the size.
    #[arg(long, global = true, default_value = "5s", value_parser = args::parse_duration, value_name = "DURATION")]
    pub compile_timeout_per_mib: std::time::Duration,

    /// The most time any plugin may take to compile, whatever its size.
    #[arg(long, global = true, default_value = "120s", value_parser = args::parse_positive_duration, value_name = "DURATION")]
    pub compile_timeout_max: std::time::Duration,

    /// Log level or filter, as RUST_LOG (`debug`, `warn,sonde_core=debug`) [default: $RUST_LOG, else `info` for `sonde run` and `warn` for the rest].
    #[arg(long, alias = "log", global = true, value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log line format on stderr: `text` for people, `json` (one object a line) for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

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
    /// Bring modules from elsewhere: `sonde modules import blackbox.yml --grant '10.0.0.0/8:*'` prints blackbox_exporter's modules as sonde's.
    #[command(subcommand)]
    Modules(modules::ModulesCommand),
    /// Show a running agent's probes (exit 0 when every probe passes, 2 when one does not, 3 when the agent cannot be reached).
    Status(run::StatusArgs),
    /// Measure what a plugin costs per run (against a native baseline with --baseline), or the scheduler at scale (--scheduler).
    Bench(bench::BenchArgs),
    /// Print a shell completion script (`sonde completions bash > /etc/bash_completion.d/sonde`).
    Completions(completions::CompletionsArgs),
    /// Print the manual page (`sonde man | man -l -`), or write every page with --dir.
    Man(completions::ManArgs),
    /// Compile one component under limits (run by the agent itself, in a child process).
    #[command(name = "compile-worker", hide = true)]
    CompileWorker(sonde_sandbox::engine::compile::WorkerArgs),
}

/// `sonde --version`: the version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SONDE_COMMIT"), ")");

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per line, the event's fields at the top level.
    Json,
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

/// Writes a command's output on stdout. A reader that closed the pipe
/// (`sonde … | head`) ends the command quietly with exit 0, as it ends a
/// C tool, instead of the panic `println!` makes of it; any other write
/// error is one line and exit 3.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("sonde: cannot write to stdout: {e}");
            std::process::exit(3);
        }
    }
}

/// A command-line error: printed as one line, exit code 3.
#[derive(Debug)]
pub struct CliError(pub String);

impl CliError {
    /// A file that could not be read or written, with what to check.
    pub(crate) fn file(path: &std::path::Path, e: &std::io::Error) -> Self {
        let what_to_do = match e.kind() {
            std::io::ErrorKind::NotFound => "check the path",
            std::io::ErrorKind::PermissionDenied => "check that this user may use it (ls -l)",
            _ => "check the path and the disk",
        };
        Self(format!("{}: {e}; {what_to_do}", path.display()))
    }
}

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        Self(e.to_string())
    }
}

/// Runs the command and returns the process exit code. Logging is the
/// binary's to set up (`main.rs`), before this.
pub fn main(cli: Cli) -> i32 {
    // The compiler child needs no async runtime (and no threads of one
    // counted against its limits).
    if let Command::CompileWorker(args) = cli.command {
        return sonde_sandbox::engine::compile::worker(args);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sonde: cannot start the async runtime: {e}");
            return 3;
        }
    };
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(CliError(message)) => {
            eprintln!("sonde: {message}");
            3
        }
    };
    // Dropping the runtime would wait for every blocking thread, and one
    // may never return (a plugin's file read, a lookup against a dead
    // resolver): the command has its answer, so it exits now.
    runtime.shutdown_background();
    code
}

async fn dispatch(cli: Cli) -> Result<i32, CliError> {
    // Plugins are compiled in a child under a time and memory budget.
    let mut compiler = sonde_sandbox::engine::Compiler::this_binary();
    if let sonde_sandbox::engine::Compiler::Child { budget, .. } = &mut compiler {
        budget.timeout = cli.compile_timeout;
        budget.timeout_per_mib = cli.compile_timeout_per_mib;
        budget.max_timeout = cli.compile_timeout_max;
    }
    let config = EngineConfig {
        cache_dir: if cli.no_cache {
            None
        } else {
            cli.cache_dir.clone().or_else(sonde_sandbox::engine::cache::default_dir)
        },
        compiler,
        ..EngineConfig::default()
    };
    match cli.command {
        Command::Check(args) => check::run(config, args).await,
        Command::Plugin(cmd) => plugin::run(config, cmd).await,
        Command::Run(args) => run::run(config, args).await,
        Command::Validate(args) => run::validate(config, args).await,
        Command::Modules(cmd) => modules::run(cmd),
        Command::Status(args) => run::status(args).await,
        Command::Bench(args) => bench::run(config, args).await,
        Command::Completions(args) => completions::completions(args),
        Command::Man(args) => completions::man(args),
        Command::CompileWorker(args) => Ok(sonde_sandbox::engine::compile::worker(args)),
    }
}

/// Loads a plugin named on the command line: a built-in name, or a path to
/// a `.wasm` component.
pub(crate) async fn load_plugin(engine: &Engine, name: &str) -> Result<Arc<Plugin>, CliError> {
    let looks_like_path = name.contains('/') || name.ends_with(".wasm");
    if looks_like_path {
        return Ok(engine.load_file(std::path::Path::new(name)).await?);
    }
    match sonde_builtins::get(name) {
        Some(bytes) => Ok(engine.load(name, bytes).await?),
        None => Err(CliError(format!(
            "unknown built-in plugin {name:?} (built-ins: {}); to run a file, give its path, such as ./{name}.wasm",
            sonde_builtins::names().collect::<Vec<_>>().join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(std::iter::once("sonde").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_a_grace_of_zero() {
        for zero in ["0", "0s"] {
            let Command::Run(run) = parse(&["run", "--grace", zero]) else {
                panic!("not run")
            };
            assert_eq!(run.grace, Duration::ZERO);
        }
    }

    #[test]
    fn check_and_bench_take_the_same_sandbox_flags() {
        let sandbox = [
            "--timeout",
            "2s",
            "--fuel",
            "7",
            "--memory",
            "1MiB",
            "--allow-net",
            "db:5432",
            "--allow-file",
            "/srv",
            "--allow-exec",
            "/bin/true",
            "--exec-env",
            "A=b",
        ];
        let check = [&["check", "tcp"][..], &sandbox].concat();
        let bench = [&["bench", "tcp"][..], &sandbox].concat();
        let Command::Check(check) = parse(&check) else {
            panic!("not check")
        };
        let Command::Bench(bench) = parse(&bench) else {
            panic!("not bench")
        };
        for s in [&check.sandbox, &bench.sandbox] {
            assert_eq!(s.limits().timeout, Duration::from_secs(2));
            assert_eq!((s.limits().fuel, s.limits().memory), (7, 1 << 20));
            assert_eq!(s.allow_net, ["db:5432"]);
            assert_eq!(s.allow_file, [PathBuf::from("/srv")]);
            assert_eq!(s.allow_exec, [PathBuf::from("/bin/true")]);
            assert_eq!(s.exec_env, [("A".to_string(), "b".to_string())]);
        }
    }
}
