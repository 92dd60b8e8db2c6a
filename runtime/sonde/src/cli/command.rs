//! What the command line says: the `sonde` command, its global options
//! and subcommands, as clap parses them.

use super::{bench, check, completions, modules, plugin, run};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// sonde: health probes as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "sonde", version = crate::build::VERSION, about)]
pub struct Cli {
    /// Directory for compiled plugins [default: $SONDE_CACHE_DIR, $XDG_CACHE_HOME/sonde or ~/.cache/sonde].
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Compile plugins afresh and keep nothing on disk.
    #[arg(long, global = true)]
    pub no_cache: bool,

    /// The time any plugin may take to compile, plus --compile-timeout-per-mib for each MiB of it, at most --compile-timeout-max; the compiler (a child process) is killed past it and the plugin refused.
    #[arg(long, global = true, default_value = "20s", value_parser = super::args::parse_positive_duration, value_name = "DURATION")]
    pub compile_timeout: std::time::Duration,

    /// The compile time added per MiB of component (a Python or JavaScript component carries its interpreter: 12-19 MB); 0s for a budget of --compile-timeout whatever the size.
    #[arg(long, global = true, default_value = "5s", value_parser = super::args::parse_duration, value_name = "DURATION")]
    pub compile_timeout_per_mib: std::time::Duration,

    /// The most time any plugin may take to compile, whatever its size.
    #[arg(long, global = true, default_value = "120s", value_parser = super::args::parse_positive_duration, value_name = "DURATION")]
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

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per line, the event's fields at the top level.
    Json,
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
